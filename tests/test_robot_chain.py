"""Your own robot, end to end, with nothing simulated in this process: a robot the registry has never seen
(tests/cart_robot.py) logs a table; `mbrl data import` turns it into a dataset; `mbrl data info` checks it; `mbrl
train` learns from it with the declared reward and no simulator; `mbrl export`; `mbrl deploy` over UDP to
`python -m mbrl.envs.robots.serve` running the same robot in another process, where the policy beats the logging
policy; then `mbrl finetune` on that same server.
"""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

import cart_robot
import robot_servers
from mbrl.cli import main
from mbrl.datasets import load
from mbrl.export import PolicySpec, export_policy

DEPLOY_EPISODES = 10
TRAIN = ["--sac.num-critics", "2", "--sac.hidden-sizes", "32", "32", "--sac.batch-size", "64",
         "--sac.actor-bc-coef", "0", "--mopo.penalty-coef", "0.1",
         "--imagination.rollouts-per-epoch", "256", "--imagination.horizon", "10",
         "--ensemble.num-members", "3", "--ensemble.num-elites", "2", "--ensemble.hidden-dims", "32", "32",
         "--fit.max-epochs", "20", "--schedule.epochs", "6", "--schedule.updates-per-epoch", "300",
         "--schedule.eval-every", "3", "--logging.progress", "False"]


@pytest.fixture(scope="module")
def robot_logs(tmp_path_factory):
    """The declaration and a CSV of 40 logged episodes (no reward column: the declared rule scores them)."""
    folder = tmp_path_factory.mktemp("cart")
    declaration, episodes = cart_robot.declared_with_episodes(folder, 40, seed=100)
    with open(folder / "cart.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["episode", "position", "velocity", "force"])
        for i, episode in enumerate(episodes):
            actions = np.concatenate([episode["actions"][:, 0], [0.0]])  # the last row's action is never taken
            for (x, v), u in zip(episode["obs"], actions):
                writer.writerow([i, repr(float(x)), repr(float(v)), repr(float(u))])
    return declaration, folder / "cart.csv", episodes


@pytest.fixture(scope="module")
def serve(robot_logs):
    """`python -m mbrl.envs.robots.serve --step cart_robot:Cart` on a free UDP port; yields its address."""
    declaration, _, _ = robot_logs
    process, line = robot_servers.serve_cart(declaration, "udp://127.0.0.1:0")
    yield f"udp://127.0.0.1:{line.rsplit(':', 1)[1].strip()}"
    robot_servers.stop(process)


def logging_returns(seeds) -> list[float]:
    """The logging policy on the episodes deploy runs (episode i resets with seed i)."""
    rng, robot, returns = np.random.default_rng(0), cart_robot.Cart(), []
    for seed in seeds:
        state, total = robot.reset(seed), 0.0
        for _ in range(cart_robot.STEPS):
            state, reward, _, _ = robot.step([cart_robot.logging_policy(state, rng)])
            total += reward
        returns.append(total)
    return returns


def test_import_train_export_deploy_beats_the_logging_policy_then_finetune(robot_logs, serve, tmp_path, capsys):
    declaration, table, episodes = robot_logs
    data = tmp_path / "cart-logs"
    assert main(["data", "import", str(table), "--task", str(declaration), "--out", str(data), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["episodes"] == 40 and summary["transitions"] == 40 * cart_robot.STEPS

    dataset = load(data)  # the task comes with the dataset: no --task from here on
    assert dataset.info.task == "cart"
    np.testing.assert_allclose(dataset.episode_returns(), [e["rewards"].sum() for e in episodes], rtol=1e-4)
    assert main(["data", "info", str(data)]) == 0
    assert "cart" in capsys.readouterr().out

    run = tmp_path / "run"
    assert main(["train", "--algo", "mopo", "--dataset", str(data), "--run-dir", str(run), *TRAIN]) == 0
    out = capsys.readouterr().out
    assert "final estimated return" in out  # no simulator: the model's estimate, labelled as one
    record = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert record["eval"]["estimate"] == "model" and np.isfinite(record["eval"]["return_mean"]).all()

    export = tmp_path / "export"
    assert main(["export", str(run), "--out", str(export)]) == 0
    policy = json.loads((export / "policy.json").read_text())
    assert (policy["task"], policy["task_declared"], policy["control_rate_hz"]) == ("cart", True, 50.0)
    assert policy["observation"]["names"] == ["position", "velocity"] and policy["observation"]["units"] == ["m", "m/s"]
    assert policy["action"]["units"] == ["N"] and policy["action"]["low"] == [-1.0]

    capsys.readouterr()
    log = tmp_path / "deploy.jsonl"
    assert main(["deploy", str(export), "--robot", serve, "--episodes", str(DEPLOY_EPISODES), "--rate", "0",
                 "--log", str(log)]) == 0
    ends = [json.loads(line) for line in log.read_text().splitlines() if '"type": "episode"' in line]
    deployed = [e["return"] for e in ends]
    logged = logging_returns(range(DEPLOY_EPISODES))
    assert len(deployed) == DEPLOY_EPISODES
    print(f"deployed return {np.mean(deployed):.2f}, logging policy {np.mean(logged):.2f} on the same starts")
    assert np.mean(deployed) > np.mean(logged) + 5.0, (deployed, logged)

    tuned = tmp_path / "finetuned"
    assert main(["finetune", str(run), "--robot", serve, "--run-dir", str(tuned), "--no-progress", "--steps", "200",
                 "--warmup", "100", "--update-every", "50", "--eval-every", "100", "--eval-episodes", "0"]) == 0
    records = [json.loads(line) for line in (tuned / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 200 and records[-1]["online"]["episodes"] >= 1
    assert (tuned / "export" / "policy.json").is_file()


def test_a_robot_whose_bounds_differ_from_the_declaration_is_refused(robot_logs, tmp_path, capsys):
    """The server's SPEC says [-2, 2]; the export was declared for [-1, 1]: one line, exit 2, nothing sent."""
    declaration, _, _ = robot_logs
    wide = tmp_path / "wide.toml"
    wide.write_text(cart_robot.DECLARATION.replace("low = -1.0\nhigh = 1.0", "low = -2.0\nhigh = 2.0"))
    process, line = robot_servers.serve_cart(wide, "udp://127.0.0.1:0")
    try:
        spec = PolicySpec(apply_fn=lambda params, obs: -obs[:1], params={}, obs_dim=2, act_dim=1,
                          action_low=np.array([-1.0]), action_high=np.array([1.0]), rescale_actions=False,
                          task="cart", task_declared=True, control_rate_hz=50.0)
        export = export_policy(spec, tmp_path / "export")
        capsys.readouterr()
        code = main(["deploy", str(export), "--robot", f"udp://127.0.0.1:{line.rsplit(':', 1)[1].strip()}"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1
        assert "the robot's action bounds [-2.0]..[2.0] differ from the declared [-1.0]..[1.0]" in err
    finally:
        robot_servers.stop(process)


def test_serve_wraps_the_users_class_over_ros2(robot_logs, loopback_dds, tmp_path, capsys):
    """The same robot behind `serve --robot ros2:PREFIX` (DDS, no ROS installation): a proportional controller
    exported for the declared task runs whole episodes whose returns are the in-process robot's."""
    pytest.importorskip("cyclonedds", reason="the ros2 extra is not installed: pip install 'offline-mbrl[ros2]'")

    declaration, _, _ = robot_logs
    prefix = f"/cart_{os.getpid()}"
    process, line = robot_servers.serve_cart(declaration, f"ros2:{prefix}")
    try:
        assert line == f"ready on ros2:{prefix}"
        spec = PolicySpec(apply_fn=lambda params, obs: -3.0 * obs[:1], params={}, obs_dim=2, act_dim=1,
                          action_low=np.array([-1.0]), action_high=np.array([1.0]), rescale_actions=False,
                          task="cart", task_declared=True, control_rate_hz=50.0)
        export = export_policy(spec, tmp_path / "export")
        log = tmp_path / "deploy.jsonl"
        assert main(["deploy", str(export), "--robot", f"ros2:{prefix}", "--episodes", "2", "--rate", "0",
                     "--max-delta", "None", "--log", str(log)]) == 0
        returns = [json.loads(line)["return"] for line in log.read_text().splitlines() if '"type": "episode"' in line]
        robot, expected = cart_robot.Cart(), []
        for seed in range(2):
            state, total = robot.reset(seed), 0.0
            for _ in range(cart_robot.STEPS):
                state, reward, _, _ = robot.step(np.clip(-3.0 * np.float32(state[0]), -1, 1))
                total += reward
            expected.append(total)
        np.testing.assert_allclose(returns, expected, rtol=1e-4)
    finally:
        robot_servers.stop(process)
