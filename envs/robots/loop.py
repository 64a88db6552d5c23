"""The fixed-rate control loop: observe, decide, make it safe, act; paced by deadlines, logged per tick.

Tick k is due at t0 + k * period. After a tick's work the loop sleeps until the next deadline, so
the time the work took never shifts the schedule (a `sleep(period)` would add it to every tick and
drift). A tick that ends after the next deadline is an overrun: it is counted and logged, and the
schedule restarts from now instead of firing the missed ticks in a burst. `rate_hz=None` runs
unpaced, as fast as the robot answers (simulation, tests).

Each tick appends one JSON line to the log: the time, the observation's seq and age, the policy's
inference time, the latency from observation to command, whether it overran, the command sent and
the safety events. Episode ends, the safe stop and a final summary are lines of their own ("type").
The loop ends with a safe stop and a disconnect in every case: all episodes done, the watchdog, a
SIGINT/SIGTERM (`mbrl.core.signals.StopSignal`), or an error (re-raised after the robot is stopped).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mbrl.core.signals import StopSignal
from mbrl.envs.robots.protocol import Observation, Robot
from mbrl.envs.robots.safety import SafetyLayer


class TickLog:
    """JSON lines to a file (or nowhere), plus the running numbers of the summary."""

    def __init__(self, path: str | Path | None, append: bool = False):
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a" if append else "w") if self.path is not None else None
        self.latencies_ms: list[float] = []
        self.events: Counter = Counter()
        self.ticks = self.overruns = 0
        self.episodes: list[dict] = []

    def write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()  # a killed process still leaves every finished tick on disk

    def tick(self, record: dict) -> None:
        self.ticks += 1
        self.overruns += int(record["overrun"])
        self.events.update(record["events"])
        if record.get("latency_ms") is not None:
            self.latencies_ms.append(record["latency_ms"])
        self.write({"type": "tick", **record})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


@dataclasses.dataclass
class EpisodeProgress:
    """The host side of the episode in progress (a checkpoint saves it to resume mid-episode)."""

    episode: int
    seed: int | None
    step: int = 0  # ticks that sent a command
    total: float = 0.0  # the rewards counted so far
    counted_seq: int = -1  # the newest observation whose reward was counted


@dataclasses.dataclass(frozen=True)
class Tick:
    """What one tick did. `fresh`: a new measurement whose reward was not counted before; `acted`: the policy
    decided this tick's command (not held by the safety layer); `end`: the episode ends here, nothing sent
    ("terminated", "truncated", "watchdog", or the signal's name)."""

    obs: Observation | None
    reward: float = 0.0
    fresh: bool = False
    acted: bool = False
    sent: np.ndarray | None = None
    end: str | None = None


class ControlLoop:
    """Runs `policy` (obs -> action, with `reset()`) on `robot` through `safety` at `rate_hz`.

    `run` drives whole episodes (deploy). A caller with its own schedule (fine-tuning) drives the same
    ticks itself inside `session`: `begin_episode`, `tick` until one ends, `finish_episode`. `robot` is any
    `Robot` (`mbrl.envs.robots.protocol`): the loop uses nothing of it beyond that base.
    """

    def __init__(self, robot: Robot, policy: Callable, safety: SafetyLayer, rate_hz: float | None,
                 log_path: str | Path | None = None, append_log: bool = False):
        if not isinstance(robot, Robot):
            raise TypeError(f"ControlLoop: the robot must be a mbrl.envs.robots.protocol.Robot, found {type(robot).__name__}")
        self.robot, self.policy, self.safety = robot, policy, safety
        self.period = None if not rate_hz else 1.0 / float(rate_hz)
        self.log = TickLog(log_path, append=append_log)
        self.stop_reason: str | None = None
        self.progress: EpisodeProgress | None = None
        self._start = time.monotonic()
        self._deadline = self._start

    def run(self, episodes: int = 1, seed: int | None = 0, max_steps: int | None = None, connect: bool = True) -> dict:
        """Connect (unless the caller did), run the episodes (episode i resets with seed + i), safe-stop,
        disconnect; the summary."""

        def drive(signals: StopSignal) -> None:
            for episode in range(episodes):
                if not self._episode(episode, None if seed is None else seed + episode, max_steps, signals):
                    break

        return self.session(drive, connect=connect)

    def session(self, drive: Callable[[StopSignal], None], connect: bool = True) -> dict:
        """Connect (unless the caller did), `drive(signals)`, then in every case safe-stop and disconnect; the
        summary. SIGINT/SIGTERM set `signals.signal_name`, which the next `tick` turns into the episode's end."""
        self._start = time.monotonic()
        if connect:
            self.robot.connect()
        try:
            with StopSignal(second_aborts=False) as signals:
                drive(signals)
            self.stop_reason = self.stop_reason or "done"
        except BaseException as exc:
            self.stop_reason = f"error: {type(exc).__name__}: {exc}"
            raise
        finally:
            self._safe_stop(self._start)
            self.robot.disconnect()
            summary = self._summary(time.monotonic() - self._start)
            self.log.write({"type": "summary", **summary})
            self.log.close()
        return summary

    def _episode(self, episode: int, seed: int | None, max_steps: int | None, signals: StopSignal) -> bool:
        """One episode; False when the run must stop (watchdog or signal)."""
        self.begin_episode(episode, seed)
        while True:
            if max_steps is not None and self.progress.step >= max_steps:
                ended = "max_steps"
                break
            tick = self.tick(signals)
            if tick.end is not None:
                ended = tick.end
                break
        self.finish_episode(ended)
        return self.stop_reason is None

    def begin_episode(self, episode: int, seed: int | None) -> None:
        """Reset the robot (with `seed`), the safety layer and the policy's memory."""
        self.robot.reset(seed)
        self.safety.reset()
        if hasattr(self.policy, "reset"):
            self.policy.reset()
        self.progress = EpisodeProgress(episode, seed)
        self._deadline = time.monotonic()

    def resume_episode(self, progress: EpisodeProgress) -> None:
        """Continue an episode whose robot and safety layer the caller restored (a checkpoint's)."""
        self.progress = progress
        self._deadline = time.monotonic()

    def _account(self, obs: Observation) -> tuple[float, bool]:
        """The reward an observation carries, counted once: with the first observation that carries it."""
        progress = self.progress
        fresh = obs.seq > progress.counted_seq
        progress.counted_seq = max(progress.counted_seq, obs.seq)
        reward = obs.reward if fresh and obs.reward is not None else 0.0
        progress.total += reward
        return reward, fresh

    def tick(self, signals: StopSignal) -> Tick:
        """One tick of the episode in progress: observe, decide, make safe, act, log."""
        robot, safety, progress = self.robot, self.safety, self.progress
        if signals.signal_name is not None:
            self.stop_reason = signals.signal_name
            return Tick(None, end=signals.signal_name)
        tick_start = time.monotonic()
        obs = robot.observe()
        now = time.monotonic()
        reward, fresh = self._account(obs)
        if obs.done:
            return Tick(obs, reward, fresh, end="terminated" if obs.terminated else "truncated")
        verdict, events = safety.check_observation(obs, now)
        inference = None
        if verdict == "ok":
            t0 = time.monotonic()
            raw = self.policy(obs.values)
            inference = time.monotonic() - t0
            command, action_events = safety.filter_action(raw)
            events += action_events
        else:
            command = safety.hold()
        record = {"t": round(now - self._start, 6), "episode": progress.episode, "step": progress.step, "obs_seq": obs.seq,
                  "obs_age_ms": _ms(now - obs.timestamp), "inference_ms": None if inference is None else _ms(inference)}
        if verdict == "stop":
            self.stop_reason = "watchdog"
            self.log.tick({**record, "latency_ms": None, "overrun": False, "action": None, "events": events})
            return Tick(obs, reward, fresh, end="watchdog")
        sent = robot.act(command)
        safety.accept_sent(sent)
        done_at = time.monotonic()
        overrun = False
        if self.period is not None:
            self._deadline += self.period
            overrun = done_at > self._deadline
            if overrun:
                self._deadline = done_at  # restart the schedule: no burst of missed ticks
        self.log.tick({**record, "latency_ms": _ms(done_at - obs.timestamp), "compute_ms": _ms(done_at - tick_start),
                       "overrun": overrun, "action": np.asarray(sent, float).round(7).tolist(), "events": events})
        progress.step += 1
        if self.period is not None and not overrun:
            time.sleep(max(0.0, self._deadline - time.monotonic()))
        return Tick(obs, reward, fresh, acted=verdict == "ok", sent=np.asarray(sent, np.float32))

    def finish_episode(self, ended: str) -> dict:
        """Log the episode's result; stopped by a step budget ("max_steps"), the last command's reward arrives
        with one more observation."""
        progress = self.progress
        if ended == "max_steps":
            self._account(self.robot.observe())
        result = {"episode": progress.episode, "seed": progress.seed, "return": progress.total, "length": progress.step,
                  "end": ended}
        self.log.episodes.append(result)
        self.log.write({"type": "episode", **result})
        self.progress = None
        return result

    def _safe_stop(self, start: float) -> None:
        record = {"type": "safe_stop", "t": round(time.monotonic() - start, 6), "reason": self.stop_reason,
                  "tick": self.log.ticks}
        try:
            self.robot.safe_stop()
            record["acknowledged"] = True
        except Exception as exc:  # a robot that is gone cannot confirm; still disconnect and report it
            record["acknowledged"] = False
            record["error"] = f"{type(exc).__name__}: {exc}"
        self.log.events["safe_stop"] += 1
        self.log.write(record)

    def _summary(self, seconds: float) -> dict:
        log = self.log
        latencies = np.asarray(log.latencies_ms) if log.latencies_ms else np.zeros(1)
        returns = [e["return"] for e in log.episodes]
        return {
            "robot": self.robot.name,
            "stop_reason": self.stop_reason,
            "seconds": round(seconds, 3),
            "ticks": log.ticks,
            "rate_hz": None if self.period is None else 1.0 / self.period,
            "achieved_hz": round(log.ticks / seconds, 2) if seconds > 0 else None,
            "overruns": log.overruns,
            "latency_ms": {"mean": float(latencies.mean()), "p50": float(np.percentile(latencies, 50)),
                           "p99": float(np.percentile(latencies, 99)), "max": float(latencies.max())},
            "events": dict(log.events),
            "episodes": log.episodes,
            "return_mean": float(np.mean(returns)) if returns else None,
        }
