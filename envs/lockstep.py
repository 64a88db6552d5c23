"""The one loop that steps N gymnasium envs in lockstep: evaluation, data collection and diagnostics.

The policy sees the whole batch in ONE call per step, always with N rows (a slot that has met its quota
keeps its last values as padding and its actions are dropped), so a jitted policy compiles once. Each
slot runs episodes until its quota (whole episodes, env steps, or whichever comes first); episode j of
slot i resets with seed `reset_seed(i, j)`, so a run is a pure function of its seeds and quotas.

The policy contract: `policy(inputs: PolicyInput) -> actions (N, act_dim)`, numpy in and out (jax
arrays out are fine). `inputs.obs` (N, obs_dim) float32; `inputs.prev_action` (N, act_dim), the action
the slot sent at its previous step (after clipping), zeros at an episode's first step;
`inputs.prev_reward` (N,), the env's previous reward, 0 at the first step; `inputs.first` (N,) bool.
Markov policies read `inputs.obs` only (`markov` wraps one); a recurrent policy keeps its carry in a
closure and resets it where `first` is True.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mbrl.core.errors import ConfigError
from mbrl.core.types import PolicyInput

Policy = Callable[[PolicyInput], Any]


def markov(act: Callable[[np.ndarray], Any]) -> Policy:
    """A policy of the observation alone, `act(obs (N, obs_dim)) -> (N, act_dim)`, as a lockstep policy."""
    return lambda inputs: act(inputs.obs)


@dataclasses.dataclass
class Episode:
    """One episode of one slot. Observations and actions are kept only when the run records."""

    observations: np.ndarray | None  # float32 (T+1, obs_dim), Minari's layout
    actions: np.ndarray | None  # float32 (T, act_dim), as the policy acted, after clipping
    rewards: np.ndarray  # float32 (T,)
    terminations: np.ndarray  # bool (T,)
    truncations: np.ndarray  # bool (T,); also True on the last step of an episode cut by a step quota
    episode_return: float  # the env's rewards summed in float64 in step order, as a plain loop sums them

    def __len__(self) -> int:
        return int(self.rewards.shape[0])


class _Track:
    """The episode in progress in one slot."""

    def __init__(self, record: bool):
        self.record = record

    def start(self, obs) -> None:
        self.obs, self.act, self.rew, self.term, self.trunc = [obs], [], [], [], []
        self.total = 0.0

    def add(self, action, next_obs, reward, terminated: bool, truncated: bool) -> None:
        if self.record:
            self.act.append(action)
            self.obs.append(next_obs)
        self.rew.append(reward)
        self.term.append(bool(terminated))
        self.trunc.append(bool(truncated))
        self.total += float(reward)

    def finish(self, cut: bool) -> Episode:
        trunc = np.asarray(self.trunc, bool)
        if cut and trunc.size:
            trunc[-1] = True
        return Episode(
            observations=np.asarray(self.obs, np.float32) if self.record else None,
            actions=np.asarray(self.act, np.float32) if self.record else None,
            rewards=np.asarray(self.rew, np.float64).astype(np.float32),
            terminations=np.asarray(self.term, bool),
            truncations=trunc,
            episode_return=self.total,
        )


def _quota(value: int | Sequence[int] | None, n: int, name: str) -> list[float]:
    if value is None:
        return [float("inf")] * n
    quotas = [value] * n if isinstance(value, (int, np.integer)) else list(value)
    if len(quotas) != n or any(not isinstance(q, (int, np.integer)) or q < 0 for q in quotas):
        raise ConfigError(f"lockstep: {name} must be one non-negative int or one per env ({n}), found {value!r}")
    return [int(q) for q in quotas]


def run(
    envs: Sequence[Any],
    policy: Policy,
    reset_seed: Callable[[int, int], int],
    *,
    episodes: int | Sequence[int] | None = None,
    steps: int | Sequence[int] | None = None,
    record: bool = False,
    unit_actions: bool = False,
    on_step: Callable[[int], None] | None = None,
) -> list[list[Episode]]:
    """Step `envs` together until every slot meets its quota; the episodes of each slot, in order.

    `episodes`, `steps`: per-slot quotas (one int for all, or one per env); a slot stops at whichever
    it meets first. Under a step quota the slot's last episode is cut there and marked truncated.
    `reset_seed(slot, episode)` seeds each reset. Actions are clipped to the action space; with
    `unit_actions` the policy acts in [-1, 1] instead, clipped there and mapped affinely onto the action
    space (behaviour policies; the episode records the [-1, 1] action). `record` keeps observations and
    actions; `on_step(n)` hears the n env steps of each lockstep step (progress bars).
    """
    n = len(envs)
    if n == 0:
        raise ConfigError("lockstep: expected at least one env, found none")
    if episodes is None and steps is None:
        raise ConfigError("lockstep: give a quota, `episodes` or `steps` (or both)")
    episode_quota, step_quota = _quota(episodes, n, "episodes"), _quota(steps, n, "steps")
    space = envs[0].action_space
    act_shape = tuple(space.shape)
    low, high = space.low.astype(np.float32), space.high.astype(np.float32)
    env_id = getattr(envs[0].spec, "id", None) or type(envs[0].unwrapped).__name__

    tracks = [_Track(record) for _ in range(n)]
    done: list[list[Episode]] = [[] for _ in range(n)]
    steps_done = [0] * n
    active = [True] * n
    obs = np.zeros((n, *envs[0].observation_space.shape), np.float32)
    prev_action = np.zeros((n, *act_shape), np.float32)
    prev_reward = np.zeros(n, np.float32)
    first = np.zeros(n, bool)

    def quota_met(i: int) -> bool:
        return len(done[i]) >= episode_quota[i] or steps_done[i] >= step_quota[i]

    def reset(i: int) -> None:
        start, _ = envs[i].reset(seed=reset_seed(i, len(done[i])))
        obs[i], prev_action[i], prev_reward[i], first[i] = start, 0.0, 0.0, True
        tracks[i].start(start)

    for i in range(n):
        if quota_met(i):
            active[i] = False
        else:
            reset(i)

    while any(active):
        inputs = PolicyInput(obs=obs.copy(), prev_action=prev_action.copy(), prev_reward=prev_reward.copy(),
                             first=first.copy())
        actions = np.asarray(policy(inputs), np.float32)
        if actions.shape != (n, *act_shape):
            raise ConfigError(
                f"the policy returned actions of shape {actions.shape} for {n} observations of {env_id}, "
                f"expected {(n, *act_shape)}"
            )
        if unit_actions:
            actions = np.clip(actions, -1.0, 1.0)
            env_actions = low + (actions + 1.0) * 0.5 * (high - low)
        else:
            actions = env_actions = np.clip(actions, low, high)
        new_steps = 0
        for i in range(n):
            if not active[i]:
                continue
            next_obs, reward, terminated, truncated, _ = envs[i].step(env_actions[i])
            tracks[i].add(actions[i], next_obs, reward, terminated, truncated)
            steps_done[i] += 1
            new_steps += 1
            obs[i], prev_action[i], prev_reward[i], first[i] = next_obs, actions[i], reward, False
            if terminated or truncated:
                done[i].append(tracks[i].finish(cut=False))
                if quota_met(i):
                    active[i] = False
                else:
                    reset(i)
            elif quota_met(i):  # cut by the step quota
                done[i].append(tracks[i].finish(cut=True))
                active[i] = False
        if on_step is not None:
            on_step(new_steps)
    return done
