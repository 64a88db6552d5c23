"""The `[import]` table of a robot's declaration: how `mbrl data import` reads that robot's logs.

    [import]
    max_age_s = 0.04          # a tick may hold a message at most this old (default: 2 control periods)
    phase_s = 0.005           # ticks sit this long after the first moment every observation and
                              # action channel has a message (default: a quarter period)
    episode_gap_s = 0.1       # no observation message for longer than this ends an episode (default: 5 periods)
    episode_topic = "/reset"  # ROS 2 bags: each message on it starts a new episode (optional)
    reward_topic = "/reward"  # ROS 2 bags: the reward, instead of the declared reward function (optional) ...
    reward_field = "data"     # ... and its field path
    episode_column = "episode"  # tables: the episode column (default "episode"; without it, one episode)
    reward_column = "reward"    # tables: the reward column (optional)
"""

from __future__ import annotations

import dataclasses
import math
import re

from mbrl.core.declaration import Declaration
from mbrl.core.errors import ConfigError

_NUMBERS = ("max_age_s", "phase_s", "episode_gap_s")
_STRINGS = ("episode_topic", "reward_topic", "reward_field", "episode_column", "reward_column")
KEYS = _NUMBERS + _STRINGS

# A field path into a message: a name, then `.name` or `[index]` steps ("position[0]", "linear.x").
_FIELD_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[\d+\])*")
_STEP = re.compile(r"\.?([A-Za-z_]\w*)|\[(\d+)\]")


@dataclasses.dataclass(frozen=True)
class ImportSettings:
    period_s: float
    max_age_s: float
    phase_s: float
    episode_gap_s: float
    episode_topic: str | None = None
    reward_topic: str | None = None
    reward_field: str | None = None
    episode_column: str = "episode"
    episode_column_given: bool = False  # a missing column is an error only when the user named it
    reward_column: str | None = None


def import_settings(decl: Declaration) -> ImportSettings:
    """The declaration's `[import]` table, checked; a ConfigError naming the file and the key otherwise."""
    where = f"{decl.path}: [import]"
    table = dict(decl.import_settings)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected some of {', '.join(KEYS)}")
    period = 1.0 / decl.control_hz
    defaults = {"max_age_s": 2 * period, "phase_s": period / 4, "episode_gap_s": 5 * period}
    numbers = {}
    for key in _NUMBERS:
        value = table.get(key, defaults[key])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}: {key} = {value!r}; expected a number of seconds >= 0")
        numbers[key] = float(value)
    if numbers["max_age_s"] <= 0 or numbers["episode_gap_s"] <= 0:
        key = "max_age_s" if numbers["max_age_s"] <= 0 else "episode_gap_s"
        raise ConfigError(f"{where}: {key} = {numbers[key]}; expected a positive number of seconds")
    if numbers["phase_s"] >= period:
        raise ConfigError(f"{where}: phase_s = {numbers['phase_s']}; expected less than one control period "
                          f"({period:g} s at control_hz = {decl.control_hz:g})")
    strings = {}
    for key in _STRINGS:
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{where}: {key} = {value!r}; expected a non-empty string")
        strings[key] = value
    if (strings["reward_topic"] is None) != (strings["reward_field"] is None):
        raise ConfigError(f"{where}: give 'reward_topic' and 'reward_field' together")
    if strings["reward_field"] is not None:
        parse_field_path(strings["reward_field"], f"{where} reward_field")
    for channel in decl.observations + decl.actions:
        if channel.field is not None:
            parse_field_path(channel.field, f"{decl.path}: channel {channel.name!r} field")
    return ImportSettings(
        period_s=period, **numbers, episode_topic=strings["episode_topic"], reward_topic=strings["reward_topic"],
        reward_field=strings["reward_field"], episode_column=strings["episode_column"] or "episode",
        episode_column_given=strings["episode_column"] is not None, reward_column=strings["reward_column"])


def parse_field_path(path: str, where: str) -> tuple[str | int, ...]:
    """`"position[0]"` -> ("position", 0); `"linear.x"` -> ("linear", "x")."""
    if not _FIELD_PATH.fullmatch(path):
        raise ConfigError(f"{where} = {path!r}; expected a field path such as 'position[0]', 'data[1]' or 'linear.x'")
    return tuple(name if name else int(index) for name, index in _STEP.findall(path))
