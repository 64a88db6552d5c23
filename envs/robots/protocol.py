"""The `Robot` protocol every adapter implements, and the observation it returns.

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
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class Robot(Protocol):
    """What the control loop needs from a robot. Dims and bounds are known after `connect`."""

    name: str

    @property
    def obs_dim(self) -> int: ...

    @property
    def act_dim(self) -> int: ...

    @property
    def action_low(self) -> np.ndarray: ...

    @property
    def action_high(self) -> np.ndarray: ...

    def connect(self) -> None: ...

    def reset(self, seed: int | None = None) -> None: ...

    def observe(self) -> Observation: ...

    def act(self, action: np.ndarray) -> np.ndarray: ...

    def safe_stop(self) -> None: ...

    def disconnect(self) -> None: ...
