"""How good a fitted world model is, on data it never trained on (what `mbrl model eval` reports).

- `holdout_metrics`: per-member MSE (standardised units, as used for elites, and raw units) and
  calibration: the fraction of targets inside each member's predicted 1σ and 2σ (a calibrated Gaussian
  gives 0.683 and 0.954). `history_holdout_metrics`: the same for a recurrent model (per head) on held-out
  episodes, each step predicted after reading the history before it.
- `open_loop_errors`: k-step error on whole held-out episodes: start from a real state (a recurrent model
  first reads the real history before it), feed the real actions, follow the elites' mean prediction,
  compare with the real observation.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from mbrl.core.types import Transitions

OPEN_LOOP_HORIZONS = (1, 5, 20, 100)
MAX_OPEN_LOOP_STARTS = 1024
MAX_HISTORY_ROWS = 4096


def holdout_metrics(model, transitions: Transitions) -> dict[str, np.ndarray]:
    """Per-member (M,) arrays on `transitions`: `mse` (standardised units), `mse_raw`, and the fractions of
    targets inside 1σ and 2σ of each member's Gaussian (`coverage_1sigma`, `coverage_2sigma`)."""
    predict = jax.jit(type(model).member_predictions)
    means, stds = predict(model, jnp.asarray(transitions.obs), jnp.asarray(transitions.action))
    return _gaussian_metrics(model, means, stds, transitions)


def history_holdout_metrics(model, transitions: Transitions, episode_starts, episodes,
                            max_rows: int = MAX_HISTORY_ROWS) -> tuple[dict[str, np.ndarray], int]:
    """`holdout_metrics` of a recurrent model on the steps of `episodes` that have its history behind them in
    their episode (evenly thinned to `max_rows`), each predicted after reading that history. Also returns the
    number of steps used."""
    history = model.history
    bounds = np.append(np.asarray(episode_starts), len(transitions.reward))
    rows = np.concatenate([np.arange(bounds[e] + history, bounds[e + 1]) for e in episodes] or [np.zeros(0, int)])
    if len(rows) > max_rows:
        rows = rows[np.linspace(0, len(rows) - 1, max_rows).round().astype(int)]
    if not len(rows):
        return {}, 0
    before = rows[:, None] - history + np.arange(history)[None, :]
    obs, action = np.asarray(transitions.obs), np.asarray(transitions.action)

    @jax.jit
    def predict(model, obs_history, action_history, obs, action):
        carry = model.warm_up(obs_history, action_history)
        return model.member_predictions(obs, action, carry)[:2]

    means, stds = predict(model, jnp.asarray(obs[before]), jnp.asarray(action[before]), jnp.asarray(obs[rows]),
                          jnp.asarray(action[rows]))
    return _gaussian_metrics(model, means, stds, transitions.slice(rows)), len(rows)


def _gaussian_metrics(model, means, stds, transitions: Transitions) -> dict[str, np.ndarray]:
    means, stds = np.asarray(means, np.float64), np.asarray(stds, np.float64)
    obs, next_obs = np.asarray(transitions.obs), np.asarray(transitions.next_obs)
    targets = np.concatenate([next_obs - obs, np.asarray(transitions.reward)[:, None]], axis=1)
    error = means - targets[None]
    target_std = np.asarray(model.target_norm.std, np.float64)
    z = np.abs(error) / stds
    return {
        "mse": np.mean(np.square(error / target_std), axis=(1, 2)),
        "mse_raw": np.mean(np.square(error), axis=(1, 2)),
        "coverage_1sigma": np.mean(z <= 1.0, axis=(1, 2)),
        "coverage_2sigma": np.mean(z <= 2.0, axis=(1, 2)),
    }


def open_loop_errors(model, transitions: Transitions, episode_starts, episodes, horizons=OPEN_LOOP_HORIZONS,
                     max_starts: int = MAX_OPEN_LOOP_STARTS, history: int | None = None) -> dict[int, tuple[float | None, int]]:
    """MSE (raw units, mean over obs dims) between real obs and the elites' mean prediction k steps ahead.

    `transitions` are a dataset's rows in episode order, `episode_starts` the first row of each episode,
    `episodes` the indices of the held-out episodes. Every step of those with `history` real steps before it
    in its episode is a start (evenly thinned to `max_starts`); a recurrent model (RWM-U) first reads those
    steps (its `warm_up`). `history` defaults to the model's own (0 for a Markov model); give a recurrent
    model's to compare a Markov one on the same starts. A start counts for horizon k when its episode has k
    more real steps. Returns {k: (mse, starts used)}, the mse None when no start counts or the prediction
    diverged.
    """
    recurrent = model.is_recurrent
    history = model.history if history is None else history
    if recurrent and history != model.history:
        raise ValueError(f"open_loop_errors: a recurrent model reads its own history of {model.history} steps")
    bounds = np.append(np.asarray(episode_starts), len(transitions.reward))
    starts, ends = [], []
    for e in episodes:
        rows = np.arange(bounds[e] + history, bounds[e + 1])
        starts.append(rows)
        ends.append(np.full(len(rows), bounds[e + 1]))
    starts = np.concatenate(starts) if starts else np.zeros(0, int)
    if not len(starts):
        return {k: (None, 0) for k in horizons}
    ends = np.concatenate(ends)
    if len(starts) > max_starts:
        keep = np.linspace(0, len(starts) - 1, max_starts).round().astype(int)
        starts, ends = starts[keep], ends[keep]
    offsets = np.arange(max(horizons))[:, None]  # (K, 1)
    rows = starts[None, :] + offsets  # (K, S): the real step taken at each model step
    valid = rows < ends[None, :]
    rows = np.minimum(rows, ends[None, :] - 1)
    actions = jnp.asarray(np.asarray(transitions.action)[rows])
    targets = jnp.asarray(np.asarray(transitions.next_obs)[rows])
    start_obs = jnp.asarray(np.asarray(transitions.obs)[starts])
    carry = ()
    if recurrent:
        before = starts[:, None] - history + np.arange(history)[None, :]  # (S, L) the history read first
        carry = model.warm_up(jnp.asarray(np.asarray(transitions.obs)[before]),
                              jnp.asarray(np.asarray(transitions.action)[before]))
    errors = np.asarray(_open_loop(model, start_obs, carry, actions, targets), np.float64)
    result = {}
    for k in horizons:
        mask = valid[k - 1]
        count = int(mask.sum())
        value = float(np.mean(errors[k - 1][mask])) if count else None
        result[k] = (value if value is None or math.isfinite(value) else None, count)
    return result


@jax.jit
def _open_loop(model, obs, carry, actions, targets):  # the model is an argument, not baked-in constants
    def step(state, xs):
        obs, carry = state
        action, target = xs
        if model.is_recurrent:
            means, _, carry = model.member_predictions(obs, action, carry)
        else:
            means, _ = model.member_predictions(obs, action)
        next_obs = obs + jnp.mean(means[model.elites], axis=0)[:, : model.obs_dim]
        return (next_obs, carry), jnp.mean(jnp.square(next_obs - target), axis=-1)

    _, errors = jax.lax.scan(step, (obs, carry), (actions, targets))
    return errors  # (K, S)


def row_holdout_metrics(model, dataset) -> tuple[dict[str, np.ndarray], int]:
    """`holdout_metrics` on the holdout rows its fit recorded (`ModelInfo.holdout_rows`), and their number."""
    holdout = dataset.transitions.slice(np.asarray(model.info.holdout_rows, dtype=np.int64))
    return holdout_metrics(model, holdout), len(holdout)


def episode_holdout_metrics(model, dataset) -> tuple[dict[str, np.ndarray], int]:
    """`history_holdout_metrics` on the holdout episodes its fit recorded (`ModelInfo.holdout_episodes`)."""
    return history_holdout_metrics(model, dataset.transitions, dataset.episode_starts, model.info.holdout_episodes)
