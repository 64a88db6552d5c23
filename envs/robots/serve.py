"""The robot side of the project's protocols: wrap a user's class and serve it over UDP or ROS 2.

    python -m mbrl.envs.robots.serve --step mypackage.robot:Robot --robot udp://0.0.0.0:5555 [--task robot.toml]
    python -m mbrl.envs.robots.serve --step mypackage.robot:Robot --robot ros2:/cart
    python -m mbrl.envs.robots.serve --env Hopper-v5 --robot udp://127.0.0.1:0     # a Gymnasium env instead

The class (or a function returning the object), built with no arguments, has

    reset(seed) -> obs                                       # seed: an int or None
    step(action) -> obs, reward, terminated, truncated

and says its dims and action bounds as `obs_dim`, `act_dim`, `action_low`, `action_high`, or takes them from
`--task` (a robot's declaration, whose episode limit then also ends episodes here). `python -m
mbrl.envs.robots.sim_server` and `mbrl.envs.robots.dds_sim` are this server with a Gymnasium env (`GymStepper`).
It prints `listening on HOST:PORT` (UDP; port 0 picks a free one) or `ready on ros2:PREFIX` once ready.
"""

from __future__ import annotations

import argparse
import sys

from mbrl.envs.robots.dds_sim import DdsSim
from mbrl.envs.robots.sim_server import SimServer
from mbrl.envs.robots.stepper import GymStepper, Stepper, load_stepper, serve_until_stopped
from mbrl.envs.robots.udp import parse_address
from mbrl.envs.tasks import get_task


def serve(stepper: Stepper, robot: str, *, stop_after: int | None = None, log: str | None = None) -> int:
    """Serve `stepper` at `robot` (udp://HOST:PORT or ros2:PREFIX) until SIGTERM; 0 on a clean exit."""
    if robot.startswith("udp://"):
        host, port = parse_address(robot, any_port=True)
        server = SimServer(stepper, host, port, stop_after=stop_after, log_path=log)
        return serve_until_stopped(server, f"listening on {server.address[0]}:{server.address[1]}")
    if robot.startswith("ros2:"):
        node = DdsSim(stepper, robot[len("ros2:"):], stop_after=stop_after, log_path=log)
        return serve_until_stopped(node, f"ready on ros2:{node.prefix}")
    raise ValueError(f"--robot {robot!r}: expected udp://HOST:PORT or ros2:PREFIX")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mbrl.envs.robots.serve", description=__doc__.split("\n\n")[0])
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
                task = get_task(args.task)
            stepper = load_stepper(args.step, task)
        if args.robot.startswith("ros2:"):
            import cyclonedds  # noqa: F401  optional: the ros2 extra
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
