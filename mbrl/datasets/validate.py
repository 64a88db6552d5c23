"""Checks every dataset passes before anything uses it, and the assembly of an `OfflineDataset`.

Every failure is a `DatasetError` whose one-line message names the source, the key as the file
spells it, the row where it applies, and what was expected versus found. Checks are vectorised
(datasets have millions of rows): the first bad row is the argmax of a mask, never a Python loop.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import numpy as np

from mbrl.core.errors import ConfigError, DatasetError
from mbrl.core.types import TASK_SPECS, DatasetInfo, OfflineDataset, Transitions, find_spec

RowLabel = Callable[[int], str]

# Float32 rounding of a bound such as 1.0 can land a hair outside it; that is not a bad action.
ACTION_TOLERANCE = 1e-5


def row_label(row: int) -> str:
    return f"row {row}"


def episode_row_label(episode_starts: np.ndarray) -> RowLabel:
    """Rows as `episode E, step S`, for formats stored episode by episode (Minari)."""

    def label(row: int) -> str:
        episode = int(np.searchsorted(episode_starts, row, side="right")) - 1
        return f"episode {episode}, step {row - int(episode_starts[episode])}"

    return label


def first_true(mask: np.ndarray) -> int | None:
    """Index of the first True along axis 0 (any True across the other axes), or None."""
    flat = mask.reshape(mask.shape[0], -1).any(axis=1) if mask.ndim > 1 else mask
    if flat.size == 0:
        return None
    row = int(np.argmax(flat))
    return row if flat[row] else None


def check_lengths(source: str, columns: Mapping[str, np.ndarray]) -> int:
    """All columns have the same number of rows, and at least one; returns that number."""
    (first_key, first), *rest = columns.items()
    n = _rows(source, first_key, first)
    for key, array in rest:
        found = _rows(source, key, array)
        if found != n:
            raise DatasetError(
                f"{source}: key '{key}' has {found} rows; expected {n} rows, the length of '{first_key}'"
            )
    if n == 0:
        raise DatasetError(f"{source}: key '{first_key}' has 0 rows; expected at least 1 transition")
    return n


def _rows(source: str, key: str, array: np.ndarray) -> int:
    if array.ndim == 0:
        raise DatasetError(f"{source}: key '{key}' is a scalar; expected an array with one row per transition")
    return int(array.shape[0])


def as_matrix(source: str, key: str, array: np.ndarray) -> np.ndarray:
    """A numeric (N, D) array: observations or actions."""
    _check_numeric(source, key, array)
    if array.ndim != 2:
        raise DatasetError(f"{source}: key '{key}' has shape {array.shape}; expected (N, D), one row per transition")
    return array


def as_vector(source: str, key: str, array: np.ndarray) -> np.ndarray:
    """A numeric (N,) array; (N, 1) is accepted (NeoRL stores rewards and dones that way)."""
    _check_numeric(source, key, array)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise DatasetError(f"{source}: key '{key}' has shape {array.shape}; expected (N,) or (N, 1)")
    return array


def _check_numeric(source: str, key: str, array: np.ndarray) -> None:
    if array.dtype.kind not in "biuf":
        raise DatasetError(f"{source}: key '{key}' has dtype {array.dtype}; expected numbers (float, int or bool)")


FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_finite(source: str, key: str, array: np.ndarray, label: RowLabel = row_label) -> None:
    """No NaN or Inf, also after the cast to float32 (a float64 of 1e300 would become inf)."""
    if array.dtype.kind != "f":
        return
    # `<=` is False for NaN, so one comparison finds NaN, Inf and float32 overflow.
    representable = np.abs(array) <= FLOAT32_MAX
    bad = first_true(~representable)
    if bad is not None:
        values = np.atleast_1d(array[bad])
        found = values[~np.atleast_1d(representable[bad])][0]
        raise DatasetError(f"{source}: key '{key}', {label(bad)}: expected finite float32 values, found {found:g}")


def as_flags(source: str, key: str, array: np.ndarray, label: RowLabel = row_label) -> np.ndarray:
    """Terminals / timeouts: bool, or numbers that are all 0 or 1."""
    array = as_vector(source, key, array)
    if array.dtype.kind != "b":
        bad = first_true((array != 0) & (array != 1))
        if bad is not None:
            raise DatasetError(
                f"{source}: key '{key}', {label(bad)}: expected a boolean (0 or 1), found {array[bad]}"
            )
    return array.astype(bool)


def check_action_range(
    source: str,
    key: str,
    actions: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    label: RowLabel = row_label,
) -> None:
    outside = (actions < low - ACTION_TOLERANCE) | (actions > high + ACTION_TOLERANCE)
    bad = first_true(outside)
    if bad is not None:
        column = int(np.argmax(outside[bad]))
        raise DatasetError(
            f"{source}: key '{key}', {label(bad)}, column {column}: expected an action in "
            f"[{low[column]:g}, {high[column]:g}], found {actions[bad, column]:g} "
            f"(pass --clip-actions / clip_actions=True to clip actions into the action space)"
        )


def check_episode_ends(
    source: str, key: str, flags: np.ndarray, episode_starts: np.ndarray, label: RowLabel = row_label
) -> None:
    """A terminal or timeout must be the last row of its episode."""
    is_last = np.zeros(len(flags), dtype=bool)
    is_last[episode_starts[1:] - 1] = True
    is_last[-1] = True
    bad = first_true(flags & ~is_last)
    if bad is not None:
        raise DatasetError(
            f"{source}: key '{key}', {label(bad)}: the episode ends here but continues to the next row; "
            f"expected terminals and timeouts only on the last row of an episode"
        )


def episode_starts_from_ends(episode_end: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """Rows (after dropping rows where `keep` is False) where episodes begin.

    An episode begins at row 0 and after every row flagged as an episode end. An episode whose rows
    are all dropped disappears.
    """
    begins = np.empty(len(episode_end), dtype=bool)
    begins[0] = True
    begins[1:] = episode_end[:-1]
    episode_of_row = np.cumsum(begins)
    if keep is not None:
        episode_of_row = episode_of_row[keep]
    if len(episode_of_row) == 0:
        return np.zeros(0, dtype=np.int64)
    changes = np.empty(len(episode_of_row), dtype=bool)
    changes[0] = True
    changes[1:] = episode_of_row[1:] != episode_of_row[:-1]
    return np.flatnonzero(changes)


# --- task ---------------------------------------------------------------------------------------


def task_from_text(text: str | None) -> str | None:
    """The one task named in `text` (an env id like Hopper-v5, a file name, a dataset id), else None."""
    if not text:
        return None
    tokens = set(re.split(r"[^a-z0-9]+", str(text).lower()))
    found = [name for name in TASK_SPECS if name.lower() in tokens]
    return found[0] if len(found) == 1 else None


def resolve_task(
    source: str,
    task: str | None,
    obs_dim: int,
    act_dim: int,
    strong_hint: tuple[str | None, str] = (None, ""),
    weak_hint: tuple[str | None, str] = (None, ""),
    obs_key: str = "observations",
    act_key: str = "actions",
) -> str | None:
    """The dataset's task, checked against its dims.

    `task` is the user's choice. A strong hint (a Minari env spec, a file attribute, a made dataset's
    name) must agree with it and with the dims. A weak hint (a word in the file name) is used only
    when the dims match, so a file that merely mentions `ant` does not make the data invalid.
    """
    hinted, hint_origin = strong_hint
    if task is not None:
        if find_spec(task) is None:
            raise ConfigError(f"--task: unknown task '{task}'; expected one of {', '.join(TASK_SPECS)}")
        task = find_spec(task).name
        if hinted is not None and hinted != task:
            raise DatasetError(f"{source}: {hint_origin} says task '{hinted}'; expected '{task}' as given by --task")
        origin = "--task"
    elif hinted is not None:
        task, origin = hinted, hint_origin
    else:
        guess, _ = weak_hint
        spec = TASK_SPECS.get(guess) if guess else None
        if spec is not None and (spec.obs_dim, spec.act_dim) == (obs_dim, act_dim):
            return guess
        return None
    spec = TASK_SPECS[task]
    for key, found, expected in ((obs_key, obs_dim, spec.obs_dim), (act_key, act_dim, spec.act_dim)):
        if found != expected:
            raise DatasetError(
                f"{source}: key '{key}' has dimension {found}; expected {expected} for task '{task}' "
                f"({spec.env_id}, from {origin})"
            )
    return task


# --- assembly -----------------------------------------------------------------------------------


def finish(
    *,
    source: str,
    name: str,
    fmt: str,
    task: str | None,
    transitions: Transitions,
    episode_starts: np.ndarray,
    action_key: str,
    clip_actions: bool,
    action_bounds: tuple[np.ndarray, np.ndarray] | None = None,
    ref_scores: tuple[float | None, float | None] = (None, None),
    label: RowLabel = row_label,
) -> OfflineDataset:
    """Check (or clip) the actions against the action space, and wrap everything up.

    `action_bounds` defaults to the task's action space; with neither, actions are not checked.
    """
    if action_bounds is None and task is not None:
        action_bounds = TASK_SPECS[task].action_bounds()
    if action_bounds is not None:
        low, high = (np.asarray(b, np.float32).reshape(-1) for b in action_bounds)
        if clip_actions:
            transitions = transitions.replace(action=np.clip(transitions.action, low, high))
        else:
            check_action_range(source, action_key, transitions.action, low, high, label)
    ref_min, ref_max = ref_scores
    if ref_min is not None and ref_max is not None:
        if not (np.isfinite(ref_min) and np.isfinite(ref_max) and ref_min != ref_max):
            raise DatasetError(
                f"{source}: metadata 'ref_min_score'/'ref_max_score': expected two different finite numbers, "
                f"found {ref_min} and {ref_max}"
            )
    else:
        ref_min = ref_max = None  # one without the other cannot normalize anything
    info = DatasetInfo(
        name=name,
        source=source,
        format=fmt,
        task=task,
        obs_dim=transitions.obs_dim,
        act_dim=transitions.act_dim,
        action_low=None if action_bounds is None else tuple(float(x) for x in low),
        action_high=None if action_bounds is None else tuple(float(x) for x in high),
        ref_min_score=None if ref_min is None else float(ref_min),
        ref_max_score=None if ref_max is None else float(ref_max),
    )
    return OfflineDataset(transitions=transitions, episode_starts=np.asarray(episode_starts, np.int64), info=info)


def task_ref_scores(task: str | None) -> tuple[float | None, float | None]:
    """The task's own reference scores, for a file that carries none."""
    if task is None:
        return None, None
    spec = TASK_SPECS[task]
    return spec.ref_min_score, spec.ref_max_score
