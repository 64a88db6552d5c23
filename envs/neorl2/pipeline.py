"""NeoRL-2's Pipeline: steer a gate so that the flow at the far end of a channel meets a changing target.

The gate's flow moves by the action each step and reaches the outlet after a transport delay, so the
policy acts on a delayed system and sees a window of its own recent actions. Written from NeoRL-2's
definitions (polixir/NeoRL2, `neorl2/envs/pipline.py`, reward in `neorl2/envs/reward/pipeline_reward.py`).
The flow dynamics are deterministic; the only randomness is the start flow and the target's jumps.
An episode never terminates; it is truncated after `EPISODE_STEPS` steps.
"""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

# NeoRL2 neorl2/envs/pipline.py: 25 past outlet flows and 25 recent actions (history_obs_fps,
# history_action_fps), behind the outlet flow and the target.
HISTORY = 25
# Observation: outlet flow now, target now, outlet flow 1..25 steps ago (newest first),
# then the actions of this step and the 24 before it (newest first).
OBS_NAMES = ("flow_out", "flow_target") + tuple(f"flow_out_lag{i}" for i in range(1, HISTORY + 1)) \
    + tuple(f"gate_change_lag{i}" for i in range(HISTORY))
# The change of the gate's flow this step, in [-1, 1].
ACT_NAMES = ("gate_change",)
# Steps carry no time unit in NeoRL-2.
CONTROL_HZ = None
# NeoRL2 neorl2/__init__.py: Pipeline registered with max_episode_steps=1000.
EPISODE_STEPS = 1000

# NeoRL2 neorl2/envs/pipline.py: the channel's constants.
MAX_FLOW = 200.0  # flows are clipped to [0, 200]
DELAY = 100 // 5  # channel length 100 over pipe velocity 5: the outlet sees the gate's flow 20 steps late
TARGETS = (50, 80, 110, 140)  # the target is one of these
TARGET_JUMP_PROB = 0.003  # each step the target is redrawn from TARGETS with this probability
START_FLOW = (80.0, 120.0)  # the whole channel starts at one flow ~ U(80, 120)

# NeoRL2 neorl2/envs/pipline.py observation_space: flows in [0, 200], actions in [-1, 1].
OBS_LOW = (0.0,) * (2 + HISTORY) + (-1.0,) * HISTORY
OBS_HIGH = (MAX_FLOW,) * (2 + HISTORY) + (1.0,) * HISTORY


def reward(obs, action, next_obs) -> jax.Array:
    """((200 - |outlet flow - target|) / 100)^2 - 3, on the next observation.

    NeoRL2 neorl2/envs/reward/pipeline_reward.py, the file pipline.py imports; the other file,
    reward/pipline_reward.py, subtracts 0.01 * sum(action^2) instead of 3 and matches no released data.
    """
    del obs, action
    next_obs = jnp.asarray(next_obs)
    gap = jnp.abs(next_obs[..., 0] - next_obs[..., 1])
    return jnp.square((200.0 - gap) * 0.01) - 3.0


def terminated(obs, action, next_obs) -> jax.Array:
    """Never: NeoRL2 neorl2/envs/pipline.py's step always returns terminated False."""
    del obs, action
    return jnp.zeros(jnp.shape(next_obs)[:-1], dtype=bool)


def _reward_np(next_obs: np.ndarray) -> float:
    # The numpy twin of `reward`, in float32 like NeoRL-2's reward on its float32 observation.
    gap = np.abs(next_obs[0] - next_obs[1])
    return float(np.square((np.float32(200.0) - gap) * np.float32(0.01)) - np.float32(3.0))


class PipelineEnv(gym.Env):
    """NeoRL-2's Pipeline task.

    State: the gate's flows of the last 20 steps (the channel), the outlet-flow and action histories and
    the target; every part of it is determined by the observation (see `set_state_from_obs`).
    Step: the action (clipped to [-1, 1]) is added to the gate's flow (clipped to [0, 200]); the outlet
    shows the gate's flow of 19 steps before; then, with probability 0.003, the target jumps to one of
    50, 80, 110, 140. Arithmetic is float32, as in NeoRL-2, so a replay matches its files bit for bit.

    `reset(seed=s)` draws from `numpy.random.default_rng(s)` (gymnasium's `np_random`) in NeoRL-2's order:
    start flow, the target-jump check, the target. One difference: NeoRL-2 draws the first target when
    the env is built and carries each episode's last target into the next reset (unless the jump check
    fires); here each reset draws a fresh target, so `reset(seed=s)` does not depend on earlier episodes.
    `options={"target": x}` starts at target x instead and then draws exactly as NeoRL-2 does, which
    replays NeoRL-2's episode for seed s given its first target.

    NeoRL-2's Pipeline has no train/test modes; `make_env` accepts either and builds the same env.
    """

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = gym.spaces.Box(np.array(OBS_LOW, np.float32), np.array(OBS_HIGH, np.float32),
                                                dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self._gate = np.zeros(DELAY, np.float32)  # gate flows, newest first; the last one is at the outlet
        self._flows = np.zeros(HISTORY + 1, np.float32)  # outlet flows, now and 1..25 steps ago
        self._actions = np.zeros(HISTORY, np.float32)  # clipped actions, this step's first
        self._target = float(TARGETS[0])

    def _draw_target(self) -> float:
        return float(self.np_random.choice(TARGETS))

    def _observe(self) -> np.ndarray:
        return np.concatenate([self._flows[:1], np.float32([self._target]), self._flows[1:], self._actions])

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        start = np.float32(self.np_random.uniform(*START_FLOW))
        self._gate[:] = start
        self._flows[:] = start
        self._actions[:] = 0.0
        # NeoRL2 pipline.py get_target_flow_rate: the jump check is drawn even when a target is drawn anyway.
        jump = self.np_random.random() < TARGET_JUMP_PROB
        if options is not None and options.get("target") is not None and not jump:
            self._target = float(options["target"])
        else:
            self._target = self._draw_target()
        return self._observe(), {}

    def step(self, action):
        action = np.clip(np.asarray(action, dtype=np.float32).reshape(1), np.float32(-1.0), np.float32(1.0))
        if self.np_random.random() < TARGET_JUMP_PROB:
            self._target = self._draw_target()
        gate = np.clip(self._gate[0] + action[0], np.float32(0.0), np.float32(MAX_FLOW))
        self._gate = np.concatenate([np.float32([gate]), self._gate[:-1]])
        self._flows = np.concatenate([self._gate[-1:], self._flows[:-1]])
        self._actions = np.concatenate([action, self._actions[:-1]])
        next_obs = self._observe()
        return next_obs, _reward_np(next_obs), False, False, {}

    def set_state_from_obs(self, obs) -> None:
        """Put the env in the state a dataset row's `obs` shows.

        The outlet flow now is the gate's flow 19 steps ago; the 19 gate flows since then follow from it by
        replaying the observed actions of those steps (obs[45] down to obs[27]) through the gate's clip.
        """
        obs = np.asarray(obs, dtype=np.float32).reshape(2 + 2 * HISTORY)
        flow_now, lags, actions = obs[0], obs[2:2 + HISTORY], obs[2 + HISTORY:]
        gate = np.empty(DELAY, np.float32)
        gate[-1] = flow_now
        for i in range(DELAY - 2, -1, -1):  # gate[i] is the gate's flow i steps ago, set by actions[i]
            gate[i] = np.clip(gate[i + 1] + actions[i], np.float32(0.0), np.float32(MAX_FLOW))
        self._gate = gate
        self._flows = np.concatenate([[flow_now], lags]).astype(np.float32)
        self._actions = actions.copy()
        self._target = float(obs[1])


def make_env(mode: str = "train", **kwargs) -> gym.Env:
    """Pipeline truncated at 1000 steps; NeoRL-2 has no modes for it, so "train" and "test" are the same."""
    if mode not in ("train", "test"):
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    max_steps = kwargs.pop("max_episode_steps", EPISODE_STEPS)
    return gym.wrappers.TimeLimit(PipelineEnv(**kwargs), max_episode_steps=max_steps)
