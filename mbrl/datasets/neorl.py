"""NeoRL and NeoRL-2 `.npz` files: flat arrays of transitions, two ways to mark episodes.

NeoRL-2 (polixir/NeoRL2, the files as released): `obs`, `next_obs`, `action`, `reward`, `done`,
`truncated`; an episode ends at a row where `done` (the environment ended it: no bootstrap) or
`truncated` (cut by the time limit: bootstrap) is set, and the next row starts the next one.

NeoRL (v1, polixir/NeoRL: `obs`, `next_obs`, `action`, `reward`, `done`, `index`, the row where each
episode starts). It has one `done` flag, so an episode that ends without it was cut (a time limit, or the
end of the data): its last row becomes a timeout.

In both, the data's last row ends an episode; without a flag it is a timeout.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from mbrl.datasets import validate
from mbrl.core.errors import DatasetError
from mbrl.core.types import OfflineDataset, Transitions

ROW_KEYS = ("obs", "next_obs", "action", "reward", "done")
EPISODE_KEYS = ("truncated", "index")  # NeoRL-2's, NeoRL's: a file has one of them
REQUIRED_KEYS = ROW_KEYS + ("index",)  # NeoRL v1's layout, as its docs list it


def load_npz(path: Path, task: str | None = None, clip_actions: bool = False, name: str | None = None,
             task_hint: tuple[str | None, str] = (None, "")) -> OfflineDataset:
    """`name`: what the dataset is called (default the file's stem); `task_hint`: a strong hint of its task
    (from a `neorl2:TASK` name) and where it came from."""
    source = str(path)
    arrays = _read(path, source)

    n = validate.check_lengths(source, {key: arrays[key] for key in ROW_KEYS + _episode_key(arrays)})
    obs = validate.as_matrix(source, "obs", arrays["obs"])
    next_obs = validate.as_matrix(source, "next_obs", arrays["next_obs"])
    action = validate.as_matrix(source, "action", arrays["action"])
    reward = validate.as_vector(source, "reward", arrays["reward"])
    ref_scores = _ref_scores(source, arrays)

    task = validate.resolve_task(
        source,
        task,
        obs.shape[1],
        action.shape[1],
        strong_hint=task_hint,
        weak_hint=(validate.task_from_text(path.stem), "the file name"),
        obs_key="obs",
        act_key="action",
    )
    if next_obs.shape[1] != obs.shape[1]:
        raise DatasetError(
            f"{source}: key 'next_obs' has dimension {next_obs.shape[1]}; expected {obs.shape[1]}, "
            f"the dimension of 'obs'"
        )
    for key, array in (("obs", obs), ("next_obs", next_obs), ("action", action), ("reward", reward)):
        validate.check_finite(source, key, array)
    done = validate.as_flags(source, "done", arrays["done"])

    if "truncated" in arrays:
        truncated = validate.as_flags(source, "truncated", arrays["truncated"])
        both = validate.first_true(done & truncated)
        if both is not None:
            raise DatasetError(f"{source}: row {both}: 'done' and 'truncated' are both set; expected at most one "
                               "(an episode either ends or is cut)")
        episode_starts = validate.episode_starts_from_ends(done | truncated)
        timeout = truncated.copy()
        fmt = "neorl2-npz"
    else:
        episode_starts = check_index(source, arrays["index"], n)
        validate.check_episode_ends(source, "done", done, episode_starts)
        episode_last = np.zeros(n, dtype=bool)
        episode_last[episode_starts[1:] - 1] = True
        timeout = episode_last & ~done
        fmt = "neorl-npz"
    timeout[-1] = not done[-1]  # the data's end cuts its last episode

    if ref_scores == (None, None):
        ref_scores = validate.task_ref_scores(task)
    transitions = Transitions.from_arrays(obs, action, reward, next_obs, done, timeout)
    return validate.finish(source=source, name=name or path.stem, fmt=fmt, task=task, transitions=transitions,
                           episode_starts=episode_starts, action_key="action", clip_actions=clip_actions,
                           ref_scores=ref_scores)


def _episode_key(arrays: dict[str, np.ndarray]) -> tuple[str, ...]:
    return ("truncated",) if "truncated" in arrays else ()


def check_index(source: str, index: np.ndarray, n: int) -> np.ndarray:
    """`index` holds episode start rows: integers, starting at 0, strictly increasing, below n."""
    index = np.asarray(index)
    if index.ndim == 2 and index.shape[1] == 1:
        index = index[:, 0]
    if index.ndim != 1 or index.size == 0:
        raise DatasetError(
            f"{source}: key 'index' has shape {index.shape}; expected (E,), the start row of each episode"
        )
    if index.dtype.kind not in "iu":
        whole = index.dtype.kind == "f" and bool(np.all(np.isfinite(index)) and np.all(index == np.round(index)))
        if not whole:
            raise DatasetError(f"{source}: key 'index' has dtype {index.dtype}; expected integer row numbers")
    index = index.astype(np.int64)
    if index[0] != 0:
        raise DatasetError(
            f"{source}: key 'index', position 0: expected 0 (the first episode starts at row 0), found {index[0]}"
        )
    bad = validate.first_true(np.diff(index) <= 0)
    if bad is not None:
        raise DatasetError(
            f"{source}: key 'index', position {bad + 1}: expected start rows in increasing order, "
            f"found {index[bad + 1]} after {index[bad]}"
        )
    if index[-1] >= n:
        raise DatasetError(
            f"{source}: key 'index', position {index.size - 1}: expected a row below {n} (the number of rows), "
            f"found {index[-1]}"
        )
    return index


def _read(path: Path, source: str) -> dict[str, np.ndarray]:
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{source}: not a zip archive; expected a NeoRL .npz (a zip of .npy arrays)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            present = set(archive.files)
            found = ", ".join(sorted(present)) or "nothing"
            for key in ROW_KEYS:
                if key not in present:
                    raise DatasetError(
                        f"{source}: key '{key}' is missing; expected the NeoRL-2 keys {', '.join(ROW_KEYS)}, truncated "
                        f"(or NeoRL's, with index instead of truncated) (found: {found})"
                    )
            episode_key = next((key for key in EPISODE_KEYS if key in present), None)
            if episode_key is None:
                raise DatasetError(
                    f"{source}: neither 'truncated' (NeoRL-2) nor 'index' (NeoRL) is present; expected one of them to "
                    f"mark where episodes end (found: {found})"
                )
            wanted = ROW_KEYS + (episode_key,) + tuple(k for k in ("ref_min_score", "ref_max_score") if k in present)
            arrays = {}
            for key in wanted:
                try:
                    arrays[key] = archive[key]
                except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
                    reason = " ".join(str(exc).split()) or type(exc).__name__
                    raise DatasetError(
                        f"{source}: key '{key}' cannot be read ({reason}); the file may be truncated or corrupt"
                    ) from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DatasetError(
            f"{source}: cannot read the .npz archive ({reason}); it may be truncated or corrupt"
        ) from None
    return arrays


def _ref_scores(source: str, arrays: dict[str, np.ndarray]) -> tuple[float | None, float | None]:
    scores = []
    for key in ("ref_min_score", "ref_max_score"):
        value = arrays.get(key)
        if value is not None and (value.size != 1 or value.dtype.kind not in "iuf"):
            raise DatasetError(
                f"{source}: key '{key}' has shape {value.shape} and dtype {value.dtype}; expected one number"
            )
        scores.append(None if value is None else float(value.reshape(())))
    return scores[0], scores[1]
