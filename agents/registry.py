"""The one registry of algorithms: it lists the modules that declare one.

Each module of `MODULES` holds an `ALGORITHM` (`mbrl.agents.base.AlgorithmEntry`): its config sections, presets,
world-model kind, imagination fields and constructor. Everything else (the `--algo` choices and their help,
`mbrl.config.TrainConfig`'s sections, what a population or a sweep may vary, the end-to-end test) is derived
from these entries. Adding an algorithm: write its module, add its line here (docs/contributing.md).
"""

from __future__ import annotations

from mbrl.agents.base import IMAGINATION_FIELDS, PRESET_NAMES, AlgorithmEntry
from mbrl.core import entries

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


ALGORITHMS: dict[str, AlgorithmEntry] = entries.collect(MODULES, "ALGORITHM", "algorithm")
DEFAULT = next(iter(ALGORITHMS))


# The config sections the algorithms define, in the order `mbrl.config.TrainConfig` holds them.
SECTIONS: dict[str, type] = entries.merged_sections(ALGORITHMS.values())


def entry(name: str) -> AlgorithmEntry:
    return entries.lookup(ALGORITHMS, name, "algo", "algorithm")


def make(config, obs_dim: int, act_dim: int, obs_scale=None):
    """The algorithm `config.algo` names, built for these dimensions; `obs_scale` (`mbrl.agents.networks.ObsScale`)
    standardises the observations inside its networks."""
    return entry(config.algo).make(config, obs_dim, act_dim, obs_scale)
