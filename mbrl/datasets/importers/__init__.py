"""Importers: a robot's own logs (ROS 2 bags, LeRobot parquet datasets, CSV/Parquet tables) as episodes.

    from mbrl.datasets import importers
    imported = importers.read("run.bag", declaration)   # declaration: mbrl.core.declaration.read_declaration(...)

Each importer turns its source into `Episode`s of T+1 observations and T actions, in the declaration's channel
order, with the rewards the log itself carries (a reward topic or column, LeRobot's `next.reward`) or None.
Rewards from the declared reward function, terminations, bounds and the Minari file are the command's
(`mbrl.commands.data_import`): this package imports nothing above `mbrl.core`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mbrl.core.declaration import Declaration
from mbrl.core.errors import ConfigError, DatasetError
from mbrl.datasets.importers.settings import ImportSettings, import_settings

FORMATS = ("ros2", "lerobot", "table")
TABLE_SUFFIXES = (".csv", ".parquet")
BAG_SUFFIXES = (".db3", ".mcap")
# What `mbrl data import` counts; every importer fills each of them.
COUNTS = ("ticks", "kept_ticks", "stale_ticks", "stale_cuts", "short_dropped", "gaps", "markers")


@dataclasses.dataclass
class Episode:
    """One episode as read: float64 arrays in the declaration's channel order."""

    observations: np.ndarray  # (T+1, obs_dim)
    actions: np.ndarray  # (T, act_dim): the action at each tick but the last
    rewards: np.ndarray | None  # (T,): from the log, else None (the declared reward function's)
    origins: np.ndarray  # (T+1,) int64: where each tick came from (a row, or a bag time in ns); see `locate`


@dataclasses.dataclass
class Imported:
    source: str
    format: str
    episodes: list[Episode]
    counts: dict[str, int]  # the keys of COUNTS
    locate: Callable[[int], str]  # an origin -> where it is in the source ("bag time 12.340 s", "line 17")
    notes: list[str] = dataclasses.field(default_factory=list)  # what was left out, for the summary


def detect_format(path: Path) -> str:
    """ros2 (a rosbag2 folder or its .db3/.mcap file), lerobot (a folder with data/, or a parquet file with an
    `observation.state` column), or table (.csv, other .parquet)."""
    if path.is_dir():
        if (path / "metadata.yaml").is_file():
            return "ros2"
        if (path / "data").is_dir() or (path / "meta" / "info.json").is_file():
            return "lerobot"
        raise DatasetError(f"{path}: a folder that is neither a ROS 2 bag (no metadata.yaml) nor a LeRobot dataset "
                           f"(no data/ folder); pass --format to say which it is")
    suffix = path.suffix.lower()
    if suffix in BAG_SUFFIXES:
        return "ros2"
    if suffix == ".csv":
        return "table"
    if suffix == ".parquet":
        from mbrl.datasets.importers import lerobot  # local: lerobot imports this package

        return "lerobot" if lerobot.STATE in lerobot.parquet_columns(path) else "table"
    raise DatasetError(f"{path}: unknown kind of log '{path.suffix or '(no suffix)'}'; expected a ROS 2 bag folder, "
                       f"a LeRobot dataset folder, or a .csv/.parquet table")


def read(source: str | Path, decl: Declaration, fmt: str = "auto") -> Imported:
    """Read `source` as `fmt` (auto: `detect_format`) against the declaration; a DatasetError or ConfigError
    naming the file, topic, column or field otherwise."""
    path = Path(source).expanduser()
    if not path.exists():
        raise DatasetError(f"{source}: no such file or folder")
    settings = import_settings(decl)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "ros2":
        from mbrl.datasets.importers import ros2  # local: ros2 imports this package

        return ros2.read_bag(path, decl, settings)
    if fmt == "lerobot":
        from mbrl.datasets.importers import lerobot  # local: lerobot imports this package

        return lerobot.read_lerobot(path, decl, settings)
    if fmt == "table":
        from mbrl.datasets.importers import table  # local: table imports this package

        return table.read_table(path, decl, settings)
    raise ConfigError(f"--format {fmt!r}; expected auto or one of {', '.join(FORMATS)}")


def episodes_from_rows(
    obs: np.ndarray, act: np.ndarray, starts: np.ndarray, rewards: np.ndarray | None, origins: np.ndarray
) -> tuple[list[Episode], dict[str, int]]:
    """Rows in order, one per tick; `starts[i]` is True where row i begins a new episode. Row k's action and
    reward belong to the transition from row k to row k+1, so an episode's last row gives only an observation,
    and an episode of one row gives nothing (counted as short_dropped)."""
    n = len(obs)
    bounds = np.append(np.flatnonzero(starts), n) if n else np.zeros(1, np.int64)
    if n and not starts[0]:
        bounds = np.concatenate([[0], bounds])
    episodes, short = [], 0
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b - a < 2:
            short += int(b - a)
            continue
        episodes.append(Episode(observations=obs[a:b], actions=act[a:b - 1],
                                rewards=None if rewards is None else rewards[a:b - 1], origins=origins[a:b]))
    counts = dict.fromkeys(COUNTS, 0)
    counts.update(ticks=n, kept_ticks=n - short, short_dropped=short)
    return episodes, counts


__all__ = ["read", "detect_format", "Episode", "Imported", "ImportSettings", "import_settings", "FORMATS", "COUNTS"]
