"""The one registry of made datasets: their names (`hopper-medium`), Minari ids and place on disk.

A made dataset is a Minari dataset with id `mbrl/<task>/<level>-v0` stored under `$MBRL_DATA_DIR`
(default `~/.mbrl/datasets`), so any Minari tool can read it too. `mbrl.envs.collect` writes them and
`mbrl.datasets` reads them; both name and find them here.
"""

from __future__ import annotations

from pathlib import Path

from mbrl.core.errors import ConfigError, DatasetError
from mbrl.core.files import data_dir
from mbrl.core.types import TASK_SPECS

# D4RL's dataset levels (Fu et al. 2020), in the order a user meets them.
LEVELS: tuple[str, ...] = ("random", "medium", "medium-replay", "expert", "medium-expert")
# The tasks with shipped behaviour policies (envs/behaviour), the only ones `mbrl data make` can make.
TASKS: tuple[str, ...] = tuple(name for name, spec in TASK_SPECS.items() if spec.suite == "mujoco")
NAMESPACE = "mbrl"
VERSION = 0


def dataset_name(task: str, level: str) -> str:
    return f"{task}-{level}"


def all_names() -> list[str]:
    return [dataset_name(task, level) for task in TASKS for level in LEVELS]


def minari_id(task: str, level: str) -> str:
    return f"{NAMESPACE}/{task}/{level}-v{VERSION}"


def parse_name(name: str) -> tuple[str, str] | None:
    """`hopper-medium-replay` -> ("hopper", "medium-replay"); None when `name` is not a dataset name
    (a path, `minari:ID`, a typo): for callers that accept other sources too. See `task_level`."""
    task, _, level = str(name).partition("-")
    if task in TASKS and level in LEVELS:
        return task, level
    return None


def task_level(name: str) -> tuple[str, str]:
    """The (task, level) of a dataset name; a ConfigError naming the known tasks and levels otherwise."""
    parsed = parse_name(name)
    if parsed is None:
        raise ConfigError(
            f"unknown dataset '{name}': expected TASK-LEVEL with TASK one of {', '.join(TASKS)} "
            f"and LEVEL one of {', '.join(LEVELS)} (e.g. hopper-medium)"
        )
    return parsed


def data_path(task: str, level: str, root: Path | None = None) -> Path:
    """The Minari `data` folder of a made dataset under `root` (default `data_dir()`)."""
    return (data_dir() if root is None else Path(root)) / minari_id(task, level) / "data"


def is_made(task: str, level: str, root: Path | None = None) -> bool:
    """A made dataset is there (`mbrl.envs.collect.write_minari` renames a finished one into place)."""
    return (data_path(task, level, root) / "metadata.json").is_file()


def resolve(name: str) -> tuple[str, str]:
    """Check that `name` is a made dataset; return its (task, level). For loaders: the message says
    what other sources look like."""
    parsed = parse_name(name)
    if parsed is None:
        raise DatasetError(
            f"{name}: not a file, not `minari:ID`, and not a known dataset name; expected a path to a "
            f".hdf5 or .npz file, `minari:DATASET_ID`, or TASK-LEVEL with TASK in {', '.join(TASKS)} and "
            f"LEVEL in {', '.join(LEVELS)} (for example hopper-medium)"
        )
    task, level = parsed
    if not is_made(task, level):
        raise DatasetError(
            f"{name}: this dataset is not made yet (looked for Minari dataset {minari_id(task, level)} under "
            f"{data_dir()}); run `mbrl data make {name}` first"
        )
    return parsed
