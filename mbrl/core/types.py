"""Core data types shared by every package: transitions, policy inputs and dataset metadata."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from flax import struct

from mbrl.core import declaration
from mbrl.core.score import normalized_score


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
    format: str  # "d4rl-hdf5" | "minari" | "neorl-npz" | "neorl2-npz"
    task: str | None  # a key of mbrl.envs.tasks.TASKS, when known
    obs_dim: int
    act_dim: int
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    ref_min_score: float | None = None
    ref_max_score: float | None = None

    def normalized_score(self, episode_return):
        """100 * (R - min) / (max - min); None when the reference scores are unknown."""
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
    # Held-out episodes released beside the data (NeoRL-2's `-val` file): the model fit's holdout and the
    # offline objective's data, so nothing is cut from the training set.
    heldout: OfflineDataset | None = None

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
    """Pure data about a task, usable without importing gymnasium or MuJoCo: a registry entry's spec.

    `mbrl.envs.tasks` adds the optional reward and termination functions and the env factory on top of it.
    `action_low`/`action_high` are one number for every dim or one per dim. Reference returns (a random
    policy's and an expert's) normalize a score; a dataset's own metadata takes precedence where it has them.
    `env_id` is the Gymnasium id that makes the task's simulator, None for a robot with no simulator.
    """

    name: str
    env_id: str | None
    obs_dim: int
    act_dim: int
    action_low: float | tuple[float, ...]
    action_high: float | tuple[float, ...]
    max_episode_steps: int
    ref_min_score: float | None = None
    ref_max_score: float | None = None
    control_hz: float | None = None
    obs_names: tuple[str, ...] | None = None
    act_names: tuple[str, ...] | None = None
    suite: str = ""  # "mujoco", "neorl2", "robot": where the task comes from
    obs_units: tuple[str, ...] | None = None
    act_units: tuple[str, ...] | None = None
    obs_low: tuple[float, ...] | None = None  # the declared range of each observation, where known
    obs_high: tuple[float, ...] | None = None
    declaration: str | None = None  # the TOML file a declared robot came from (mbrl.core.declaration)

    def action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(low, high), float32 arrays of act_dim."""
        return (np.broadcast_to(np.asarray(self.action_low, np.float32), (self.act_dim,)).copy(),
                np.broadcast_to(np.asarray(self.action_high, np.float32), (self.act_dim,)).copy())


# D4RL reference scores: d4rl/infos.py (REF_MIN_SCORE / REF_MAX_SCORE), Fu et al. 2020. Control rates: the
# v5 envs' dt (Hopper and Walker2d 0.008 s, HalfCheetah 0.05 s, Ant 0.05 s).
# NeoRL-2 (Gao et al. 2025, polixir/NeoRL2): dims and limits from its README and neorl2/__init__.py, reference
# scores from neorl2/envs/info.py, action spaces from each env's `action_space`.
_BUILTIN_SPECS = (
    TaskSpec("hopper", "Hopper-v5", 11, 3, -1.0, 1.0, 1000, -20.272305, 3234.3, 125.0, suite="mujoco"),
    TaskSpec("halfcheetah", "HalfCheetah-v5", 17, 6, -1.0, 1.0, 1000, -280.178953, 12135.0, 20.0, suite="mujoco"),
    TaskSpec("walker2d", "Walker2d-v5", 17, 6, -1.0, 1.0, 1000, 1.629008, 4592.3, 125.0, suite="mujoco"),
    TaskSpec("ant", "Ant-v5", 105, 8, -1.0, 1.0, 1000, -325.6, 3879.7, 20.0, suite="mujoco"),
    TaskSpec("DMSD", "NeoRL2/DMSD-v0", 6, 2, -1.0, 1.0, 100, 30.60, 849.51, 5.0, suite="neorl2"),
    TaskSpec("Pipeline", "NeoRL2/Pipeline-v0", 52, 1, -1.0, 1.0, 1000, -296.0, 751.0, suite="neorl2"),
    TaskSpec("RocketRecovery", "NeoRL2/RocketRecovery-v0", 7, 2, -1.0, 1.0, 500, -176.0, 208.0, suite="neorl2"),
    TaskSpec("RandomFrictionHopper", "NeoRL2/RandomFrictionHopper-v0", 13, 3, -1.0, 1.0, 1000, -3.0, 503.0, 125.0,
             suite="neorl2"),
    TaskSpec("SafetyHalfCheetah", "NeoRL2/SafetyHalfCheetah-v0", 18, 6, -1.0, 1.0, 1000, -283.0, 2507.0, 20.0,
             suite="neorl2"),
    TaskSpec("Simglucose", "NeoRL2/Simglucose-v0", 31, 1, -1.0, 1.0, 480, 9.75, 475.0, suite="neorl2"),
)

# The one registry of task specs, by name. Open: `register_spec` adds an entry (a robot a user declares).
TASK_SPECS: dict[str, TaskSpec] = {spec.name: spec for spec in _BUILTIN_SPECS}


def register_spec(spec: TaskSpec, replace: bool = False) -> TaskSpec:
    """Add `spec` to TASK_SPECS; the same spec again is a no-op, another spec under a taken name a ValueError
    unless `replace`."""
    known = TASK_SPECS.get(spec.name)
    if known is not None and known != spec and not replace:
        raise ValueError(f"task {spec.name!r} is already registered with another spec")
    TASK_SPECS[spec.name] = spec
    return spec


# `<task>+change`: the task observed as [o_t, o_t - o_{t-1}] (mbrl.core.change).
CHANGE_SUFFIX = "+change"


def change_spec(base: TaskSpec) -> TaskSpec:
    """`base` with each observation's change since the step before after it: twice the dims, the names repeated as
    "change of ...", the change's range from the observation's, the Gymnasium id `<namespace>/<Name>Change-v<N>`."""
    env_id = None
    if base.env_id is not None:
        head, sep, version = base.env_id.rpartition("-v")
        env_id = f"{head}Change-v{version}" if sep and version.isdigit() else f"{base.env_id}Change"
    low = None if base.obs_low is None or base.obs_high is None else np.asarray(base.obs_low, np.float64)
    high = None if low is None else np.asarray(base.obs_high, np.float64)
    return dataclasses.replace(
        base, name=f"{base.name}{CHANGE_SUFFIX}", env_id=env_id, obs_dim=2 * base.obs_dim,
        obs_names=None if base.obs_names is None else (*base.obs_names, *(f"change of {n}" for n in base.obs_names)),
        obs_units=None if base.obs_units is None else (*base.obs_units, *base.obs_units),
        obs_low=None if low is None else tuple(float(v) for v in np.concatenate([low, low - high])),
        obs_high=None if high is None else tuple(float(v) for v in np.concatenate([high, high - low])),
        declaration=None)


def declared_spec(decl) -> TaskSpec:
    """The spec of a robot's declaration (`mbrl.core.declaration.Declaration`)."""
    return TaskSpec(**decl.spec_fields())


def find_spec(name: str | None) -> TaskSpec | None:
    """The spec called `name`, case-insensitively ("dmsd" finds DMSD), else None.

    `name` may also be a robot's declaration file (`robot.toml`), or the name of one placed in
    `$MBRL_DATA_DIR/tasks/`; either is read, checked and registered here (a ConfigError if it is bad).
    """
    if not isinstance(name, str):
        return None

    if declaration.is_declaration_path(name):
        return register_spec(declared_spec(declaration.read_declaration(name)), replace=True)
    if name.lower().endswith(CHANGE_SUFFIX):
        base = find_spec(name[: -len(CHANGE_SUFFIX)])
        return None if base is None else register_spec(change_spec(base), replace=True)
    if name in TASK_SPECS:
        return TASK_SPECS[name]
    folded = {key.lower(): spec for key, spec in TASK_SPECS.items()}
    if name.lower() in folded:
        return folded[name.lower()]
    placed = declaration.find_declaration(name)
    return None if placed is None else register_spec(declared_spec(declaration.read_declaration(placed)), replace=True)
