"""The data's half of `mbrl data profile`: facts about a dataset that a choice of settings can rest on, measured
from the rows alone (no simulator, no fitted model).

- the reward's scale per step;
- per action dimension: the share of rows pressed against a bound, the mean and spread, and the entropy of its
  values over the declared range (1 is uniform over the range, 0 a single value);
- per observation dimension: its scale, whether it tracks the time step within episodes, and whether the
  dynamics depend on it (the held-out error of a one-step regressor grows when the dimension is left out of its
  inputs);
- the spread of the observations' scales.

The flags carry the thresholds they were set at (`THRESHOLDS`), so that a rule built on them says what it read.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from mbrl.core.errors import DatasetError
from mbrl.core.types import OfflineDataset
from mbrl.datasets import load, validate

# A value within this share of its range from a bound counts as at the bound (float32 logs of a clipped action
# land within rounding of it, not on it).
AT_BOUND_TOLERANCE = 0.01
ENTROPY_BINS = 20
THRESHOLDS = {
    # An action dimension is "pressed" when most of its rows sit at one of its bounds.
    "pressed_at_bound": 0.5,
    # A dimension "tracks time" when its rank correlation with the step index within episodes is at least this.
    "tracks_time": 0.9,
    # The dynamics "ignore" a dimension when leaving it out raises the held-out one-step error by under this share.
    "dynamics_ignore": 0.01,
    # Observation scales are "unequal" when the largest standard deviation is this many times the smallest.
    "unequal_scales": 100.0,
}
CONSTANT_TO_ROUNDING = 1e-4  # well above float32's relative rounding (1.2e-7) of a logged value
MIN_EPISODES = 2  # the dependence test holds whole episodes out
# Ridge strengths tried, relative to the mean feature's squared norm; the smallest keeps constant dimensions solvable.
RIDGES = (1e-6, 1e-4, 1e-3, 1e-2, 1e-1)


@dataclasses.dataclass(frozen=True)
class ActionProfile:
    low: float | None
    high: float | None
    at_low: float  # share of rows at the lower bound
    at_high: float
    mean: float
    std: float
    entropy: float | None  # of a 20-bin histogram over [low, high], over log(20); None without bounds
    pressed: bool


@dataclasses.dataclass(frozen=True)
class ObservationProfile:
    mean: float
    std: float
    min: float
    max: float
    time_correlation: float  # Spearman's rank correlation with the step index within episodes
    tracks_time: bool
    dynamics_error_increase: float  # held-out one-step error without this input, relative to with it, less 1
    dynamics_ignore: bool


@dataclasses.dataclass(frozen=True)
class DataProfile:
    source: str
    transitions: int
    episodes: int
    mean_episode_length: float
    reward_mean: float
    reward_std: float
    reward_abs_mean: float  # the reward's scale per step
    return_mean: float
    return_std: float
    actions: tuple[ActionProfile, ...]
    observations: tuple[ObservationProfile, ...]
    obs_scale_ratio: float  # the largest observation std over the smallest non-zero one
    unequal_scales: bool
    thresholds: dict

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def pressed_actions(self) -> list[int]:
        return [i for i, a in enumerate(self.actions) if a.pressed]

    @property
    def time_tied_observations(self) -> list[int]:
        """Dimensions that track the time step and that the dynamics do not depend on: an absolute position or a
        clock, which a policy can only overfit to."""
        return [i for i, o in enumerate(self.observations) if o.tracks_time and o.dynamics_ignore]


def step_index(episode_starts: np.ndarray, rows: int) -> np.ndarray:
    """Each row's step within its episode (0 at the episode's first row)."""
    lengths = np.diff(np.append(episode_starts, rows))
    return np.arange(rows) - np.repeat(episode_starts, lengths)


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (ties take their mean rank); 0 where either is constant."""
    rx, ry = _ranks(x), _ranks(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return 0.0
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    sorted_values = values[order]
    # Mean rank over each run of equal values.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    mean_rank = (starts + ends - 1) / 2.0
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def histogram_entropy(values: np.ndarray, low: float, high: float, bins: int = ENTROPY_BINS) -> float:
    """The entropy of `values`' histogram over [low, high] in `bins` equal bins, over log(bins): 1 for a uniform
    spread, 0 for a single bin."""
    counts, _ = np.histogram(np.clip(values, low, high), bins=bins, range=(low, high))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum() / math.log(bins))


def _action_profile(values: np.ndarray, low: float | None, high: float | None) -> ActionProfile:
    values = values.astype(np.float64)
    mean, std = float(values.mean()), float(values.std())
    if low is None or high is None or not np.isfinite(low) or not np.isfinite(high) or high <= low:
        return ActionProfile(None, None, 0.0, 0.0, mean, std, None, False)
    margin = AT_BOUND_TOLERANCE * (high - low)
    at_low, at_high = float((values <= low + margin).mean()), float((values >= high - margin).mean())
    return ActionProfile(float(low), float(high), at_low, at_high, mean, std, histogram_entropy(values, low, high),
                         max(at_low, at_high) >= THRESHOLDS["pressed_at_bound"])


def _features(obs: np.ndarray, action: np.ndarray, scale: np.ndarray, center: np.ndarray) -> np.ndarray:
    """Standardised inputs, their squares (so that a dependence through |x| or x² is seen), and a constant."""
    x = (np.concatenate([obs, action], axis=1) - center) / scale
    return np.concatenate([x, x * x, np.ones((len(x), 1))], axis=1)


def dynamics_dependence(dataset: OfflineDataset, seed: int = 0) -> np.ndarray:
    """Per observation dimension: the held-out one-step error (the change of the observation and the reward, each
    standardised) of a least-squares regressor on quadratic features of (obs, action) without that dimension,
    relative to the one with every input, less 1. Episodes are split half and half at random."""
    t = dataset.transitions
    obs, action = t.obs.astype(np.float64), t.action.astype(np.float64)
    targets = np.concatenate([t.next_obs - t.obs, t.reward[:, None]], axis=1).astype(np.float64)
    spread, level = targets.std(0), np.abs(targets.mean(0))
    # A target constant but for float32 rounding (a clock's step) has nothing to predict: it is left at zero.
    varies = spread > CONSTANT_TO_ROUNDING * np.maximum(level, np.finfo(np.float32).tiny)
    targets = np.where(varies, (targets - targets.mean(0)) / np.where(varies, spread, 1.0), 0.0)
    inputs = np.concatenate([obs, action], axis=1)
    center, scale = inputs.mean(0), np.where(inputs.std(0) > 0, inputs.std(0), 1.0)
    features = _features(obs, action, scale, center)

    episode = np.repeat(np.arange(dataset.num_episodes), dataset.episode_lengths())
    chosen = np.random.default_rng(seed).permutation(dataset.num_episodes)[: max(1, dataset.num_episodes // 2)]
    train = np.isin(episode, chosen)
    gram, moment = features[train].T @ features[train], features[train].T @ targets[train]
    # The held-out error from second moments alone: |Xw - Y|² = tr(wᵀ XᵀX w) - 2 tr(wᵀ XᵀY) + tr(YᵀY).
    x_test, y_test = features[~train], targets[~train]
    test_gram, test_moment, test_size = x_test.T @ x_test, x_test.T @ y_test, float(np.sum(y_test * y_test))
    cells = y_test.size
    obs_dim, width = obs.shape[1], inputs.shape[1]
    unit = np.trace(gram) / len(gram)

    def heldout_error(keep: np.ndarray, ridge: float) -> float:
        weights = np.linalg.solve(gram[np.ix_(keep, keep)] + ridge * unit * np.eye(int(keep.sum())), moment[keep])
        fitted = np.sum(weights * (test_gram[np.ix_(keep, keep)] @ weights)) - 2 * np.sum(weights * test_moment[keep])
        return max(float(fitted + test_size), 0.0) / cells

    if test_size == 0:  # nothing changes and the reward is constant: no input matters
        return np.zeros(obs.shape[1])
    everything = np.ones(len(gram), bool)
    # The ridge that fits the held-out half best with every input, then kept for every comparison: without it a
    # small dataset's regressor overfits and loses nothing by dropping any input.
    ridge = min(RIDGES, key=lambda r: heldout_error(everything, r))
    full = heldout_error(everything, ridge)
    increase = []
    for d in range(obs_dim):
        keep = everything.copy()
        keep[[d, width + d]] = False
        # Floored at 1e-9 of the targets' size, where the second moments' rounding would take over.
        increase.append(heldout_error(keep, ridge) / max(full, 1e-9 * test_size / cells) - 1.0)
    return np.array(increase)


def _check(dataset: OfflineDataset) -> None:
    source = dataset.info.source
    if dataset.num_episodes < MIN_EPISODES:
        raise DatasetError(f"{source}: {dataset.num_episodes} episode(s); a profile needs at least {MIN_EPISODES} "
                           "(its dependence test holds whole episodes out)")
    for name in ("obs", "action", "reward", "next_obs"):  # a dataset built in Python has not met the loaders' check
        validate.check_finite(source, name, np.asarray(getattr(dataset.transitions, name)))


def _bound(bound, dim: int) -> float | None:
    if bound is None:
        return None
    return float(bound[dim]) if np.ndim(bound) else float(bound)


def profile_data(dataset: OfflineDataset, seed: int = 0) -> DataProfile:
    """The dataset's profile (see the module's docstring)."""
    _check(dataset)
    t, info = dataset.transitions, dataset.info
    rewards = t.reward.astype(np.float64)
    returns = dataset.episode_returns()
    actions = tuple(_action_profile(t.action[:, d], _bound(info.action_low, d), _bound(info.action_high, d))
                    for d in range(t.action.shape[1]))
    steps = step_index(dataset.episode_starts, len(dataset))
    increase = dynamics_dependence(dataset, seed)
    observations = []
    for d in range(t.obs.shape[1]):
        column = t.obs[:, d].astype(np.float64)
        correlation = rank_correlation(column, steps)
        observations.append(ObservationProfile(
            float(column.mean()), float(column.std()), float(column.min()), float(column.max()), correlation,
            abs(correlation) >= THRESHOLDS["tracks_time"], float(increase[d]),
            bool(increase[d] < THRESHOLDS["dynamics_ignore"])))
    stds = np.array([o.std for o in observations])
    nonzero = stds[stds > 0]
    ratio = float(nonzero.max() / nonzero.min()) if len(nonzero) else 1.0
    return DataProfile(
        source=info.source, transitions=len(dataset), episodes=dataset.num_episodes,
        mean_episode_length=float(dataset.episode_lengths().mean()),
        reward_mean=float(rewards.mean()), reward_std=float(rewards.std()), reward_abs_mean=float(np.abs(rewards).mean()),
        return_mean=float(returns.mean()), return_std=float(returns.std()),
        actions=actions, observations=tuple(observations), obs_scale_ratio=ratio,
        unequal_scales=ratio >= THRESHOLDS["unequal_scales"], thresholds=dict(THRESHOLDS))


@functools.lru_cache(maxsize=8)
def cached_profile(source: str, task: str | None = None) -> DataProfile:
    """The profile of the dataset `source` (`mbrl.datasets.load`), read once per process: a sweep's trials share it."""
    return profile_data(load(source, task=task))
