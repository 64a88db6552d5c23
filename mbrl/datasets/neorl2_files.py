"""NeoRL-2's released files by name, and the `-val` file beside a train file as its held-out data.

Users download the files from NeoRL-2's release (polixir/NeoRL2, `benchmark/download_dataset.py`; the
files `TASK-train.npz` and `TASK-val.npz`) into `$MBRL_DATA_DIR/neorl2/`; nothing downloads at run time.
`neorl2:DMSD` reads the train file, `neorl2:DMSD-val` the val file. A file name may also carry the level and
size between the task and the split, as the benchmark's scripts write them (`DMSD-high-100000-train.npz`).
"""

from __future__ import annotations

from pathlib import Path

from mbrl.core import dataset_registry
from mbrl.core.errors import DatasetError
from mbrl.core.types import TASK_SPECS, OfflineDataset, find_spec
from mbrl.datasets.neorl import load_npz

SPLITS = ("train", "val")


def neorl2_dir() -> Path:
    """Where `neorl2:` names are looked up: `$MBRL_DATA_DIR/neorl2/`."""
    return dataset_registry.data_dir() / "neorl2"


def neorl2_tasks() -> list[str]:
    return [name for name, spec in TASK_SPECS.items() if spec.suite == "neorl2"]


def split_files(folder: Path, task: str, split: str) -> list[Path]:
    """Files of `task`'s `split` in `folder`: TASK-SPLIT.npz or TASK-*-SPLIT.npz, the task's case ignored."""
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.npz")):
        head, _, rest = path.stem.partition("-")
        if head.lower() == task.lower() and (rest == split or rest.endswith(f"-{split}")):
            found.append(path)
    return found


def find(name: str) -> tuple[Path, str]:
    """The file a `neorl2:` name reads, and its task."""
    task_text, _, split = name.partition("-")
    split = split or "train"
    spec = find_spec(task_text)
    if spec is None or spec.suite != "neorl2" or split not in SPLITS:
        raise DatasetError(f"neorl2:{name}: unknown NeoRL-2 dataset; expected neorl2:TASK or neorl2:TASK-val with TASK "
                           f"one of {', '.join(neorl2_tasks())}")
    folder = neorl2_dir()
    files = split_files(folder, spec.name, split)
    if not files:
        raise DatasetError(f"neorl2:{name}: no file {spec.name}-{split}.npz (or {spec.name}-*-{split}.npz) in {folder}; "
                           f"download NeoRL-2's released {spec.name}-{split}.npz there (see the README)")
    if len(files) > 1:
        raise DatasetError(f"neorl2:{name}: {len(files)} files match in {folder} ({', '.join(p.name for p in files)}); "
                           "expected one")
    return files[0], spec.name


def val_beside(path: Path) -> Path | None:
    """The one `-val` file beside a `-train` file of the same task, else None."""
    head, _, rest = path.stem.partition("-")
    if not (rest == "train" or rest.endswith("-train")):
        return None
    candidates = split_files(path.parent, head, "val")
    return candidates[0] if len(candidates) == 1 else None


def load_with_heldout(path: Path, task: str | None = None, clip_actions: bool = False, name: str | None = None,
                      task_hint: tuple[str | None, str] = (None, "")) -> OfflineDataset:
    """Read a NeoRL(-2) file; a `-val` file beside a `-train` one becomes its `heldout`, read for the same task."""
    dataset = load_npz(path, task=task, clip_actions=clip_actions, name=name, task_hint=task_hint)
    val_path = val_beside(path)
    if val_path is None:
        return dataset
    heldout = load_npz(val_path, task=dataset.info.task, clip_actions=clip_actions,
                       task_hint=task_hint if dataset.info.task is None else (None, ""))
    if (heldout.transitions.obs_dim, heldout.transitions.act_dim) != (dataset.transitions.obs_dim, dataset.transitions.act_dim):
        raise DatasetError(f"{val_path}: obs/action dims {heldout.transitions.obs_dim}/{heldout.transitions.act_dim} differ "
                           f"from those of {path} ({dataset.transitions.obs_dim}/{dataset.transitions.act_dim}); "
                           "expected the val file of the same task")
    dataset.heldout = heldout
    return dataset


def load_named(name: str, task: str | None = None, clip_actions: bool = False) -> OfflineDataset:
    path, task_name = find(name)
    return load_with_heldout(path, task=task, clip_actions=clip_actions, name=f"neorl2:{name}",
                             task_hint=(task_name, f"the name neorl2:{name}"))
