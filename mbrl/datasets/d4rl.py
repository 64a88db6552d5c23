"""D4RL-layout `.hdf5` files: flat arrays of one row per step, episodes cut by terminals | timeouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mbrl.datasets import validate
from mbrl.core.errors import DatasetError
from mbrl.core.types import OfflineDataset, Transitions

REQUIRED_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts")
NEXT_OBS_KEY = "next_observations"
# File attributes that may name the environment (ours write `task`; others use an env id).
TASK_ATTRS = ("task", "env_id", "env_name", "env")


def load_hdf5(path: Path, task: str | None = None, clip_actions: bool = False) -> OfflineDataset:
    source = str(path)
    arrays, attrs = _read(path, source)

    validate.check_lengths(source, arrays)
    obs = validate.as_matrix(source, "observations", arrays["observations"])
    actions = validate.as_matrix(source, "actions", arrays["actions"])
    rewards = validate.as_vector(source, "rewards", arrays["rewards"])
    next_obs = arrays.get(NEXT_OBS_KEY)
    if next_obs is not None:
        next_obs = validate.as_matrix(source, NEXT_OBS_KEY, next_obs)

    task = validate.resolve_task(
        source,
        task,
        obs.shape[1],
        actions.shape[1],
        strong_hint=_task_from_attrs(attrs),
        weak_hint=(validate.task_from_text(path.stem), "the file name"),
    )
    if next_obs is not None and next_obs.shape[1] != obs.shape[1]:
        raise DatasetError(
            f"{source}: key '{NEXT_OBS_KEY}' has dimension {next_obs.shape[1]}; "
            f"expected {obs.shape[1]}, the dimension of 'observations'"
        )

    for key, array in (("observations", obs), ("actions", actions), ("rewards", rewards), (NEXT_OBS_KEY, next_obs)):
        if array is not None:
            validate.check_finite(source, key, array)
    terminals = validate.as_flags(source, "terminals", arrays["terminals"])
    timeouts = validate.as_flags(source, "timeouts", arrays["timeouts"])
    episode_end = terminals | timeouts

    if next_obs is None:
        keep, next_obs = rebuild_next_observations(obs, timeouts)
        if not keep.any():
            raise DatasetError(
                f"{source}: key '{NEXT_OBS_KEY}' is missing and no step has a known next observation "
                f"(the last step and timed-out steps are dropped); expected at least 1 transition"
            )
        transitions = Transitions.from_arrays(
            obs[keep], actions[keep], rewards[keep], next_obs, terminals[keep], timeouts[keep]
        )
        episode_starts = validate.episode_starts_from_ends(episode_end, keep)
    else:
        transitions = Transitions.from_arrays(obs, actions, rewards, next_obs, terminals, timeouts)
        episode_starts = validate.episode_starts_from_ends(episode_end)

    ref_scores = _ref_scores_from_attrs(source, attrs)
    if ref_scores == (None, None):
        ref_scores = validate.task_ref_scores(task)
    return validate.finish(source=source, name=path.stem, fmt="d4rl-hdf5", task=task, transitions=transitions,
                           episode_starts=episode_starts, action_key="actions", clip_actions=clip_actions,
                           ref_scores=ref_scores)


def rebuild_next_observations(obs: np.ndarray, timeouts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Next observations from the following row, as D4RL's `qlearning_dataset` does.

    Returns (keep, next_obs[keep]). The next observation of a timed-out step, and of the file's last
    step, is not in the file, so those steps are dropped. A terminal step keeps the following row as
    its next observation, like D4RL (that row starts the next episode; `terminal` stops bootstrapping).
    """
    keep = ~timeouts
    keep[-1] = False
    following = np.empty_like(obs)
    following[:-1] = obs[1:]
    following[-1] = obs[-1]
    return keep, following[keep]


def _read(path: Path, source: str) -> tuple[dict[str, np.ndarray], dict]:
    import h5py  # lazy: h5py at the top adds 0.06 s to `mbrl data info --help` (mbrl.datasets imports this) (measured)

    try:
        file = h5py.File(path, "r")
    except OSError as exc:
        raise DatasetError(
            f"{source}: not a readable HDF5 file ({_reason(exc)}); expected a D4RL-layout .hdf5"
        ) from None
    with file:
        try:
            present = set(file.keys())
        except (OSError, RuntimeError, KeyError) as exc:
            raise DatasetError(
                f"{source}: the HDF5 file cannot be read ({_reason(exc)}); it may be truncated"
            ) from None
        for key in REQUIRED_KEYS:
            if key not in present:
                raise DatasetError(
                    f"{source}: key '{key}' is missing; expected the D4RL keys {', '.join(REQUIRED_KEYS)} "
                    f"(found: {', '.join(sorted(present)) or 'nothing'})"
                )
        keys = REQUIRED_KEYS + ((NEXT_OBS_KEY,) if NEXT_OBS_KEY in present else ())
        arrays = {key: _read_array(file, key, source) for key in keys}
        attrs = {key: file.attrs[key] for key in file.attrs if key in TASK_ATTRS or key.startswith("ref_")}
    return arrays, attrs


def _read_array(file, key: str, source: str) -> np.ndarray:
    import h5py  # lazy: as in _read

    node = file[key]
    if not isinstance(node, h5py.Dataset):
        raise DatasetError(f"{source}: key '{key}' is a group; expected an array")
    try:
        return np.asarray(node[()])
    except (OSError, ValueError, RuntimeError, TypeError) as exc:
        raise DatasetError(
            f"{source}: key '{key}' cannot be read ({_reason(exc)}); the file may be truncated or corrupt"
        ) from None


def _task_from_attrs(attrs: dict) -> tuple[str | None, str]:
    for key in TASK_ATTRS:
        if key in attrs:
            found = validate.task_from_text(_as_text(attrs[key]))
            if found is not None:
                return found, f"file attribute '{key}'"
    return None, ""


def _ref_scores_from_attrs(source: str, attrs: dict) -> tuple[float | None, float | None]:
    scores = []
    for key in ("ref_min_score", "ref_max_score"):
        value = attrs.get(key)
        try:
            scores.append(None if value is None else float(np.asarray(value).reshape(())))
        except (TypeError, ValueError):
            raise DatasetError(f"{source}: file attribute '{key}' is {value!r}; expected a number") from None
    return scores[0], scores[1]


def _as_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reason(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
