"""`mbrl finetune RUN --robot URI`: offline-to-online fine-tuning (WSRL) of a trained run on a robot.

    mbrl finetune runs/mopo --robot mujoco:Hopper-v5 --steps 30000 --warmup 5000 --utd 4
    mbrl finetune --resume runs/finetune-mopo-...        # after a crash, Ctrl-C or SIGTERM

The program is `mbrl.finetune`; the robot URIs are deploy's (`envs.robots.connect`).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Annotated

import tyro

from mbrl.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class FinetuneArgs:
    run: Annotated[tyro.conf.Positional[Path | None], tyro.conf.arg(metavar="RUN")] = None
    """A run directory written by `mbrl train` with a SAC-N agent (ravl, mopo)."""
    robot: str | None = None
    """mujoco:ENV_ID | udp://HOST:PORT | ros2:PREFIX (with --resume: the robot at a new address)."""
    steps: int = 30_000
    """Online env steps in all, the warm-up's included."""
    warmup: int = 5_000
    """Steps of the frozen offline policy (uniform random actions with --scratch) before the first update."""
    utd: int = 4
    """Updates per new env step once the warm-up is over."""
    retain_offline_ratio: float = 0.0
    """Share of every batch drawn from the run's offline dataset (WSRL keeps none)."""
    scratch: bool = False
    """SAC from scratch: fresh networks of the run's shapes instead of its trained ones (a baseline)."""
    seed: int = 0
    """Seed of the fine-tuning: its sampling, its updates and its episodes' resets."""
    seed_index: int = 0
    """Which of the run's training seeds to fine-tune."""
    update_every: int = 50
    """Env steps between update chunks (utd x this many updates each); the policy is fixed in between."""
    eval_every: int = 2_500
    """Env steps between metrics records (and evaluations in simulation when the run's task is known)."""
    eval_episodes: int = 10
    """Episodes of each evaluation of the deterministic policy in simulation (0: none)."""
    eval_seed: int = 0
    """Evaluation episode i resets with eval_seed + i, the same episodes at every evaluation."""
    checkpoint_every: int | None = None
    """Env steps between checkpoints (default: --eval-every)."""
    anchor: float | None = None
    """Weight of a BC anchor to the warm-start policy's actions online (default: the offline run's
    sac.actor_bc_coef, 0 with --scratch; 0: none, plain WSRL)."""
    anchor_final: float | None = None
    """The anchor's weight at the run's end, reached linearly from --anchor over the online phase (default: constant)."""
    rate: float = 0.0
    """Control rate in Hz; 0 runs unpaced, as fast as the robot answers."""
    max_delta: float | None = 0.5
    """Largest change of a command per tick, as a fraction of the action range; None: no rate limit."""
    max_stale_ticks: int = 2
    """Ticks in a row without a new observation before the watchdog stops the robot safely."""
    max_obs_age: float | None = None
    """Seconds after which an observation counts as stale even if it is new to the controller (default: off)."""
    obs_timeout: float = 1.0
    """udp/ros2: seconds to wait for a new observation each tick."""
    ros2_backend: str = "dds"
    """ros2: `dds` (cyclonedds, the `ros2` extra) or `rclpy` (a ROS 2 installation)."""
    run_dir: Path | None = None
    """Where to write the fine-tuning run (default: runs/finetune-RUN-TIME)."""
    resume: Path | None = None
    """Continue the fine-tuning run in this directory from its last checkpoint."""
    progress: bool = True
    """Show a progress bar."""


def _config_fields() -> list[str]:
    from mbrl.finetune import FinetuneConfig

    return [field.name for field in dataclasses.fields(FinetuneConfig)]


def finetune(args: FinetuneArgs) -> int:
    from mbrl.commands.train import enable_compile_cache
    from mbrl.finetune import FinetuneConfig, run

    enable_compile_cache()
    if args.resume is not None:
        defaults = FinetuneArgs()
        given = [name for name in _config_fields() if name not in ("robot",) and getattr(args, name) != getattr(defaults, name)]
        given += ["run_dir"] if args.run_dir is not None else []
        if given:
            flags = ", ".join("RUN" if name == "run" else f"--{name.replace('_', '-')}" for name in given)
            raise ConfigError(f"--resume continues a fine-tuning run with its own {args.resume}/finetune.json; drop {flags}")
        result = run(None, args.resume, resume=True, robot_uri=args.robot, progress=args.progress)
    else:
        if args.run is None:
            raise ConfigError("RUN: expected the run directory to fine-tune (or --resume DIR)")
        if args.robot is None:
            raise ConfigError("--robot: expected mujoco:ENV_ID, udp://HOST:PORT or ros2:PREFIX")
        config = FinetuneConfig(**{name: str(args.run) if name == "run" else getattr(args, name) for name in _config_fields()})
        run_dir = args.run_dir or Path("runs") / f"finetune-{Path(args.run).name}-{time.strftime('%Y%m%d-%H%M%S')}"
        result = run(config, run_dir, progress=args.progress)
    _print_summary(result)
    if result.interrupted == "watchdog":
        print(f"mbrl finetune: the watchdog stopped the robot at step {result.steps}; checkpoint saved. "
              f"Continue with: mbrl finetune --resume {result.run_dir}")
        return 1
    if result.interrupted is not None:
        print(f"mbrl finetune: stopped by {result.interrupted} at step {result.steps}; the robot was stopped safely and "
              f"a checkpoint saved. Continue with: mbrl finetune --resume {result.run_dir}")
        return 128 + int(signal.Signals[result.interrupted])
    return 0


def _print_summary(result) -> None:
    evals = [r for r in result.records if r.get("eval")]
    print(f"fine-tuning run: {result.run_dir} ({result.steps:,} steps, {result.seconds / 60:.1f} min)")
    if evals:
        first, last = evals[0], evals[-1]
        best = max(evals, key=lambda r: r["score_mean"])
        print(f"score: offline {first['score_mean']:.1f} -> {last['score_mean']:.1f} at step {last['step']:,} "
              f"(best {best['score_mean']:.1f} at step {best['step']:,})")
    if result.export_dir is not None:
        print(f"export: {result.export_dir}  (mbrl deploy {result.export_dir} --robot ...)")
