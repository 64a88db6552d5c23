"""`mbrl train`: fit (or load) the world model, train the agent, evaluate, write the run directory.

With no options: RAVL, quick preset, hopper-medium (made first with `mbrl data make` if missing).
Options come from the config dataclasses (`mbrl.config.TrainArgs`): `--algo mopo`, `--seeds 3`,
`--sac.num-critics 5`, `--schedule.epochs 10`, ... Ctrl-C or SIGTERM saves a checkpoint and stops;
`mbrl train --resume DIR` continues from it.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import jax
import numpy as np
from rich.console import Console
from rich.table import Table

from mbrl.config import TrainArgs, dataset_key, given_options, resolve
from mbrl.core.errors import ConfigError
from mbrl.core.files import cache_dir
from mbrl.core.score import score_key, score_label
from mbrl.datasets import registry


def enable_compile_cache() -> None:
    """Keep compiled programs on disk between runs ($MBRL_CACHE_DIR, default ~/.cache/mbrl/jax): a second
    `mbrl train` with the same shapes skips most of its compile time. MBRL_CACHE_DIR=off disables it."""
    where = cache_dir()
    if where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(where))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    except (OSError, AttributeError):  # a read-only home or an older jax: compile as usual
        pass


def ensure_dataset(source: str) -> None:
    """Make a known dataset name (hopper-medium) with `mbrl data make` when it is not made yet."""
    parsed = registry.parse_name(source)
    if parsed is None or Path(source).exists() or registry.is_made(*parsed):
        return
    from mbrl.commands.data_make import MakeArgs, make  # lazy: 0.04 s more for `mbrl train --help` (measured)

    print(f"mbrl train: dataset {source} is not made yet; making it now (`mbrl data make {source}`)")
    make(MakeArgs(name=source))


def default_run_dir(algo: str, dataset: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{algo}-{dataset_key(dataset)}-{stamp}"


SELECTED_BY = {"fqe": "FQE's estimate", "model": "the world model's estimate"}


def selection_summary(selected: dict) -> str:
    """The summary's line for a run's `selected.json`: the chosen epochs and what chose them."""
    return f"epoch {', '.join(map(str, selected['epochs']))} (per seed, by {SELECTED_BY[selected['by']]})"


def print_summary(result) -> None:
    from mbrl.logging import mean_stderr  # lazy: 0.31 s more for `mbrl train --help` (matplotlib) (measured)

    config = result.config
    table = Table(title=f"{config.algo} on {config.dataset} ({config.preset} preset)", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("run directory", str(result.run_dir))
    table.add_row("seeds", ", ".join(str(s) for s in config.seed_list))
    table.add_row("epochs", f"{result.epochs_done} / {config.schedule.epochs}")
    table.add_row("updates", f"{result.epochs_done * config.schedule.updates_per_epoch:,}")
    final = result.final_eval
    # Without a simulator the evaluation is the world model's estimate: every figure says so.
    estimated = "estimated " if final is not None and final.get("estimate") else ""
    if final is not None:
        scores = final["normalized_score"]
        if scores is not None:
            mean, stderr = mean_stderr(scores)
            table.add_row(f"final {estimated}normalized score", f"{mean:.1f} ± {stderr:.1f}")
            table.add_row("per seed", ", ".join(f"{s:.1f}" for s in scores))
            best = max((r for r in result.records if r.get("eval")), key=lambda r: r["score_mean"])
            table.add_row("best (mean over seeds)", f"{best['score_mean']:.1f} at {best['updates']:,} updates")
        mean, stderr = mean_stderr(final["return_mean"])
        table.add_row(f"final {estimated}return", f"{mean:.1f} ± {stderr:.1f}")
        if estimated:
            spread = float(np.mean(final["return_std"]))
            table.add_row("estimate", f"greedy return in the world model, {spread:.1f} spread over its elites "
                                      "(no simulator for this dataset)")
    elif result.interrupted is None:
        # No simulator and no world model to imagine in (BC on a robot's logs): say how to judge it instead.
        table.add_row("estimate", f"none: no simulator, and {config.algo} fits no world model; "
                                  f"mbrl ope {result.run_dir} --dataset {config.dataset} estimates it (FQE)")
    selected = result.run_dir / "selected.json"
    if selected.is_file():
        table.add_row("checkpoint to export", selection_summary(json.loads(selected.read_text())))
    if result.dataset_score is not None:
        table.add_row("dataset's mean normalized score", f"{result.dataset_score:.1f}")
    table.add_row("wall time", f"{result.seconds / 60:.1f} min")
    console = Console()
    console.print(table)
    if final is not None:
        key = score_key(final)
        mean, stderr = mean_stderr(final[key])
        print(f"final {estimated}{score_label(key)}: {mean:.1f} ± {stderr:.1f} (mean ± stderr over "
              f"{len(config.seed_list)} seed(s){', in the world model' if estimated else ''})")


def train(args: TrainArgs) -> int:
    from mbrl.train import run  # lazy: importing it here adds 0.9 s to `mbrl train --help` (measured)
    from mbrl.world_models.fit import FitInterrupted

    enable_compile_cache()
    if args.resume is not None:
        given = sorted(given_options(args))
        extra = [f"--{name.replace('_', '-')}" for name in given]
        extra += [opt for opt, value in (("--config", args.config), ("--run-dir", args.run_dir), ("--world-model", args.world_model)) if value]
        if extra:
            raise ConfigError(f"--resume continues a run with its own config.json; drop {', '.join(extra)}")
        run_dir, config = args.resume, None
    else:
        config = resolve(args)
        if args.world_model is not None and not Path(args.world_model).is_dir():
            raise ConfigError(f"--world-model {args.world_model}: no such directory")
        ensure_dataset(config.dataset)
        run_dir = args.run_dir or default_run_dir(config.algo, config.dataset)
    try:
        result = run(config, run_dir, resume=args.resume is not None, world_model_dir=args.world_model)
    except FitInterrupted as interrupted:
        print(f"mbrl train: stopped by {signal.Signals(interrupted.signum).name} while fitting its world model, "
              f"after fit epoch {interrupted.epoch}; the fit's checkpoint is saved. Continue with: mbrl train "
              f"--resume {Path(run_dir).absolute()}")
        return 128 + interrupted.signum
    print_summary(result)
    if result.interrupted is not None:
        name = signal.Signals(result.interrupted).name
        print(f"mbrl train: stopped by {name} after epoch {result.epochs_done}; checkpoint saved. "
              f"Continue with: mbrl train --resume {result.run_dir}")
        return 128 + int(result.interrupted)
    return 0
