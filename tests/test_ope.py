"""Off-policy evaluation: FQE recovers the closed-form value of linear policies on a linear system with a quadratic
reward, ranks them, and `mbrl ope` judges a real run directory from its data, with one line for bad input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from mbrl import config as config_io
from mbrl.cli import main
from mbrl.commands.train import selection_summary
from mbrl.config import SelectConfig
from mbrl.core.errors import DatasetError
from mbrl.core.types import Transitions
from mbrl.export_run import load_policy_from_run
from mbrl.ope.fqe import FQEConfig
from mbrl.ope.judged import JudgedPolicy, fqe_of
from mbrl.train import load_run, run

from test_end_to_end import tiny_config

A = np.array([[0.9, 0.1], [0.0, 0.9]])
B = np.array([[0.0], [0.1]])
ACTION_COST, GAMMA = 0.1, 0.9
# Policies a = -K s: two that stay inside the data's actions, one that pushes the state away.
GAINS = {"none": [0.0, 0.0], "damping": [0.3, 0.6], "pushing": [-0.3, -0.6]}
FQE = FQEConfig(heads=5, hidden_sizes=(32, 32), gamma=GAMMA, steps=5000, chunk=500, min_steps=2000, patience=4)


def linear_system(episodes: int, length: int, seed: int):
    """s' = A s + B a, r = -(s's + 0.1 a²), from s0 ~ U(-1, 1)² under uniform random actions; episodes cut by a
    time limit (bootstrapped)."""
    rng = np.random.default_rng(seed)
    rows, starts = {k: [] for k in ("obs", "action", "reward", "next_obs")}, []
    for _ in range(episodes):
        s = rng.uniform(-1, 1, 2)
        starts.append(s)
        for _ in range(length):
            a = rng.uniform(-1, 1, 1)
            s_next = A @ s + B @ a
            for key, value in zip(rows, (s, a, -(s @ s) - ACTION_COST * (a @ a), s_next)):
                rows[key].append(value)
            s = s_next
    n = episodes * length
    timeout = np.zeros(n, bool)
    timeout[length - 1::length] = True
    arrays = {k: np.asarray(v, np.float32) for k, v in rows.items()}
    t = Transitions.from_arrays(arrays["obs"], arrays["action"], arrays["reward"], arrays["next_obs"], np.zeros(n, bool), timeout)
    return t, np.asarray(starts, np.float32)


def true_value(gain, starts) -> float:
    """The discounted value, -s0' P s0 averaged over the starts, P = Q + K'RK + γ (A - BK)' P (A - BK)."""
    k = np.asarray([gain])
    closed = A - B @ k
    p = scipy.linalg.solve_discrete_lyapunov(np.sqrt(GAMMA) * closed.T, np.eye(2) + ACTION_COST * k.T @ k)
    return float(np.mean([-s @ p @ s for s in starts]))


def closed_form_fits(out_path: str) -> None:
    """FQE of the three policies on the linear system, written to `out_path` as JSON (run by `fits` in a child)."""
    train, starts = linear_system(100, 30, seed=0)
    heldout, _ = linear_system(20, 30, seed=1)
    out = {}
    for name, gain in GAINS.items():
        policy = lambda obs, k=jnp.asarray([gain], jnp.float32): -obs @ k.T  # noqa: E731
        result = fqe_of(JudgedPolicy(policy, 2, 1, name), train, heldout, starts, FQE)
        out[name] = {"value": result.value, "interval": [float(v) for v in result.interval], "steps": result.steps,
                     "head_values": [float(v) for v in result.head_values], "true_value": true_value(gain, starts)}
    with open(out_path, "w") as f:
        json.dump(out, f)


@pytest.fixture(scope="module")
def fits(tmp_path_factory, default_compile_env):
    """The fits in a child process at XLA's own compile settings, as a user's `mbrl ope` runs: their 15,000 steps run
    several times faster there than under the suite's fast-compile flags (conftest.py)."""
    out = tmp_path_factory.mktemp("fqe") / "fits.json"
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_ope; "
            "test_ope.closed_form_fits(sys.argv[1])")
    done = subprocess.run([sys.executable, "-c", code, str(out)], env=default_compile_env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    fitted = json.loads(out.read_text())
    return {name: (SimpleNamespace(value=f["value"], interval=tuple(f["interval"]), steps=f["steps"],
                                   head_values=f["head_values"]), f["true_value"]) for name, f in fitted.items()}


@pytest.mark.parametrize("name", ["none", "damping"])
def test_fqe_recovers_the_closed_form_value_within_its_interval(fits, name):
    result, truth = fits[name]
    low, high = result.interval
    assert low <= truth <= high, (truth, result.interval)
    assert abs(result.value - truth) < 0.04 * abs(truth), (truth, result.value)
    assert len(result.head_values) == FQE.heads and result.steps == FQE.steps


def test_fqe_ranks_policies_of_clearly_different_value(fits):
    truths = {name: truth for name, (_, truth) in fits.items()}
    estimates = {name: result.value for name, (result, _) in fits.items()}
    assert sorted(truths, key=truths.get) == sorted(estimates, key=estimates.get) == ["pushing", "none", "damping"]


def test_a_fit_shorter_than_a_chunk_runs_the_steps_it_was_given():
    train, starts = linear_system(10, 10, seed=0)
    config = dataclasses.replace(FQE, steps=150, min_steps=100)  # the chunk stays 500
    result = fqe_of(JudgedPolicy(lambda obs: obs[:, :1], 2, 1, "p"), train, train, starts, config)
    assert result.steps == 150 and len(result.heldout_td) == 1


def test_an_empty_holdout_is_refused():
    train, starts = linear_system(4, 10, seed=0)
    with pytest.raises(DatasetError, match="held-out data is empty"):
        fqe_of(JudgedPolicy(lambda obs: obs[:, :1], 2, 1, "p"), train, train.slice(np.arange(0)), starts, FQE)


# ------------------------------------------------------------------------------------------------ mbrl ope


@pytest.fixture(scope="module")
def bc_run(hopper_tiny_path, tmp_path_factory):
    config = config_io.build("bc", str(hopper_tiny_path), "quick", {
        "bc": {"hidden_sizes": [32, 32], "batch_size": 32},
        "schedule": {"epochs": 1, "updates_per_epoch": 50, "eval_every": 1, "eval_episodes": 1},
        "logging": {"progress": False}})
    return run(config, tmp_path_factory.mktemp("ope") / "bc").run_dir


FAST = ["--fqe.steps", "400", "--fqe.chunk", "100", "--fqe.min-steps", "200", "--fqe.hidden-sizes", "32", "32"]


def test_ope_judges_a_run_from_its_data(bc_run, hopper_tiny_path, capsys):
    assert main(["ope", str(bc_run), "--dataset", str(hopper_tiny_path), "--holdout", "0.3", "--json", *FAST]) == 0
    report = json.loads(capsys.readouterr().out)
    [fqe] = report["estimates"]  # BC has no critics and no world model: FQE alone
    assert fqe["method"] == "fqe" and fqe["low"] <= fqe["value"] <= fqe["high"] and np.isfinite(fqe["value"])
    assert report["initial_states"] > 1 and len(fqe["heads"]) == 5


def test_ope_bad_input_gets_one_line_and_exit_2(bc_run, hopper_tiny_path, tmp_path, capsys):
    t, _ = linear_system(10, 10, seed=0)
    other = tmp_path / "linear.npz"  # a NeoRL-2 layout file, 2 observations and 1 action
    np.savez(other, obs=t.obs, next_obs=t.next_obs, action=t.action, reward=t.reward, done=t.terminal,
             truncated=t.timeout)
    cases = [
        (["--dataset", str(other)], "takes 11 observations and gives 3 actions"),
        (["--dataset", str(hopper_tiny_path), "--holdout", "0.01"], "holds out no episode"),
        (["--dataset", str(hopper_tiny_path), "--method", "critic"], "no critics"),
        (["--dataset", str(hopper_tiny_path), "--holdout", "1.5"], "--holdout"),
    ]
    for args, expected in cases:
        assert main(["ope", str(bc_run), *args, *FAST]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err
    assert main(["ope", str(tmp_path), "--dataset", str(hopper_tiny_path)]) == 2
    assert "neither a run directory" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_world_model(hopper_tiny_path, tmp_path_factory):
    model = tmp_path_factory.mktemp("ope") / "wm"
    assert main(["model", "fit", "--dataset", str(hopper_tiny_path), "--out", str(model), "--ensemble.num-members", "3",
                 "--ensemble.num-elites", "2", "--ensemble.hidden-dims", "16", "16", "--fit.max-epochs", "2",
                 "--no-progress"]) == 0
    return model


def test_an_export_is_judged_in_a_given_world_model_as_its_run_is(bc_run, hopper_tiny_path, tiny_world_model, tmp_path,
                                                                   capsys):
    """The model estimate of any Markov policy: the export of a run, rolled out in a fitted model through its
    deployed function, gives the run's own value (its agent acting greedily in the same model)."""
    model = tiny_world_model
    assert main(["export", str(bc_run), "--out", str(tmp_path / "export")]) == 0
    values = []
    for policy in (bc_run, tmp_path / "export"):
        capsys.readouterr()
        assert main(["ope", str(policy), "--dataset", str(hopper_tiny_path), "--method", "model", "--world-model",
                     str(model), "--starts", "8", "--json"]) == 0
        [estimate] = json.loads(capsys.readouterr().out)["estimates"]
        assert estimate["method"] == "model" and estimate["low"] <= estimate["value"] <= estimate["high"]
        values.append(estimate["value"])
    np.testing.assert_allclose(values[1], values[0], rtol=1e-4)
    assert main(["ope", str(tmp_path / "export"), "--dataset", str(hopper_tiny_path), "--method", "model"]) == 2
    assert "give --world-model DIR" in capsys.readouterr().err


def test_select_checkpoint_fqe_exports_the_checkpoint_fqe_prefers(hopper_tiny_path, bc_run, tmp_path, capsys):
    assert not (bc_run / "selected.json").exists()  # the default: the last checkpoint, nothing chosen
    config = config_io.build("bc", str(hopper_tiny_path), "quick", {
        "bc": {"hidden_sizes": [32, 32], "batch_size": 32},
        "schedule": {"epochs": 3, "updates_per_epoch": 30, "eval_every": 1, "eval_episodes": 1},
        "select": {"by": "fqe", "fqe_steps": 100, "holdout": 0.3}, "logging": {"progress": False}})
    run_dir = run(config, tmp_path / "bc").run_dir
    selection = json.loads((run_dir / "selected.json").read_text())
    assert [c["epoch"] for c in selection["candidates"]] == [1, 2, 3]  # every checkpoint kept and judged
    best = max(selection["candidates"], key=lambda c: c["fqe_low"][0])["epoch"]
    assert selection["epochs"] == [best]
    assert selection_summary(selection) == f"epoch {best} (per seed, by FQE's estimate)"
    spec = load_policy_from_run(run_dir)
    assert spec.metadata["epoch"] == best
    chosen = load_run(run_dir, epoch=best)
    np.testing.assert_array_equal(jax.tree.leaves(spec.params)[0], jax.tree.leaves(chosen.actor_params(0))[0])


def test_select_checkpoint_model_takes_the_checkpoint_the_model_rates_best(hopper_tiny_path, tiny_world_model, tmp_path,
                                                                           capsys):
    """`--select.by model`: each checkpoint judged by its greedy return in the run's world model (the elites' mean
    less their spread); the chosen one is the best, and the last one's value is `mbrl ope`'s model estimate."""
    config = tiny_config("mopo", str(hopper_tiny_path))
    config = dataclasses.replace(
        config, schedule=dataclasses.replace(config.schedule, epochs=3, updates_per_epoch=20, eval_every=1, eval_episodes=1),
        select=SelectConfig(by="model", starts=8), logging=dataclasses.replace(config.logging, progress=False))
    run_dir = run(config, tmp_path / "mopo", world_model_dir=tiny_world_model).run_dir
    selection = json.loads((run_dir / "selected.json").read_text())
    assert selection["by"] == "model" and [c["epoch"] for c in selection["candidates"]] == [1, 2, 3]
    assert selection["epochs"] == [max(selection["candidates"], key=lambda c: c["model_low"][0])["epoch"]]
    assert all(c["model_low"][0] <= c["model"][0] for c in selection["candidates"])
    assert selection_summary(selection) == f"epoch {selection['epochs'][0]} (per seed, by the world model's estimate)"
    capsys.readouterr()
    assert main(["ope", str(run_dir), "--dataset", str(hopper_tiny_path), "--method", "model", "--starts", "8",
                 "--json"]) == 0
    [estimate] = json.loads(capsys.readouterr().out)["estimates"]
    np.testing.assert_allclose(estimate["value"], selection["candidates"][-1]["model"][0], rtol=1e-5)

    assert main(["train", "--algo", "bc", "--dataset", str(hopper_tiny_path), "--select.by", "model",
                 "--run-dir", str(tmp_path / "bc"), "--logging.progress", "False"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no MLP world model" in err, err
    assert not (tmp_path / "bc").exists()
