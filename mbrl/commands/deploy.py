"""`mbrl deploy EXPORT --robot URI`: run an exported policy on a robot through the safety layer.

URI: `mujoco:ENV_ID` (a Gymnasium MuJoCo env in this process), `udp://HOST:PORT` (a robot speaking
the protocol of `mbrl.envs.robots.udp`, such as `python -m mbrl.envs.robots.sim_server`), `ros2:PREFIX` (ROS 2 topics
over DDS, `mbrl.envs.robots.dds`, such as `python -m mbrl.envs.robots.dds_sim`; `--ros2-backend rclpy` for rclpy).

A recurrent export (NEUBAY) keeps its memory between ticks in the runner and resets it at every episode
start; it also reads the previous step's reward, which `mbrl.envs.robots.runner.RewardFeed` takes from each
fresh observation (a robot that reports none feeds 0, and deploy says so). An export of a `TASK+change` policy
takes each observation followed by its change since the step before: for a robot that sends the observation alone,
`mbrl.envs.robots.runner.ChangeFeed` computes the change from its fresh observations.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from mbrl.envs.robots.connect import SimOptions, check_fit, make_robot as connect
from mbrl.envs.robots.loop import ControlLoop
from mbrl.envs.robots.protocol import Robot
from mbrl.envs.robots.runner import ChangeFeed, PolicyRunner, RewardFeed
from mbrl.envs.robots.safety import SafetyConfig, SafetyLayer
from mbrl import config as config_io
from mbrl.core.change import base_name
from mbrl.core.errors import ConfigError

# Generated from the classes that hold their defaults and help (`mbrl.config.option_fields`); flat: --max-delta.
SafetyArgs = config_io.options_of(SafetyConfig)
SimArgs = config_io.options_of(SimOptions, skip=("noise_seed",))  # the noise follows --seed


@dataclasses.dataclass(frozen=True)
class DeployArgs:
    export: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="EXPORT")]
    """A folder written by `mbrl export` (policy.onnx + policy.json)."""
    robot: str
    """mujoco:ENV_ID | udp://HOST:PORT | ros2:PREFIX"""
    episodes: int = 1
    """Episodes to run; episode i starts with seed + i (simulated robots)."""
    rate: float | None = None
    """Control rate in Hz (default: the export's control rate); 0 runs unpaced, as fast as the robot answers."""
    seed: int = 0
    """The seed of episode 0 (simulated robots) and of the observation noise."""
    max_steps: int | None = None
    """Stop each episode after this many ticks (default: when the robot ends it)."""
    safety: tyro.conf.OmitArgPrefixes[SafetyArgs] = dataclasses.field(default_factory=SafetyArgs)
    obs_timeout: float | None = None
    """UDP/ROS 2: seconds to wait for a new observation each tick (default: half a period; 1 s unpaced)."""
    log: Path | None = None
    """Per-tick JSON lines (default: EXPORT/deploy/ROBOT-TIME.jsonl)."""
    sim: tyro.conf.OmitArgPrefixes[SimArgs] = dataclasses.field(default_factory=SimArgs)
    ros2_backend: str = "dds"
    """ros2: `dds` speaks DDS directly through cyclonedds (the `ros2` extra; `mbrl.envs.robots.dds`); `rclpy` goes
    through a ROS 2 installation's rclpy (JointState in, Float64MultiArray out; `mbrl.envs.robots.ros2`)."""


def make_robot(uri: str, args: DeployArgs, description: dict, period: float | None, obs_dim: int | None = None) -> Robot:
    """The adapter for a robot URI (`mbrl.envs.robots.connect.make_robot`); ConfigError for an unknown one.
    `obs_dim`: what the robot sends, where that is not the policy's input (default: the policy's)."""
    obs_timeout = args.obs_timeout if args.obs_timeout is not None else (0.5 * period if period else 1.0)
    sim = config_io.from_options(SimOptions, args.sim, noise_seed=args.seed)
    obs_dim = description["observation"]["dim"] if obs_dim is None else obs_dim
    return connect(uri, obs_dim=obs_dim, action_low=description["action"]["low"],
                   action_high=description["action"]["high"], obs_timeout=obs_timeout, sim=sim,
                   ros2_backend=args.ros2_backend)


def _default_log(export: Path, uri: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return export / "deploy" / f"{re.sub(r'[^A-Za-z0-9.-]+', '_', uri)}-{stamp}.jsonl"


def deploy(args: DeployArgs) -> int:
    args = config_io.from_options(DeployArgs, args)  # every number option finite (mbrl.config's one rule)
    if args.episodes < 1:
        raise ConfigError(f"--episodes: expected a positive int, found {args.episodes}")
    if args.rate is not None and args.rate < 0:
        raise ConfigError(f"--rate: expected Hz >= 0 (0: unpaced), found {args.rate}")
    runner = PolicyRunner(args.export)
    rate = args.rate if args.rate is not None else (runner.control_rate_hz or 50.0)
    period = 1.0 / rate if rate else None
    safety_config = config_io.from_options(SafetyConfig, args.safety)
    # A policy of a `+change` task takes each observation followed by its change; a networked robot sends the
    # observation alone (half the input), a simulator of the base task too: the change is computed here.
    observes_change = base_name(runner.description.get("task") or "") is not None
    networked = not args.robot.startswith(("sim:", "mujoco:"))
    robot = make_robot(args.robot, args, runner.description, period,
                       obs_dim=runner.obs_dim // 2 if observes_change and networked else None)
    feed = None
    if runner.recurrent:  # the loop hands the policy an observation's values only: feed it the reward too
        robot = feed = RewardFeed(robot, runner)
    robot.connect()
    if observes_change and 2 * robot.obs_dim == runner.obs_dim:
        robot = ChangeFeed(robot)
    try:
        low, high = check_fit(robot, f"export {runner.export_dir}", runner.obs_dim, runner.act_dim, runner.action_low,
                              runner.action_high, declared=bool(runner.description.get("task_declared")))
    except BaseException:
        robot.disconnect()
        raise
    log_path = args.log if args.log is not None else _default_log(Path(args.export), args.robot)
    loop = ControlLoop(robot, runner, SafetyLayer(low, high, safety_config), rate or None, log_path)
    summary = loop.run(episodes=args.episodes, seed=args.seed, max_steps=args.max_steps, connect=False)
    _print_summary(summary, log_path)
    if feed is not None and feed.rewards_seen == 0 and summary["ticks"]:
        print(f"deploy: {robot.name} reported no rewards; the recurrent policy's prev_reward input was 0 throughout")
    if summary["stop_reason"] == "watchdog":
        print(f"deploy: the watchdog stopped {robot.name}: no new observation for {safety_config.max_stale_ticks} ticks")
        return 1
    return 0


def _print_summary(summary: dict, log_path: Path) -> None:
    episodes = summary["episodes"]
    print(f"deploy on {summary['robot']}: {len(episodes)} episode(s), {summary['ticks']} ticks, stop: {summary['stop_reason']}")
    if episodes:
        returns = np.asarray([e["return"] for e in episodes])
        print(f"return {returns.mean():.2f} ± {returns.std():.2f} (per episode: {', '.join(f'{r:.2f}' for r in returns)})")
    rate = f"{summary['rate_hz']:.1f} Hz" if summary["rate_hz"] else "unpaced"
    lat = summary["latency_ms"]
    print(f"rate {rate} (achieved {summary['achieved_hz']} Hz), overruns {summary['overruns']}, "
          f"latency ms p50 {lat['p50']:.3f} p99 {lat['p99']:.3f} max {lat['max']:.3f}")
    events = ", ".join(f"{k} {v}" for k, v in sorted(summary["events"].items())) or "none"
    print(f"safety events: {events}")
    print(f"log: {log_path}")
