"""ROS 2 over DDS (cyclonedds, no ROS installation): `python -m mbrl.envs.robots.dds_sim` in its own process against
`mbrl deploy --robot ros2:PREFIX` and `DdsRobot`: the in-process evaluation reproduced, a killed robot stopped
by the watchdog, the protocol's retries and refusals, and the errors a user can cause (fine-tuning over DDS is in
test_finetune.py). The exported policy is conftest's `export_dir`.
Discovery stays on loopback (CYCLONEDDS_URI) and every topic prefix carries this process's pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium
import numpy as np
import pytest

pytest.importorskip("cyclonedds", reason="cyclonedds is not installed: pip install 'offline-mbrl[ros2]'")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: pip install 'offline-mbrl[onnx]'")

from mbrl.envs.robots.dds import DdsRobot, parse_segments  # noqa: E402
from mbrl.envs.robots.protocol import RobotError  # noqa: E402
from mbrl.envs.robots.ros2_types import Float64MultiArray, MultiArrayDimension, segmented  # noqa: E402
from mbrl.cli import main  # noqa: E402
from robot_servers import REPO  # noqa: E402
import robot_servers  # noqa: E402

EPISODE_STEPS = 60
PREFIX = f"/mbrl_test_{os.getpid()}"
pytestmark = pytest.mark.usefixtures("loopback_dds")  # conftest: DDS discovery on loopback only


def _start_node(prefix: str, events: Path, *extra: str) -> subprocess.Popen:
    process, line = robot_servers.start("mbrl.envs.robots.dds_sim", "--env", "Hopper-v5", "--prefix", prefix, "--log",
                                        str(events), *extra, ready="ready on ros2:")
    assert line == f"ready on ros2:{prefix}"
    return process


@pytest.fixture(scope="module")
def dds_node(loopback_dds, tmp_path_factory):
    """One `python -m mbrl.envs.robots.dds_sim` for the module, episodes of EPISODE_STEPS; yields (prefix, events log)."""
    events = tmp_path_factory.mktemp("node") / "events.jsonl"
    process = _start_node(PREFIX, events, "--max-episode-steps", str(EPISODE_STEPS))
    yield PREFIX, events
    robot_servers.stop(process)


def _events(path):
    return [e["event"] for e in robot_servers.read_log(path)] if Path(path).exists() else []


def test_dds_deploy_reproduces_in_process_evaluation(export_dir, dds_node, tmp_path, capsys):
    prefix, _ = dds_node
    records = robot_servers.deploy_reproduces_evaluation(export_dir, f"ros2:{prefix}", tmp_path / "dds.jsonl",
                                                         EPISODE_STEPS, capsys)
    assert all("stale_obs" not in t["events"] for t in robot_servers.ticks(records))


def test_repeats_are_answered_without_acting_twice(dds_node):
    """A duplicate action does not step the env twice; a malformed action is refused; after stop actions are ignored
    until the next reset; a retried request (same stamp) is acted on once; a request the robot refuses is a RobotError."""
    prefix, events = dds_node
    robot = DdsRobot(prefix, 11, -np.ones(3), np.ones(3), obs_timeout=1.0)
    robot.connect()
    try:
        robot.reset(seed=3)
        first = robot.observe()
        assert first.reward is None and first.seq == 1
        a, b = np.array([0.5, -0.2, 0.1]), np.array([-0.3, 0.4, 0.0])
        robot.act(a)
        robot._dds["action"].write(robot._msg.segmented([("action", a.tolist()), ("step", [0])]))  # a duplicate
        second = robot.observe()
        robot.act(b)
        third = robot.observe()
        assert (second.seq, third.seq) == (2, 3)

        env = gymnasium.make("Hopper-v5")
        obs, _ = env.reset(seed=3)
        np.testing.assert_allclose(first.values, obs, rtol=1e-6)
        for action, seen in ((a, second), (b, third)):
            obs, reward, *_ = env.step(action)
            np.testing.assert_allclose(seen.values, obs, rtol=1e-5, atol=1e-6)
            assert seen.reward == pytest.approx(reward, rel=1e-6)

        robot._dds["action"].write(robot._msg.segmented([("action", [0.0, 0.0]), ("step", [2])]))
        with pytest.raises(RobotError, match="refused an action: error: an action of 2 values, this robot has 3"):
            robot.observe()

        stops = _events(events).count("stop")
        stamp = robot._msg.stamp_of(time.time_ns())  # one request seen twice (a retry): one stop, two replies
        robot._dds["request"].write(robot._msg.Header(stamp, "stop"))
        robot._dds["request"].write(robot._msg.Header(stamp, "stop"))
        robot.safe_stop()
        robot.obs_timeout = 0.2
        robot.act(a)
        assert robot.observe().seq == 3  # held: no step after the stop
        assert _events(events).count("stop") == stops + 2

        with pytest.raises(RobotError, match=r"answered `reset -1` with `error: reset with seed -1 failed"):
            robot.reset(seed=-1)
        robot.reset(seed=3)
        np.testing.assert_allclose(robot.observe().values, first.values)
    finally:
        robot.disconnect()


def test_observation_that_does_not_fit_its_layout_is_a_robot_error():
    topic = "rt/robot/observation"
    message = segmented([("observation", [0.0] * 11), ("reward", [1.0]), ("step", [4])])
    assert parse_segments(message, topic, 11)["step"] == 4
    message.data.append(0.0)
    with pytest.raises(RobotError, match=r"rt/robot/observation: a message of 14 values, its layout says 0 \+ 13"):
        parse_segments(message, topic, 11)
    with pytest.raises(RobotError, match=r"rt/robot/observation: an observation of 17 values, the policy expects 11"):
        parse_segments(Float64MultiArray(data=[0.0] * 17), topic, 11)  # an empty layout: all of data
    message = segmented([("observation", [0.0] * 11), ("reward", [1.0, 2.0])])
    with pytest.raises(RobotError, match="`reward` 2 values, expected 1"):
        parse_segments(message, topic, 11)
    message.layout.dim = [MultiArrayDimension("state", 13, 13)]
    with pytest.raises(RobotError, match="no `observation` in the layout"):
        parse_segments(message, topic, 11)


def test_killed_robot_safe_stops_within_twoticks(export_dir, loopback_dds, tmp_path, capsys):
    prefix = f"{PREFIX}_kill"
    node = _start_node(prefix, tmp_path / "events.jsonl")
    log = tmp_path / "kill.jsonl"
    killed = threading.Event()

    def kill_mid_episode():  # after >= 20 ticks, early in an episode (these last 9 steps or more), not in a reset
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and node.poll() is None:
            lines = log.read_text().splitlines(keepends=True) if log.exists() else []
            lines = [line for line in lines if line.endswith("\n")]  # complete lines only
            last = json.loads(lines[-1]) if lines else {}
            if len(lines) >= 20 and last.get("type") == "tick" and 2 <= last["step"] <= 5:
                node.kill()
                killed.set()
                return
            time.sleep(0.003)

    watcher = threading.Thread(target=kill_mid_episode, daemon=True)
    watcher.start()
    try:
        code = main(["deploy", str(export_dir[0]), "--robot", f"ros2:{prefix}", "--episodes", "50", "--seed", "0",
                     "--rate", "100", "--log", str(log)])
    finally:
        watcher.join(timeout=5)
        node.kill()
        node.wait(timeout=10)
    assert killed.is_set()
    assert code == 1, capsys.readouterr().err
    records = robot_servers.read_log(log)
    ticks = robot_servers.ticks(records)
    last_fresh = max(i for i, t in enumerate(ticks) if "stale_obs" not in t["events"])
    stop_tick = next(i for i, t in enumerate(ticks) if "watchdog" in t["events"])
    assert stop_tick - last_fresh <= 2
    assert stop_tick == len(ticks) - 1 and ticks[-1]["action"] is None  # nothing sent after the watchdog
    stop = next(r for r in records if r["type"] == "safe_stop")
    assert stop["reason"] == "watchdog" and not stop["acknowledged"]  # the robot is dead: nobody acknowledges
    assert "no reply to `stop`" in stop["error"]
    assert records[-1]["type"] == "summary" and records[-1]["stop_reason"] == "watchdog"
    assert "the watchdog stopped ros2:" in capsys.readouterr().out


def test_no_node_on_the_prefix_is_one_line_and_exit_2(export_dir, loopback_dds, monkeypatch, capsys):
    monkeypatch.setenv("MBRL_ROS2_CONNECT_TIMEOUT", "0.5")
    prefix = f"{PREFIX}_nobody"
    assert main(["deploy", str(export_dir[0]), "--robot", f"ros2:{prefix}", "--rate", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no robot on ros2:{prefix}: nobody subscribes to rt{prefix}/request after 0.5 s" in err[0], err
    assert main(["deploy", str(export_dir[0]), "--robot", "ros2:/9lives", "--rate", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a ROS 2 topic prefix" in err[0], err


def test_node_with_an_unknown_env_exits_2_with_one_line(loopback_dds):
    result = subprocess.run([sys.executable, "-m", "mbrl.envs.robots.dds_sim", "--env", "NoSuchEnv-v0", "--prefix", f"{PREFIX}_bad"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 2
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "NoSuchEnv-v0" in err[0], err
