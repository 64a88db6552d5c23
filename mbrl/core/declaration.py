"""A robot declared in a TOML file: its channels, rate, episode limit, optional rules and import sources.

    name = "cart"
    control_hz = 50.0
    max_episode_steps = 200
    reward = "cart_rules.py:reward"          # optional: jax.numpy f(obs, action, next_obs) -> reward
    termination = "cart_rules.py:terminated"  # optional: jax.numpy f(obs, action, next_obs) -> bool
    ref_min_score = 0.0                       # optional, both or neither
    ref_max_score = 200.0

    [[observation]]                           # one table per dimension, in order
    name = "position"
    unit = "m"
    low = -2.0                                # optional, for observations
    high = 2.0
    topic = "/joint_states"                   # where `mbrl data import` finds it in a ROS 2 bag
    field = "position[0]"
    column = "position"                       # in a CSV/Parquet table (default: the name)

    [[action]]                                # bounds are required for actions
    name = "force"
    unit = "N"
    low = -1.0
    high = 1.0
    topic = "/cmd"
    field = "data[0]"

    [import]                                  # optional settings of `mbrl data import`
    max_age_s = 0.05

A reward or termination is `module:function` (an importable module) or `file.py:function` (a file beside the
declaration). This module reads and checks the file and makes the task's spec; `mbrl.envs.tasks` imports the
functions. A declaration is pure data, so the dataset loaders can use it without JAX.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
from pathlib import Path
from typing import Any

from mbrl.core.errors import ConfigError
from mbrl.core.files import data_dir, read_toml

_TOP_KEYS = {"name", "control_hz", "max_episode_steps", "reward", "termination", "ref_min_score", "ref_max_score",
             "observation", "action", "import", "description"}
_CHANNEL_KEYS = {"name", "unit", "low", "high", "topic", "field", "column"}


@dataclasses.dataclass(frozen=True)
class Channel:
    """One dimension of the observation or the action."""

    name: str
    unit: str = ""
    low: float = -math.inf
    high: float = math.inf
    topic: str | None = None  # ROS 2 bags: the topic that carries it ...
    field: str | None = None  # ... and the field path in its message: "position[0]", "linear.x"
    column: str | None = None  # CSV/Parquet: the column (default: the name)

    @property
    def column_name(self) -> str:
        return self.column or self.name


@dataclasses.dataclass(frozen=True)
class Declaration:
    path: Path
    name: str
    control_hz: float
    max_episode_steps: int
    observations: tuple[Channel, ...]
    actions: tuple[Channel, ...]
    reward: str | None = None  # "module:function", a file path made absolute
    termination: str | None = None
    ref_min_score: float | None = None
    ref_max_score: float | None = None
    import_settings: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def obs_dim(self) -> int:
        return len(self.observations)

    @property
    def act_dim(self) -> int:
        return len(self.actions)

    def spec_fields(self) -> dict:
        """The fields of its `mbrl.core.types.TaskSpec` (`types.declared_spec` makes it)."""
        return dict(
            name=self.name, env_id=None, obs_dim=self.obs_dim, act_dim=self.act_dim,
            action_low=tuple(c.low for c in self.actions), action_high=tuple(c.high for c in self.actions),
            max_episode_steps=self.max_episode_steps, ref_min_score=self.ref_min_score,
            ref_max_score=self.ref_max_score, control_hz=self.control_hz,
            obs_names=tuple(c.name for c in self.observations), act_names=tuple(c.name for c in self.actions),
            obs_units=tuple(c.unit for c in self.observations), act_units=tuple(c.unit for c in self.actions),
            obs_low=tuple(c.low for c in self.observations), obs_high=tuple(c.high for c in self.observations),
            suite="robot", declaration=str(self.path))


def is_declaration_path(text: str | os.PathLike | None) -> bool:
    return text is not None and str(text).lower().endswith(".toml")


def tasks_dir() -> Path:
    """Where declarations are found by name: `$MBRL_DATA_DIR/tasks/NAME.toml`."""
    return data_dir() / "tasks"


def find_declaration(name: str) -> Path | None:
    """The declaration file of a task called `name` in `tasks_dir()`, else None."""
    folder = tasks_dir()
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.toml")):
        if path.stem.lower() == name.lower():
            return path
    return None


def read_declaration(path: str | os.PathLike) -> Declaration:
    """Read and check a declaration; every problem is a ConfigError naming the file and the field."""
    path = Path(path).expanduser()
    where = str(path)
    data = read_toml(path, "no such task declaration (a .toml file)", ConfigError)
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; expected some of {', '.join(sorted(_TOP_KEYS))}")
    name = _required(data, "name", str, where)
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"{where}: field 'name' = {name!r}; expected letters, digits, '-' and '_'")
    control_hz = float(_required(data, "control_hz", (int, float), where))
    if not (math.isfinite(control_hz) and control_hz > 0):
        raise ConfigError(f"{where}: field 'control_hz' = {control_hz}; expected a positive number of Hz")
    steps = _required(data, "max_episode_steps", int, where)
    if steps < 1:
        raise ConfigError(f"{where}: field 'max_episode_steps' = {steps}; expected at least 1")
    observations = _channels(data, "observation", where, bounds_required=False)
    actions = _channels(data, "action", where, bounds_required=True)
    refs = [data.get(key) for key in ("ref_min_score", "ref_max_score")]
    if (refs[0] is None) != (refs[1] is None):
        raise ConfigError(f"{where}: fields 'ref_min_score' and 'ref_max_score': give both or neither")
    for key, value in zip(("ref_min_score", "ref_max_score"), refs):
        if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value)):
            raise ConfigError(f"{where}: field {key!r} = {value!r}; expected a finite number")
    if refs[0] is not None and refs[0] == refs[1]:
        raise ConfigError(f"{where}: 'ref_min_score' equals 'ref_max_score'; expected two different numbers")
    settings = data.get("import", {})
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}: field 'import' must be a table ([import])")
    return Declaration(
        path=path.resolve(), name=name, control_hz=control_hz, max_episode_steps=steps,
        observations=observations, actions=actions,
        reward=_function_ref(data, "reward", path), termination=_function_ref(data, "termination", path),
        ref_min_score=None if refs[0] is None else float(refs[0]),
        ref_max_score=None if refs[1] is None else float(refs[1]), import_settings=settings)


def _required(data: dict, key: str, kind, where: str):
    if key not in data:
        raise ConfigError(f"{where}: field {key!r} is missing")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        expected = {str: "a string", int: "an integer"}.get(kind, "a number")
        raise ConfigError(f"{where}: field {key!r} = {value!r}; expected {expected}")
    return value


def _channels(data: dict, key: str, where: str, bounds_required: bool) -> tuple[Channel, ...]:
    tables = data.get(key)
    if not tables:
        raise ConfigError(f"{where}: no [[{key}]] table; expected one per {key} dimension")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{where}: field {key!r} must be an array of tables ([[{key}]])")
    channels, seen = [], set()
    for i, table in enumerate(tables):
        at = f"{where}: [[{key}]] #{i + 1}"
        unknown = sorted(set(table) - _CHANNEL_KEYS)
        if unknown:
            raise ConfigError(f"{at}: unknown field {unknown[0]!r}; expected some of {', '.join(sorted(_CHANNEL_KEYS))}")
        name = _required(table, "name", str, at)
        if name in seen:
            raise ConfigError(f"{at}: name {name!r} is used twice")
        seen.add(name)
        if bounds_required:
            for bound in ("low", "high"):
                if bound not in table:
                    raise ConfigError(f"{at} ({name}): field {bound!r} is missing; every action needs bounds")
        low, high = (float(_required(table, b, (int, float), at)) if b in table else d
                     for b, d in (("low", -math.inf), ("high", math.inf)))
        if math.isnan(low) or math.isnan(high) or not low < high:
            raise ConfigError(f"{at} ({name}): low = {low} and high = {high}; expected low < high")
        if bounds_required and not (math.isfinite(low) and math.isfinite(high)):
            raise ConfigError(f"{at} ({name}): expected finite action bounds, found [{low}, {high}]")
        text = {k: table[k] for k in ("unit", "topic", "field", "column") if k in table}
        for k, v in text.items():
            if not isinstance(v, str):
                raise ConfigError(f"{at} ({name}): field {k!r} = {v!r}; expected a string")
        if ("topic" in text) != ("field" in text):
            raise ConfigError(f"{at} ({name}): give 'topic' and 'field' together")
        channels.append(Channel(name=name, low=low, high=high, **text))
    return tuple(channels)


def import_reference(ref: str):
    """The object `module:name` (an importable module) or `/path/file.py:name` names; ImportError, AttributeError or
    OSError (a missing file) as Python raises them, for the caller to name its field or option."""
    module_name, _, name = ref.rpartition(":")
    if module_name.endswith(".py"):
        if not Path(module_name).is_file():
            raise FileNotFoundError(f"no such file {module_name}")
        spec = importlib.util.spec_from_file_location(f"mbrl_declared_{Path(module_name).stem}", module_name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    return getattr(module, name)


def _function_ref(data: dict, key: str, path: Path) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    module, sep, function = str(value).rpartition(":")
    if not isinstance(value, str) or not sep or not module or not function.isidentifier():
        raise ConfigError(f"{path}: field {key!r} = {value!r}; expected 'module:function' or 'file.py:function'")
    if module.endswith(".py"):
        file = Path(module).expanduser()
        file = file if file.is_absolute() else path.parent / file
        return f"{file.resolve()}:{function}"
    return value
