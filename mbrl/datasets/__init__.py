"""Datasets: read D4RL `.hdf5`, NeoRL `.npz`, local Minari datasets and made datasets, validated.

    from mbrl.datasets import load
    dataset = load("hopper-medium")                      # made by `mbrl data make hopper-medium`
    dataset = load("walker2d-medium-v2.hdf5")            # D4RL layout
    dataset = load("minari:mujoco/hopper/expert-v0")     # a local Minari dataset (never downloaded)
    dataset = load("HalfCheetah-v3-L-1000.npz", task="halfcheetah")  # NeoRL layout
    dataset = load("neorl2:DMSD")                        # NeoRL-2's released file, under $MBRL_DATA_DIR/neorl2/

A lower module: it imports only `mbrl.core`, never envs, world models or agents. Names of made datasets
are the one registry's, `mbrl.core.dataset_registry` (also reachable as `mbrl.datasets.registry`).
"""

from __future__ import annotations

from pathlib import Path

from mbrl.core import change
from mbrl.core import dataset_registry as registry
from mbrl.core.errors import DatasetError
from mbrl.core.types import OfflineDataset
from mbrl.datasets import minari_io, neorl2_files
from mbrl.datasets.d4rl import load_hdf5
from mbrl.datasets.minari_io import load_made, load_minari_id

MINARI_PREFIX = "minari:"
NEORL2_PREFIX = "neorl2:"
HDF5_SUFFIXES = (".hdf5", ".h5")
NPZ_SUFFIXES = (".npz",)
FORMATS = {"d4rl-hdf5": "D4RL-layout .hdf5", "neorl-npz": "NeoRL-layout .npz", "neorl2-npz": "NeoRL-2-layout .npz",
           "minari": "Minari dataset"}

# A tiny real Hopper-v5 dataset (random policy) shipped with the package: scripts/make_sample.py.
SAMPLE_PATH = Path(__file__).parent / "samples" / "hopper-sample.hdf5"


def load(source: str | Path, task: str | None = None, clip_actions: bool = False) -> OfflineDataset:
    """Read and validate a dataset; every problem with it is a `DatasetError` naming file, key and row.

    `source`: a path to a `.hdf5` (D4RL layout) or `.npz` (NeoRL or NeoRL-2 layout) file, a Minari dataset
    folder, `minari:DATASET_ID` (under `$MINARI_DATASETS_PATH`), `neorl2:TASK` or `neorl2:TASK-val` (NeoRL-2's
    released train or val file under `$MBRL_DATA_DIR/neorl2/`), or the name of a made dataset such as
    `hopper-medium` (under `$MBRL_DATA_DIR`). `task` (a key of `mbrl.core.types.TASK_SPECS`) checks the
    dims and supplies the action space; without it the task is inferred where that is unambiguous.
    Actions outside the action space are refused unless `clip_actions`. A NeoRL-2 train file with its `-val`
    file beside it gets that file as `heldout`. Any source followed by `+change` is read with each row's
    observation followed by its change since the row before, for the task `<task>+change` (`mbrl.core.change`).
    """
    text = str(source)
    base = change.base_name(text)
    if base is not None:  # `<dataset>+change`: each row's observation with its change since the row before
        base_task = None if task is None else (change.base_name(task) or task)
        return change.with_change(load(base, task=base_task, clip_actions=clip_actions))
    if text.startswith(NEORL2_PREFIX):
        return neorl2_files.load_named(text[len(NEORL2_PREFIX):], task=task, clip_actions=clip_actions)
    if text.startswith(MINARI_PREFIX):
        return load_minari_id(text[len(MINARI_PREFIX) :], task=task, clip_actions=clip_actions)

    path = Path(text).expanduser()
    if path.is_dir():
        if minari_io.is_dataset_directory(path):
            return minari_io.load_directory(path, task=task, clip_actions=clip_actions)
        raise DatasetError(
            f"{text}: is a directory; expected a .hdf5 or .npz file, a Minari dataset folder, or minari:DATASET_ID"
        )
    if not path.exists():
        if isinstance(source, str) and registry.parse_name(text) is not None:
            return load_made(text, task=task, clip_actions=clip_actions)
        if _looks_like_path(text):
            raise DatasetError(f"{text}: no such file")
        registry.resolve(text)  # raises: an unknown name, with what names look like

    suffix = path.suffix.lower()
    if suffix in HDF5_SUFFIXES:
        return load_hdf5(path, task=task, clip_actions=clip_actions)
    if suffix in NPZ_SUFFIXES:
        return neorl2_files.load_with_heldout(path, task=task, clip_actions=clip_actions)
    raise DatasetError(
        f"{text}: unknown file type '{path.suffix or '(none)'}'; "
        f"expected .hdf5/.h5 (D4RL layout) or .npz (NeoRL layout)"
    )


def _looks_like_path(text: str) -> bool:
    # Made-dataset names never hold a dot or a slash.
    return any(ch in text for ch in "/\\.")


__all__ = ["load", "SAMPLE_PATH", "FORMATS", "registry"]
