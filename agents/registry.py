"""The one registry of algorithms: it lists the modules that declare one.

Each module of `MODULES` holds an `ALGORITHM` (`mbrl.agents.base.AlgorithmEntry`): its config sections, presets,
world-model kind, imagination fields and constructor. Everything else (the `--algo` choices and their help,
`mbrl.config.TrainConfig`'s sections, what a population or a sweep may vary, the end-to-end test) is derived
from these entries. Adding an algorithm: write its module, add its line here (docs/contributing.md).
"""

from __future__ import annotations

import importlib

from mbrl.agents.base import IMAGINATION_FIELDS, PRESET_NAMES, AlgorithmEntry
from mbrl.core.errors import ConfigError

# One line per algorithm; the first is what `mbrl train` runs with no --algo.
MODULES = (
    "mbrl.agents.ravl",
    "mbrl.agents.mopo",
    "mbrl.agents.bc",
    "mbrl.agents.neubay",
    "mbrl.agents.mopo_ppo",
    "mbrl.agents.edac",
    "mbrl.agents.td3_bc",
    "mbrl.agents.cql",
    "mbrl.agents.iql",
    "mbrl.agents.combo",
    "mbrl.agents.mobile",
)

# Sections every run has, whatever the algorithm.
COMMON_SECTIONS = ("schedule", "select", "logging")
ALL_IMAGINATION = IMAGINATION_FIELDS
PRESETS = PRESET_NAMES


def _collect(modules: tuple[str, ...]) -> dict[str, AlgorithmEntry]:
    out: dict[str, AlgorithmEntry] = {}
    for module in modules:
        found = importlib.import_module(module).ALGORITHM
        if found.name in out:
            raise ValueError(f"{module}: algorithm {found.name!r} is already declared")
        out[found.name] = found
    return out


ALGORITHMS: dict[str, AlgorithmEntry] = _collect(MODULES)
DEFAULT = next(iter(ALGORITHMS))


def _sections() -> dict[str, type]:
    """Every algorithm's own config sections, in the order of `MODULES` (one class per name)."""
    out: dict[str, type] = {}
    for found in ALGORITHMS.values():
        for name, cls in found.sections.items():
            if out.setdefault(name, cls) is not cls:
                raise ValueError(f"{found.name}: section {name!r} is {cls.__name__} here and {out[name].__name__} elsewhere")
    return out


# The config sections the algorithms define, in the order `mbrl.config.TrainConfig` holds them.
SECTIONS: dict[str, type] = _sections()


def entry(name: str) -> AlgorithmEntry:
    if name not in ALGORITHMS:
        raise ConfigError(f"algo: unknown algorithm {name!r}; expected one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def make(config, obs_dim: int, act_dim: int, obs_scale=None):
    """The algorithm `config.algo` names, built for these dimensions; `obs_scale` (`mbrl.agents.networks.ObsScale`)
    standardises the observations inside its networks."""
    return entry(config.algo).make(config, obs_dim, act_dim, obs_scale)
