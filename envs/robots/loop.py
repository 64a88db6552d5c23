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
SIGINT/SIGTERM (`StopSignals`), or an error (re-raised after the robot is stopped).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from envs.robots.protocol import Robot
from envs.robots.safety import SafetyLayer, StopSignals


class TickLog:
    """JSON lines to a file (or nowhere), plus the running numbers of the summary."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w") if self.path is not None else None
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


class ControlLoop:
    """Runs `policy` (obs -> action, with `reset()`) on `robot` through `safety` at `rate_hz`."""

    def __init__(self, robot: Robot, policy: Callable, safety: SafetyLayer, rate_hz: float | None,
                 log_path: str | Path | None = None):
        self.robot, self.policy, self.safety = robot, policy, safety
        self.period = None if not rate_hz else 1.0 / float(rate_hz)
        self.log = TickLog(log_path)
        self.stop_reason: str | None = None

    def run(self, episodes: int = 1, seed: int | None = 0, max_steps: int | None = None, connect: bool = True) -> dict:
        """Connect (unless the caller did), run the episodes (episode i resets with seed + i), safe-stop,
        disconnect; the summary."""
        start = time.monotonic()
        if connect:
            self.robot.connect()
        try:
            with StopSignals() as signals:
                for episode in range(episodes):
                    if not self._episode(episode, None if seed is None else seed + episode, max_steps, signals, start):
                        break
            self.stop_reason = self.stop_reason or "done"
        except BaseException as exc:
            self.stop_reason = f"error: {type(exc).__name__}: {exc}"
            raise
        finally:
            self._safe_stop(start)
            self.robot.disconnect()
            summary = self._summary(time.monotonic() - start)
            self.log.write({"type": "summary", **summary})
            self.log.close()
        return summary

    def _episode(self, episode: int, seed: int | None, max_steps: int | None, signals: StopSignals, start: float) -> bool:
        """One episode; False when the run must stop (watchdog or signal)."""
        robot, safety = self.robot, self.safety
        robot.reset(seed)
        safety.reset()
        if hasattr(self.policy, "reset"):
            self.policy.reset()
        total, step, ended, counted_seq = 0.0, 0, None, -1
        deadline = time.monotonic()

        def account(obs) -> float:  # a reward counts once, with the first observation that carries it
            nonlocal counted_seq
            fresh = obs.reward is not None and obs.seq > counted_seq
            counted_seq = max(counted_seq, obs.seq)
            return obs.reward if fresh else 0.0

        while max_steps is None or step < max_steps:
            if signals.signal_name is not None:
                self.stop_reason = ended = signals.signal_name
                break
            tick_start = time.monotonic()
            obs = robot.observe()
            now = time.monotonic()
            total += account(obs)
            if obs.done:
                ended = "terminated" if obs.terminated else "truncated"
                break
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
            record = {"t": round(now - start, 6), "episode": episode, "step": step, "obs_seq": obs.seq,
                      "obs_age_ms": _ms(now - obs.timestamp), "inference_ms": None if inference is None else _ms(inference)}
            if verdict == "stop":
                self.stop_reason = ended = "watchdog"
                self.log.tick({**record, "latency_ms": None, "overrun": False, "action": None, "events": events})
                break
            sent = robot.act(command)
            safety.accept_sent(sent)
            done_at = time.monotonic()
            overrun = False
            if self.period is not None:
                deadline += self.period
                overrun = done_at > deadline
                if overrun:
                    deadline = done_at  # restart the schedule: no burst of missed ticks
            self.log.tick({**record, "latency_ms": _ms(done_at - obs.timestamp), "compute_ms": _ms(done_at - tick_start),
                           "overrun": overrun, "action": np.asarray(sent, float).round(7).tolist(), "events": events})
            step += 1
            if self.period is not None and not overrun:
                time.sleep(max(0.0, deadline - time.monotonic()))
        else:  # stopped by max_steps: the last command's reward arrives with one more observation
            total += account(robot.observe())
        result = {"episode": episode, "seed": seed, "return": total, "length": step, "end": ended or "max_steps"}
        self.log.episodes.append(result)
        self.log.write({"type": "episode", **result})
        return self.stop_reason is None

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
            "robot": getattr(self.robot, "name", type(self.robot).__name__),
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
