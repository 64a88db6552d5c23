"""`mbrl data info SOURCE` and `mbrl data list`: look at datasets before training on them."""

from __future__ import annotations

import dataclasses
import json
import warnings

from typing import Annotated

import numpy as np
import tyro
from rich.console import Console
from rich.table import Table

from mbrl.core import dataset_registry as registry
from mbrl.datasets import FORMATS, SAMPLE_PATH, load, neorl2_files
from mbrl.datasets.minari_io import minari_root


@dataclasses.dataclass(frozen=True)
class InfoArgs:
    source: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="SOURCE")]
    """A .hdf5 (D4RL layout) or .npz (NeoRL / NeoRL-2 layout) file, minari:DATASET_ID, neorl2:TASK, or a made
    dataset such as hopper-medium."""
    task: Annotated[str | None, tyro.conf.arg(metavar="TASK")] = None
    """The task the data comes from (a name of `mbrl data list`'s tasks); checks its dims and action space."""
    clip_actions: bool = False
    """Clip actions into the action space instead of refusing actions outside it."""


@dataclasses.dataclass(frozen=True)
class ListArgs:
    """No options: lists the known dataset names and the local Minari datasets."""


def info(args: InfoArgs) -> int:
    """Validate a dataset and print a summary of it."""
    dataset = load(args.source, task=args.task, clip_actions=args.clip_actions)
    meta = dataset.info
    returns = dataset.episode_returns()
    lengths = dataset.episode_lengths()
    transitions = dataset.transitions

    table = Table(title=f"dataset {meta.name}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("source", meta.source)
    table.add_row("format", FORMATS.get(meta.format, meta.format))
    table.add_row("task", meta.task or "unknown (pass --task to check dims and action space)")
    table.add_row("transitions", f"{len(dataset):,}")
    table.add_row("episodes", f"{dataset.num_episodes:,}")
    table.add_row("obs dim", str(meta.obs_dim))
    table.add_row("action dim", str(meta.act_dim))
    table.add_row("action space", _bounds(meta.action_low, meta.action_high))
    table.add_row("terminals", f"{int(transitions.terminal.sum()):,}")
    table.add_row("timeouts", f"{int(transitions.timeout.sum()):,}")
    table.add_row("episode length", _stats(lengths, "{:.0f}"))
    table.add_row("episode return", _stats(returns, "{:.2f}"))
    normalized = meta.normalized_score(returns)
    if normalized is None:
        table.add_row("normalized score", "unknown (no reference scores for this dataset)")
    else:
        table.add_row("normalized score", _stats(normalized, "{:.2f}"))
        table.add_row("reference scores", f"min {meta.ref_min_score:g}, max {meta.ref_max_score:g}")
    if dataset.heldout is not None:
        held = dataset.heldout
        table.add_row("held-out data", f"{held.info.source}: {len(held):,} transitions, {held.num_episodes:,} episodes")
    Console(highlight=False).print(table)
    return 0


def list_datasets(args: ListArgs) -> int:
    """Print the known dataset names (which are made locally) and other local Minari datasets."""
    console = Console(highlight=False)
    made = Table(title=f"made datasets (TASK-LEVEL) in {registry.data_dir()}", title_justify="left")
    made.add_column("task", style="bold")
    for level in registry.LEVELS:
        made.add_column(level)
    for task in registry.TASKS:
        made.add_row(task, *(_made_cell(task, level) for level in registry.LEVELS))
    console.print(made)
    console.print("make one with `mbrl data make TASK-LEVEL` (for example `mbrl data make hopper-medium`)")

    console.print()
    neorl2 = Table(title=f"NeoRL-2 datasets (neorl2:TASK) in {neorl2_files.neorl2_dir()}", title_justify="left")
    for column in ("task", "train", "val"):
        neorl2.add_column(column, style="bold" if column == "task" else None)
    for task in neorl2_files.neorl2_tasks():
        cells = []
        for split in neorl2_files.SPLITS:
            files = neorl2_files.split_files(neorl2_files.neorl2_dir(), task, split)
            cells.append(", ".join(p.name for p in files) or "-")
        neorl2.add_row(task, *cells)
    console.print(neorl2)
    console.print("download NeoRL-2's released TASK-train.npz and TASK-val.npz files there (see the README)")

    others = _other_minari_datasets()
    console.print()
    if others:
        table = Table(title=f"other local Minari datasets in {minari_root()}", title_justify="left")
        for column in ("source", "env", "episodes", "transitions"):
            table.add_column(column)
        for dataset_id, meta in others.items():
            episodes, steps = meta.get("total_episodes"), meta.get("total_steps")
            table.add_row(f"minari:{dataset_id}", _env_id(meta), _count(episodes), _count(steps))
        console.print(table)
    else:
        console.print(f"no other local Minari datasets in {minari_root()} (MINARI_DATASETS_PATH)")
    console.print(f"shipped sample: {SAMPLE_PATH}")
    return 0


def _made_cell(task: str, level: str) -> str:
    if not registry.is_made(task, level):
        return "-"
    try:
        steps = json.loads((registry.data_path(task, level) / "metadata.json").read_text()).get("total_steps")
    except (OSError, ValueError):
        return "made (unreadable metadata)"
    return f"made ({_count(steps)})" if steps is not None else "made"


def _other_minari_datasets() -> dict[str, dict]:
    root = minari_root()
    if not root.is_dir():  # listing must not create Minari's folder
        return {}
    import minari  # lazy: importing minari here adds 0.08 s to every `mbrl data ... --help` (measured)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a misconfigured folder is skipped, not shouted about
        found = minari.list_local_datasets()
    if root.resolve() == registry.data_dir().resolve():
        made_ids = {registry.minari_id(t, lv) for t in registry.TASKS for lv in registry.LEVELS}
        found = {k: v for k, v in found.items() if k not in made_ids}
    return found


def _env_id(meta: dict) -> str:
    spec = meta.get("env_spec")
    try:
        return json.loads(spec)["id"] if isinstance(spec, str) else "-"
    except (ValueError, KeyError, TypeError):
        return "-"


def _count(value) -> str:
    return f"{int(value):,}" if isinstance(value, (int, float, np.integer)) else "?"


def _stats(values: np.ndarray, fmt: str) -> str:
    values = np.asarray(values, dtype=np.float64)
    return f"mean {fmt.format(values.mean())}, min {fmt.format(values.min())}, max {fmt.format(values.max())}"


def _bounds(low, high) -> str:
    if low is None or high is None:
        return "unknown"
    if len(set(low)) == 1 and len(set(high)) == 1:
        return f"[{low[0]:g}, {high[0]:g}] per dimension"
    return ", ".join(f"[{lo:g}, {hi:g}]" for lo, hi in zip(low, high))
