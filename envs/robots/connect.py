"""The adapter for a robot URI, shared by `mbrl deploy` and `mbrl finetune`.

    mujoco:ENV_ID     a Gymnasium MuJoCo env in this process (`mbrl.envs.robots.mujoco`)
    sim:TASK          the simulator of a registered task (sim:DMSD, sim:hopper), as mujoco: with its env id
    udp://HOST:PORT   a robot speaking the UDP protocol (`mbrl.envs.robots.udp`; `python -m mbrl.envs.robots.sim_server`)
    ros2:PREFIX       a robot on ROS 2 topics under PREFIX: over DDS with cyclonedds (`mbrl.envs.robots.dds`;
                      `python -m mbrl.envs.robots.dds_sim`), or through rclpy with `ros2_backend="rclpy"`
                      (`mbrl.envs.robots.ros2`, needs a ROS 2 installation)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mbrl.core.errors import ConfigError
from mbrl.envs.robots.dds import DdsRobot
from mbrl.envs.robots.protocol import Robot, RobotError
from mbrl.envs.robots.ros2 import Ros2Robot
from mbrl.envs.robots.udp import UdpRobot, parse_address

ROS2_BACKENDS = ("dds", "rclpy")


@dataclasses.dataclass(frozen=True)
class SimOptions:
    """The imperfections and time limit of a simulated (mujoco:) robot; refused for any other robot.

    max_episode_steps: mujoco: the env's time limit (default: the env's own).
    obs_latency: mujoco: the policy sees the observation of this many steps ago.
    obs_noise: mujoco: standard deviation of Gaussian noise added to observations.
    action_delay: mujoco: a command takes effect this many steps after it was sent.
    noise_seed: the seed of the observation noise (deploy's and finetune's --seed).

    `mbrl deploy` generates its options from these fields (`mbrl.config.option_fields`), with the entries above
    as their help.
    """

    max_episode_steps: int | None = None
    obs_latency: int = 0
    obs_noise: float = 0.0
    action_delay: int = 0
    noise_seed: int = 0

    def given(self) -> list[str]:
        """The options that differ from their defaults, as CLI flags (noise_seed follows --seed: not listed)."""
        return [f"--{name.replace('_', '-')}" for name in ("max_episode_steps", "obs_latency", "obs_noise", "action_delay")
                if getattr(self, name) != getattr(SimOptions(), name)]


def make_robot(uri: str, *, obs_dim: int, action_low, action_high, obs_timeout: float, sim: SimOptions = SimOptions(),
               ros2_backend: str = "dds") -> Robot:
    """The adapter for `uri`. `obs_dim` and the action bounds describe what the controller expects (ROS 2 topics
    do not advertise sizes); `obs_timeout` is how long a networked robot's `observe` waits for a new one."""
    if uri.startswith("sim:"):
        # lazy: this and MujocoRobot at the top add 0.45 s to `mbrl deploy --help` (it imports SimOptions) (measured)
        from mbrl.envs.tasks import get_task

        task = get_task(uri.removeprefix("sim:"))
        if task.env_id is None:
            raise ConfigError(f"--robot {uri!r}: task {task.name!r} has no simulator")
        uri = f"mujoco:{task.env_id}"
    if uri.startswith("mujoco:"):
        from mbrl.envs.robots.mujoco import MujocoRobot  # lazy: as get_task above

        env_id = uri.removeprefix("mujoco:")
        if not env_id:
            raise ConfigError(f"--robot {uri!r}: expected mujoco:ENV_ID, such as mujoco:Hopper-v5")
        return MujocoRobot(env_id, max_episode_steps=sim.max_episode_steps, obs_latency=sim.obs_latency,
                           obs_noise=sim.obs_noise, action_delay=sim.action_delay, noise_seed=sim.noise_seed)
    given = sim.given()
    if given and (uri.startswith("udp://") or uri.startswith("ros2:")):
        raise ConfigError(f"{', '.join(given)}: only for --robot mujoco:ENV_ID, found --robot {uri}")
    if uri.startswith("udp://"):
        return UdpRobot(*parse_address(uri), obs_timeout=obs_timeout)
    if uri.startswith("ros2:"):
        prefix = uri.removeprefix("ros2:")
        if not prefix.strip("/"):
            raise ConfigError(f"--robot {uri!r}: expected ros2:TOPIC_PREFIX, such as ros2:/my_robot")
        if ros2_backend not in ROS2_BACKENDS:
            raise ConfigError(f"--ros2-backend {ros2_backend!r}: expected one of {', '.join(ROS2_BACKENDS)}")
        low, high = np.asarray(action_low, np.float32), np.asarray(action_high, np.float32)
        if ros2_backend == "rclpy":
            return Ros2Robot(prefix, obs_dim, low, high, obs_timeout=obs_timeout)

        return DdsRobot(prefix, obs_dim, low, high, obs_timeout=obs_timeout)
    raise ConfigError(f"--robot {uri!r}: unknown robot; expected sim:TASK, mujoco:ENV_ID, udp://HOST:PORT or ros2:PREFIX")


def check_fit(robot: Robot, policy: str, obs_dim: int, act_dim: int, action_low, action_high,
              declared: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The command bounds a policy (`policy` names it: an export, a run) and a connected robot agree on;
    RobotError when the dims differ or the bounds do not overlap, or, for a `declared` robot (its bounds are the
    user's declaration of this very robot), when they differ at all."""
    where = f"{policy} and robot {robot.name}"
    if robot.obs_dim != obs_dim:
        raise RobotError(f"{where}: the policy takes observations of dim {obs_dim}, the robot gives {robot.obs_dim}")
    if robot.act_dim != act_dim:
        raise RobotError(f"{where}: the policy gives actions of dim {act_dim}, the robot takes {robot.act_dim}")
    action_low, action_high = np.asarray(action_low, np.float32), np.asarray(action_high, np.float32)
    if declared and not (np.allclose(action_low, robot.action_low, rtol=1e-6, atol=1e-6)
                         and np.allclose(action_high, robot.action_high, rtol=1e-6, atol=1e-6)):
        raise RobotError(f"{where}: the robot's action bounds {robot.action_low.tolist()}..{robot.action_high.tolist()} "
                         f"differ from the declared {action_low.tolist()}..{action_high.tolist()}")
    low, high = np.maximum(action_low, robot.action_low), np.minimum(action_high, robot.action_high)
    if not np.all(low < high):
        raise RobotError(f"{where}: the action bounds do not overlap (policy {action_low.tolist()}..{action_high.tolist()}, "
                         f"robot {robot.action_low.tolist()}..{robot.action_high.tolist()})")
    return low, high
