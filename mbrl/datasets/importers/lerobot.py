"""LeRobot datasets (the v2/v3 parquet layout), read with pyarrow; no `lerobot` dependency.

A folder with `data/chunk-*/*.parquet` (and `meta/info.json`), or a single parquet file. Columns used:
`observation.state` and `action` (a list of floats per frame, or a number), `episode_index`, `frame_index`
(optional: the file's order otherwise) and `next.reward` (optional; else the declared reward function).
`next.done` only marks an episode's last frame in LeRobot, so terminations come from the declared termination
function instead. State-based only: image and video columns are left out (the summary lists them).
Frame k's action and `next.reward` belong to the transition from frame k to frame k+1.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mbrl.core.declaration import Declaration
from mbrl.core.errors import DatasetError
from mbrl.datasets.importers import Imported, episodes_from_rows
from mbrl.datasets.importers.settings import ImportSettings

STATE, ACTION, EPISODE, FRAME, REWARD = "observation.state", "action", "episode_index", "frame_index", "next.reward"


def parquet_columns(path: Path) -> list[str]:
    try:
        return list(pq.read_schema(path).names)
    except Exception as exc:  # noqa: BLE001 - not parquet, or a damaged file
        raise DatasetError(f"{path}: cannot read the parquet file ({_reason(exc)}); "
                           f"it may be truncated or corrupt") from None


def read_lerobot(path: Path, decl: Declaration, settings: ImportSettings) -> Imported:
    files, skipped = _files(path, decl)
    parts, lengths = {k: [] for k in (STATE, ACTION, EPISODE, FRAME, REWARD)}, []
    for file in files:
        names = parquet_columns(file)
        for required in (STATE, ACTION, EPISODE):
            if required not in names:
                raise DatasetError(f"{file}: no column '{required}'; expected LeRobot's columns {STATE}, {ACTION}, "
                                   f"{EPISODE} (found {', '.join(names)})")
        wanted = [c for c in (STATE, ACTION, EPISODE, FRAME, REWARD) if c in names]
        skipped.update(n for n in names if n.startswith("observation.") and n != STATE)
        try:
            table = pq.read_table(file, columns=wanted)
        except Exception as exc:  # noqa: BLE001 - a damaged file
            raise DatasetError(f"{file}: cannot read the parquet file ({_reason(exc)}); "
                               f"it may be truncated or corrupt") from None
        lengths.append(table.num_rows)
        parts[STATE].append(_matrix(file, table, STATE, decl.obs_dim, "[[observation]]", pa))
        parts[ACTION].append(_matrix(file, table, ACTION, decl.act_dim, "[[action]]", pa))
        parts[EPISODE].append(_integers(file, table, EPISODE))
        parts[FRAME].append(_integers(file, table, FRAME) if FRAME in wanted else None)
        parts[REWARD].append(_matrix(file, table, REWARD, 1, "", pa)[:, 0] if REWARD in wanted else None)
    for key in (FRAME, REWARD):
        present = [p is not None for p in parts[key]]
        if any(present) and not all(present):
            missing = files[present.index(False)]
            raise DatasetError(f"{missing}: no column '{key}', which the dataset's other files have; "
                               f"expected it in every file")
    notes = [f"left out (state-based import): {', '.join(sorted(skipped))}"] if skipped else []

    offsets = np.cumsum([0, *lengths])
    obs, act = np.concatenate(parts[STATE]), np.concatenate(parts[ACTION])
    episode = np.concatenate(parts[EPISODE])
    frame = np.concatenate(parts[FRAME]) if parts[FRAME][0] is not None else None
    rewards = np.concatenate(parts[REWARD]) if parts[REWARD][0] is not None else None
    rows = np.arange(len(obs), dtype=np.int64)
    order = np.lexsort((rows if frame is None else frame, episode))
    new_episode = np.concatenate([[True], episode[order][1:] != episode[order][:-1]])
    gaps = np.zeros(len(order), bool)
    if frame is not None:
        step = np.diff(frame[order], prepend=frame[order][:1] - 1)
        duplicate = np.flatnonzero((step == 0) & ~new_episode)
        if duplicate.size:
            row = int(order[duplicate[0]])
            raise DatasetError(f"{_locate(files, offsets, row)}: episode {episode[row]} has frame_index {frame[row]} "
                               f"twice; expected each frame once")
        gaps = (step != 1) & ~new_episode  # missing frames: the episode is cut there
    episodes, counts = episodes_from_rows(obs[order], act[order], new_episode | gaps,
                                          None if rewards is None else rewards[order], order)
    counts["gaps"] = int(gaps.sum())
    return Imported(source=str(path), format="lerobot", episodes=episodes, counts=counts,
                    locate=lambda row: _locate(files, offsets, int(row)), notes=notes)


def _files(path: Path, decl: Declaration) -> tuple[list[Path], set[str]]:
    """The parquet files in order, and the image and video features that meta/info.json names."""
    if path.is_file():
        return [path], set()
    data = path / "data"
    files = sorted(data.rglob("*.parquet")) if data.is_dir() else []
    if not files:
        raise DatasetError(f"{path}: no parquet files under data/; expected LeRobot's layout "
                           f"data/chunk-000/episode_000000.parquet (v2) or data/chunk-000/file-000.parquet (v3)")
    info_path = path / "meta" / "info.json"
    if info_path.is_file():
        try:
            info = json.loads(info_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{info_path}: not valid JSON ({exc})") from None
        fps = info.get("fps") if isinstance(info, dict) else None
        if isinstance(fps, (int, float)) and not isinstance(fps, bool) and abs(fps - decl.control_hz) > 1e-6 * fps:
            raise DatasetError(f"{info_path}: fps = {fps:g}; expected the declaration's control_hz = "
                               f"{decl.control_hz:g} ({decl.path})")
        features = info.get("features") if isinstance(info, dict) else None
        features = features if isinstance(features, dict) else {}
        return files, {k for k, v in features.items() if isinstance(v, dict) and v.get("dtype") in ("image", "video")}
    return files, set()


def _matrix(file: Path, table, name: str, width: int, declared: str, pa) -> np.ndarray:
    """A column of lists (or numbers) as a float64 (rows, width) matrix; a DatasetError naming the row otherwise."""
    column = table.column(name).combine_chunks()
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise DatasetError(f"{file}: column '{name}', row {row} is empty; expected {width} numbers")
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        counts = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero(counts != width)
        if wrong.size:
            row = int(wrong[0])
            raise DatasetError(f"{file}: column '{name}', row {row} has {counts[row]} values; expected {width}"
                               + (f" (one per {declared} table of the declaration)" if declared else ""))
        values = column.flatten()
    elif width == 1:
        values = column
    else:
        raise DatasetError(f"{file}: column '{name}' holds {kind}; expected a list of {width} numbers per row")
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type) or pa.types.is_boolean(values.type)):
        raise DatasetError(f"{file}: column '{name}' holds {values.type}; expected numbers")
    return values.to_numpy(zero_copy_only=False).astype(np.float64).reshape(-1, width)


def _integers(file: Path, table, name: str) -> np.ndarray:
    column = table.column(name).combine_chunks()
    if column.null_count or not (column.type.id in _integer_ids()):
        empty = " with empty rows" if column.null_count else ""
        raise DatasetError(f"{file}: column '{name}' holds {column.type}{empty}; expected integers")
    return column.to_numpy(zero_copy_only=False).astype(np.int64)


def _integer_ids() -> set:
    return {pa.int8().id, pa.int16().id, pa.int32().id, pa.int64().id,
            pa.uint8().id, pa.uint16().id, pa.uint32().id, pa.uint64().id}


def _locate(files: list[Path], offsets: np.ndarray, row: int) -> str:
    index = int(np.searchsorted(offsets, row, "right") - 1)
    return f"{files[index]}, row {row - offsets[index]}" if len(files) > 1 else f"{files[0]}, row {row}"


def _reason(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = ["read_lerobot", "parquet_columns", "STATE"]
