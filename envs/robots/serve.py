"""The robot side of the project's protocols: wrap a user's class and serve it over UDP or ROS 2.

    python -m envs.robots.serve --step mypackage.robot:Robot --robot udp://0.0.0.0:5555 [--task robot.toml]
    python -m envs.robots.serve --step mypackage.robot:Robot --robot ros2:/cart
    python -m envs.robots.serve --env Hopper-v5 --robot udp://127.0.0.1:0     # a Gymnasium env instead

The class (or a function returning the object), built with no arguments, has

    reset(seed) -> obs                                       # seed: an int or None
    step(action) -> obs, reward, terminated, truncated

and says its dims and action bounds as `obs_dim`, `act_dim`, `action_low`, `action_high`, or takes them from
`--task` (a robot's declaration, whose episode limit then also ends episodes here). `python -m
envs.robots.sim_server` and `envs.robots.dds_sim` are this server with a Gymnasium env (`GymStepper`).
It prints `listening on HOST:PORT` (UDP; port 0 picks a free one) or `ready on ros2:PREFIX` once ready.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from typing import Any, Protocol, runtime_checkable

import numpy as np


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
        import gymnasium

        import envs.tasks  # noqa: F401  registers the tasks' Gymnasium ids (NeoRL2/DMSD-v0, ...)

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
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
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


def serve(stepper: Stepper, robot: str, *, stop_after: int | None = None, log: str | None = None) -> int:
    """Serve `stepper` at `robot` (udp://HOST:PORT or ros2:PREFIX) until SIGTERM; 0 on a clean exit."""
    if robot.startswith("udp://"):
        from envs.robots.sim_server import SimServer

        host, _, port = robot[len("udp://"):].rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"--robot {robot!r}: expected udp://HOST:PORT with a port in 0..65535 (0: any free port)")
        host, port = host.strip("[]"), int(port)
        server = SimServer(stepper, host, port, stop_after=stop_after, log_path=log)
        return serve_until_stopped(server, f"listening on {server.address[0]}:{server.address[1]}")
    if robot.startswith("ros2:"):
        from envs.robots.dds_sim import DdsSim

        node = DdsSim(stepper, robot[len("ros2:"):], stop_after=stop_after, log_path=log)
        return serve_until_stopped(node, f"ready on ros2:{node.prefix}")
    raise ValueError(f"--robot {robot!r}: expected udp://HOST:PORT or ros2:PREFIX")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.robots.serve", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--step", help="module:Class with reset(seed) -> obs and step(action) -> obs, reward, "
                                       "terminated, truncated")
    source.add_argument("--env", help="a Gymnasium env id instead (Hopper-v5, NeoRL2/DMSD-v0, ...)")
    parser.add_argument("--robot", required=True, help="udp://HOST:PORT (port 0: any free port) or ros2:PREFIX")
    parser.add_argument("--task", default=None, help="the robot's declaration (robot.toml): dims, bounds, episode limit")
    parser.add_argument("--max-episode-steps", type=int, default=None, help="with --env: the episode limit")
    parser.add_argument("--stop-after", type=int, default=None, help="stop answering after N steps of an episode")
    parser.add_argument("--log", default=None, help="append events as JSON lines to this file")
    args = parser.parse_args(argv)
    try:
        if args.env is not None:
            stepper = GymStepper(args.env, args.max_episode_steps)
        else:
            task = None
            if args.task is not None:
                from envs.tasks import get_task

                task = get_task(args.task)
            stepper = load_stepper(args.step, task)
        if args.robot.startswith("ros2:"):
            import cyclonedds  # noqa: F401
    except ImportError as exc:
        print(f"serve: error: cannot import cyclonedds ({exc}); pip install 'offline-mbrl[ros2]'", file=sys.stderr)
        return 2
    except Exception as exc:  # a bad class, task or env: one line, exit 2
        print(f"serve: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    try:
        return serve(stepper, args.robot, stop_after=args.stop_after, log=args.log)
    except OSError as exc:  # a port in use, an address that does not resolve
        print(f"serve: error: {args.robot}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"serve: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
