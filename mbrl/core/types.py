"""Core data types shared by every package: transitions, policy inputs and dataset metadata."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from flax import struct


@struct.dataclass
class Transitions:
    """A batch of transitions as a pytree of arrays with a common leading axis.

    Works with numpy arrays (on the host, as loaded) and jax arrays (on the device);
    `jax.tree.map` and `jax.device_put` apply to all fields at once.

    - obs, next_obs: float32 (N, obs_dim)
    - action: float32 (N, act_dim)
    - reward: float32 (N,)
    - terminal: bool (N,), the environment ended the episode (no bootstrap)
    - timeout: bool (N,), the episode was cut by a time limit after this step (bootstrap)
    """

    obs: Any
    action: Any
    reward: Any
    next_obs: Any
    terminal: Any
    timeout: Any

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    @property
    def obs_dim(self) -> int:
        return int(self.obs.shape[-1])

    @property
    def act_dim(self) -> int:
        return int(self.action.shape[-1])

    @classmethod
    def from_arrays(cls, obs, action, reward, next_obs, terminal, timeout) -> Transitions:
        """Build host transitions with the canonical dtypes."""
        return cls(
            obs=np.asarray(obs, dtype=np.float32),
            action=np.asarray(action, dtype=np.float32),
            reward=np.asarray(reward, dtype=np.float32).reshape(-1),
            next_obs=np.asarray(next_obs, dtype=np.float32),
            terminal=np.asarray(terminal).astype(bool).reshape(-1),
            timeout=np.asarray(timeout).astype(bool).reshape(-1),
        )

    def slice(self, index) -> Transitions:
        """Rows selected by a slice, an index array or a boolean mask."""
        return Transitions(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))

    @staticmethod
    def concatenate(parts: list[Transitions]) -> Transitions:
        return Transitions(
            *(np.concatenate([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(Transitions))
        )


@struct.dataclass
class PolicyInput:
    """What a policy sees at one step, for B trajectories (numpy on the host, jax in compiled code).

    Markov policies read `obs` only; recurrent ones also read the previous action and reward, and reset
    their memory where `first` is True.
    """

    obs: Any  # (B, obs_dim)
    prev_action: Any  # (B, act_dim), zeros at an episode's first step
    prev_reward: Any  # (B,), the raw reward of the previous step, zero at an episode's first step
    first: Any  # (B,) bool: first step of an episode (a recurrent memory should reset)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Where a dataset came from and what it is for.

    Reference scores turn a return into a normalized score (D4RL's convention):
    100 * (return - ref_min_score) / (ref_max_score - ref_min_score).
    """

    name: str
    source: str  # path or `minari:ID`
    format: str  # "d4rl-hdf5" | "minari" | "neorl-npz"
    task: str | None  # a key of envs.tasks.TASKS, when known
    obs_dim: int
    act_dim: int
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    ref_min_score: float | None = None
    ref_max_score: float | None = None

    def normalized_score(self, episode_return):
        """100 * (R - min) / (max - min); None when the reference scores are unknown."""
        from mbrl.core.score import normalized_score

        if self.ref_min_score is None or self.ref_max_score is None:
            return None
        return normalized_score(episode_return, self.ref_min_score, self.ref_max_score)


@dataclasses.dataclass
class OfflineDataset:
    """A validated dataset on the host.

    `episode_starts` holds the row of `transitions` where each episode begins (sorted, first is 0),
    so episode i spans rows [episode_starts[i], episode_starts[i+1]).
    """

    transitions: Transitions
    episode_starts: np.ndarray
    info: DatasetInfo

    def __len__(self) -> int:
        return len(self.transitions)

    @property
    def num_episodes(self) -> int:
        return int(len(self.episode_starts))

    def episode_returns(self) -> np.ndarray:
        """Sum of rewards per episode (float64)."""
        if len(self.transitions) == 0:
            return np.zeros(0)
        return np.add.reduceat(self.transitions.reward.astype(np.float64), self.episode_starts)

    def episode_lengths(self) -> np.ndarray:
        bounds = np.append(self.episode_starts, len(self.transitions))
        return np.diff(bounds)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Pure data about a task, usable without importing gymnasium or MuJoCo.

    `envs.tasks` adds the env factory and the termination function on top of this.
    Reference returns are D4RL's (random / expert), used for D4RL-layout files; a dataset's own
    metadata takes precedence where it has reference scores.
    """

    name: str
    env_id: str
    obs_dim: int
    act_dim: int
    action_low: float
    action_high: float
    max_episode_steps: int
    d4rl_ref_min_score: float
    d4rl_ref_max_score: float


# D4RL reference scores: d4rl/infos.py (REF_MIN_SCORE / REF_MAX_SCORE), Fu et al. 2020.
TASK_SPECS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("hopper", "Hopper-v5", 11, 3, -1.0, 1.0, 1000, -20.272305, 3234.3),
        TaskSpec("halfcheetah", "HalfCheetah-v5", 17, 6, -1.0, 1.0, 1000, -280.178953, 12135.0),
        TaskSpec("walker2d", "Walker2d-v5", 17, 6, -1.0, 1.0, 1000, 1.629008, 4592.3),
        TaskSpec("ant", "Ant-v5", 105, 8, -1.0, 1.0, 1000, -325.6, 3879.7),
    )
}
