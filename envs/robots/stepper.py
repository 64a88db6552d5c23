"""What a robot-side server steps (`mbrl.envs.robots.serve`, `sim_server`, `dds_sim`): a Stepper, one robot or simulator,
one episode at a time; a Gymnasium env (`GymStepper`) or a user's class (`UserStepper`, `load_stepper`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import gymnasium
import numpy as np

import mbrl.envs.tasks  # noqa: F401  registers the tasks' Gymnasium ids (NeoRL2/DMSD-v0, ...)
from mbrl.core.declaration import import_reference


@runtime_checkable
class Stepper(Protocol):
    """What a server steps: one robot (or simulator), one episode at a time."""

    obs_dim: int
    act_dim: int
    action_low: np.ndarray
    action_high: np.ndarray

    def reset(self, seed: int | None) -> np.ndarray: ...

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool]: ...

    def close(self) -> None: ...


class GymStepper:
    """A Gymnasium env as a Stepper: actions in the action space's dtype, as a controller in this process passes
    them (Hopper's control cost squares the action in that dtype)."""

    def __init__(self, env_id: str, max_episode_steps: int | None = None):
        kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
        try:
            self.env = gymnasium.make(env_id, **kwargs)
        except Exception as exc:
            raise ValueError(f"--env {env_id}: {' '.join(str(exc).split())}") from None
        self.obs_dim = int(np.prod(self.env.observation_space.shape))
        self.act_dim = int(np.prod(self.env.action_space.shape))
        self.action_low = self.env.action_space.low.astype(np.float64)
        self.action_high = self.env.action_space.high.astype(np.float64)

    def reset(self, seed: int | None) -> np.ndarray:
        obs, _ = self.env.reset(seed=seed)
        return obs

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool]:
        obs, reward, terminated, truncated, _ = self.env.step(np.asarray(action).astype(self.env.action_space.dtype))
        return obs, reward, terminated, truncated

    def close(self) -> None:
        self.env.close()


class UserStepper:
    """A user's object as a Stepper: dims and bounds from it or from the declared task, every answer checked, and
    episodes cut at the declared limit."""

    def __init__(self, robot: Any, task=None, where: str = "the robot"):
        self.robot, self.where = robot, where
        for method in ("reset", "step"):
            if not callable(getattr(robot, method, None)):
                raise ValueError(f"{where} has no {method}() method; expected reset(seed) -> obs and "
                                 f"step(action) -> obs, reward, terminated, truncated")
        if task is not None:
            self.obs_dim, self.act_dim = task.obs_dim, task.act_dim
            self.action_low, self.action_high = (b.astype(np.float64) for b in task.action_bounds())
            self.limit = task.max_episode_steps
        else:
            missing = [a for a in ("obs_dim", "act_dim", "action_low", "action_high") if not hasattr(robot, a)]
            if missing:
                raise ValueError(f"{where} has no {missing[0]}; give obs_dim, act_dim, action_low and action_high "
                                 f"on it, or pass --task robot.toml")
            self.obs_dim, self.act_dim = int(robot.obs_dim), int(robot.act_dim)
            self.action_low, self.action_high = (np.broadcast_to(np.asarray(b, np.float64), (self.act_dim,)).copy()
                                                 for b in (robot.action_low, robot.action_high))
            self.limit = None
        for name in ("obs_dim", "act_dim"):
            mine = getattr(robot, name, None)
            if mine is not None and int(mine) != getattr(self, name):
                raise ValueError(f"{where} says {name} = {mine}; the declared task has {getattr(self, name)}")
        self.steps = 0

    def _obs(self, obs, method: str) -> np.ndarray:
        values = np.asarray(obs, np.float64).reshape(-1)
        if values.shape != (self.obs_dim,):
            raise ValueError(f"{self.where}.{method}() returned an observation of {values.size} values; "
                             f"expected {self.obs_dim}")
        return values

    def reset(self, seed: int | None) -> np.ndarray:
        self.steps = 0
        return self._obs(self.robot.reset(seed), "reset")

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool]:
        answer = self.robot.step(np.asarray(action, np.float64))
        if not (isinstance(answer, tuple) and len(answer) == 4):
            raise ValueError(f"{self.where}.step() returned {type(answer).__name__}; expected a tuple "
                             f"(obs, reward, terminated, truncated)")
        obs, reward, terminated, truncated = answer
        self.steps += 1
        truncated = bool(truncated) or (self.limit is not None and self.steps >= self.limit and not terminated)
        return self._obs(obs, "step"), float(reward), bool(terminated), truncated

    def close(self) -> None:
        close = getattr(self.robot, "close", None)
        if callable(close):
            close()


def load_stepper(ref: str, task=None) -> UserStepper:
    """`module:Name` -> a UserStepper of `Name()` (a class or a factory function)."""
    module_name, sep, attr = ref.rpartition(":")
    if not sep or not module_name or not attr.isidentifier():
        raise ValueError(f"--step {ref!r}: expected module:Class, such as mypackage.robot:Robot")

    try:
        factory = import_reference(ref)
    except (ImportError, AttributeError, OSError) as exc:
        raise ValueError(f"--step {ref!r} does not import ({type(exc).__name__}: {exc})") from None
    return UserStepper(factory(), task=task, where=ref)


def serve_until_stopped(server, ready: str) -> int:
    """Print `ready`, serve until SIGTERM or Ctrl-C, close; 0."""
    def terminate(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, terminate)
    print(ready, flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def gym_server_parser(prog: str, doc: str, stops: str, *own: tuple[str, dict]) -> argparse.ArgumentParser:
    """The options of a server program around a Gymnasium env (`sim_server`, `dds_sim`): --env, its `own` options
    (name, add_argument keywords) where it is reached, then --max-episode-steps, --stop-after (it stops `stops`),
    --log."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--env", default="Hopper-v5", help="a Gymnasium env id (default Hopper-v5)")
    for name, options in own:
        parser.add_argument(name, **options)
    parser.add_argument("--max-episode-steps", type=int, default=None)
    parser.add_argument("--stop-after", type=int, default=None, help=f"stop {stops} after N steps of an episode")
    parser.add_argument("--log", default=None, help="append events as JSON lines to this file")
    return parser


def serve_program(name: str, make: Callable[[], Any], ready: Callable[[Any], str]) -> int:
    """Make the server (a failure, such as a bad env id, a port in use or a bad prefix, is one line on stderr and
    exit 2), then `serve_until_stopped` with its `ready(server)` line."""
    try:
        server = make()
    except Exception as exc:
        print(f"{name}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return serve_until_stopped(server, ready(server))
