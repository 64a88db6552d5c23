"""`mbrl finetune RUN --robot URI`: offline-to-online fine-tuning (WSRL) of a trained run on a robot.

    mbrl finetune runs/mopo --robot mujoco:Hopper-v5 --steps 30000 --warmup 5000 --utd 4
    mbrl finetune --resume runs/finetune-mopo-...        # after a crash, Ctrl-C or SIGTERM

The program is `mbrl.finetune`; the robot URIs are deploy's (`mbrl.envs.robots.connect`).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Annotated

import tyro

from mbrl import config as config_io
from mbrl.commands.train import enable_compile_cache
from mbrl.core.errors import ConfigError
from mbrl.finetune import FinetuneConfig, run


def _arg(help_: str | None, metavar: str | None = None):
    return tyro.conf.arg(help=help_, metavar=metavar)


# The options are FinetuneConfig's fields (one home for their defaults and help), the safety layer's flat
# (--max-delta); RUN and --robot may be absent with --resume.
FinetuneArgs = config_io.options_class(
    "FinetuneArgs",
    "Fine-tune a trained policy online on a robot (WSRL).",
    [
        ("run", Annotated[tyro.conf.Positional[Path | None], _arg(config_io.field_help(FinetuneConfig, "run"), "RUN")],
         dataclasses.field(default=None)),
        ("robot", Annotated[str | None, _arg(config_io.field_help(FinetuneConfig, "robot"))], dataclasses.field(default=None)),
    ],
    [
        *config_io.option_fields(FinetuneConfig, skip=("run", "robot"), flat=("safety",)),
        ("run_dir", Annotated[Path | None, _arg("where to write the fine-tuning run (default: runs/finetune-RUN-TIME)")],
         dataclasses.field(default=None)),
        ("resume", Annotated[Path | None, _arg("continue the fine-tuning run in this directory from its last checkpoint")],
         dataclasses.field(default=None)),
        ("progress", Annotated[bool, _arg("show a progress bar")], dataclasses.field(default=True)),
    ],
)


def finetune(args: FinetuneArgs) -> int:
    enable_compile_cache()
    if args.resume is not None:
        given = config_io.changed_options(args, FinetuneArgs(), skip=("robot", "resume", "progress"))
        if given:
            flags = ", ".join("RUN" if flag == "--run" else flag for flag in given)
            raise ConfigError(f"--resume continues a fine-tuning run with its own {args.resume}/finetune.json; drop {flags}")
        result = run(None, args.resume, resume=True, robot_uri=args.robot, progress=args.progress)
    else:
        if args.run is None:
            raise ConfigError("RUN: expected the run directory to fine-tune (or --resume DIR)")
        if args.robot is None:
            raise ConfigError("--robot: expected mujoco:ENV_ID, udp://HOST:PORT or ros2:PREFIX")
        config = config_io.from_options(FinetuneConfig, args, run=str(args.run))
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
