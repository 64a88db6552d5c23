"""Deployment: the UDP sim-server process against in-process evaluation, a recurrent (NEUBAY) export through
`mbrl deploy` on MuJoCo against its JAX policy, the safety layer on a real MuJoCo robot (NaN observations,
a dead sensor, the rate limit), SIGTERM on a real deploy process, and the errors a user can cause."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import gymnasium
import jax
import numpy as np
import pytest

from mbrl.agents.neubay import Neubay, NeubayConfig
from mbrl.datasets import SAMPLE_PATH, load
from mbrl.envs.robots.loop import ControlLoop
from mbrl.envs.robots.mujoco import MujocoRobot
from mbrl.envs.robots.ros2 import Ros2Robot, rclpy_available
from mbrl.envs.robots.runner import PolicyRunner, RewardFeed
from mbrl.envs.robots.safety import SafetyConfig, SafetyLayer
from mbrl.cli import main
from mbrl.export import PolicySpec, carry_leaves, export_policy, observation_envelope, policy_function
from mbrl.export_run import policy_of
from robot_servers import REPO
import robot_servers

EPISODE_STEPS = 60  # the sim server's time limit: short episodes keep the tests fast


@pytest.fixture(scope="module")
def neubay_export(tmp_path_factory, onnx_extra):
    """A NEUBAY actor (LRU memory, 2 layers) at init for Hopper-v5, exported as a run's policy is."""
    agent = Neubay(NeubayConfig(d_model=8, d_hidden=4, memory_layers=2, head_hidden=8, head_layers=1), 11, 3)
    obs_low, obs_high = observation_envelope(load(SAMPLE_PATH).transitions.obs)
    params = agent.init(jax.random.PRNGKey(5), agent.hypers()).actor_params
    out = params["head"]["params"]["Dense_0"]  # gentler actions: the hopper stays up for the whole test
    out["kernel"], out["bias"] = 0.1 * out["kernel"], 0.0 * out["bias"]
    spec = PolicySpec(**policy_of(agent), params=params, obs_dim=11,
                      act_dim=3, action_low=-1.0, action_high=1.0, obs_low=obs_low, obs_high=obs_high,
                      rescale_actions=False, control_rate_hz=125.0, env_id="Hopper-v5")
    return export_policy(spec, tmp_path_factory.mktemp("neubay") / "export"), spec


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory):
    """`python -m mbrl.envs.robots.sim_server` in its own process on a free port; yields (port, events log)."""
    events = tmp_path_factory.mktemp("server") / "events.jsonl"
    process, line = robot_servers.start("mbrl.envs.robots.sim_server", "--env", "Hopper-v5", "--port", "0",
                                        "--max-episode-steps", str(EPISODE_STEPS), "--log", str(events),
                                        ready="listening on ")
    yield int(line.rsplit(":", 1)[1]), events
    robot_servers.stop(process)


def test_udp_deploy_reproduces_in_process_evaluation(export_dir, sim_server, tmp_path, capsys):
    port, _ = sim_server
    robot_servers.deploy_reproduces_evaluation(export_dir, f"udp://127.0.0.1:{port}", tmp_path / "udp.jsonl",
                                               EPISODE_STEPS, capsys)


def test_mujoco_deploy_of_a_recurrent_export_matches_its_jax_policy(neubay_export, tmp_path, capsys):
    """Two episodes through `mbrl deploy --robot mujoco:Hopper-v5`: each tick's command equals the JAX policy's
    action, with the carry, the previous action and reward handed along and reset at the second episode."""
    path, spec = neubay_export
    log = tmp_path / "neubay.jsonl"
    code = main(["deploy", str(path), "--robot", "mujoco:Hopper-v5", "--episodes", "2", "--seed", "5", "--rate", "0",
                 "--max-delta", "None", "--max-steps", "60", "--log", str(log)])
    assert code == 0, capsys.readouterr().err
    records = robot_servers.read_log(log)
    assert records[-1]["stop_reason"] == "done"

    policy = jax.jit(policy_function(spec))
    env = gymnasium.make("Hopper-v5")
    for episode in (0, 1):
        sent = [np.asarray(t["action"], np.float32) for t in robot_servers.ticks(records) if t["episode"] == episode]
        obs, _ = env.reset(seed=5 + episode)
        carry = [leaf["initial"] for leaf in carry_leaves(spec)]
        prev_action, prev_reward, worst, total = np.zeros(3, np.float32), np.float32(0), 0.0, 0.0
        for step, command in enumerate(sent):
            action, prev_action, *carry = policy(obs.astype(np.float32), prev_action, prev_reward, np.bool_(step == 0), *carry)
            worst = max(worst, float(np.max(np.abs(np.asarray(action) - command))))
            obs, reward, terminated, truncated, _ = env.step(command)
            prev_reward, total = np.float32(reward), total + reward
        assert worst <= 1e-5, (episode, worst)
        result = next(r for r in records if r["type"] == "episode" and r["episode"] == episode)
        assert result["length"] == len(sent) >= 20  # until the hopper falls
        assert result["return"] == pytest.approx(total, rel=1e-5)


def _run_loop(tmp_path, robot, runner, max_delta=None, episodes=1, max_steps=40):
    safety = SafetyLayer(-np.ones(3, np.float32), np.ones(3, np.float32), SafetyConfig(max_delta=max_delta))
    loop = ControlLoop(robot, runner, safety, rate_hz=None, log_path=tmp_path / "loop.jsonl")
    summary = loop.run(episodes=episodes, seed=0, max_steps=max_steps)
    return summary, robot_servers.read_log(tmp_path / "loop.jsonl")


@pytest.mark.parametrize("recurrent", [False, True], ids=["markov", "recurrent"])
def test_nan_observation_gives_the_last_safe_action_and_an_event(export_dir, neubay_export, tmp_path, recurrent):
    runner = PolicyRunner((neubay_export if recurrent else export_dir)[0])
    robot = MujocoRobot("Hopper-v5", nan_obs_at=(5, 6))
    if recurrent:
        robot = RewardFeed(robot, runner)
    summary, records = _run_loop(tmp_path, robot, runner, max_steps=12)
    ticks = robot_servers.ticks(records)
    by_step = {t["step"]: t for t in ticks}
    for step in (5, 6):
        assert by_step[step]["events"] == ["nonfinite_obs"]
        assert by_step[step]["inference_ms"] is None  # the policy never saw the NaNs
        assert by_step[step]["action"] == by_step[4]["action"]  # held: the last safe action
    assert by_step[7]["events"] in ([], ["clipped"])
    assert all(np.all(np.isfinite(t["action"])) for t in ticks)
    assert summary["events"]["nonfinite_obs"] == 2


def test_observations_stop_then_safe_stop_within_twoticks(export_dir, tmp_path):
    robot = MujocoRobot("Hopper-v5", freeze_obs_after=8)  # a dead sensor: the sim runs on, no new observation
    summary, records = _run_loop(tmp_path, robot, PolicyRunner(export_dir[0]), max_steps=30)
    ticks = robot_servers.ticks(records)
    last_fresh = max(t["step"] for t in ticks if "stale_obs" not in t["events"])
    stop_tick = next(t for t in ticks if "watchdog" in t["events"])
    assert stop_tick["step"] - last_fresh <= 2
    assert ticks[-1] is stop_tick  # nothing is sent after the watchdog fired
    assert robot.safe_stops == 1 and summary["stop_reason"] == "watchdog"
    stop = next(r for r in records if r["type"] == "safe_stop")
    assert stop["reason"] == "watchdog" and stop["acknowledged"]


def test_action_change_never_exceeds_the_rate_limit(export_dir, tmp_path):
    max_delta = 0.05  # of the range 2: 0.1 per tick
    robot = MujocoRobot("Hopper-v5", obs_noise=0.05, nan_obs_at=(10,))
    summary, records = _run_loop(tmp_path, robot, PolicyRunner(export_dir[0]), max_delta=max_delta, episodes=2)
    assert summary["events"].get("rate_limited", 0) > 0  # the limit was actually reached
    for episode in (0, 1):
        actions = np.array([t["action"] for t in robot_servers.ticks(records) if t["episode"] == episode])
        steps = np.abs(np.diff(np.vstack([np.zeros(3), actions]), axis=0))  # from rest after the reset
        assert steps.max() <= max_delta * 2 + 1e-6


def test_mujoco_robot_latency_and_delay(export_dir):
    actions = np.random.default_rng(0).uniform(-1, 1, (6, 3)).astype(np.float32)

    def trace(sent=actions, **options):
        robot = MujocoRobot("Hopper-v5", **options)
        robot.connect()
        robot.reset(seed=1)
        seen = [robot.observe().values]
        for action in sent:
            robot.act(action)
            seen.append(robot.observe().values)
        robot.disconnect()
        return np.array(seen)

    clean = trace()
    lagged = trace(obs_latency=2)
    np.testing.assert_array_equal(lagged[2:], clean[:-2])
    # Each command is applied one step late; the first step applies the safe action (zero torque).
    delayed = trace(action_delay=1)
    np.testing.assert_array_equal(delayed, trace(np.concatenate([np.zeros((1, 3), np.float32), actions[:-1]])))
    assert not np.array_equal(delayed, clean)


def test_sigterm_safe_stops_then_exits_0(export_dir, sim_server, tmp_path):
    port, events = sim_server
    log = tmp_path / "sigterm.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "mbrl.cli", "deploy", str(export_dir[0]), "--robot", f"udp://127.0.0.1:{port}",
         "--episodes", "1000", "--rate", "200", "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 20):
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    records = robot_servers.read_log(log)
    stop = next(r for r in records if r["type"] == "safe_stop")
    assert stop["reason"] == "SIGTERM" and stop["acknowledged"]
    assert records[-1]["type"] == "summary" and records[-1]["stop_reason"] == "SIGTERM"
    server_events = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert server_events[-2:] == ["stop", "bye"]  # the robot heard the safe stop, then the disconnect
    assert "stop: SIGTERM" in out


def test_deploy_errors_print_one_line_and_exit_2(export_dir, tmp_path, capsys):
    path = export_dir[0]
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    (broken / "policy.onnx").unlink()
    cases = [
        ([str(tmp_path / "missing"), "--robot", "mujoco:Hopper-v5"], "no such export directory"),
        ([str(broken), "--robot", "mujoco:Hopper-v5"], "policy.onnx: missing"),
        ([str(path), "--robot", "mujoco:HalfCheetah-v5"], "observations of dim 11, the robot gives 17"),
        ([str(path), "--robot", "serial:/dev/ttyUSB0"], "unknown robot"),
        ([str(path), "--robot", "udp://localhost:notaport"], "udp://HOST:PORT"),
        ([str(path), "--robot", "mujoco:NoSuchEnv-v0"], "NoSuchEnv-v0"),
    ]
    for argv, expected in cases:
        assert main(["deploy", *argv, "--rate", "0"]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], (argv, err)


@pytest.mark.skipif(rclpy_available(), reason="rclpy is installed: the missing-dependency path cannot be taken")
def test_ros2_without_rclpy_is_a_clear_error(export_dir, capsys):
    assert main(["deploy", str(export_dir[0]), "--robot", "ros2:/hopper", "--ros2-backend", "rclpy"]) == 2
    assert "rclpy is not installed" in capsys.readouterr().err


@pytest.mark.skipif(not rclpy_available(), reason="rclpy is not installed (ROS 2 is not on PyPI; source a ROS 2 installation to run this test)")
def test_ros2_robot_round_trip(export_dir):
    # optional: a ROS 2 installation's rclpy and messages (the test is skipped without them)
    import rclpy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    robot = Ros2Robot("/mbrl_test", 11, -np.ones(3), np.ones(3), obs_timeout=0.5)
    robot.connect()
    node = rclpy.create_node("mbrl_test_peer")
    publisher = node.create_publisher(JointState, "/mbrl_test/joint_states", 10)
    commands = []
    node.create_subscription(Float64MultiArray, "/mbrl_test/command", lambda m: commands.append(list(m.data)), 10)
    try:
        for _ in range(50):
            publisher.publish(JointState(position=[0.1] * 5, velocity=[0.2] * 6))
            obs = robot.observe()
            if obs.seq:
                break
        np.testing.assert_allclose(obs.values, [0.1] * 5 + [0.2] * 6, rtol=1e-6)
        robot.act(np.array([2.0, 0.0, -0.5]))
        for _ in range(50):
            rclpy.spin_once(node, timeout_sec=0.1)
            if commands:
                break
        assert commands[0] == [1.0, 0.0, -0.5]
    finally:
        node.destroy_node()
        robot.disconnect()
