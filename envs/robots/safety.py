"""The safety layer between the policy and the robot, and the stop-on-signal guard.

Per tick, in this order:
1. the observation: NaN/Inf values -> hold the last safe action (event `nonfinite_obs`); a stale
   observation (no new measurement, or older than `max_obs_age`) -> hold (event `stale_obs`); after
   `max_stale_ticks` stale ticks in a row the watchdog asks for a safe stop (event `watchdog`).
2. the action: NaN/Inf -> the last safe action (event `nonfinite_action`); clip to the robot's bounds
   (event `clipped`); limit the change from the last sent action to `max_delta` (event `rate_limited`).
The last action that passed is the "last safe action"; at the start of an episode it is the safe
action (zeros, moved into the bounds), i.e. the robot is assumed at rest after a reset.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mbrl.envs.robots.protocol import Observation
from mbrl.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class SafetyConfig:
    """The safety layer between the policy and the robot: its limits.

    max_delta: the largest change of a command per tick per joint, |a_t - a_{t-1}|, as a fraction of the action
        range (high - low); None: no rate limit.
    max_stale_ticks: ticks in a row without a new observation before the watchdog stops the robot safely.
    max_obs_age: seconds after which an observation counts as stale even if it is new to the controller (since it
        was measured); None: off, only an observation that does not advance counts (unpaced runs, where
        wall-clock ages mean nothing).
    safe_action: the command at rest, in the robot's units; None: zeros moved into the bounds.

    The one home of these defaults: `mbrl deploy` and `mbrl finetune` generate their options from these fields
    (`mbrl.config.option_fields`), with the entries above as their help.
    """

    max_delta: float | None = 0.5
    max_stale_ticks: int = 2
    max_obs_age: float | None = None
    safe_action: tuple[float, ...] | None = None

    def __post_init__(self):
        if self.max_delta is not None and not self.max_delta > 0:
            raise ConfigError(f"--max-delta: expected a fraction of the action range > 0 (or None), found {self.max_delta}")
        if self.max_stale_ticks < 1:
            raise ConfigError(f"--max-stale-ticks: expected an int >= 1, found {self.max_stale_ticks}")
        if self.max_obs_age is not None and not self.max_obs_age > 0:
            raise ConfigError(f"--max-obs-age: expected seconds > 0 (or None), found {self.max_obs_age}")


class SafetyLayer:
    """Turns policy outputs into commands that are finite, within bounds and rate limited."""

    def __init__(self, low, high, config: SafetyConfig = SafetyConfig()):
        self.low = np.asarray(low, np.float32)
        self.high = np.asarray(high, np.float32)
        if not (np.all(np.isfinite(self.low)) and np.all(np.isfinite(self.high)) and np.all(self.low < self.high)):
            raise ConfigError(f"safety: the action bounds must be finite with low < high, found {self.low.tolist()} / {self.high.tolist()}")
        self.config = config
        safe = np.zeros_like(self.low) if config.safe_action is None else np.asarray(config.safe_action, np.float32)
        if safe.shape != self.low.shape:
            raise ConfigError(f"safety: safe_action has {safe.size} values, the robot has {self.low.size} actuators")
        self.safe_action = np.clip(safe, self.low, self.high)
        self.max_delta = None if config.max_delta is None else np.float32(config.max_delta) * (self.high - self.low)
        self.reset()

    def reset(self) -> None:
        """A new episode: the robot is at rest, no observation seen yet."""
        self.last_action = self.safe_action.copy()
        self._last_seq: int | None = None
        self.stale_ticks = 0

    def state(self) -> dict:
        """What the layer remembers within an episode, as plain values (a fine-tuning checkpoint keeps it)."""
        return {"last_action": self.last_action.tolist(), "last_seq": self._last_seq, "stale_ticks": self.stale_ticks}

    def restore(self, state: dict) -> None:
        self.last_action = np.asarray(state["last_action"], np.float32)
        self._last_seq, self.stale_ticks = state["last_seq"], state["stale_ticks"]

    def check_observation(self, obs: Observation, now: float) -> tuple[str, list[str]]:
        """("ok" | "hold" | "stop", events) for this tick's observation."""
        stale = self._last_seq is not None and obs.seq <= self._last_seq
        if self.config.max_obs_age is not None and now - obs.timestamp > self.config.max_obs_age:
            stale = True
        if stale:
            self.stale_ticks += 1
            if self.stale_ticks >= self.config.max_stale_ticks:
                return "stop", ["stale_obs", "watchdog"]
            return "hold", ["stale_obs"]
        self.stale_ticks = 0
        self._last_seq = obs.seq
        if not np.all(np.isfinite(obs.values)):
            return "hold", ["nonfinite_obs"]
        return "ok", []

    def hold(self) -> np.ndarray:
        """The command when the policy must not be trusted this tick: the last safe action."""
        return self.last_action.copy()

    def filter_action(self, action) -> tuple[np.ndarray, list[str]]:
        """The command to send for a policy output, and the safety events it raised."""
        action = np.asarray(action, np.float32).reshape(self.low.shape)
        events = []
        if not np.all(np.isfinite(action)):
            return self.hold(), ["nonfinite_action"]
        clipped = np.clip(action, self.low, self.high)
        if np.any(clipped != action):
            events.append("clipped")
        if self.max_delta is not None:
            limited = np.clip(clipped, self.last_action - self.max_delta, self.last_action + self.max_delta)
            # Both the last action and `clipped` lie within the bounds, so the result does too.
            if np.any(limited != clipped):
                events.append("rate_limited")
            clipped = limited
        self.last_action = clipped
        return clipped.copy(), events

    def accept_sent(self, sent) -> None:
        """The robot's own clipping may change the command: the rate limit continues from what was sent."""
        sent = np.asarray(sent, np.float32).reshape(self.low.shape)
        if np.all(np.isfinite(sent)):
            self.last_action = sent
