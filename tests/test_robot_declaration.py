"""A robot declared in a TOML file (mbrl.core.declaration) is a task like any other: its names, units, bounds,
rate and reward function reach the dataset, the export and the robot side; a bad declaration is one line, exit 2.

The robot is tests/cart_robot.py, which no registry knows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cart_robot
from mbrl.cli import main
from mbrl.datasets import load
from mbrl.envs.tasks import get_task

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def cart_files(tmp_path_factory):
    """The cart's declaration, and a NeoRL-2-layout file of its logging policy's episodes."""
    folder = tmp_path_factory.mktemp("cart")
    declaration, episodes = cart_robot.declared_with_episodes(folder, 4, seed=0)
    truncated = np.zeros(4 * cart_robot.STEPS, bool)
    truncated[cart_robot.STEPS - 1::cart_robot.STEPS] = True
    np.savez(folder / "cart.npz", obs=np.concatenate([e["obs"][:-1] for e in episodes]).astype(np.float32),
             next_obs=np.concatenate([e["obs"][1:] for e in episodes]).astype(np.float32),
             action=np.concatenate([e["actions"] for e in episodes]).astype(np.float32),
             reward=np.concatenate([e["rewards"] for e in episodes]).astype(np.float32),
             done=np.zeros(4 * cart_robot.STEPS, bool), truncated=truncated)
    return declaration, folder / "cart.npz", episodes


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_declaration_is_a_task_with_its_names_units_bounds_rate_and_reward(cart_files):
    declaration, data, episodes = cart_files
    task = get_task(str(declaration))
    assert (task.name, task.obs_dim, task.act_dim, task.control_hz, task.max_episode_steps) == ("cart", 2, 1, 50.0, 100)
    assert task.obs_names == ("position", "velocity") and task.obs_units == ("m", "m/s") and task.act_units == ("N",)
    assert not task.has_env and task.suite == "robot"
    low, high = task.action_bounds()
    assert low.tolist() == [-1.0] and high.tolist() == [1.0]
    episode = episodes[0]
    rewards = task.reward_fn(episode["obs"][:-1].astype(np.float32), episode["actions"].astype(np.float32),
                             episode["obs"][1:].astype(np.float32))
    np.testing.assert_allclose(rewards, episode["rewards"], rtol=1e-5, atol=1e-6)
    dataset = load(data, task=str(declaration))
    assert dataset.info.task == "cart"
    np.testing.assert_allclose(dataset.episode_returns(), [e["rewards"].sum() for e in episodes], rtol=1e-5)


def test_a_declaration_in_the_data_dir_is_found_by_name(cart_files, tmp_path, monkeypatch):
    declaration, _, _ = cart_files
    (tmp_path / "tasks").mkdir()
    text = cart_robot.DECLARATION.replace('name = "cart"', 'name = "cart2"')
    (tmp_path / "tasks" / "cart2.toml").write_text(text)
    monkeypatch.setenv("MBRL_DATA_DIR", str(tmp_path))
    task = get_task("cart2")
    assert task.name == "cart2" and task.declaration == str((tmp_path / "tasks" / "cart2.toml").resolve())


BAD = {
    "missing field": (lambda t: t.replace("control_hz = 50.0\n", ""), "field 'control_hz' is missing"),
    "low > high": (lambda t: t.replace("low = -1.0\nhigh = 1.0", "low = 1.0\nhigh = -1.0"),
                   "[[action]] #1 (force): low = 1.0 and high = -1.0; expected low < high"),
    "action without bounds": (lambda t: t.replace("low = -1.0\n", ""), "field 'low' is missing; every action needs bounds"),
    "unknown field": (lambda t: t + "colour = 'red'\n", "unknown field 'colour'"),
    "reward does not import": (lambda t: t.replace("cart_robot:reward", "no_such_module_here:reward"),
                               "field 'reward' = 'no_such_module_here:reward' does not import"),
    "reward of the wrong shape": (lambda t: t.replace("cart_robot:reward", "rules.py:per_dim"),
                                  "returns shape (3, 2) for a batch of 3 transitions; expected (3,)"),
    "dims that do not fit the data": (lambda t: t + '\n[[observation]]\nname = "angle"\n',
                                      "key 'obs' has dimension 2; expected 3 for task 'cart'"),
    "not TOML": (lambda t: t.replace('name = "cart"', "name = cart"), "not a valid TOML file"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_declaration_is_one_line_and_exit_2(cart_files, tmp_path, capsys, case):
    _, data, _ = cart_files
    edit, expected = BAD[case]
    (tmp_path / "rules.py").write_text("def per_dim(obs, action, next_obs):\n    return next_obs\n")
    bad = tmp_path / "bad.toml"
    bad.write_text(edit(cart_robot.DECLARATION))
    code = main(["train", "--algo", "mopo", "--dataset", str(data), "--task", str(bad), "--run-dir",
                 str(tmp_path / "run"), "--logging.progress", "False"])
    err = one_line_error(capsys)
    assert code == 2 and expected in err, err
    assert str(data if case == "dims that do not fit the data" else bad) in err  # the file at fault
    assert not (tmp_path / "run").exists()


def test_serve_refuses_a_class_that_does_not_import(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mbrl.envs.robots.serve", "--step", "cart_robot:NoSuchRobot",
                             "--robot", "udp://127.0.0.1:0"], capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert result.stderr.strip() == ("serve: error: --step 'cart_robot:NoSuchRobot' does not import (AttributeError: "
                                     "module 'cart_robot' has no attribute 'NoSuchRobot')")
