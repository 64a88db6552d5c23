"""NeoRL-2's DMSD: two masses in series between two walls, joined by three springs and three dampers.

Each action component pushes one mass; the policy must bring both masses to their target positions.
Written from NeoRL-2's definitions (polixir/NeoRL2, `neorl2/envs/dmsd.py`, reward in
`neorl2/envs/reward/dmsd_reward.py`); the system itself is Ian Char's (GPIDE). The dynamics are
deterministic: an explicit-Euler step of the linear system, with no process or sensor noise. An episode
never terminates; it is truncated after `EPISODE_STEPS` steps.
"""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

# Observation: both positions, both velocities, both current targets.
# NeoRL2 neorl2/envs/dmsd.py: the obs is the full observation's X, V, T blocks picked as [0, 1, 10, 11, 8, 9].
OBS_NAMES = ("x1", "x2", "v1", "v2", "target1", "target2")
# Normalised forces on mass 1 and mass 2, in [-1, 1].
ACT_NAMES = ("force1", "force2")
# NeoRL2 neorl2/envs/dmsd.py: dt = 0.2 s a step.
CONTROL_HZ = 5.0
# NeoRL2 neorl2/__init__.py: DMSD registered with max_episode_steps=100.
EPISODE_STEPS = 100

# NeoRL2 neorl2/envs/dmsd.py (constructor defaults, as registered): the physical constants.
DT = 0.2
DAMPING = 4.0  # d1 = d2 = d3
STIFFNESS = 2.0  # k1 = k2 = k3
MASS = {"train": 20.0, "test": 30.0}  # m1 = m2; test mode swaps the mass bounds to (30, 30)
FORCE_MAX = 30.0  # force bounds (-30, 30), reached from the action by an affine map of [-1, 1]
TARGET_BOUND = 1.5  # each target ~ U(-1.5, 1.5)
START_POSITION_BOUND = 0.25  # each start position ~ U(-0.25, 0.25)
START_VELOCITY_BOUND = 0.1  # each start velocity ~ U(-0.1, 0.1)
MAX_TARGETS_PER_EPISODE = 2  # per mass: 1 or 2 targets, the episode split evenly between them
# NeoRL2 neorl2/envs/reward/dmsd_reward.py: the 0.01 inside the log bounds the reward per mass by -log(0.01).
_REWARD_EPS = 0.01


def reward(obs, action, next_obs) -> jax.Array:
    """Sum over both masses of -log(|position - target| + 0.01), on the next observation.

    NeoRL2 neorl2/envs/reward/dmsd_reward.py: positions are next_obs[:2], targets next_obs[-2:].
    """
    del obs, action
    next_obs = jnp.asarray(next_obs)
    err = jnp.abs(next_obs[..., 0:2] - next_obs[..., 4:6])
    return jnp.sum(-jnp.log(err + _REWARD_EPS), axis=-1)


def terminated(obs, action, next_obs) -> jax.Array:
    """Never: NeoRL2 neorl2/envs/dmsd.py's step always returns terminated False."""
    del obs, action
    return jnp.zeros(jnp.shape(next_obs)[:-1], dtype=bool)


def _reward_np(next_obs: np.ndarray) -> float:
    # The numpy twin of `reward` in float32, as NeoRL-2 scores its float32-cast observation.
    err = np.abs(next_obs[0:2] - next_obs[4:6])
    return float(np.sum(-np.log(err + np.float32(_REWARD_EPS)), dtype=np.float32))


def _transition_matrix(mass: float) -> np.ndarray:
    """The Euler step of [x1, x2, v1, v2] with equal dampers, springs and masses (NeoRL2 dmsd.py, reset)."""
    c, k, m, dt = DAMPING, STIFFNESS, mass, DT
    # Spring and damper 2 couple the masses; 1 and 3 tie each mass to its wall.
    return np.array([
        [1.0, 0.0, dt, 0.0],
        [0.0, 1.0, 0.0, dt],
        [-dt * 2 * k / m, dt * k / m, 1.0 - dt * 2 * c / m, dt * c / m],
        [dt * k / m, -dt * 2 * k / m, dt * c / m, 1.0 - dt * 2 * c / m],
    ])


class DMSDEnv(gym.Env):
    """NeoRL-2's DMSD task.

    Observation (float32): positions x1, x2, velocities v1, v2, and the current targets of both masses.
    Action: two normalised forces in [-1, 1] (clipped), each scaled to [-30, 30] N on its mass.
    Reward: `reward` on the next observation. Never terminates; `make_env` truncates at 100 steps.

    Each episode draws, per mass, one or two targets in [-1.5, 1.5] (with two, the second takes over at
    step 50, and the observation after step 50 shows it), start positions in [-0.25, 0.25] and start
    velocities in [-0.1, 0.1]. `reset(seed=s)` draws them from `numpy.random.RandomState(s)` in NeoRL-2's
    order, so it gives the same episode as NeoRL-2's `reset(seed=s)`: the released files' episode i was
    collected with seed i. `reset()` without a seed continues this env's stream.

    mode: "train" (masses of 20 kg, NeoRL-2's default, in which its datasets were collected and its
    policies scored) or "test" (masses of 30 kg, NeoRL-2's held-out variant); nothing else differs.
    """

    metadata = {"render_modes": []}

    def __init__(self, mode: str = "train"):
        if mode not in MASS:
            raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
        self.mode = mode
        self.mass = MASS[mode]
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(6,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self._matrix = _transition_matrix(self.mass)
        self._rs: np.random.RandomState | None = None
        self._state = np.zeros(4)  # [x1, x2, v1, v2], float64 as in NeoRL-2
        self._targets = np.zeros((EPISODE_STEPS, 2))  # the target schedule, one row per step
        self._t = 0
        self._obs = np.zeros(6, dtype=np.float32)

    # -- episode draws ------------------------------------------------------------------------------------
    def _draw_episode(self, rs: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
        # NeoRL2 neorl2/envs/dmsd.py reset: task (8 draws: 3 dampers, 3 springs, 2 masses, all with equal
        # bounds, so constant here but still consuming the stream), then targets, then the start state.
        rs.uniform(size=8)
        targets = np.empty((EPISODE_STEPS, 2))
        for j in range(2):
            count = rs.randint(1, MAX_TARGETS_PER_EPISODE + 1)
            length = EPISODE_STEPS // count
            for n in range(count):
                stop = EPISODE_STEPS if n == count - 1 else (n + 1) * length
                targets[n * length:stop, j] = rs.uniform(-TARGET_BOUND, TARGET_BOUND)
        positions = [rs.uniform(-START_POSITION_BOUND, START_POSITION_BOUND) for _ in range(2)]
        velocities = [rs.uniform(-START_VELOCITY_BOUND, START_VELOCITY_BOUND) for _ in range(2)]
        return np.array(positions + velocities), targets

    def _target(self) -> np.ndarray:
        # NeoRL2 dmsd.py `target`: the schedule's row at the current step, held at the last row after it.
        return self._targets[min(self._t, EPISODE_STEPS - 1)]

    def _observe(self) -> np.ndarray:
        return np.concatenate([self._state, self._target()]).astype(np.float32)

    # -- gymnasium API ------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rs = np.random.RandomState(seed)
        elif self._rs is None:
            self._rs = np.random.RandomState(int(self.np_random.integers(2**32)))
        self._state, self._targets = self._draw_episode(self._rs)
        self._t = 0
        self._obs = self._observe()
        return self._obs.copy(), {"target": self._target().copy()}

    def step(self, action):
        action = np.clip(np.asarray(action, dtype=np.float32).reshape(2), -1.0, 1.0)
        # NeoRL2 dmsd.py step: force = (a + 1) / 2 * (30 - (-30)) - 30, computed in the action's float32.
        force = (action + np.float32(1.0)) / np.float32(2.0) * np.float32(2 * FORCE_MAX) - np.float32(FORCE_MAX)
        self._t += 1
        state = self._matrix @ self._state
        state[2:] += DT / self.mass * force.astype(np.float64)
        self._state = state
        next_obs = self._observe()
        r = _reward_np(next_obs)
        self._obs = next_obs
        return next_obs.copy(), r, False, False, {"target": self._target().copy()}

    def set_state_from_obs(self, obs) -> None:
        """Put the env in the state a dataset row's `obs` shows: positions, velocities, and its targets.

        The targets are held for the rest of the episode (as NeoRL-2's `set_obs` does), so a step from a
        row just before a scheduled target change shows the old target where the file shows the new one.
        """
        obs = np.asarray(obs, dtype=np.float64).reshape(6)
        self._state = obs[:4].copy()
        self._targets = np.tile(obs[4:6], (EPISODE_STEPS, 1))
        self._t = 0
        self._obs = obs.astype(np.float32)


def make_env(mode: str = "train", **kwargs) -> gym.Env:
    """DMSD in `mode` ("train" or "test"), truncated at 100 steps."""
    max_steps = kwargs.pop("max_episode_steps", EPISODE_STEPS)
    return gym.wrappers.TimeLimit(DMSDEnv(mode=mode, **kwargs), max_episode_steps=max_steps)
