"""The one loop that steps N gymnasium envs in lockstep: evaluation, data collection, diagnostics and online
training (in chunks, `Lockstep.advance`).

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


class Lockstep:
    """The loop and its state between calls: `advance` steps the envs until this call's quotas are met, and an
    episode still running then is kept for the next call (`cut` ends it instead). Online training steps in
    chunks this way (`scripts/train_behaviour.py`); `run` is one call, then the cut.

    `reset_seed(slot, episode)` seeds each reset, the episode counted over every call. Actions are clipped to
    the action space; with `unit_actions` the policy acts in [-1, 1] instead, clipped there and mapped affinely
    onto the action space (the episode records the [-1, 1] action). `record` keeps each episode's observations
    and actions; `transitions` keeps every step's (obs, action, reward, next_obs, terminated, truncated), which
    `take_transitions` hands over.
    """

    def __init__(self, envs: Sequence[Any], reset_seed: Callable[[int, int], int], *, record: bool = False,
                 unit_actions: bool = False, transitions: bool = False):
        n = len(envs)
        if n == 0:
            raise ConfigError("lockstep: expected at least one env, found none")
        self.envs, self.reset_seed, self.record, self.unit_actions = envs, reset_seed, record, unit_actions
        space = envs[0].action_space
        self.act_shape = tuple(space.shape)
        self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
        self.env_id = getattr(envs[0].spec, "id", None) or type(envs[0].unwrapped).__name__
        self.tracks = [_Track(record) for _ in range(n)]
        self.live = [False] * n  # an episode in progress
        self.episodes = [0] * n  # episodes begun, over every call
        self.steps = [0] * n  # env steps, over every call
        self.finished: list[list[Episode]] = [[] for _ in range(n)]
        self.obs = np.zeros((n, *envs[0].observation_space.shape), np.float32)
        self.prev_action = np.zeros((n, *self.act_shape), np.float32)
        self.prev_reward = np.zeros(n, np.float32)
        self.first = np.zeros(n, bool)
        self._rows: list[list[tuple]] | None = [[] for _ in range(n)] if transitions else None

    def _reset(self, i: int) -> None:
        start, _ = self.envs[i].reset(seed=self.reset_seed(i, self.episodes[i]))
        self.episodes[i] += 1
        self.obs[i], self.prev_action[i], self.prev_reward[i], self.first[i] = start, 0.0, 0.0, True
        self.tracks[i].start(start)
        self.live[i] = True

    def advance(self, policy: Policy, *, episodes: int | Sequence[int] | None = None,
                steps: int | Sequence[int] | None = None, on_step: Callable[[int], None] | None = None) -> None:
        """Step until every slot meets this call's quotas (episodes ended, env steps taken, from now; a slot stops
        at whichever it meets first). The policy sees all N rows in one call per step."""
        n = len(self.envs)
        if episodes is None and steps is None:
            raise ConfigError("lockstep: give a quota, `episodes` or `steps` (or both)")
        episode_quota, step_quota = _quota(episodes, n, "episodes"), _quota(steps, n, "steps")
        ended, taken = [0] * n, [0] * n
        active = [episode_quota[i] > 0 and step_quota[i] > 0 for i in range(n)]
        while any(active):
            for i in range(n):
                if active[i] and not self.live[i]:
                    self._reset(i)
            inputs = PolicyInput(obs=self.obs.copy(), prev_action=self.prev_action.copy(),
                                 prev_reward=self.prev_reward.copy(), first=self.first.copy())
            actions = np.asarray(policy(inputs), np.float32)
            if actions.shape != (n, *self.act_shape):
                raise ConfigError(
                    f"the policy returned actions of shape {actions.shape} for {n} observations of {self.env_id}, "
                    f"expected {(n, *self.act_shape)}"
                )
            if self.unit_actions:
                actions = np.clip(actions, -1.0, 1.0)
                env_actions = self.low + (actions + 1.0) * 0.5 * (self.high - self.low)
            else:
                actions = env_actions = np.clip(actions, self.low, self.high)
            new_steps = 0
            for i in range(n):
                if not active[i]:
                    continue
                next_obs, reward, terminated, truncated, _ = self.envs[i].step(env_actions[i])
                self.tracks[i].add(actions[i], next_obs, reward, terminated, truncated)
                if self._rows is not None:
                    self._rows[i].append((self.obs[i].copy(), actions[i], reward, next_obs, terminated, truncated))
                self.steps[i] += 1
                taken[i] += 1
                new_steps += 1
                self.obs[i], self.prev_action[i], self.prev_reward[i], self.first[i] = next_obs, actions[i], reward, False
                if terminated or truncated:
                    self.finished[i].append(self.tracks[i].finish(cut=False))
                    self.live[i] = False
                    ended[i] += 1
                if ended[i] >= episode_quota[i] or taken[i] >= step_quota[i]:
                    active[i] = False
            if on_step is not None:
                on_step(new_steps)

    def cut(self) -> None:
        """End each episode in progress where it stands, its last step marked truncated."""
        for i, live in enumerate(self.live):
            if live:
                self.finished[i].append(self.tracks[i].finish(cut=True))
                self.live[i] = False

    def take_finished(self, slot: int) -> list[Episode]:
        """The episodes of `slot` ended since the last take."""
        out, self.finished[slot] = self.finished[slot], []
        return out

    def take_transitions(self, slot: int) -> tuple[np.ndarray, ...]:
        """The steps of `slot` since the last take: (obs, action, reward, next_obs, terminated, truncated) arrays."""
        if self._rows is None:
            raise ConfigError("lockstep: transitions were not kept (Lockstep(..., transitions=True))")
        rows, self._rows[slot] = self._rows[slot], []
        obs_shape = self.obs.shape[1:]
        columns = list(zip(*rows)) if rows else [()] * 6
        return tuple(np.asarray(c, dtype).reshape(len(rows), *shape) for c, dtype, shape in zip(
            columns, (np.float32, np.float32, np.float32, np.float32, bool, bool),
            (obs_shape, self.act_shape, (), obs_shape, (), ())))

    def in_progress(self, slot: int) -> dict | None:
        """The host side of `slot`'s episode in progress (None between episodes), for an exact resume: save the
        simulator's state beside it."""
        if not self.live[slot]:
            return None
        track = self.tracks[slot]
        return {"episode": self.episodes[slot] - 1, "obs": self.obs[slot].tolist(), "rewards": list(map(float, track.rew)),
                "total": track.total, "prev_action": self.prev_action[slot].tolist(),
                "prev_reward": float(self.prev_reward[slot]), "first": bool(self.first[slot])}

    def resume(self, slot: int, saved: dict) -> None:
        """Reset `slot` with the saved episode's seed and put its host side back; the caller restores the
        simulator's state. Episodes that record observations are not resumable."""
        if self.record:
            raise ConfigError("lockstep: an episode that records its observations cannot be resumed")
        self.episodes[slot] = saved["episode"]
        self._reset(slot)
        track = self.tracks[slot]
        track.rew, track.total = list(saved["rewards"]), saved["total"]
        track.term, track.trunc = [False] * len(track.rew), [False] * len(track.rew)
        self.obs[slot] = np.asarray(saved["obs"], np.float32)
        self.prev_action[slot] = np.asarray(saved["prev_action"], np.float32)
        self.prev_reward[slot], self.first[slot] = saved["prev_reward"], saved["first"]


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
    `reset_seed(slot, episode)` seeds each reset. `unit_actions` and `record`: as `Lockstep`'s;
    `on_step(n)` hears the n env steps of each lockstep step (progress bars).
    """
    loop = Lockstep(envs, reset_seed, record=record, unit_actions=unit_actions)
    loop.advance(policy, episodes=episodes, steps=steps, on_step=on_step)
    loop.cut()
    return loop.finished
