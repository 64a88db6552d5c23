"""NeoRL-2's two MuJoCo tasks: RandomFrictionHopper and SafetyHalfCheetah.

Both run Gymnasium's v5 MuJoCo models (`hopper.xml`, `half_cheetah.xml`) and, unlike Gymnasium's
defaults, keep the root x position in the observation, so the forward velocity in the reward is
(next_obs x - obs x) / dt, computable from a transition. Written from NeoRL-2's definitions
(polixir/NeoRL2: `neorl2/envs/randomfrictionhopper.py`, `neorl2/envs/safetyhalfcheetah.py`, and the
reward/termination rules in `neorl2/envs/reward/` and `neorl2/envs/terminated/`).

RandomFrictionHopper: the hopper's foot friction is drawn anew each episode and appended to the
observation; the reward has no alive bonus. SafetyHalfCheetah: the usual run reward, replaced by a
penalty on any step whose forward velocity exceeds a speed limit; it never terminates.
"""

from __future__ import annotations

import gymnasium as gym
import jax.numpy as jnp
import numpy as np
from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv
from gymnasium.envs.mujoco.hopper_v5 import HopperEnv

# ----------------------------------------------------------------------------------------------------
# RandomFrictionHopper
# ----------------------------------------------------------------------------------------------------

# NeoRL2 neorl2/envs/randomfrictionhopper.py: the inner Hopper is built with
# exclude_current_positions_from_observation=False, so obs = qpos (6, rootx first), qvel clipped to
# [-10, 10] (6), then the episode's friction value (1): 13 dims.
HOPPER_OBS_NAMES = (
    "rootx", "rootz", "torso_angle", "thigh_angle", "leg_angle", "foot_angle",
    "rootx_vel", "rootz_vel", "torso_angvel", "thigh_angvel", "leg_angvel", "foot_angvel",
    "friction",
)
# Torques at the three hinges, in [-1, 1] (hopper.xml ctrlrange).
HOPPER_ACT_NAMES = ("thigh_torque", "leg_torque", "foot_torque")
# NeoRL2 neorl2/envs/reward/randomfrictionhopper_reward.py: dt = 0.008 (frame_skip 4 x timestep 0.002).
HOPPER_DT = 0.008
HOPPER_CONTROL_HZ = 1.0 / HOPPER_DT
# NeoRL2 neorl2/__init__.py: registered with max_episode_steps=1000.
HOPPER_EPISODE_STEPS = 1000
# NeoRL2 neorl2/envs/randomfrictionhopper.py: friction ~ U(1.5, 2.5) per episode (2.0 without
# randomisation, the value in hopper.xml); it replaces the foot geom's sliding friction.
HOPPER_FRICTION_RANGE = (1.5, 2.5)
HOPPER_DEFAULT_FRICTION = 2.0
_HOPPER_FRICTION_INDEX = 12
_HOPPER_VEL_CLIP = 10.0  # Gymnasium hopper_v5 _get_obs clips qvel
# NeoRL2 neorl2/envs/reward/randomfrictionhopper_reward.py: forward velocity minus 1e-3 |a|^2, no
# healthy reward (unlike Gymnasium's Hopper).
_HOPPER_CTRL_COST = 1e-3
# NeoRL2 neorl2/envs/terminated/randomfrictionhopper_terminated.py: healthy while next_obs z (index 1)
# is in (0.7, inf), the torso angle (index 2) in (-0.2, 0.2) and every later entry (index 3 on: joint
# angles, clipped velocities and the friction) in (-100, 100), all strict.
_HOPPER_Z_RANGE = (0.7, float("inf"))
_HOPPER_ANGLE_RANGE = (-0.2, 0.2)
_HOPPER_STATE_RANGE = (-100.0, 100.0)


def _within(xp, x, low, high):
    return xp.logical_and(low < x, x < high)


def hopper_reward(obs, action, next_obs):
    """NeoRL-2's RandomFrictionHopper reward: (x' - x) / dt - 1e-3 |a|^2, from obs/next_obs index 0.

    Exact rule; applied to float32 files it differs from the stored reward (computed by NeoRL-2 from
    float64 positions) only by the float32 rounding of x, amplified by 1/dt.
    """
    obs, action, next_obs = jnp.asarray(obs), jnp.asarray(action), jnp.asarray(next_obs)
    x_velocity = (next_obs[..., 0] - obs[..., 0]) / HOPPER_DT
    return x_velocity - _HOPPER_CTRL_COST * jnp.sum(jnp.square(action), axis=-1)


def hopper_terminated(obs, action, next_obs):
    """NeoRL-2's RandomFrictionHopper termination: next_obs leaves the healthy ranges (NaN terminates)."""
    del obs, action
    return jnp.logical_not(_hopper_healthy(jnp, jnp.asarray(next_obs)))


def _hopper_healthy(xp, next_obs):
    state_ok = xp.all(_within(xp, next_obs[..., 3:], *_HOPPER_STATE_RANGE), axis=-1)
    return (state_ok & _within(xp, next_obs[..., 1], *_HOPPER_Z_RANGE)
            & _within(xp, next_obs[..., 2], *_HOPPER_ANGLE_RANGE))


def _physical_friction(friction: float) -> float:
    # NeoRL2 neorl2/envs/randomfrictionhopper.py: the model file's friction is the drawn value written
    # with two decimals (hopper_friction_X.XX.xml), while the observation shows the drawn value unrounded.
    return float(f"{float(friction):.2f}")


class RandomFrictionHopperEnv(gym.Env):
    """NeoRL-2's RandomFrictionHopper: Gymnasium's Hopper-v5 with a random foot friction per episode.

    Observation (13, float32): qpos including rootx, qvel clipped to [-10, 10], and the episode's friction.
    Action: Box(-1, 1, (3,)) torques. Reward: forward velocity - 1e-3 |a|^2 (no alive bonus). Terminates
    when unhealthy (see `hopper_terminated`).

    `mode`: NeoRL-2 has no train/test split for this task; both modes draw the friction from U(1.5, 2.5)
    at each reset, as NeoRL-2 registers it and as its benchmark scores policies. `random_friction=False`
    fixes it at 2.0 (NeoRL-2's other option); `friction=` fixes it at a given value. As in NeoRL-2, the
    simulated friction is the drawn value rounded to two decimals, the observed one is the value itself.
    """

    metadata = {"render_modes": ["human", "rgb_array", "depth_array"]}

    def __init__(self, mode: str = "train", random_friction: bool = True, friction: float | None = None,
                 render_mode: str | None = None):
        if mode not in ("train", "test"):
            raise ValueError(f"mode must be 'train' or 'test', not {mode!r}")

        self.mode = mode
        self.random_friction = bool(random_friction)
        self._fixed_friction = None if friction is None else float(friction)
        self._sim = HopperEnv(exclude_current_positions_from_observation=False, render_mode=render_mode)
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "render_fps": self._sim.metadata["render_fps"]}
        self._foot = self._sim.model.geom("foot_geom").id
        self.action_space = self._sim.action_space
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (len(HOPPER_OBS_NAMES),), np.float32)
        self.friction = HOPPER_DEFAULT_FRICTION
        self._last_obs = None

    def _set_friction(self, friction: float) -> None:
        self.friction = float(friction)
        self._sim.model.geom_friction[self._foot, 0] = _physical_friction(friction)

    def _full_obs(self) -> np.ndarray:
        return np.append(self._sim._get_obs(), self.friction)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self._fixed_friction is not None:
            friction = self._fixed_friction
        elif self.random_friction:
            friction = self.np_random.uniform(*HOPPER_FRICTION_RANGE)
        else:
            friction = HOPPER_DEFAULT_FRICTION
        self._set_friction(friction)
        # The inner env draws its start state from our generator, so `seed` fixes the whole episode.
        self._sim.np_random = self.np_random
        _, info = self._sim.reset()
        self._last_obs = self._full_obs()
        return self._last_obs.astype(np.float32), {**info, "friction": self.friction}

    def set_state_from_obs(self, obs) -> None:
        """Put the hopper in the state a dataset row's `obs` describes (friction included).

        Velocities the obs shows clipped at +-10 are taken as +-10; MuJoCo's solver warm start is not
        part of the obs and keeps its current value.
        """
        obs = np.asarray(obs, np.float64)
        self._set_friction(obs[_HOPPER_FRICTION_INDEX])
        self._sim.set_state(obs[:6], obs[6:12])
        self._last_obs = self._full_obs()

    def step(self, action):
        if self._last_obs is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        action = np.asarray(action, np.float64)
        self._sim.step(action)
        obs = self._full_obs()
        # Same rule as hopper_reward / hopper_terminated, on NeoRL-2's float64 observations.
        x_velocity = (obs[0] - self._last_obs[0]) / HOPPER_DT
        reward = float(x_velocity - _HOPPER_CTRL_COST * np.sum(np.square(action)))
        terminated = not bool(_hopper_healthy(np, obs))
        self._last_obs = obs
        info = {"x_velocity": x_velocity, "friction": self.friction}
        return obs.astype(np.float32), reward, terminated, False, info

    def render(self):
        return self._sim.render()

    def close(self):
        self._sim.close()


def make_hopper_env(mode: str = "train", max_episode_steps: int = HOPPER_EPISODE_STEPS, **kwargs) -> gym.Env:
    """RandomFrictionHopper in a TimeLimit of NeoRL-2's 1000 steps."""
    return gym.wrappers.TimeLimit(RandomFrictionHopperEnv(mode=mode, **kwargs), max_episode_steps)


# ----------------------------------------------------------------------------------------------------
# SafetyHalfCheetah
# ----------------------------------------------------------------------------------------------------

# NeoRL2 neorl2/envs/safetyhalfcheetah.py: exclude_current_positions_from_observation=False, so
# obs = qpos (9, rootx first) then qvel (9, not clipped): 18 dims.
_CHEETAH_JOINTS = ("rootx", "rootz", "rooty", "bthigh", "bshin", "bfoot", "fthigh", "fshin", "ffoot")
CHEETAH_OBS_NAMES = tuple(f"{j}_pos" for j in _CHEETAH_JOINTS) + tuple(f"{j}_vel" for j in _CHEETAH_JOINTS)
CHEETAH_ACT_NAMES = ("bthigh", "bshin", "bfoot", "fthigh", "fshin", "ffoot")
# NeoRL2 neorl2/envs/reward/safetyhalfcheetah_reward.py: dt = 0.05 (frame_skip 5 x timestep 0.01).
CHEETAH_DT = 0.05
CHEETAH_CONTROL_HZ = 1.0 / CHEETAH_DT
# NeoRL2 neorl2/__init__.py: registered with max_episode_steps=1000.
CHEETAH_EPISODE_STEPS = 1000
# NeoRL2 neorl2/envs/reward/safetyhalfcheetah_reward.py: reward = vx - 0.1 |a|^2, but -100 on a step
# whose vx exceeds 3.2096 (the speed limit, also set in neorl2/envs/safetyhalfcheetah.py).
CHEETAH_VELOCITY_LIMIT = 3.2096
CHEETAH_OVERSPEED_REWARD = -100.0
_CHEETAH_CTRL_COST = 0.1


def cheetah_reward(obs, action, next_obs):
    """NeoRL-2's SafetyHalfCheetah reward: vx - 0.1 |a|^2 with vx = (x' - x) / dt, or -100 when vx > 3.2096.

    Exact rule; on float32 files the error is the float32 rounding of x (which grows with the distance
    run) amplified by 1/dt.
    """
    obs, action, next_obs = jnp.asarray(obs), jnp.asarray(action), jnp.asarray(next_obs)
    x_velocity = (next_obs[..., 0] - obs[..., 0]) / CHEETAH_DT
    run = x_velocity - _CHEETAH_CTRL_COST * jnp.sum(jnp.square(action), axis=-1)
    return jnp.where(x_velocity > CHEETAH_VELOCITY_LIMIT, CHEETAH_OVERSPEED_REWARD, run)


def cheetah_terminated(obs, action, next_obs):
    """Never: SafetyHalfCheetah episodes end only at the time limit.

    NeoRL2 neorl2/envs/safetyhalfcheetah.py steps with terminated=False (the speed limit is enforced
    by the reward alone); its `terminated/safetyhalfcheetah_terminated.py` would flag overspeed steps,
    but the env does not use it, and no row of the released files is overspeed.
    """
    del obs, action
    next_obs = jnp.asarray(next_obs)
    return jnp.zeros(next_obs.shape[:-1], dtype=bool)


class SafetyHalfCheetahEnv(gym.Env):
    """NeoRL-2's SafetyHalfCheetah: Gymnasium's HalfCheetah-v5 with rootx observed and a speed limit.

    Observation (18, float32): qpos including rootx, then qvel. Action: Box(-1, 1, (6,)) torques.
    Reward: see `cheetah_reward` (-100 on a step faster than 3.2096 m/s). Never terminates.

    `mode`: NeoRL-2 has no train/test split for this task; both modes are the same env.
    """

    metadata = {"render_modes": ["human", "rgb_array", "depth_array"]}

    def __init__(self, mode: str = "train", render_mode: str | None = None):
        if mode not in ("train", "test"):
            raise ValueError(f"mode must be 'train' or 'test', not {mode!r}")

        self.mode = mode
        self._sim = HalfCheetahEnv(exclude_current_positions_from_observation=False, render_mode=render_mode)
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "render_fps": self._sim.metadata["render_fps"]}
        self.action_space = self._sim.action_space
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (len(CHEETAH_OBS_NAMES),), np.float32)
        self._last_obs = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._sim.np_random = self.np_random
        obs, info = self._sim.reset()
        self._last_obs = obs
        return obs.astype(np.float32), info

    def set_state_from_obs(self, obs) -> None:
        """Put the cheetah in the state a dataset row's `obs` describes (the obs is the full qpos, qvel)."""
        obs = np.asarray(obs, np.float64)
        self._sim.set_state(obs[:9], obs[9:18])
        self._last_obs = self._sim._get_obs()

    def step(self, action):
        if self._last_obs is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        action = np.asarray(action, np.float64)
        obs = self._sim.step(action)[0]
        # Same rule as cheetah_reward, on NeoRL-2's float64 observations.
        x_velocity = (obs[0] - self._last_obs[0]) / CHEETAH_DT
        overspeed = x_velocity > CHEETAH_VELOCITY_LIMIT
        reward = CHEETAH_OVERSPEED_REWARD if overspeed else x_velocity - _CHEETAH_CTRL_COST * np.sum(np.square(action))
        self._last_obs = obs
        info = {"x_velocity": x_velocity, "cost": float(overspeed)}
        return obs.astype(np.float32), float(reward), False, False, info

    def render(self):
        return self._sim.render()

    def close(self):
        self._sim.close()


def make_cheetah_env(mode: str = "train", max_episode_steps: int = CHEETAH_EPISODE_STEPS, **kwargs) -> gym.Env:
    """SafetyHalfCheetah in a TimeLimit of NeoRL-2's 1000 steps."""
    return gym.wrappers.TimeLimit(SafetyHalfCheetahEnv(mode=mode, **kwargs), max_episode_steps)
