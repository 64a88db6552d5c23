"""`Robot`, the one base every robot adapter extends, and the observation it returns.

Modelled on LeRobot's Robot (connect / get_observation / send_action returning what was actually
sent / disconnect), plus `safe_stop` and, for simulated robots, episodes:

    robot.connect()
    robot.reset(seed)              # start an episode: a simulator resets; a real robot may do nothing
    obs = robot.observe()          # Observation: values + timestamp + seq (+ reward / done in simulation)
    sent = robot.act(action)       # returns the action actually sent, after the robot's own clipping
    robot.safe_stop()              # bring the robot to rest: zero command, episode over
    robot.disconnect()

`seq` numbers the robot's measurements: an observation whose seq did not advance is stale (no new
measurement arrived), which the watchdog of the control loop counts. `timestamp` is when the
observation was measured or received, in this process's `time.monotonic()` seconds.

What every adapter shares lives here once: the dims and bounds (`_set_spec`, known at construction or
after `connect`), the clipping of a command (`clip`, `act` = clip then the adapter's `_send`), the
command at rest, the numbering of fresh measurements (`_measured`), and `observe` for a robot whose
measurements arrive over time (the episode's first one handed out once, then up to `obs_timeout`
seconds of the adapter's `_receive_observation`, else the previous one: stale). An adapter writes its
transport only: `connect`, `reset`, `_send`, `_receive_observation` (or its own `observe`), `safe_stop`,
`disconnect`. The control loop (`loop.ControlLoop`), `connect.check_fit` and `mbrl deploy` / `mbrl
finetune` speak to this class only; `RobotWrapper` is a robot seen through something that changes
what it observes (`runner.RewardFeed`, `runner.ChangeFeed`).
"""

from __future__ import annotations

import abc
import dataclasses
import time

import numpy as np

from mbrl.core.errors import UserError


class RobotError(UserError):
    """A robot that cannot be reached or that answers outside the protocol."""


@dataclasses.dataclass(frozen=True)
class Observation:
    values: np.ndarray  # float32 (obs_dim,)
    timestamp: float  # time.monotonic() seconds at measurement (or reception)
    seq: int  # increases with every new measurement
    reward: float | None = None  # simulated robots: the reward of the step that led here
    terminated: bool = False  # simulated robots: the episode ended (fell, reached a terminal state)
    truncated: bool = False  # simulated robots: the episode hit its time limit

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class Robot(abc.ABC):
    """What the control loop needs from a robot. Dims and bounds are known after `connect`.

    `name` says where the robot is (`udp://HOST:PORT`, `ros2:/PREFIX`, `mujoco:ENV_ID`); `obs_timeout` is how long
    the shared `observe` waits for a new measurement.
    """

    def __init__(self, name: str, *, obs_timeout: float = 0.0):
        self.name = name
        self.obs_timeout = obs_timeout
        self._spec: tuple[int, np.ndarray, np.ndarray] | None = None  # (obs_dim, action_low, action_high)
        self._seq = 0  # local measurement counter: one per fresh observation
        self._last: Observation | None = None  # the newest observation
        self._fresh = False  # the episode's first observation is waiting to be observed

    # -- dims and bounds ---------------------------------------------------------------------------------

    def _set_spec(self, obs_dim: int, action_low, action_high) -> None:
        """The robot's dims and command bounds (float32, one per actuator); None: not known (disconnected)."""
        self._spec = (int(obs_dim), np.asarray(action_low, np.float32).reshape(-1),
                      np.asarray(action_high, np.float32).reshape(-1))

    def _known_spec(self) -> tuple[int, np.ndarray, np.ndarray]:
        if self._spec is None:
            raise RobotError(f"{self.name}: not connected")
        return self._spec

    @property
    def obs_dim(self) -> int:
        return self._known_spec()[0]

    @property
    def act_dim(self) -> int:
        return int(self._known_spec()[1].size)

    @property
    def action_low(self) -> np.ndarray:
        return self._known_spec()[1]

    @property
    def action_high(self) -> np.ndarray:
        return self._known_spec()[2]

    @property
    def rest_action(self) -> np.ndarray:
        """The command at rest: zeros moved into the bounds."""
        return np.clip(np.zeros(self.act_dim, np.float32), self.action_low, self.action_high)

    # -- commands ----------------------------------------------------------------------------------------

    def clip(self, action) -> np.ndarray:
        """`action` as this robot takes it: float32, one value per actuator, within the bounds."""
        return np.clip(np.asarray(action, np.float32).reshape(self.act_dim), self.action_low, self.action_high)

    def act(self, action) -> np.ndarray:
        """Send `action` clipped to the bounds; the command actually sent."""
        sent = self.clip(action)
        self._send(sent)
        return sent

    @abc.abstractmethod
    def _send(self, sent: np.ndarray) -> None:
        """Hand the clipped command to the robot."""

    # -- observations ------------------------------------------------------------------------------------

    def _measured(self, values, reward: float | None = None, terminated: bool = False,
                  truncated: bool = False) -> Observation:
        """A fresh measurement, stamped on reception and numbered with the next local seq: the newest observation."""
        self._seq += 1
        self._last = Observation(np.asarray(values, np.float32), time.monotonic(), self._seq, reward, terminated,
                                 truncated)
        return self._last

    def observe(self) -> Observation:
        """The observation that followed the last action; the previous one (same seq, stale) if none arrives in time."""
        if self._fresh:
            self._fresh = False
            return self._last
        deadline = time.monotonic() + self.obs_timeout
        seconds = 0.0  # first: what has arrived already
        while not self._receive_observation(seconds):
            seconds = deadline - time.monotonic()
            if seconds <= 0:
                break
        if self._last is None:  # nothing measured yet: not finite, so the safety layer holds
            return Observation(np.full(self.obs_dim, np.nan, np.float32), 0.0, 0)
        return self._last

    def _receive_observation(self, seconds: float) -> bool:
        """Wait up to `seconds` (0: do not wait) and take what arrived; True when a new observation was taken
        (`_measured`). For the shared `observe`; an adapter with its own `observe` need not write it."""
        raise NotImplementedError(f"{type(self).__name__}: write _receive_observation or observe")

    # -- the session ---------------------------------------------------------------------------------------

    @abc.abstractmethod
    def connect(self) -> None:
        """Reach the robot; its dims and bounds are known afterwards."""

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> None:
        """Start an episode (a real robot may have none to start)."""

    @abc.abstractmethod
    def safe_stop(self) -> None:
        """Bring the robot to rest; RobotError when it does not confirm."""

    @abc.abstractmethod
    def disconnect(self) -> None:
        """Let the robot go; `connect` may follow again."""

    def snapshot(self) -> dict | None:
        """The episode in progress as plain values, for `restore`; None: this robot cannot be put back mid-episode."""
        return None

    def restore(self, snapshot: dict) -> None:
        """Continue the episode of a `snapshot`."""
        raise RobotError(f"{self.name}: an episode in progress cannot be restored on this robot")


class RobotWrapper(Robot):
    """A robot seen through a wrapper: everything passes through to `robot` unless the wrapper overrides it."""

    def __init__(self, robot: Robot):
        if not isinstance(robot, Robot):
            raise TypeError(f"{type(self).__name__}: expected a Robot, found {type(robot).__name__}")
        super().__init__(robot.name)
        self.robot = robot

    @property
    def obs_dim(self) -> int:
        return self.robot.obs_dim

    @property
    def act_dim(self) -> int:
        return self.robot.act_dim

    @property
    def action_low(self) -> np.ndarray:
        return self.robot.action_low

    @property
    def action_high(self) -> np.ndarray:
        return self.robot.action_high

    def act(self, action) -> np.ndarray:
        return self.robot.act(action)

    def _send(self, sent: np.ndarray) -> None:
        self.robot.act(sent)

    def observe(self) -> Observation:
        return self.robot.observe()

    def connect(self) -> None:
        self.robot.connect()

    def reset(self, seed: int | None = None) -> None:
        self.robot.reset(seed)

    def safe_stop(self) -> None:
        self.robot.safe_stop()

    def disconnect(self) -> None:
        self.robot.disconnect()

    def snapshot(self) -> dict | None:
        return self.robot.snapshot()

    def restore(self, snapshot: dict) -> None:
        self.robot.restore(snapshot)
