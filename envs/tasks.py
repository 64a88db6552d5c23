"""The task registry: each task's spec, reward and termination functions, and env factory.

The numbers (dims, names, action bounds, episode limit, control rate, reference scores) live as pure data in
`mbrl.core.types.TASK_SPECS`; this module adds what needs gymnasium or JAX on top of them. The MuJoCo
benchmarks are defined here; NeoRL-2's tasks in `mbrl.envs.neorl2`.

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
import importlib
import re
from collections.abc import Callable
from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np

from mbrl.core import declaration
from mbrl.core.errors import ConfigError
from mbrl.core.types import TASK_SPECS, TaskSpec, declared_spec, find_spec, register_spec
from mbrl.core.change import base_name as change_base
from mbrl.envs import change, neorl2

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


RewardFn = Callable[[Any, Any, Any], jax.Array]


@dataclasses.dataclass(frozen=True)
class Task(TaskSpec):
    """A registry entry: a TaskSpec plus what needs gymnasium or JAX, each optional.

    `termination_fn(obs, action, next_obs) -> bool array` and `reward_fn(obs, action, next_obs) -> reward` work
    over the leading axes of `next_obs` in `jax.numpy`; imagination uses them instead of the model's learned
    ones. The env factory is `gymnasium.make(env_id)`; a task without `env_id` has no simulator.
    """

    termination_fn: TerminationFn | None = dataclasses.field(default=None, repr=False)
    reward_fn: RewardFn | None = dataclasses.field(default=None, repr=False)

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TaskSpec)})

    @property
    def has_env(self) -> bool:
        return self.env_id is not None

    def model_fns(self) -> dict[str, Callable | None]:
        """The keyword arguments that give a world model this task's reward and termination rules."""
        return {"termination_fn": self.termination_fn, "reward_fn": self.reward_fn}

    def make_env(self, **kwargs):
        """`gymnasium.make` of this task's id; kwargs (render_mode, max_episode_steps, ...) pass through."""
        if self.env_id is None:
            raise ConfigError(f"task {self.name!r} has no simulator (no env id); it cannot be evaluated or stepped here")
        return gymnasium.make(self.env_id, **kwargs)


def make_task(spec: TaskSpec, termination_fn: TerminationFn | None = None, reward_fn: RewardFn | None = None) -> Task:
    """A Task from its spec and functions, jitted once here: a direct call compiles per input shape; calls inside
    other jitted code inline it."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(TaskSpec)}
    return Task(**fields, termination_fn=None if termination_fn is None else jax.jit(termination_fn),
                reward_fn=None if reward_fn is None else jax.jit(reward_fn))


_TERMINATIONS: dict[str, TerminationFn] = {
    "hopper": hopper_termination,
    "halfcheetah": halfcheetah_termination,
    "walker2d": walker2d_termination,
    "ant": ant_termination,
}

# The one registry of tasks, by name: the MuJoCo benchmarks, NeoRL-2's tasks (`mbrl.envs.neorl2`), and any task
# `register` adds (a user's robot).
TASKS: dict[str, Task] = {name: make_task(spec, _TERMINATIONS.get(name)) for name, spec in TASK_SPECS.items()}


def register(task: Task, replace: bool = False) -> Task:
    """Add `task` to the registry (and its spec to TASK_SPECS, which the dataset loaders read); `replace`
    lets it stand in for the entry of the same name."""
    register_spec(task.spec, replace=replace)
    TASKS[task.name] = task
    return task


def _register_neorl2() -> None:
    for entry in neorl2.ENTRIES:
        module = importlib.import_module(f"mbrl.envs.neorl2.{entry.module}")
        # The module knows the names and the control rate; the rest of the spec is core data.
        spec = dataclasses.replace(TASK_SPECS[entry.name], obs_names=tuple(getattr(module, entry.attr("OBS_NAMES"))),
                                   act_names=tuple(getattr(module, entry.attr("ACT_NAMES"))),
                                   control_hz=getattr(module, entry.attr("CONTROL_HZ")))
        register(make_task(spec, getattr(module, entry.attr("terminated")), getattr(module, entry.attr("reward"))),
                 replace=True)
        if spec.env_id not in gymnasium.registry:
            gymnasium.register(id=spec.env_id, entry_point=f"mbrl.envs.neorl2.{entry.module}:{entry.env_class}",
                               max_episode_steps=spec.max_episode_steps, kwargs=dict(entry.env_kwargs))


_register_neorl2()


def get_task(name: str) -> Task:
    """The task called `name` (a key of TASKS, its case ignored), a robot's declaration file (`robot.toml`), or a
    declaration placed in `$MBRL_DATA_DIR/tasks/`, each optionally followed by `+change` (`mbrl.envs.change`);
    a ConfigError listing the valid names otherwise."""
    spec = find_spec(name)
    base = change_base(spec.name) if spec is not None else None
    if base is not None:
        known = TASKS.get(spec.name)
        return known if known is not None and known.spec == spec else change.change_task(get_task(base), make_task, register)
    if spec is not None and spec.declaration is not None:
        known = TASKS.get(spec.name)
        if known is not None and known.spec == spec:
            return known
        return register(declared_task(declaration.read_declaration(spec.declaration)), replace=True)
    if spec is not None and spec.name in TASKS:
        return TASKS[spec.name]
    raise ConfigError(f"unknown task {name!r}: expected one of {', '.join(TASKS)}, or a robot's declaration (.toml)")


def find_task(name: str | None) -> Task | None:
    """`get_task(name)`, or None for no name or one no registry knows (a dataset whose task nobody registered); a
    declared robot whose declaration or functions are bad raises."""
    spec = find_spec(name) if name else None
    if spec is None:
        return None
    return get_task(spec.declaration or spec.name)


def declared_task(decl: declaration.Declaration) -> Task:
    """A declared robot's registry entry: its spec, and its reward and termination functions, imported and checked
    on a batch of zeros (jax.numpy on obs, action, next_obs)."""
    fns = {}
    for key in ("reward", "termination"):
        ref = getattr(decl, key)
        if ref is None:
            continue
        fn = _import_function(ref, decl.path, key)
        obs, act = np.zeros((3, decl.obs_dim), np.float32), np.zeros((3, decl.act_dim), np.float32)
        try:
            out = jnp.asarray(jax.jit(fn)(obs, act, obs))
        except Exception as exc:  # noqa: BLE001 - whatever the user's function raises, named with its file
            raise ConfigError(f"{decl.path}: field {key!r} = {ref!r} fails on a batch of 3 zero transitions "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
        if out.shape != (3,):
            raise ConfigError(f"{decl.path}: field {key!r} = {ref!r} returns shape {tuple(out.shape)} for a batch of 3 "
                              f"transitions; expected (3,): one value per transition")
        fns[key] = fn
    return make_task(declared_spec(decl), fns.get("termination"), fns.get("reward"))


def _import_function(ref: str, path, key: str):
    try:
        fn = declaration.import_reference(ref)
    except Exception as exc:  # noqa: BLE001 - an import that fails is the declaration's problem
        raise ConfigError(f"{path}: field {key!r} = {ref!r} does not import "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
    if not callable(fn):
        raise ConfigError(f"{path}: field {key!r} = {ref!r} is not a function")
    return fn


_ENV_ID = re.compile(r"^(?:.*/)?(?P<name>[A-Za-z0-9_]+)-v(?P<version>\d+)$")


def task_for_env_id(env_id: str) -> Task | None:
    """The task whose Gymnasium id is `env_id` ("Hopper-v5" -> hopper, "NeoRL2/DMSD-v0" -> DMSD), or None.

    For the MuJoCo tasks a namespace prefix ("mujoco/Hopper-v5") is ignored. Only v5 ids map to them: other
    versions have other observation layouts or health checks (Ant-v4 omits contact forces by default), so
    the termination function and dims here would not describe them.
    """
    if not isinstance(env_id, str):
        return None
    for task in TASKS.values():
        if task.env_id is not None and task.env_id == env_id.strip():
            return task
    match = _ENV_ID.match(env_id.strip())
    if match is None:
        return None
    bare_id = f"{match['name']}-v{match['version']}"
    for task in TASKS.values():
        if task.suite == "mujoco" and task.env_id == bare_id:
            return task
    return None
