"""The fitted model's half of `mbrl data profile --world-model DIR`: how far its imagined steps can be trusted, measured
on data it did not fit.

- calibration: the elites' predicted spread against their error on the held-out rows, apart on the rows where a
  target jumps (a change far outside its usual spread) and on the rest. A model whose spread on ordinary rows is
  several times its error has learnt the jumps as noise: sampling that noise makes every imagined step wander;
- k-step error: the elites' mean prediction fed the data's actions from a held-out episode's real state, against
  the real observations k steps on, in units of the observations' variance, and the longest horizon within a
  tolerance;
- with `--compare DIR` (a model of another kind, such as a history model), the same k-step error for it on the same
  starts: whether reading a history predicts better than the Markov step (a partially observed task).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mbrl.core.errors import UserError
from mbrl.datasets import load
from mbrl.world_models import registry as model_registry
from mbrl.world_models.metrics import open_loop_errors

HORIZONS = (1, 2, 5, 10, 20, 50, 100)
JUMP_Z = 6.0  # a change this many robust standard deviations from its median is a jump (a Gaussian: 2e-9 odds)
OVERDISPERSED = 3.0  # predicted spread over error on ordinary rows; a calibrated Gaussian gives 1
# The normalised k-step error (mean squared error over the observations' variance) beyond which an imagined state
# is no nearer the real one than half the distance between two random states of the data (2 variances).
K_STEP_TOLERANCE = 1.0
MAX_ROWS = 20_000  # held-out rows scored for calibration (evenly thinned beyond)


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    model: str
    kind: str
    holdout_rows: int | None
    jump_rows: int | None
    jumping_targets: list[int] | None  # targets (obs changes, then the reward at index obs_dim) with a jump
    spread_over_error: list[float] | None  # per target (obs changes, then the reward), on rows without a jump
    spread_over_error_jumps: list[float] | None  # the same on the jump rows (None without any)
    # On some observation that jumps, the spread is OVERDISPERSED times the error on the rows without a jump. The
    # reward is left out: a task's own reward function replaces it in imagination, and its noise does not wander.
    variance_is_jumps: bool | None
    k_step_error: dict[str, float | None]  # horizon -> normalised k-step error
    trusted_horizon: int | None  # the longest horizon of HORIZONS with error <= K_STEP_TOLERANCE (None: not even 1)
    compare: dict | None  # {"model", "kind", "k_step_error", "better_at": [horizons where it beats this model]}
    thresholds: dict

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def jump_rows(targets: np.ndarray) -> np.ndarray:
    """Rows where some target jumps (`jumps`)."""
    return jumps(targets).any(axis=1)


def jumps(targets: np.ndarray) -> np.ndarray:
    """(rows, targets): where a target lies more than JUMP_Z robust standard deviations (1.4826 MAD) from its median; a
    target with no spread at all (MAD 0) jumps wherever it moves by more than 1e-4 of its largest size, far above
    the float32 rounding of a logged value."""
    median = np.median(targets, axis=0)
    mad = 1.4826 * np.median(np.abs(targets - median), axis=0)
    floor = 1e-4 * (np.abs(median) + np.abs(targets).max(axis=0)) + np.finfo(np.float32).tiny
    return np.abs(targets - median) > JUMP_Z * np.maximum(mad, floor)


def _spread_over_error(means: np.ndarray, stds: np.ndarray, targets: np.ndarray) -> list[float]:
    """Per target: the RMS of the predicted std over the RMS error, pooled over the elites and rows."""
    error = means - targets[None]
    spread = np.sqrt(np.mean(np.square(stds), axis=(0, 1)))
    return [float(s / max(e, 1e-12)) for s, e in zip(spread, np.sqrt(np.mean(np.square(error), axis=(0, 1))))]


def calibration(model, transitions) -> tuple[int, list[float], list[float] | None, int, list[int]]:
    """(rows, spread over error without jumps, with jumps or None, jump rows, the targets that jump) of a Markov
    model on `transitions`."""
    rows = len(transitions.reward)
    if rows > MAX_ROWS:
        transitions = transitions.slice(np.linspace(0, rows - 1, MAX_ROWS).round().astype(np.int64))
        rows = MAX_ROWS
    means, stds = jax.jit(type(model).member_predictions)(model, jnp.asarray(transitions.obs),
                                                          jnp.asarray(transitions.action))
    elites = np.asarray(model.elites)
    means, stds = np.asarray(means, np.float64)[elites], np.asarray(stds, np.float64)[elites]
    obs, next_obs = np.asarray(transitions.obs, np.float64), np.asarray(transitions.next_obs, np.float64)
    targets = np.concatenate([next_obs - obs, np.asarray(transitions.reward, np.float64)[:, None]], axis=1)
    cells = jumps(targets)
    rows_jumping = cells.any(axis=1)
    ordinary = _spread_over_error(means[:, ~rows_jumping], stds[:, ~rows_jumping], targets[~rows_jumping])
    on_jumps = (_spread_over_error(means[:, rows_jumping], stds[:, rows_jumping], targets[rows_jumping])
                if rows_jumping.any() else None)
    return rows, ordinary, on_jumps, int(rows_jumping.sum()), np.flatnonzero(cells.any(axis=0)).tolist()


def _normalised_k_step(model, dataset, episodes, history: int | None) -> dict[str, float | None]:
    t = dataset.transitions
    bounds = np.append(dataset.episode_starts, len(dataset))
    rows = np.concatenate([np.arange(bounds[e], bounds[e + 1]) for e in episodes])
    variance = float(np.mean(np.var(np.asarray(t.next_obs, np.float64)[rows], axis=0))) or 1.0
    errors = open_loop_errors(model, t, dataset.episode_starts, episodes, horizons=HORIZONS, history=history)
    return {str(k): (None if mse is None else mse / variance) for k, (mse, _) in errors.items()}


def _trusted(errors: dict[str, float | None]) -> int | None:
    trusted = None
    for k in HORIZONS:
        value = errors.get(str(k))
        if value is None or not math.isfinite(value) or value > K_STEP_TOLERANCE:
            break
        trusted = k
    return trusted


def _loaded(path: Path, dataset_source: str | None):
    kind = model_registry.saved_kind(path)
    model = kind.load(path)
    source = dataset_source or model.info.source
    if not source:
        raise UserError(f"{path}: the model records no dataset; pass the dataset it was fitted on")
    return kind, model, source


def profile_model(model_dir: str | Path, dataset_source: str | None = None, compare: str | Path | None = None,
                  dataset=None) -> ModelProfile:
    """The profile of the model saved in `model_dir` on the dataset it was fitted on (`dataset`, else loaded)."""
    kind, model, source = _loaded(Path(model_dir), dataset_source)
    dataset = load(source, task=model.info.task) if dataset is None else dataset
    if len(dataset) != model.info.num_transitions or dataset.transitions.obs_dim != model.obs_dim:
        raise UserError(f"{source}: {len(dataset):,} transitions of obs dim {dataset.transitions.obs_dim}; the model "
                        f"in {model_dir} was fitted on {model.info.num_transitions:,} of obs dim {model.obs_dim}")
    held = dataset
    if model.info.holdout_from == "heldout":
        if dataset.heldout is None:
            raise UserError(f"{model_dir}: the model was checked on {source}'s held-out file, which is not beside it now")
        held = dataset.heldout
    episodes = list(model.info.eval_episodes)
    if not episodes:
        raise UserError(f"{model_dir}: the model keeps no episode out of its fit; refit it with eval episodes")
    rows = jump_count = jumping = ordinary = on_jumps = overdispersed = None
    if not kind.is_recurrent:
        holdout = held.transitions.slice(np.asarray(model.info.holdout_rows, dtype=np.int64))
        rows, ordinary, on_jumps, jump_count, jumping = calibration(model, holdout)
        overdispersed = any(ordinary[d] >= OVERDISPERSED for d in jumping if d < model.obs_dim)
    other = None
    history = 0
    if compare is not None:
        other_kind, other_model, _ = _loaded(Path(compare), source)
        if tuple(other_model.info.eval_episodes) != tuple(episodes):
            raise UserError(f"--compare {compare}: it keeps out episodes {list(other_model.info.eval_episodes)}, "
                            f"{model_dir} keeps out {episodes}; fit both with the same seed")
        history = max(model.history, other_model.history)
        other_errors = _normalised_k_step(other_model, held, episodes,
                                          None if other_kind.is_recurrent else history)
        other = {"model": str(compare), "kind": other_kind.name, "k_step_error": other_errors}
    errors = _normalised_k_step(model, held, episodes, None if kind.is_recurrent else history)
    if other is not None:
        other["better_at"] = [int(k) for k in errors if errors[k] is not None and other["k_step_error"][k] is not None
                              and other["k_step_error"][k] < errors[k]]
    return ModelProfile(
        model=str(model_dir), kind=kind.name, holdout_rows=rows, jump_rows=jump_count, jumping_targets=jumping,
        spread_over_error=ordinary,
        spread_over_error_jumps=on_jumps, variance_is_jumps=overdispersed, k_step_error=errors,
        trusted_horizon=_trusted(errors), compare=other,
        thresholds={"jump_z": JUMP_Z, "overdispersed": OVERDISPERSED, "k_step_tolerance": K_STEP_TOLERANCE})
