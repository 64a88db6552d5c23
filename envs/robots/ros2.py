"""`Ros2Robot`: a robot behind ROS 2 topics, with rclpy imported only when one is made.

Topics under a prefix P (`--robot ros2:P`):
- P/joint_states   sensor_msgs/JointState, subscribed: obs = position ++ velocity (++ effort when
                   `use_effort`), in message order; or, with `obs_topic_type="array"`,
                   P/observation std_msgs/Float64MultiArray: obs = data.
- P/command        std_msgs/Float64MultiArray, published: the command, one value per actuator.
ROS topics do not advertise sizes, so the dims and bounds come from the export (policy.json) and the
first message is checked against them. rclpy comes with a ROS 2 installation (not from PyPI); where it
is absent, making a Ros2Robot raises MissingDependencyError.
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np

from mbrl.envs.robots.protocol import Observation, RobotError
from mbrl.core.errors import MissingDependencyError


def rclpy_available() -> bool:
    return importlib.util.find_spec("rclpy") is not None


class Ros2Robot:
    def __init__(self, prefix: str, obs_dim: int, action_low, action_high, *, obs_topic_type: str = "joint_state",
                 use_effort: bool = False, obs_timeout: float = 0.05):
        if not rclpy_available():
            raise MissingDependencyError(
                f"ros2:{prefix}: rclpy is not installed; source a ROS 2 installation (for example "
                "`source /opt/ros/jazzy/setup.bash`) so that `import rclpy` works"
            )
        if obs_topic_type not in ("joint_state", "array"):
            raise RobotError(f"ros2:{prefix}: obs_topic_type must be 'joint_state' or 'array', found {obs_topic_type!r}")
        self.prefix = "/" + prefix.strip("/")
        self.name = f"ros2:{self.prefix}"
        self._obs_dim = int(obs_dim)
        self._low = np.asarray(action_low, np.float32)
        self._high = np.asarray(action_high, np.float32)
        self.obs_topic_type, self.use_effort, self.obs_timeout = obs_topic_type, use_effort, obs_timeout
        self._node = None
        self._latest: Observation | None = None
        self._seq = 0

    @property
    def obs_dim(self) -> int:
        return self._obs_dim

    @property
    def act_dim(self) -> int:
        return int(self._low.size)

    @property
    def action_low(self) -> np.ndarray:
        return self._low

    @property
    def action_high(self) -> np.ndarray:
        return self._high

    def connect(self) -> None:
        # optional: a ROS 2 installation's rclpy and messages (no pip package; __init__ checks for them)
        import rclpy
        from sensor_msgs.msg import JointState
        from std_msgs.msg import Float64MultiArray

        self._rclpy = rclpy
        if not rclpy.ok():
            rclpy.init()
        self._node = rclpy.create_node("mbrl_deploy")
        if self.obs_topic_type == "joint_state":
            self._node.create_subscription(JointState, f"{self.prefix}/joint_states", self._on_joint_state, 10)
        else:
            self._node.create_subscription(Float64MultiArray, f"{self.prefix}/observation", self._on_array, 10)
        self._publisher = self._node.create_publisher(Float64MultiArray, f"{self.prefix}/command", 10)
        self._message_type = Float64MultiArray

    def _store(self, values) -> None:
        values = np.asarray(values, np.float32).reshape(-1)
        if values.size != self._obs_dim:
            raise RobotError(f"{self.name}: an observation of {values.size} values, the policy expects {self._obs_dim}")
        self._seq += 1
        self._latest = Observation(values, time.monotonic(), self._seq)

    def _on_joint_state(self, message) -> None:
        parts = [message.position, message.velocity] + ([message.effort] if self.use_effort else [])
        self._store(np.concatenate([np.asarray(p, np.float64) for p in parts]))

    def _on_array(self, message) -> None:
        self._store(message.data)

    def reset(self, seed: int | None = None) -> None:
        """A real robot has no episodes to reset; the controller starts from its current state."""

    def observe(self) -> Observation:
        seq = self._seq
        deadline = time.monotonic() + self.obs_timeout
        while self._seq == seq and (remaining := deadline - time.monotonic()) > 0:
            self._rclpy.spin_once(self._node, timeout_sec=remaining)
        if self._latest is None:
            return Observation(np.full(self._obs_dim, np.nan, np.float32), 0.0, 0)  # nothing yet: not finite, held
        return self._latest

    def act(self, action) -> np.ndarray:
        sent = np.clip(np.asarray(action, np.float32).reshape(self.act_dim), self._low, self._high)
        self._publisher.publish(self._message_type(data=[float(x) for x in sent]))
        return sent

    def safe_stop(self) -> None:
        if self._node is not None:
            safe = np.clip(np.zeros(self.act_dim, np.float32), self._low, self._high)
            self._publisher.publish(self._message_type(data=[float(x) for x in safe]))

    def disconnect(self) -> None:
        if self._node is not None:
            self._node.destroy_node()
            self._node = None
