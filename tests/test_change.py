"""`<task>+change` and `<dataset>+change`: each observation followed by its change since the step before.

Oracles: a Python loop over rows and episodes; the base task's own env stepped with the same seed and actions; the
base task's reward and termination functions on the current observation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from mbrl import config as config_io
from mbrl import datasets
from mbrl.cli import main as cli_main
from mbrl.config import dataset_key
from mbrl.core.change import changes, with_change
from mbrl.core.errors import DatasetError
from mbrl.core.types import DatasetInfo, OfflineDataset, Transitions, find_spec
from mbrl.envs.tasks import get_task


def _dataset(obs: np.ndarray, next_obs: np.ndarray, starts) -> OfflineDataset:
    n, dim = obs.shape
    transitions = Transitions.from_arrays(obs, np.zeros((n, 1)), np.arange(n, dtype=float), next_obs, np.zeros(n),
                                          np.zeros(n))
    info = DatasetInfo(name="toy", source="toy.npz", format="neorl2-npz", task="DMSD", obs_dim=dim, act_dim=1)
    return OfflineDataset(transitions=transitions, episode_starts=np.asarray(starts), info=info)


def _episodes(rng, lengths, dim=2):
    """Consecutive rows of episodes of the given lengths: (obs, next_obs, episode_starts)."""
    obs, next_obs, starts = [], [], []
    for length in lengths:
        path = rng.normal(size=(length + 1, dim))
        starts.append(sum(len(o) for o in obs))
        obs.append(path[:-1])
        next_obs.append(path[1:])
    return np.concatenate(obs), np.concatenate(next_obs), np.asarray(starts)


def test_each_row_gains_its_change_since_the_row_before_within_its_episode():
    obs, next_obs, starts = _episodes(np.random.default_rng(0), [3, 1, 4])
    out = with_change(_dataset(obs, next_obs, starts))
    expected_obs, expected_next = [], []
    for episode, start in enumerate(starts):
        end = starts[episode + 1] if episode + 1 < len(starts) else len(obs)
        for row in range(start, end):
            before = obs[row - 1] if row > start else obs[row]
            expected_obs.append(np.concatenate([obs[row], obs[row] - before]))
            expected_next.append(np.concatenate([next_obs[row], next_obs[row] - obs[row]]))
    np.testing.assert_allclose(out.transitions.obs, np.asarray(expected_obs), atol=1e-6)
    np.testing.assert_allclose(out.transitions.next_obs, np.asarray(expected_next), atol=1e-6)
    # A row's next observation is the next row's observation, as in any dataset of consecutive rows.
    inside = np.setdiff1d(np.arange(1, len(obs)), starts)
    np.testing.assert_allclose(out.transitions.next_obs[inside - 1], out.transitions.obs[inside], atol=1e-6)
    np.testing.assert_array_equal(out.transitions.reward, np.arange(len(obs)))
    assert (out.info.obs_dim, out.info.task, out.info.name) == (4, "DMSD+change", "toy+change")
    np.testing.assert_array_equal(changes(obs, starts)[starts], 0.0)


def test_rows_out_of_order_are_refused_naming_the_row():
    obs, next_obs, starts = _episodes(np.random.default_rng(1), [4])
    obs[2] += 1.0
    with pytest.raises(DatasetError, match=r"toy\.npz: row 2's obs differs from row 1's next_obs"):
        with_change(_dataset(obs, next_obs, starts))


def test_the_task_steps_the_base_env_and_appends_the_change():
    base, task = get_task("DMSD"), get_task("dmsd+change")
    assert (task.name, task.obs_dim, task.env_id) == ("DMSD+change", 2 * base.obs_dim, "NeoRL2/DMSDChange-v0")
    assert task.obs_names[base.obs_dim] == f"change of {base.obs_names[0]}"
    assert find_spec("DMSD+change") == task.spec and get_task("DMSD+change") is task
    env, plain = task.make_env(), base.make_env()
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=3)
    raw, _ = plain.reset(seed=3)
    np.testing.assert_array_equal(obs, np.concatenate([raw, np.zeros_like(raw)]))
    assert env.observation_space.shape == (2 * base.obs_dim,)
    for _ in range(5):
        action = rng.uniform(-1, 1, base.act_dim).astype(np.float32)
        obs, reward, terminated, truncated, _ = env.step(action)
        before = raw
        raw, plain_reward, plain_terminated, plain_truncated, _ = plain.step(action)
        np.testing.assert_allclose(obs, np.concatenate([raw, raw - before]), atol=1e-6)
        assert (reward, terminated, truncated) == (plain_reward, plain_terminated, plain_truncated)


def test_the_derived_gymnasium_id_keeps_the_version():
    from mbrl.core.types import change_spec

    spec = find_spec("DMSD")
    assert change_spec(dataclasses.replace(spec, env_id="Hopper-v5")).env_id == "HopperChange-v5"
    assert change_spec(dataclasses.replace(spec, env_id="lab/arm")).env_id == "lab/armChange"
    assert change_spec(dataclasses.replace(spec, env_id=None)).env_id is None


def test_reward_and_termination_read_the_current_observation():
    base, task = get_task("DMSD"), get_task("DMSD+change")
    rng = np.random.default_rng(2)
    obs, next_obs = rng.normal(size=(7, base.obs_dim)), rng.normal(size=(7, base.obs_dim))
    action = rng.uniform(-1, 1, (7, base.act_dim))
    wide, next_wide = np.concatenate([obs, 5 * obs], 1), np.concatenate([next_obs, next_obs - obs], 1)
    np.testing.assert_allclose(task.reward_fn(wide, action, next_wide), base.reward_fn(obs, action, next_obs), rtol=1e-6)
    np.testing.assert_array_equal(task.termination_fn(wide, action, next_wide), base.termination_fn(obs, action, next_obs))


def test_presets_and_the_file_loader_see_through_the_suffix():
    assert dataset_key("neorl2:Simglucose+change") == "simglucose" and dataset_key("hopper-medium+change") == "hopper-medium"
    sample = datasets.load(str(datasets.__path__[0] + "/samples/hopper-sample.hdf5"))
    wide = datasets.load(str(datasets.__path__[0] + "/samples/hopper-sample.hdf5") + "+change")
    assert wide.info.obs_dim == 2 * sample.info.obs_dim and wide.info.task == f"{sample.info.task}+change"
    np.testing.assert_array_equal(wide.transitions.obs[:, : sample.info.obs_dim], sample.transitions.obs)
    assert dataclasses.replace(wide.info, name="", source="", obs_dim=0, task="") == dataclasses.replace(
        sample.info, name="", source="", obs_dim=0, task="")


@pytest.fixture(scope="module")
def change_export(hopper_tiny_path, tmp_path_factory):
    """A tiny BC trained on Hopper's data `+change` (evaluated in Hopper's simulator wrapped to append the change),
    and its export."""
    root = tmp_path_factory.mktemp("change")
    config = config_io.build("bc", f"{hopper_tiny_path}+change", "quick",
                             {"bc": {"hidden_sizes": [16, 16], "batch_size": 16},
                              "schedule": {"epochs": 1, "updates_per_epoch": 10, "eval_episodes": 1}})
    config_io.save(config, root / "config.json")
    assert cli_main(["train", "--config", str(root / "config.json"), "--run-dir", str(root / "run"),
                     "--logging.progress", "False"]) == 0
    assert cli_main(["export", str(root / "run"), "--out", str(root / "export")]) == 0
    return root


def test_train_eval_and_export_a_policy_of_the_wider_observation(change_export, capsys):
    import onnx

    assert cli_main(["eval", str(change_export / "run"), "--episodes", "2"]) == 0
    assert "normalized score" in capsys.readouterr().out
    graph = onnx.load(str(change_export / "export" / "policy.onnx")).graph
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim][-1] == 22  # 2 x Hopper's 11


def _actions(log: Path) -> list:
    return [r["action"] for r in map(json.loads, log.read_text().splitlines()) if r.get("type") == "tick"]


def test_deploy_computes_the_change_for_a_robot_that_sends_the_observation_alone(change_export):
    """The base simulator (Hopper-v5, 11 values) with the change computed by deploy, and the `+change` task's own
    simulator (22 values): the same seed gives the same commands, tick by tick (the feed takes the change in float32,
    the wrapper in MuJoCo's float64)."""
    logs = {}
    for robot in ("mujoco:Hopper-v5", "sim:hopper+change"):
        logs[robot] = change_export / f"{robot.replace(':', '_')}.jsonl"
        assert cli_main(["deploy", str(change_export / "export"), "--robot", robot, "--episodes", "2", "--rate", "0",
                         "--max-steps", "40", "--seed", "3", "--log", str(logs[robot])]) == 0
    base, wrapped = (_actions(log) for log in logs.values())
    assert len(base) == len(wrapped) > 40
    np.testing.assert_allclose(base, wrapped, atol=1e-5)


def test_the_released_neorl2_files_gain_their_change(monkeypatch):
    """DMSD's released train and val files (NeoRL-2's own writer): the appended columns are the file's own
    observation minus the row before's within an episode, 0 on an episode's first row."""
    from neorl2_files import NEORL2_DIR, neorl2_arrays

    raw = neorl2_arrays("DMSD-high-100000-train.npz")
    neorl2_arrays("DMSD-high-20000-val.npz")  # skips where absent
    monkeypatch.setenv("MBRL_DATA_DIR", str(NEORL2_DIR.parent))
    if NEORL2_DIR.name != "neorl2":
        pytest.skip(f"{NEORL2_DIR} is not a folder named neorl2, which neorl2:TASK reads")
    wide = datasets.load("neorl2:DMSD+change")
    dim, starts = raw["obs"].shape[1], wide.episode_starts
    np.testing.assert_array_equal(wide.transitions.obs[:, :dim], raw["obs"])
    expected = np.diff(raw["obs"], axis=0, prepend=raw["obs"][:1])
    expected[starts] = 0.0
    np.testing.assert_allclose(wide.transitions.obs[:, dim:], expected, atol=1e-6)
    assert wide.heldout is not None and wide.heldout.info.obs_dim == 2 * dim and wide.info.task == "DMSD+change"
