"""The task registry and its termination functions, checked against the real MuJoCo v5 envs."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl.datasets import load
from mbrl.envs.tasks import TASKS, Task, get_task, make_task, register, task_for_env_id
from mbrl.core.errors import ConfigError
from mbrl.core.types import TASK_SPECS, TaskSpec

TRANSITIONS_PER_TASK = 5_000
# The MuJoCo benchmarks, whose health checks are tested against the env's own `is_healthy`; NeoRL-2's tasks are
# tested against their released files in tests/test_neorl2_*.py.
MUJOCO_TASKS = sorted(name for name, task in TASKS.items() if task.suite == "mujoco")


def _collect(task: Task, seed: int) -> dict[str, np.ndarray]:
    """Real `env.step` transitions under uniform random actions, resetting whenever an episode ends.

    Hopper and walker2d fall often under random actions. Ant rarely does, so each of its episodes
    starts from a perturbed state (height and a vertical velocity that makes it leap above 1.0 or
    slam below 0.2) set through the env, and lasts at most 30 steps; every transition still comes
    from the env's own step.
    """
    env = task.make_env()
    sim = env.unwrapped
    rng = np.random.default_rng(seed)
    obs_rows, act_rows, next_rows, terminated_rows = [], [], [], []
    episode = 0
    while len(obs_rows) < TRANSITIONS_PER_TASK:
        obs, _ = env.reset(seed=seed + episode)
        episode += 1
        horizon = task.max_episode_steps
        if task.name == "ant":
            qpos, qvel = sim.data.qpos.copy(), rng.normal(0.0, 1.0, sim.model.nv)
            qpos[2] = rng.uniform(0.25, 0.95)
            qvel[2] = rng.uniform(-40.0, 8.0)
            sim.set_state(qpos, qvel)
            obs = sim._get_obs()
            horizon = 30
        for _ in range(horizon):
            action = rng.uniform(-1.0, 1.0, task.act_dim)
            next_obs, _, terminated, truncated, _ = env.step(action)
            obs_rows.append(obs)
            act_rows.append(action)
            next_rows.append(next_obs)
            terminated_rows.append(terminated)
            obs = next_obs
            if terminated or truncated:
                break
    env.close()
    return {
        "obs": np.asarray(obs_rows, np.float32),
        "action": np.asarray(act_rows, np.float32),
        "next_obs": np.asarray(next_rows, np.float32),
        "terminated": np.asarray(terminated_rows, bool),
    }


@pytest.fixture(scope="module", params=MUJOCO_TASKS)
def rollout(request):
    task = TASKS[request.param]
    return task, _collect(task, seed=1000)


def test_termination_agrees_exactly_with_the_real_env(rollout):
    task, data = rollout
    assert len(data["terminated"]) >= TRANSITIONS_PER_TASK
    predicted = np.asarray(task.termination_fn(data["obs"], data["action"], data["next_obs"]))
    assert predicted.dtype == bool and predicted.shape == data["terminated"].shape
    mismatches = np.flatnonzero(predicted != data["terminated"])
    assert mismatches.size == 0, f"{task.name}: disagree on rows {mismatches[:10]} of {len(predicted)}"

    terminals = int(data["terminated"].sum())
    if task.name == "halfcheetah":
        assert terminals == 0
    else:
        assert terminals >= 100, f"{task.name}: only {terminals} terminal transitions, too few to test"
    if task.name == "ant":  # both ways out of the healthy range happen
        z = data["next_obs"][data["terminated"], 0]
        assert (z < 0.2).sum() >= 10 and (z > 1.0).sum() >= 10


def test_termination_keeps_leading_axes_and_composes_with_jit_and_vmap(rollout):
    task, data = rollout
    n = 4_000
    obs, act, nxt = (data[k][:n].reshape(2, n // 2, -1) for k in ("obs", "action", "next_obs"))
    expected = data["terminated"][:n].reshape(2, n // 2)

    assert np.array_equal(np.asarray(task.termination_fn(obs, act, nxt)), expected)
    vmapped = jax.jit(jax.vmap(task.termination_fn))(jnp.asarray(obs), jnp.asarray(act), jnp.asarray(nxt))
    assert np.array_equal(np.asarray(vmapped), expected)
    single = task.termination_fn(obs[0, 0], act[0, 0], nxt[0, 0])
    assert single.shape == () and bool(single) == bool(expected[0, 0])


# (task, qpos index or ("qvel", index), boundary value). Hopper and walker2d use strict ranges, ant an
# inclusive one; the exact boundary value is part of each case.
_BOUNDARIES = [
    ("hopper", 1, 0.7),  # z
    ("hopper", 2, -0.2),  # angle
    ("hopper", 2, 0.2),
    ("hopper", 3, -100.0),  # state range, on a joint position
    ("hopper", 4, 100.0),
    ("walker2d", 1, 0.8),
    ("walker2d", 1, 2.0),
    ("walker2d", 2, -1.0),
    ("walker2d", 2, 1.0),
    ("ant", 2, 0.2),
    ("ant", 2, 1.0),
]


def _healthy_edge_cases(task_name: str, index, bound: float):
    """(obs, env says terminated) for states set through the real env just inside, at and just outside a bound."""
    env = TASKS[task_name].make_env()
    env.reset(seed=0)
    sim = env.unwrapped
    rows, expected = [], []
    # 1e-4 (relative for large bounds) stays distinguishable in float32, the precision of our arrays.
    delta = 1e-4 * max(1.0, abs(bound))
    for value in (bound - 10 * delta, bound - delta, bound, bound + delta, bound + 10 * delta):
        qpos, qvel = sim.init_qpos.copy(), np.zeros(sim.model.nv)
        qpos[index] = value
        sim.set_state(qpos, qvel)
        rows.append(sim._get_obs())
        # `step` returns terminated = (not is_healthy) with the default terminate_when_unhealthy=True
        expected.append(not sim.is_healthy)
    env.close()
    return np.asarray(rows, np.float32), np.asarray(expected)


@pytest.mark.parametrize(("task_name", "index", "bound"), _BOUNDARIES)
def test_healthy_boundaries_agree_with_the_env(task_name, index, bound):
    obs, expected = _healthy_edge_cases(task_name, index, bound)
    assert expected.any() and not expected.all()  # the cases straddle the boundary
    task = TASKS[task_name]
    action = np.zeros((len(obs), task.act_dim), np.float32)
    assert np.array_equal(np.asarray(task.termination_fn(obs, action, obs)), expected)


@pytest.mark.parametrize("task_name", MUJOCO_TASKS)
def test_a_non_finite_state_is_judged_as_the_env_judges_it(task_name):
    task = TASKS[task_name]
    env = task.make_env()
    env.reset(seed=0)
    sim = env.unwrapped
    cases, expected = [], []
    # NaN velocities and an infinite joint position. (Not an infinite velocity: hopper's obs clips
    # velocities to +-10, so the env's |qvel| < 100 check cannot be seen from the obs; see envs/tasks.py.)
    for field, index, bad in (("qvel", -1, np.nan), ("qvel", 0, np.nan), ("qpos", -1, np.inf), ("qpos", -1, -np.inf)):
        sim.data.qpos[:] = sim.init_qpos
        sim.data.qvel[:] = 0.0
        getattr(sim.data, field)[index] = bad  # no mj_forward: the state itself is what is judged
        cases.append(sim._get_obs())
        # HalfCheetah-v5 has no health check: its step always returns terminated=False
        expected.append(not sim.is_healthy if hasattr(sim, "is_healthy") else False)
    env.close()
    obs = np.asarray(cases, np.float32)
    action = np.zeros((len(obs), task.act_dim), np.float32)
    assert np.array_equal(np.asarray(task.termination_fn(obs, action, obs)), np.asarray(expected))
    if task_name in ("hopper", "ant"):
        assert all(expected)


@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_registry_matches_the_env_and_the_specs(task_name):
    task = get_task(task_name)
    assert task.spec == TASK_SPECS[task_name]
    assert {f.name for f in dataclasses.fields(TASK_SPECS[task_name])} <= {f.name for f in dataclasses.fields(task)}
    env = task.make_env(max_episode_steps=3)
    assert env.observation_space.shape == (task.obs_dim,)
    assert env.action_space.shape == (task.act_dim,)
    assert np.all(env.action_space.low == task.action_low) and np.all(env.action_space.high == task.action_high)
    assert gymnasium.spec(task.env_id).max_episode_steps == task.max_episode_steps
    env.reset(seed=0)
    truncated = [env.step(np.zeros(task.act_dim))[3] for _ in range(3)]
    assert truncated == [False, False, True]  # kwargs reach gymnasium.make
    env.close()


def test_get_task_rejects_unknown_names_listing_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        get_task("hoper")
    message = str(info.value)
    assert "hoper" in message
    assert all(name in message for name in TASKS)


def test_task_for_env_id():
    assert task_for_env_id("Hopper-v5") is TASKS["hopper"]
    assert task_for_env_id("HalfCheetah-v5") is TASKS["halfcheetah"]
    assert task_for_env_id("mujoco/Walker2d-v5") is TASKS["walker2d"]
    assert task_for_env_id(" Ant-v5 ") is TASKS["ant"]
    assert task_for_env_id("Ant-v4") is None  # another obs layout (no contact forces by default)
    assert task_for_env_id("Pendulum-v1") is None
    assert task_for_env_id("not an id") is None


NEORL2_TASKS = [name for name, spec in TASK_SPECS.items() if spec.suite == "neorl2"]


@pytest.mark.parametrize("task_name", NEORL2_TASKS)
def test_neorl2_tasks_are_entries_with_their_rules_names_and_simulator(task_name):
    task = get_task(task_name.lower())  # names are found whatever their case
    assert task.name == task_name and task.reward_fn is not None and task.termination_fn is not None
    assert len(task.obs_names) == task.obs_dim and len(task.act_names) == task.act_dim
    assert task_for_env_id(task.env_id) is task and task.env_id.startswith("NeoRL2/")
    obs = np.zeros((2, 3, task.obs_dim), np.float32)  # leading axes are kept
    action = np.zeros((2, 3, task.act_dim), np.float32)
    assert task.reward_fn(obs, action, obs).shape == (2, 3) and task.termination_fn(obs, action, obs).shape == (2, 3)


def test_a_task_registered_later_is_an_entry_like_the_others(tmp_path):
    """The registry is open: a robot's task (spec and rules) registers, then its data load for it."""
    spec = TaskSpec("test-arm", None, 2, 1, -0.5, 0.5, 50, ref_min_score=0.0, ref_max_score=10.0, suite="robot")
    task = register(make_task(spec, reward_fn=lambda obs, action, next_obs: -jnp.abs(next_obs[..., 0])))
    try:
        assert get_task("test-arm") is task and not task.has_env
        with pytest.raises(ConfigError, match="has no simulator"):
            task.make_env()
        rows = 6
        np.savez(tmp_path / "arm.npz", obs=np.ones((rows, 2), np.float32), next_obs=np.ones((rows, 2), np.float32),
                 action=np.full((rows, 1), 0.4, np.float32), reward=np.ones(rows, np.float32),
                 done=np.zeros(rows, np.float32), truncated=np.array([0, 0, 1, 0, 0, 1], np.float32))
        dataset = load(tmp_path / "arm.npz", task="test-arm")
        assert dataset.info.task == "test-arm" and dataset.info.action_high == (0.5,)
        assert dataset.info.ref_max_score == 10.0 and dataset.num_episodes == 2
        with pytest.raises(ValueError, match="already registered"):
            register(make_task(dataclasses.replace(spec, act_dim=2)))
    finally:
        TASKS.pop("test-arm")
        TASK_SPECS.pop("test-arm")


LOWER_LAYERS = ("agents", "world_models")
PROGRAM_MODULES = ("mbrl/train.py", "mbrl/trainer.py", "mbrl/population.py", "mbrl/imagination.py", "mbrl/evaluate.py", "mbrl/export_run.py", "mbrl/finetune.py")


def test_no_task_is_named_by_the_agents_the_world_models_or_the_training_program():
    """Tasks are data: agents, world models and the program that wires them never name one. Presets are the
    exception by design, data keyed by dataset (hopper-medium) or, for NeoRL-2's one-dataset tasks, by task: the
    keys of a module-level table (`NEORL2 = {"dmsd": ...}`) and files named `*presets.py`."""
    root = Path(__file__).resolve().parents[1]
    names = {name.lower() for name in TASK_SPECS}
    files = [p for layer in LOWER_LAYERS for p in (root / layer).rglob("*.py") if not p.name.endswith("presets.py")]
    files += [root / p for p in PROGRAM_MODULES]
    found = []
    for path in files:
        tree = ast.parse(path.read_text())
        table_keys = {id(key) for stmt in tree.body if isinstance(stmt, (ast.Assign, ast.AnnAssign))
                      and isinstance(stmt.value, ast.Dict) for key in stmt.value.keys}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in names
                    and id(node) not in table_keys):
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.value!r}")
    assert not found, found
