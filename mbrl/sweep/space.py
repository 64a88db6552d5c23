"""A search space: a TOML file whose every key is an `mbrl train` option with a range or choices.

    "mopo.penalty_coef" = {low = 0.1, high = 10.0, log = true}   # a float range (log-uniform)
    "imagination.horizon" = {choices = [1, 5, 10]}               # categorical
    "sac.num_critics" = {low = 2, high = 10, step = 2}           # an int range (the field is an int)

A key may be written as the option (`--mopo.penalty-coef`) or as the field (`mopo.penalty_coef`). Whether
a range is sampled as int or float follows the field's type. Every value the space can produce is checked
against the config's own validation when the space is loaded, so a bad range fails before any trial runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import optuna

from mbrl.agents import registry
from mbrl.config import TrainConfig, _cli_type, _hints, _section_names, override, unread
from mbrl.core.errors import ConfigError

_RANGE_KEYS = {"low", "high", "log", "step"}


@dataclasses.dataclass(frozen=True)
class Dimension:
    name: str  # section.field
    kind: str  # "float" | "int" | "categorical"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()  # categorical values as optuna stores them (lists as JSON strings)

    def distribution(self):
        if self.kind == "categorical":
            return optuna.distributions.CategoricalDistribution(self.choices)
        if self.kind == "int":
            return optuna.distributions.IntDistribution(self.low, self.high, log=self.log, step=self.step or 1)
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def values_to_check(self) -> list:
        return [decode(c) for c in self.choices] if self.kind == "categorical" else [self.low, self.high]


@dataclasses.dataclass(frozen=True)
class Space:
    source: str  # the file it came from
    dimensions: tuple[Dimension, ...]

    def distributions(self) -> dict[str, Any]:
        return {d.name: d.distribution() for d in self.dimensions}

    def names(self) -> list[str]:
        return [d.name for d in self.dimensions]


def decode(value):
    """A categorical value as the config takes it (list choices are stored as JSON strings)."""
    if isinstance(value, str) and value.startswith("["):
        return json.loads(value)
    return value


def nested(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{"mopo.penalty_coef": 2.0} -> {"mopo": {"penalty_coef": 2.0}} (list choices decoded)."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in params.items():
        section, _, field = name.partition(".")
        out.setdefault(section, {})[field] = decode(value)
    return out


def shipped_names() -> list[str]:
    """The algorithms that ship a search space (`mbrl.agents.base.AlgorithmEntry.space`), by name."""
    return [name for name, entry in registry.ALGORITHMS.items() if entry.space]


def load(path: str | Path, base) -> Space:
    """The space in TOML file `path` (or the space algorithm `path` ships, e.g. `mopo`), checked against
    the base config `base` (a `TrainConfig`): its algorithm must read every option, and every value
    the space can give must be valid for that option."""
    path = Path(path)
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not a valid TOML space ({exc})") from None
    elif str(path) in shipped_names():
        data = {key: dict(spec) for key, spec in registry.entry(str(path)).space.items()}
        path = Path(f"{path}'s shipped space")
    else:
        raise ConfigError(f"{path}: no such space file (shipped spaces: {', '.join(shipped_names())})")
    if not data:
        raise ConfigError(f"{path}: the space is empty; expected keys such as \"mopo.penalty_coef\" = {{low = 0.1, high = 10}}")
    sections = _section_names()
    dims = []
    for key, spec in data.items():
        name = key.removeprefix("--").replace("-", "_")
        where = f"{path}: {key}"
        section, dot, field = name.partition(".")
        if not dot or section not in sections:
            top = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in sections]
            if name in top:
                raise ConfigError(f"{where}: {name} is fixed for a whole sweep (give it as --{name.replace('_', '-')}), not searched")
            raise ConfigError(f"{where}: unknown option; expected SECTION.FIELD with a section among {', '.join(sections)}")
        section_cls = type(getattr(TrainConfig(), section))
        hints = _hints(section_cls)
        if field not in hints:
            raise ConfigError(f"{where}: unknown option; {section} has {', '.join(hints)}")
        if unread(base.algo, {section: {field: None}}):
            raise ConfigError(f"{where}: not read by algorithm {base.algo}")
        dims.append(_dimension(name, spec, hints[field], where))
    space = Space(str(path), tuple(dims))
    for dim in space.dimensions:
        section, _, field = dim.name.partition(".")
        for value in dim.values_to_check():
            try:
                override(base, {section: {field: value}})
            except ConfigError as exc:
                raise ConfigError(f"{path}: {dim.name} = {value!r} is outside the option's valid values ({exc})") from None
    return space


def _dimension(name: str, spec, hint, where: str) -> Dimension:
    base_hint = _cli_type(hint)  # `float | None` -> float
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a table {{low = .., high = ..}} or {{choices = [..]}}, found {spec!r}")
    if "choices" in spec:
        extra = set(spec) - {"choices"}
        if extra:
            raise ConfigError(f"{where}: a choices dimension takes no {', '.join(sorted(extra))}")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: choices must be a non-empty list, found {choices!r}")
        stored = tuple(json.dumps(c) if isinstance(c, list) else c for c in choices)
        if len(set(map(repr, stored))) != len(stored):
            raise ConfigError(f"{where}: choices repeat a value: {choices!r}")
        return Dimension(name, "categorical", choices=stored)
    unknown = set(spec) - _RANGE_KEYS
    if unknown or "low" not in spec or "high" not in spec:
        raise ConfigError(f"{where}: expected low and high (optional log, step) or choices, found keys {', '.join(spec) or 'none'}")
    if base_hint not in (int, float):
        raise ConfigError(f"{where}: a range needs a numeric option; give choices for this one")
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    for label, value in (("low", low), ("high", high)) + ((("step", step),) if step is not None else ()):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}: {label} must be a finite number, found {value!r}")
        if base_hint is int and not isinstance(value, int):
            raise ConfigError(f"{where}: {label} must be an integer (the option is an int), found {value!r}")
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log must be true or false, found {log!r}")
    if not low < high:
        raise ConfigError(f"{where}: expected low < high, found low {low} and high {high}")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log range needs low > 0, found {low}")
    if log and step is not None:
        raise ConfigError(f"{where}: a log range takes no step")
    if step is not None and step <= 0:
        raise ConfigError(f"{where}: step must be positive, found {step}")
    if base_hint is int:
        return Dimension(name, "int", int(low), int(high), log, step)
    return Dimension(name, "float", float(low), float(high), log, None if step is None else float(step))

