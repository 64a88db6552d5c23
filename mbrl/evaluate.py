"""Evaluate a policy in the real simulator: N seeded episodes in lockstep, normalized score.

Episode i runs in its own env reset with seed `seed + i` (or the i-th of a list of seeds), so a result
is reproducible and any single episode can be replayed alone. The envs advance together in `mbrl.envs.lockstep`'s loop: the policy sees
the whole batch in ONE call per time step, always N rows (finished episodes padded), so a jitted
policy compiles once. A policy takes a `PolicyInput` (`mbrl.envs.lockstep.markov` wraps one of the
observation alone).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from mbrl.envs import lockstep
from mbrl.envs.tasks import TASKS, Task, get_task, task_for_env_id
from mbrl.core.errors import ConfigError
from mbrl.core.score import normalized_score, reference_scores

PolicyFn = lockstep.Policy  # PolicyInput of B rows -> (B, act_dim), numpy or jax


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: compare .returns etc. explicitly
class EvalResult:
    """Returns and lengths per episode (index i was seeded with seed + i) and their summary."""

    mean: float
    std: float
    returns: np.ndarray  # float64 (episodes,)
    lengths: np.ndarray  # int64 (episodes,), steps until termination or truncation
    normalized_score: float | None  # 100 * (mean - min) / (max - min), None without reference scores

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, for metrics files."""
        return {
            "return_mean": self.mean,
            "return_std": self.std,
            "returns": self.returns.tolist(),
            "lengths": self.lengths.tolist(),
            "normalized_score": self.normalized_score,
        }


def _resolve(task_or_env_id: Task | str) -> tuple[str, Task | None]:
    """(gymnasium id, task or None) from a Task, a task name ("hopper") or any gymnasium id."""
    if isinstance(task_or_env_id, Task):
        return task_or_env_id.env_id, task_or_env_id
    if not isinstance(task_or_env_id, str):
        raise ConfigError(f"evaluate: expected a Task, a task name or a gymnasium env id, found {task_or_env_id!r}")
    if task_or_env_id in TASKS:
        return TASKS[task_or_env_id].env_id, TASKS[task_or_env_id]
    if "-v" not in task_or_env_id:
        get_task(task_or_env_id)  # raises ConfigError listing the known names
    return task_or_env_id, task_for_env_id(task_or_env_id)


def member_reset_seeds(seeds: Sequence[int], episodes: int, eval_seed: int = 0) -> list[int]:
    """The reset seeds of a population's evaluation, member after member: episode i of the member with training seed
    s resets with `eval_seed + s * episodes + i`, so a member's score does not depend on which others ran with it."""
    return [eval_seed + s * episodes + i for s in seeds for i in range(episodes)]


def evaluate(
    policy_fn: PolicyFn,
    task_or_env_id: Task | str,
    episodes: int = 10,
    seed: int | Sequence[int] = 0,
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
    env_kwargs: dict[str, Any] | None = None,
) -> EvalResult:
    """Run `policy_fn` (a lockstep policy of a `PolicyInput`) for `episodes` episodes of the real env and
    summarise the returns.

    `task_or_env_id`: a Task, a task name ("hopper") or a gymnasium id ("Hopper-v5", or any other env).
    Reference scores: a dataset's own (`ref_min_score`, `ref_max_score`) when given, else D4RL's for a
    known task, else the normalized score is None. `env_kwargs` go to `gymnasium.make` (for example
    `max_episode_steps`). Each episode ends at the env's termination or truncation, whichever is first.
    """
    if not isinstance(episodes, int) or episodes < 1:
        raise ConfigError(f"evaluate: episodes must be a positive integer, found {episodes!r}")
    reset_seeds = [seed + i for i in range(episodes)] if isinstance(seed, int) else [int(s) for s in seed]
    if len(reset_seeds) != episodes:
        raise ConfigError(f"evaluate: expected one reset seed per episode ({episodes}), found {len(reset_seeds)}")
    env_id, task = _resolve(task_or_env_id)
    reference = reference_scores(ref_min_score, ref_max_score, task)

    # A diverged policy (one member of a population, say) gives NaN actions, which one simulator integrates and
    # another refuses: its episodes run on with zero actions and return NaN, and the others are unaffected.
    diverged = np.zeros(episodes, bool)

    def finite_policy(inputs):
        actions = np.asarray(policy_fn(inputs), np.float32)
        if actions.shape[:1] == (episodes,):
            bad = ~np.isfinite(actions.reshape(episodes, -1)).all(axis=1)
            if bad.any():
                diverged[bad] = True
                actions = np.where(bad.reshape(-1, *[1] * (actions.ndim - 1)), np.float32(0.0), actions)
        return actions

    envs = []
    try:
        for _ in range(episodes):
            try:
                envs.append(gymnasium.make(env_id, **(env_kwargs or {})))
            except gymnasium.error.Error as exc:
                raise ConfigError(f"evaluate: cannot make env {env_id!r}: {exc}") from None
        slots = lockstep.run(envs, finite_policy, lambda slot, episode: reset_seeds[slot], episodes=1)
    finally:
        for env in envs:
            env.close()

    returns = np.array([ep.episode_return for (ep,) in slots], np.float64)
    returns[diverged] = np.nan
    lengths = np.array([len(ep) for (ep,) in slots], np.int64)
    mean = float(returns.mean())
    return EvalResult(
        mean=mean,
        std=float(returns.std()),
        returns=returns,
        lengths=lengths,
        normalized_score=None if reference is None else float(normalized_score(mean, *reference)),
    )
