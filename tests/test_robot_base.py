"""The one robot base (`mbrl.envs.robots.protocol.Robot`): every adapter extends it, and the safety layer, the control
loop and `mbrl deploy` need nothing else. A tiny robot written here on the base alone, a known closed-form system,
is driven by the real control loop and safety layer; every number it logs is checked against the closed form."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from mbrl.envs.robots.dds import DdsRobot
from mbrl.envs.robots.loop import ControlLoop
from mbrl.envs.robots.mujoco import MujocoRobot
from mbrl.envs.robots.protocol import Robot, RobotError, RobotWrapper
from mbrl.envs.robots.ros2 import Ros2Robot
from mbrl.envs.robots.runner import ChangeFeed, RewardFeed
from mbrl.envs.robots.safety import SafetyConfig, SafetyLayer
from mbrl.envs.robots.udp import UdpRobot

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = (UdpRobot, DdsRobot, Ros2Robot, MujocoRobot)
STEPS = 6  # the decay's episodes


class Decay(Robot):
    """x_{t+1} = 0.5 x_t + u_t, one actuator bounded to [-1, 1], reward -x_{t+1}^2, episodes of STEPS steps from
    x_0 = seed. After `quiet_after` steps of an episode no measurement arrives any more (a dead sensor)."""

    def __init__(self, quiet_after: int | None = None):
        super().__init__("decay:test", obs_timeout=0.0)
        self.quiet_after = quiet_after
        self.safe_stops = self.disconnects = 0

    def connect(self) -> None:
        self._set_spec(1, [-1.0], [1.0])

    def reset(self, seed: int | None = None) -> None:
        self.x, self.t, self.waiting = float(seed), 0, False
        self._measured([self.x])
        self._fresh = True

    def _send(self, sent: np.ndarray) -> None:
        self.x, self.t, self.waiting = 0.5 * self.x + float(sent[0]), self.t + 1, True

    def _receive_observation(self, seconds: float) -> bool:
        if not self.waiting or (self.quiet_after is not None and self.t > self.quiet_after):
            return False
        self.waiting = False
        self._measured([self.x], reward=-self.x ** 2, truncated=self.t >= STEPS)
        return True

    def safe_stop(self) -> None:
        self.safe_stops += 1

    def disconnect(self) -> None:
        self.disconnects += 1


def _loop(robot: Robot, policy, tmp_path, max_delta=None, max_stale_ticks=2):
    robot.connect()
    safety = SafetyLayer(robot.action_low, robot.action_high,
                         SafetyConfig(max_delta=max_delta, max_stale_ticks=max_stale_ticks))
    return ControlLoop(robot, policy, safety, rate_hz=None, log_path=tmp_path / "loop.jsonl")


def _records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "loop.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("adapter", ADAPTERS + (RewardFeed, ChangeFeed), ids=lambda c: c.__name__)
def test_every_adapter_extends_the_one_base(adapter):
    assert issubclass(adapter, Robot)


def test_the_loop_drives_any_robot_of_the_base_to_the_closed_form(tmp_path):
    """u = -k x with k = 0.25: x_t = x_0 (0.5 - k)^t, u_t = -k x_t, the episode's return -sum_{t=1..T} x_t^2."""
    k, seed = 0.25, -2
    robot = Decay()
    summary = _loop(robot, lambda obs: -k * obs, tmp_path).run(episodes=2, seed=seed)
    assert summary["stop_reason"] == "done" and summary["robot"] == "decay:test"
    assert (robot.safe_stops, robot.disconnects) == (1, 1)
    ticks = [r for r in _records(tmp_path) if r["type"] == "tick"]
    for episode in (0, 1):  # episode i starts at x_0 = seed + i
        x = (seed + episode) * (0.5 - k) ** np.arange(STEPS + 1)
        sent = np.array([t["action"][0] for t in ticks if t["episode"] == episode])
        np.testing.assert_allclose(sent, -k * x[:STEPS], rtol=1e-6, atol=1e-7)  # the log keeps 7 decimals
        result = summary["episodes"][episode]
        assert (result["length"], result["end"]) == (STEPS, "truncated")
        assert result["return"] == pytest.approx(-np.sum(x[1:] ** 2), rel=1e-6)
    assert all(t["events"] == [] for t in ticks)


def test_the_base_clips_and_the_safety_layer_and_watchdog_work_on_any_robot(tmp_path):
    """A policy asking for 3 gets the bound 1 (event `clipped`); the sensor goes quiet after step 2: the observation
    goes stale, and the watchdog stops the robot after two stale ticks, nothing sent after it."""
    robot = Decay(quiet_after=2)
    with pytest.raises(RobotError, match="decay:test: not connected"):
        robot.act([0.0])
    summary = _loop(robot, lambda obs: np.array([3.0]), tmp_path).run(episodes=1, seed=0)
    np.testing.assert_array_equal(robot.act(np.array([[7.0]])), np.array([1.0], np.float32))  # the base's own clip
    assert robot.rest_action.tolist() == [0.0]
    ticks = [r for r in _records(tmp_path) if r["type"] == "tick"]
    assert [t["events"] for t in ticks] == [["clipped"]] * 3 + [["stale_obs"], ["stale_obs", "watchdog"]]
    assert [t["action"] for t in ticks] == [[1.0]] * 4 + [None]  # a stale tick holds the last safe action
    assert summary["stop_reason"] == "watchdog" and robot.safe_stops == 1
    # x: 0 -> 1 -> 1.5 measured, then nothing: the rewards -x^2 of the two fresh observations after the first
    assert summary["episodes"][0]["return"] == pytest.approx(-(1.0 + 1.5 ** 2))


def test_a_wrapped_robot_is_a_robot_to_the_loop(tmp_path):
    """ChangeFeed over the decay: the policy sees (x_t, x_t - x_{t-1}); the wrapper's dims are its own."""
    seen = []
    robot = ChangeFeed(Decay())
    loop = _loop(robot, lambda obs: seen.append(obs.copy()) or np.array([0.0]), tmp_path)
    assert robot.obs_dim == 2 and robot.act_dim == 1 and robot.name == "decay:test"
    loop.run(episodes=1, seed=4)
    x = 4 * 0.5 ** np.arange(STEPS)
    np.testing.assert_allclose(np.array(seen), np.stack([x, np.diff(x, prepend=x[0])], axis=1))
    with pytest.raises(TypeError, match="must be a mbrl.envs.robots.protocol.Robot"):
        ControlLoop(object(), lambda obs: obs, SafetyLayer([-1.0], [1.0]), rate_hz=None)
    with pytest.raises(TypeError, match="expected a Robot"):
        RobotWrapper(object())


def test_the_loop_safety_layer_and_deploy_name_no_adapter():
    """The safety layer, the control loop and `mbrl deploy` import no adapter module and name no adapter class: they
    speak to the base only (`connect.make_robot` is where a URI picks an adapter)."""
    adapters = {"udp", "dds", "ros2", "mujoco"}
    names = {cls.__name__ for cls in ADAPTERS}
    for path in (ROOT / "envs/robots/loop.py", ROOT / "envs/robots/safety.py", ROOT / "mbrl/commands/deploy.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module.split(".")[-1] not in adapters, (path.name, node.module)
            if isinstance(node, ast.Name):
                assert node.id not in names, (path.name, node.id)
