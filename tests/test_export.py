"""Policy export: ONNX (onnxruntime) and jax.export (a fresh process) against the JAX policy, policy.json,
recurrent policies (a GRU, and a NEUBAY run side by side with its JAX policy over a 200-step MuJoCo
episode), a real training run's directory, and the errors a user can cause."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from mbrl.envs.robots.runner import PolicyRunner
from mbrl import __version__
from mbrl.cli import main
from mbrl.datasets import SAMPLE_PATH, load
from mbrl.core.errors import UserError
from mbrl.export import ExportError, PolicySpec, export_policy, params_sha256, policy_function
from mbrl.export_onnx import OnnxExportError, to_onnx
from mbrl.export_run import load_policy_from_run, policy_of

LOW = np.array([-1.0, -0.5, -2.0], np.float32)  # asymmetric bounds: the rescaling is exercised
HIGH = np.array([1.0, 0.5, 1.0], np.float32)


@pytest.fixture(scope="module")
def dataset():
    return load(SAMPLE_PATH)


@pytest.fixture(scope="module")
def spec(dataset):
    """A BC policy after 300 updates on the sample dataset, trained on normalized observations."""
    from mbrl.agents.bc import BC, BCConfig
    from mbrl.core.types import Transitions

    data = dataset.transitions
    obs = np.concatenate([data.obs, data.next_obs])
    mean, std = obs.mean(axis=0), obs.std(axis=0) + 1e-3
    agent = BC(BCConfig(hidden_sizes=(64, 64), batch_size=64), obs.shape[1], 3)
    rows = np.random.default_rng(0).integers(0, len(data), (300, 64))
    batches = jax.tree.map(jnp.asarray, data.slice(rows.reshape(-1)))
    batches = jax.tree.map(lambda x: x.reshape(300, 64, *x.shape[1:]), batches)
    batches = batches.replace(obs=(batches.obs - mean) / std)
    assert isinstance(batches, Transitions)
    hypers = agent.hypers()
    state, _ = jax.jit(agent.update_many)(agent.init(jax.random.PRNGKey(0), hypers), batches, jax.random.PRNGKey(1), hypers)
    return PolicySpec(
        **policy_of(agent),
        params=state.actor_params,
        obs_dim=obs.shape[1],
        act_dim=3,
        action_low=LOW,
        action_high=HIGH,
        obs_mean=mean,
        obs_std=std,
        control_rate_hz=125.0,
        env_id="Hopper-v5",
        dataset="hopper-sample",
        run_id="test-run",
        metadata={"algo": "bc"},
    )


@pytest.fixture(scope="module")
def exported(spec, tmp_path_factory, onnx_extra):
    return export_policy(spec, tmp_path_factory.mktemp("export") / "policy")


@pytest.fixture(scope="module")
def observations(dataset, spec):
    """10,000 observations: 5,000 rows of the dataset, 5,000 far outside it (and beyond the envelope)."""
    rng = np.random.default_rng(1)
    rows = np.concatenate([dataset.transitions.obs, dataset.transitions.next_obs])
    inside = rows[rng.integers(0, len(rows), 5000)]
    outside = rows[rng.integers(0, len(rows), 5000)] * rng.choice([-1e3, 30.0, 1e6], size=(5000, 1))
    outside[::7] = spec.obs_high + rng.uniform(0, 5, (len(outside[::7]), spec.obs_dim)) * spec.obs_std
    return np.concatenate([inside, outside]).astype(np.float32)


@pytest.fixture(scope="module")
def jax_actions(spec, observations):
    return np.asarray(jax.jit(jax.vmap(policy_function(spec)))(observations))


def test_onnx_matches_jax_on_dataset_and_out_of_range_observations(exported, observations, jax_actions):
    onnx_actions = PolicyRunner(exported)(observations)
    assert onnx_actions.shape == (10_000, 3) and onnx_actions.dtype == np.float32
    assert np.max(np.abs(onnx_actions - jax_actions)) <= 1e-5
    # Scaling and clipping are in the graph: the actions fill the robot's bounds and never leave them.
    assert np.all(onnx_actions >= LOW) and np.all(onnx_actions <= HIGH)
    assert np.all(onnx_actions.max(axis=0) - onnx_actions.min(axis=0) > 0.9 * (HIGH - LOW))


def test_normalizer_and_envelope_are_baked_into_the_graph(spec, exported):
    runner = PolicyRunner(exported)
    raw = np.asarray(jax.vmap(spec.apply_fn, in_axes=(None, 0))(spec.params, jnp.zeros((1, spec.obs_dim))))
    at_mean = runner(spec.obs_mean)  # the normalized observation is 0 there
    np.testing.assert_allclose(at_mean, LOW + (raw[0] + 1) * 0.5 * (HIGH - LOW), atol=1e-5)
    # Beyond the envelope the observation is clipped: any further out gives the same action.
    np.testing.assert_allclose(runner(spec.obs_high * 1e4), runner(spec.obs_high), atol=1e-6)


def test_jax_export_runs_in_a_fresh_process_without_project_code(exported, observations, jax_actions, tmp_path):
    np.save(tmp_path / "obs.npy", observations)
    script = f"""
import sys, jax, numpy as np
exported = jax.export.deserialize(bytearray(open({str(exported / 'policy.jax')!r}, 'rb').read()))
np.save({str(tmp_path / 'actions.npy')!r}, np.asarray(exported.call(np.load({str(tmp_path / 'obs.npy')!r}))))
print(sorted(m for m in sys.modules if m.split('.')[0] in ('mbrl', 'agents', 'envs', 'world_models', 'flax')))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # neither this project nor flax was imported
    assert np.max(np.abs(np.load(tmp_path / "actions.npy") - jax_actions)) <= 1e-5


def test_policy_json_describes_the_policy(spec, exported):
    data = json.loads((exported / "policy.json").read_text())
    assert data["framework_version"] == __version__
    assert data["observation"]["dim"] == spec.obs_dim and len(data["observation"]["names"]) == spec.obs_dim
    assert data["action"]["dim"] == 3 and data["action"]["low"] == LOW.tolist() and data["action"]["high"] == HIGH.tolist()
    np.testing.assert_allclose(data["observation"]["normalizer"]["mean"], spec.obs_mean)
    assert data["control_rate_hz"] == 125.0 and data["env_id"] == "Hopper-v5"
    assert (data["dataset"], data["run_id"]) == ("hopper-sample", "test-run")
    leaves = b"".join(np.asarray(x).astype("<f4").tobytes() for x in jax.tree.leaves(spec.params))
    assert data["params_sha256"] == hashlib.sha256(leaves).hexdigest() == params_sha256(spec.params)
    for name in ("policy.onnx", "policy.jax"):
        assert data["files"][name]["sha256"] == hashlib.sha256((exported / name).read_bytes()).hexdigest()
    assert data["state"] is None and data["onnx"]["inputs"] == ["obs"]


@pytest.fixture(scope="module")
def gru_export(tmp_path_factory, onnx_extra):
    """A GRU policy on the observation alone (it ignores the previous action and reward), exported."""
    import flax.linen as nn

    cell, head = nn.GRUCell(features=8), nn.Dense(2)
    cell_params = cell.init(jax.random.PRNGKey(1), jnp.zeros(8), jnp.zeros(5))
    head_params = head.init(jax.random.PRNGKey(2), jnp.zeros(8))

    def apply_fn(params, carry, inputs):
        carry, features = cell.apply(params[0], carry, inputs.obs)
        return jnp.tanh(head.apply(params[1], features)), carry

    spec = PolicySpec(apply_fn=apply_fn, params=(cell_params, head_params), obs_dim=5, act_dim=2,
                      action_low=-2.0, action_high=2.0, initial_carry=np.zeros(8, np.float32))
    return spec, export_policy(spec, tmp_path_factory.mktemp("gru") / "recurrent")


def test_recurrent_policy_exports_its_state_as_inputs_and_outputs(gru_export):
    spec, out = gru_export
    data = json.loads((out / "policy.json").read_text())
    assert data["onnx"]["inputs"] == ["obs", "prev_action", "prev_reward", "first", "carry_0"]
    assert data["onnx"]["outputs"] == ["action", "policy_action", "next_carry_0"]
    (leaf,) = data["state"]["carry"]
    assert (leaf["input"], leaf["output"], leaf["shape"], leaf["dtype"]) == ("carry_0", "next_carry_0", [8], "float32")
    assert leaf["initial"] == [0.0] * 8 and data["state"]["feedback"] == {"prev_action": "policy_action"}

    # An episode of 30 steps: the runner carries the state like a scan over the JAX policy does.
    observations = np.random.default_rng(0).normal(size=(30, 5)).astype(np.float32)
    step = policy_function(spec)
    zero = (np.zeros(2, np.float32), np.float32(0), np.bool_(False))
    _, expected = jax.lax.scan(lambda h, o: step(o, *zero, h)[::-2], jnp.zeros(8), observations)
    runner = PolicyRunner(out)
    actions = np.stack([runner(o) for o in observations])
    assert np.max(np.abs(actions - np.asarray(expected))) <= 1e-5
    assert np.any(np.abs(runner.carry[0]) > 1e-3)
    runner.reset()
    np.testing.assert_allclose(runner(observations[0]), actions[0], atol=1e-6)

    # policy.jax takes and returns the same arrays.
    exported = jax.export.deserialize(bytearray((out / "policy.jax").read_bytes()))
    batch = (observations[:4], np.zeros((4, 2), np.float32), np.ones(4, np.float32), np.ones(4, bool),
             np.ones((4, 8), np.float32))
    for got, want in zip(exported.call(*batch), jax.vmap(step)(*batch)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)


def _broken_copy(out, tmp_path, edit):
    """A copy of the export folder `out` whose policy.json `edit(data)` changed."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    data = json.loads((broken / "policy.json").read_text())
    edit(data)
    (broken / "policy.json").write_text(json.dumps(data))
    return broken


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["state"]["carry"][0].pop("initial"), "'state.carry[0].initial' is missing"),
    (lambda d: d["state"]["carry"][0].update(initial=[0.0] * 7), "'state.carry[0].initial' has shape [7]; expected shape [8]"),
    (lambda d: d["state"]["carry"][0].update(shape=[9], initial=[0.0] * 9), "'state.carry[0].input' says input 'carry_0' is float32 [9]"),
    (lambda d: d["state"]["carry"][0].update(input="carry_x"), "'state.carry[0].input' names input 'carry_x'"),
    (lambda d: d["state"].pop("carry"), "'state.carry' is missing"),
    (lambda d: d["state"]["inputs"].pop(1), "'state.inputs' names"),
    (lambda d: d.update(state=None), "'state' does not describe the graph inputs"),
], ids=["no-initial", "initial-shape", "shape-vs-graph", "input-name", "no-carry", "inputs", "no-state"])
def test_a_damaged_recurrent_description_names_the_file_and_field(gru_export, tmp_path, capsys, edit, field):
    broken = _broken_copy(gru_export[1], tmp_path, edit)
    with pytest.raises(UserError, match=re.escape(f"policy.json: field {field}")):
        PolicyRunner(broken)
    # `mbrl deploy` reports it in one line and exits 2, before it touches a robot.
    assert main(["deploy", str(broken), "--robot", "mujoco:Hopper-v5", "--max-steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "policy.json: field" in err[0]


def test_a_recurrent_spec_whose_carry_changes_shape_is_refused(tmp_path, onnx_extra):
    spec = PolicySpec(apply_fn=lambda p, c, i: (jnp.tanh(i.obs[:2]), jnp.concatenate([c, c])), params=(), obs_dim=4,
                      act_dim=2, action_low=-1, action_high=1, initial_carry=np.zeros(3, np.float32))
    with pytest.raises(ExportError, match=r"carry of \(shape, dtype\) \[\(\(6,\), 'float32'\)\], expected"):
        export_policy(spec, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_export_from_a_training_run_directory(tmp_path, onnx_extra):
    """A real (tiny) `mbrl train` run directory goes through `mbrl export`."""
    from mbrl import config as config_io
    from mbrl import train

    config = config_io.build("bc", str(SAMPLE_PATH), "quick", {
        "schedule": {"epochs": 1, "updates_per_epoch": 5, "eval_every": 1, "eval_episodes": 1},
        "bc": {"hidden_sizes": [8], "batch_size": 16}, "logging": {"progress": False}})
    train.run(config, tmp_path / "run", progress=False)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "exported")]) == 0
    data = json.loads((tmp_path / "exported" / "policy.json").read_text())
    assert data["metadata"]["algo"] == "bc" and data["run_id"] == "run" and data["env_id"] == "Hopper-v5"
    assert data["observation"]["names"][0] == "qpos:rootz" and data["control_rate_hz"] == 125.0
    assert data["action"]["rescaled_from_unit_range"] is False
    runner = PolicyRunner(tmp_path / "exported")
    assert runner(np.zeros(11, np.float32)).shape == (3,)


NEUBAY_TINY = {
    "neubay": {"d_model": 8, "d_hidden": 4, "memory_layers": 2, "head_hidden": 8, "head_layers": 1, "num_critics": 2,
               "sampled_critics": 2, "num_sequences": 2, "sequence_length": 4, "warmup_length": 4, "parallel_size": 4,
               "tape_capacity": 8, "max_episode_steps": 20, "rollout_chunk": 5, "max_rollout_length": 10},
    "ensemble": {"num_members": 2, "num_elites": 2, "hidden_dims": [8, 8]},
    "fit": {"max_epochs": 1},
    "schedule": {"epochs": 1, "updates_per_epoch": 2, "eval_every": 1, "eval_episodes": 1},
    "logging": {"progress": False},
}


@pytest.fixture(scope="module")
def neubay_run(tmp_path_factory, onnx_extra):
    """A tiny NEUBAY run (LRU memory, 2 layers) of `mbrl.train.run` on the sample dataset, then `mbrl export`."""
    from mbrl import config as config_io
    from mbrl import train

    root = tmp_path_factory.mktemp("neubay")
    train.run(config_io.build("neubay", str(SAMPLE_PATH), "quick", NEUBAY_TINY), root / "run", progress=False)
    assert main(["export", str(root / "run"), "--out", str(root / "export")]) == 0
    return root / "run", root / "export"


def test_neubay_run_exports_with_its_carry_and_onnx_equals_jax_over_a_200_step_episode(neubay_run):
    """The ONNX graph and the agent's own `act` (with its carry, previous action and reward) side by side
    over 200 steps of a real Hopper-v5 episode, fed the same observations."""
    import gymnasium

    from mbrl.agents.registry import make
    from mbrl import config as config_io
    from mbrl.core.types import PolicyInput

    run_dir, out = neubay_run
    data = json.loads((out / "policy.json").read_text())
    assert data["metadata"]["algo"] == "neubay" and data["env_id"] == "Hopper-v5"
    assert [leaf["shape"] for leaf in data["state"]["carry"]] == [[4, 2], [4, 2]]  # complex64 (4,) per LRU layer
    assert data["state"]["carry"][0]["encoding"].startswith("complex64")

    spec = load_policy_from_run(run_dir)
    agent = make(config_io.load(run_dir / "config.json"), 11, 3)
    act = jax.jit(lambda carry, inputs: agent.act(spec.params, carry, inputs, jax.random.PRNGKey(0), True))
    env = gymnasium.make("Hopper-v5", max_episode_steps=200, terminate_when_unhealthy=False)
    obs, _ = env.reset(seed=3)
    runner = PolicyRunner(out)
    runner.reset()
    carry = agent.initial_carry(1)
    prev_action, prev_reward = np.zeros((1, 3), np.float32), np.zeros(1, np.float32)
    worst, steps, truncated = 0.0, 0, False
    while not truncated:
        obs = obs.astype(np.float32)
        inputs = PolicyInput(np.clip(obs, spec.obs_low, spec.obs_high)[None], prev_action, prev_reward, np.array([steps == 0]))
        u, carry = act(carry, inputs)
        expected = np.clip(np.asarray(u[0]), spec.action_low, spec.action_high)
        worst = max(worst, float(np.max(np.abs(runner(obs) - expected))))
        obs, reward, _, truncated, _ = env.step(expected)
        runner.give_reward(reward)
        prev_action, prev_reward, steps = np.asarray(u), np.array([reward], np.float32), steps + 1
    assert steps == 200 and worst <= 1e-5
    np.testing.assert_allclose(runner.carry[1][0], np.stack([carry[1].real, carry[1].imag], axis=-1)[0], atol=1e-4)


def test_export_errors_print_one_line_and_exit_2(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "missing" in err[0] and "config.json" in err[1]


def test_spec_and_translation_errors(tmp_path, onnx_extra):
    with pytest.raises(ExportError, match="apply_fn returns shapes"):
        bad = PolicySpec(apply_fn=lambda p, o: o[:2], params=(), obs_dim=4, act_dim=3, action_low=-1, action_high=1)
        export_policy(bad, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # nothing partial is left behind
    with pytest.raises(ExportError, match="action_low"):
        PolicySpec(apply_fn=None, params=(), obs_dim=4, act_dim=2, action_low=1.0, action_high=-1.0)
    with pytest.raises(OnnxExportError, match="'sort'"):
        to_onnx(lambda o: jnp.sort(o), [np.zeros(4, np.float32)], ["obs"], ["action"])


def test_translator_covers_the_operations_of_common_policies(onnx_extra):
    """Shape ops, reductions, selects and elementwise math, batched and mixed with constants, vs jax.vmap."""
    import onnxruntime

    weights = np.random.default_rng(2).normal(size=(4, 6)).astype(np.float32)

    def fn(obs, extra):
        x = jnp.concatenate([obs, jnp.ones(2), extra[:2]])  # batched and constant parts
        y = x.reshape(2, 4).T @ jnp.arange(2.0)  # reshape, transpose, dot
        z = jnp.einsum("i,ij->j", y, weights) + jnp.sum(x**2) * 0.1  # a batched scalar against a vector
        gate = jax.nn.sigmoid(z) * jax.lax.rsqrt(1.0 + z**2) + jnp.log1p(jnp.abs(z))
        picked = jnp.where(z > 0, gate, -gate)
        return jnp.stack([picked.max(), picked.mean(), jnp.argmax(picked).astype(jnp.float32), jnp.isfinite(z).sum() * 1.0])

    examples = [np.zeros(4, np.float32), np.zeros(3, np.float32)]
    model = to_onnx(fn, examples, ["obs", "extra"], ["out"])
    session = onnxruntime.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(3)
    obs, extra = rng.normal(size=(64, 4)).astype(np.float32), rng.normal(size=(64, 3)).astype(np.float32)
    (out,) = session.run(None, {"obs": obs, "extra": extra})
    np.testing.assert_allclose(out, np.asarray(jax.vmap(fn)(obs, extra)), atol=1e-5)


def test_translator_covers_the_operations_of_recurrent_policies(onnx_extra):
    """A complex diagonal recurrence (an LRU's), layer norm, leaky ReLU, a scan, a scatter-add at a constant
    index and a bool input, vs jax.vmap: complex values travel as real and imaginary parts."""
    import flax.linen as nn
    import onnxruntime

    rng = np.random.default_rng(4)
    lam = (0.9 * np.exp(1j * rng.uniform(0, 6.28, 4))).astype(np.complex64)
    weights = rng.normal(size=(6, 4)).astype(np.float32)
    norm = nn.LayerNorm()
    norm_params = norm.init(jax.random.PRNGKey(0), jnp.zeros(6))

    def fn(x, first, h):  # x (3, 6): a sequence of 3 steps; h (4, 2): a complex carry as (real, imaginary)
        h = jax.lax.complex(h[..., 0], h[..., 1])
        u = jax.nn.leaky_relu(norm.apply(norm_params, x))
        bu = jax.lax.complex(u @ weights, jnp.tanh(u) @ weights)
        decay = jnp.where(first, 0.0, lam).astype(jnp.complex64)
        bu = bu.at[0].add(decay * h)
        last, hs = jax.lax.scan(lambda c, b: (decay * c + b,) * 2, jnp.zeros_like(h), bu)
        _, back = jax.lax.scan(lambda c, v: (c + v, c * v), jnp.zeros(4), hs.real, reverse=True)
        return jnp.concatenate([hs.imag.sum(0), back[0]]), jnp.stack([last.real, last.imag], axis=-1)

    examples = [np.zeros((3, 6), np.float32), np.zeros((), bool), np.zeros((4, 2), np.float32)]
    model = to_onnx(fn, examples, ["x", "first", "h"], ["y", "h_next"])
    session = onnxruntime.InferenceSession(model.SerializeToString())
    feeds = {"x": rng.normal(size=(16, 3, 6)).astype(np.float32), "first": np.arange(16) % 3 == 0,
             "h": rng.normal(size=(16, 4, 2)).astype(np.float32)}
    for got, want in zip(session.run(None, feeds), jax.vmap(fn)(*feeds.values())):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)  # float32 round-off
    with pytest.raises(OnnxExportError, match="'exp' on complex values"):
        to_onnx(lambda h: jnp.exp(jax.lax.complex(h, h)).real, [np.zeros(3, np.float32)], ["h"], ["out"])


def test_off_policy_evaluation_reads_a_recurrent_policys_logged_episodes(neubay_run, capsys):
    """A recurrent policy's action at a dataset's next state is the one it gives after reading that episode's logged
    steps from its start (its memory reset there), as a step-by-step loop over the episode gives it; `mbrl ope`
    then judges the run by FQE."""
    from mbrl.core.types import PolicyInput
    from mbrl.datasets import SAMPLE_PATH, load
    from mbrl.ope.fqe import FQEConfig
    from mbrl.ope.judged import agent_policy
    from mbrl.ope.policy import load_policy
    from mbrl.ope.holdout import fqe_values, split_holdout
    from test_ope import FAST

    run_dir, _ = neubay_run
    policy = load_policy(run_dir)
    assert policy.recurrent
    dataset = load(SAMPLE_PATH)
    rows = dataset.transitions.slice(np.arange(int(dataset.episode_starts[2])))  # the first two episodes
    along = policy.next_actions(rows)
    run = policy.run
    agent, params = run.trainer.agent, run.actor_params(0)
    act = jax.jit(agent.act, static_argnums=4)  # one step at a time, as the oracle; compiled once, not per call
    expected = []
    for start, end in ((0, int(dataset.episode_starts[1])), (int(dataset.episode_starts[1]), len(rows))):
        carry = agent.initial_carry(1)
        prev_action, prev_reward = np.zeros((1, rows.act_dim), np.float32), np.zeros(1, np.float32)
        for t in range(start, end):
            step = PolicyInput(rows.obs[t:t + 1], prev_action, prev_reward, np.array([t == start]))
            _, carry = act(params, carry, step, jax.random.PRNGKey(0), True)
            prev_action, prev_reward = rows.action[t:t + 1], rows.reward[t:t + 1]
            nxt = PolicyInput(rows.next_obs[t:t + 1], prev_action, prev_reward, np.array([False]))
            expected.append(np.asarray(act(params, carry, nxt, jax.random.PRNGKey(0), True)[0])[0])
    np.testing.assert_allclose(along, np.clip(expected, -1, 1), atol=2e-5)
    assert np.abs(along[1:] - along[:-1]).max() > 0  # it acts, not a constant
    # The agent's own greedy policy (the sweep's and the selection's FQE) reads the history the same way.
    own = agent_policy(agent, params, "member 0")
    assert own.recurrent
    np.testing.assert_allclose(np.clip(own.next_actions(rows), -1, 1), along, atol=2e-5)
    train, held = split_holdout(dataset, 0.3, seed=0)
    fast = FQEConfig(steps=400, chunk=100, min_steps=200, hidden_sizes=(32, 32))
    [(value, low)] = fqe_values(run.trainer, jax.tree.map(lambda x: x[:1], run.state), train, held, fast)
    assert np.isfinite(value) and low <= value

    assert main(["ope", str(run_dir), "--dataset", str(SAMPLE_PATH), "--method", "fqe", "--holdout", "0.3",
                 "--json", *FAST]) == 0
    [fqe] = json.loads(capsys.readouterr().out)["estimates"]
    assert fqe["low"] <= fqe["value"] <= fqe["high"] and np.isfinite(fqe["value"])
