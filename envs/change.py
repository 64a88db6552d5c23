"""The simulator's side of `<task>+change` (`mbrl.core.change`): the env wrapper that appends each observation's change
since the step before, and the registry entry whose reward and termination functions read the current observation."""

from __future__ import annotations

import gymnasium
import numpy as np

from mbrl.core.types import change_spec


class ObservedChange(gymnasium.Wrapper):
    """An env observed as [o_t, o_t - o_{t-1}]; after a reset, [o_0, 0]."""

    def __init__(self, env: gymnasium.Env):
        super().__init__(env)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = gymnasium.spaces.Box(np.concatenate([low, low - high]),
                                                      np.concatenate([high, high - low]),
                                                      dtype=env.observation_space.dtype)
        self._last = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._last = obs
        return np.concatenate([obs, np.zeros_like(obs)]), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        observed = np.concatenate([obs, obs - self._last])
        self._last = obs
        return observed, reward, terminated, truncated, info


def _on_current(fn, obs_dim: int):
    if fn is None:
        return None

    def current(obs, action, next_obs):
        return fn(obs[..., :obs_dim], action, next_obs[..., :obs_dim])

    return current


def change_task(base, make_task, register):
    """The registry entry `<base>+change` (`mbrl.envs.tasks` passes its `make_task` and `register`): the derived
    spec, the base's reward and termination functions on the current observation, and a Gymnasium id that wraps
    the base's env in `ObservedChange`."""
    spec = change_spec(base.spec)
    if spec.env_id is not None and spec.env_id not in gymnasium.registry:
        base_id = base.env_id
        gymnasium.register(id=spec.env_id, entry_point=lambda **kwargs: ObservedChange(gymnasium.make(base_id, **kwargs)))
    task = make_task(spec, _on_current(base.termination_fn, base.obs_dim), _on_current(base.reward_fn, base.obs_dim))
    return register(task, replace=True)
