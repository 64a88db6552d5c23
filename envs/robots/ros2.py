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

import numpy as np

from mbrl.envs.robots.protocol import Robot, RobotError
from mbrl.core.errors import MissingDependencyError


def rclpy_available() -> bool:
    return importlib.util.find_spec("rclpy") is not None


class Ros2Robot(Robot):
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
        super().__init__(f"ros2:{self.prefix}", obs_timeout=obs_timeout)
        self._set_spec(obs_dim, action_low, action_high)
        self.obs_topic_type, self.use_effort = obs_topic_type, use_effort
        self._node = None

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
        if values.size != self.obs_dim:
            raise RobotError(f"{self.name}: an observation of {values.size} values, the policy expects {self.obs_dim}")
        self._measured(values)

    def _on_joint_state(self, message) -> None:
        parts = [message.position, message.velocity] + ([message.effort] if self.use_effort else [])
        self._store(np.concatenate([np.asarray(p, np.float64) for p in parts]))

    def _on_array(self, message) -> None:
        self._store(message.data)

    def reset(self, seed: int | None = None) -> None:
        """A real robot has no episodes to reset; the controller starts from its current state."""

    def _receive_observation(self, seconds: float) -> bool:
        """The subscriptions' callbacks run here; every message is a new measurement (a robot with no steps)."""
        seq = self._seq
        if seconds > 0:
            self._rclpy.spin_once(self._node, timeout_sec=seconds)
        return self._seq != seq

    def _send(self, sent: np.ndarray) -> None:
        self._publisher.publish(self._message_type(data=[float(x) for x in sent]))

    def safe_stop(self) -> None:
        if self._node is not None:
            self._send(self.rest_action)

    def disconnect(self) -> None:
        if self._node is not None:
            self._node.destroy_node()
            self._node = None
