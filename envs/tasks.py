"""The task registry: Gymnasium MuJoCo v5 ids, env factories and termination functions.

The numbers (dims, action bounds, episode limit, D4RL reference scores) live as pure data in
`mbrl.core.types.TASK_SPECS`; this module adds what needs gymnasium or JAX on top of them.

Termination functions decide `terminated` from an observed transition, as the real env does after
its step, so that imagined rollouts stop where the real robot would have fallen. They are written
from Gymnasium's v5 sources (gymnasium/envs/mujoco/<task>_v5.py, `is_healthy`) with the DEFAULT env
parameters and the default observation layout (`exclude_current_positions_from_observation=True`,
so the x position (and y for ant) is absent and the obs starts at qpos[1] (qpos[2] for ant)).

They work on any leading batch axes, are pure `jax.numpy` (jittable, vmappable) and compare in the
input's floating precision. Arrays are float32 in this project, so a state within ~1e-7 of a
boundary may be judged differently than the env judges its float64 state.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from mbrl.core.errors import ConfigError
from mbrl.core.types import TASK_SPECS, TaskSpec

TerminationFn = Callable[[Any, Any, Any], jax.Array]


def _strictly_within(x, low: float, high: float):
    return jnp.logical_and(low < x, x < high)


# Hopper-v5 `is_healthy`: z = qpos[1] in (0.7, inf), angle = qpos[2] in (-0.2, 0.2), and every entry of
# state_vector()[2:] (qpos[2:] and qvel) in (-100, 100), all strict. In the obs, qpos[1:] sits at
# [0:5] and qvel at [5:11], clipped to [-10, 10] by `_get_obs`, so the |qvel| > 100 case cannot be seen
# from the obs; the clipped values always pass, as written here. NaN fails every comparison, so a NaN
# state terminates, as in the env. OfflineRL-Kit (offlinerlkit/utils/termination_fns.py) writes
# `np.abs(next_obs[:, 1:] < 100)`, the abs of a bool: it misses the lower bound -100; we compare values.
_HOPPER_Z_RANGE = (0.7, float("inf"))
_HOPPER_ANGLE_RANGE = (-0.2, 0.2)
_HOPPER_STATE_RANGE = (-100.0, 100.0)


def hopper_termination(obs, action, next_obs) -> jax.Array:
    del obs, action
    next_obs = jnp.asarray(next_obs)
    z, angle = next_obs[..., 0], next_obs[..., 1]
    healthy_state = jnp.all(_strictly_within(next_obs[..., 1:], *_HOPPER_STATE_RANGE), axis=-1)
    healthy = healthy_state & _strictly_within(z, *_HOPPER_Z_RANGE) & _strictly_within(angle, *_HOPPER_ANGLE_RANGE)
    return jnp.logical_not(healthy)


# Walker2d-v5 `is_healthy`: z = qpos[1] in (0.8, 2.0) and angle = qpos[2] in (-1, 1), strict.
# Obs [0] and [1] hold them. No state-range check in v5.
_WALKER_Z_RANGE = (0.8, 2.0)
_WALKER_ANGLE_RANGE = (-1.0, 1.0)


def walker2d_termination(obs, action, next_obs) -> jax.Array:
    del obs, action
    next_obs = jnp.asarray(next_obs)
    healthy = _strictly_within(next_obs[..., 0], *_WALKER_Z_RANGE) & _strictly_within(
        next_obs[..., 1], *_WALKER_ANGLE_RANGE
    )
    return jnp.logical_not(healthy)


# Ant-v5 `is_healthy`: state_vector() (qpos, qvel) all finite and z = qpos[2] in [0.2, 1.0], INCLUSIVE
# (unlike hopper and walker2d). The default obs is qpos[2:] (13), qvel (14, not clipped), then the
# clipped contact forces cfrc_ext[1:] (78) = 105; the state part the env checks is obs[0:27].
_ANT_Z_RANGE = (0.2, 1.0)
_ANT_STATE_DIM = 13 + 14


def ant_termination(obs, action, next_obs) -> jax.Array:
    del obs, action
    next_obs = jnp.asarray(next_obs)
    z = next_obs[..., 0]
    finite = jnp.all(jnp.isfinite(next_obs[..., :_ANT_STATE_DIM]), axis=-1)
    healthy = finite & (_ANT_Z_RANGE[0] <= z) & (z <= _ANT_Z_RANGE[1])
    return jnp.logical_not(healthy)


# HalfCheetah-v5 never terminates; its episodes end only by the time limit.
def halfcheetah_termination(obs, action, next_obs) -> jax.Array:
    del obs, action
    next_obs = jnp.asarray(next_obs)
    return jnp.zeros(next_obs.shape[:-1], dtype=bool)


@dataclasses.dataclass(frozen=True)
class Task(TaskSpec):
    """A TaskSpec plus what needs gymnasium or JAX: an env factory and a termination function.

    `termination_fn(obs, action, next_obs) -> bool array` over the leading axes of `next_obs`.
    """

    termination_fn: TerminationFn = dataclasses.field(repr=False)

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TaskSpec)})

    def make_env(self, **kwargs):
        """`gymnasium.make` of this task's v5 id; kwargs (render_mode, max_episode_steps, ...) pass through."""
        import gymnasium

        return gymnasium.make(self.env_id, **kwargs)


def _task(spec: TaskSpec, termination_fn: TerminationFn) -> Task:
    # Jitted once here: a direct call compiles per input shape; calls inside other jitted code inline it.
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(TaskSpec)}
    return Task(**fields, termination_fn=jax.jit(termination_fn))


_TERMINATIONS: dict[str, TerminationFn] = {
    "hopper": hopper_termination,
    "halfcheetah": halfcheetah_termination,
    "walker2d": walker2d_termination,
    "ant": ant_termination,
}

TASKS: dict[str, Task] = {name: _task(TASK_SPECS[name], fn) for name, fn in _TERMINATIONS.items()}


def get_task(name: str) -> Task:
    """The task called `name` (a key of TASKS); a ConfigError listing the valid names otherwise."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown task {name!r}: expected one of {', '.join(sorted(TASKS))}") from None


_ENV_ID = re.compile(r"^(?:.*/)?(?P<name>[A-Za-z0-9_]+)-v(?P<version>\d+)$")


def task_for_env_id(env_id: str) -> Task | None:
    """The task whose Gymnasium id is `env_id` ("Hopper-v5" -> hopper), or None when it is not one of ours.

    A namespace prefix ("mujoco/Hopper-v5") is ignored. Only v5 ids map to a task: other versions have
    other observation layouts or health checks (Ant-v4 omits contact forces by default), so the
    termination function and dims here would not describe them.
    """
    match = _ENV_ID.match(env_id.strip()) if isinstance(env_id, str) else None
    if match is None:
        return None
    bare_id = f"{match['name']}-v{match['version']}"
    for task in TASKS.values():
        if task.env_id == bare_id:
            return task
    return None
