"""`mbrl sweep`: tune an algorithm's options by Bayesian optimisation (Optuna), K trials at a time as one
population of the training program. The engine: `mbrl.sweep.engine`; spaces: `mbrl.sweep.space`.

    mbrl sweep --algo mopo --dataset hopper-medium --space mopo --trials 24 --population 4

Any `mbrl train` option may follow, as the fixed base of every trial (`--schedule.epochs 16`). Running the
same command again continues the study until it holds `--trials` completed trials; N workers on N
machines given the same `--storage postgresql://...` share one study.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import tyro
from optuna.trial import TrialState
from rich.console import Console
from rich.live import Live
from rich.table import Table

from mbrl import config as config_io
from mbrl.commands.train import enable_compile_cache, ensure_dataset
from mbrl.core.errors import ConfigError
from mbrl.sweep import engine, space as space_io
from mbrl.sweep.engine import SweepOptions
from mbrl.core.signals import StopSignal


def _arg(help_: str, metavar: str | None = None, hint: str | None = None):
    return tyro.conf.arg(help=help_, metavar=metavar, help_behavior_hint=hint)


# The sweep's own options are `SweepOptions`' fields (one home for their defaults and help); what the command
# resolves into `Settings` (the space, where the study lives) is declared here; any `mbrl train` option follows.
SweepArgs = config_io.options_class(
    "SweepArgs",
    "Tune an algorithm's options by Bayesian optimisation, K trials at a time in one compiled program.",
    [
        ("space", Annotated[Path, _arg("a TOML search space, or the one an algorithm ships, by its name (mopo, cql, ...)", "SPACE")]),
        *config_io.option_fields(SweepOptions),
        ("storage", Annotated[str | None, _arg("study storage URL (default: sqlite:///SWEEP_DIR/study.db); "
                                               "postgresql://USER@HOST:PORT/DB to share it between machines", "URL", "")],
         dataclasses.field(default=None)),
        ("study", Annotated[str | None, _arg("study name (default: ALGO-DATASET)", "NAME", "")],
         dataclasses.field(default=None)),
        ("sweep_dir", Annotated[Path | None, _arg("where trials.csv, best/, plots and model fits go "
                                                  "(default: sweeps/ALGO-DATASET)", "DIR", "")],
         dataclasses.field(default=None)),
        ("config", Annotated[Path | None, _arg("a config.json as the base of every trial (options given here override it)",
                                               "FILE")], dataclasses.field(default=None)),
    ],
    config_io.mirror_fields(config_io.TrainConfig, "", config_io.from_the_preset),
)


def settings_of(args):
    base = config_io.resolve(args)
    space = space_io.load(args.space, base)
    name = f"{base.algo}-{config_io.dataset_key(base.dataset)}"
    sweep_dir = Path(args.sweep_dir or Path("sweeps") / name).absolute()
    url = engine.storage_url(args.storage, sweep_dir)
    settings = config_io.from_options(engine.Settings, args, space=space, base=base, storage_url=url,
                                      study_name=args.study or name, sweep_dir=sweep_dir, progress=base.logging.progress)
    ensure_dataset(base.dataset)
    return settings


class Display:
    """The live view: trials done, running and failed, the best so far, the ETA, the last event."""

    def __init__(self, settings, enabled: bool):
        self.settings = settings
        self.console = Console()
        self.enabled = enabled and self.console.is_terminal
        self.sweep = None
        self.event = "starting"
        self.live = None

    def __enter__(self):
        if self.enabled:
            self.live = Live(self.render(), console=self.console, refresh_per_second=1, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
        return False

    def __call__(self, message: str) -> None:
        self.event = message
        if self.live is not None:
            self.live.update(self.render())
        else:
            print(f"mbrl sweep: {message}", flush=True)

    def render(self):
        s = self.settings
        table = Table(title=f"sweep {s.study_name} · {s.objective} objective", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        if self.sweep is not None:
            counts = self.sweep.counts()
            table.add_row("trials", f"{counts['complete']} / {s.trials} done · {counts['running']} running · "
                                    f"{counts['fail']} failed · {counts['waiting']} queued")
            complete = [t for t in self.sweep.study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
            if complete:
                best = max(complete, key=lambda t: t.value)
                params = ", ".join(f"{k}={_short(v)}" for k, v in best.params.items())
                table.add_row("best so far", f"{best.value:.1f} (trial {best.number}: {params})")
            elapsed = time.time() - self.sweep.started
            done = self.sweep.done_here
            remaining = max(s.trials - counts["complete"], 0)
            eta = f"{remaining * elapsed / done / 60:.0f} min" if done else "after the first population"
            table.add_row("this worker", f"{done} trials in {elapsed / 60:.1f} min · ETA {eta}")
        table.add_row("now", self.event)
        return table


def _short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def print_summary(settings, study, summary: dict) -> None:
    complete = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: -t.value)
    table = Table(title=f"{settings.study_name}: {len(complete)} completed trials (best 10)")
    table.add_column("trial", justify="right")
    table.add_column("objective", justify="right")
    table.add_column("sim score", justify="right")
    table.add_column("offline", justify="right")
    for name in settings.space.names():
        table.add_column(name)
    for t in complete[:10]:
        sim, offline = t.user_attrs.get("sim_score"), t.user_attrs.get("offline_objective")
        table.add_row(str(t.number), f"{t.value:.1f}", "–" if sim is None else f"{sim:.1f}",
                      "–" if offline is None else f"{offline:.1f}", *[_short(t.params.get(n)) for n in settings.space.names()])
    console = Console()
    console.print(table)
    rho = summary.get("spearman_offline_vs_sim")
    if rho is not None:
        console.print(f"Spearman rank correlation of the offline objective with the sim score: {rho:.2f} "
                      f"over {summary['trials_with_both']} trials")
    if summary.get("spearman_fqe_vs_sim") is not None:
        console.print(f"Spearman rank correlation of FQE's estimate with the sim score: {summary['spearman_fqe_vs_sim']:.2f}")
    if "best" in summary:
        console.print(f"best config: {settings.sweep_dir / 'best' / 'config.json'} "
                      f"(mbrl train --config {settings.sweep_dir / 'best' / 'config.json'})")
    console.print(f"results: {settings.sweep_dir} · study: optuna-dashboard {settings.storage_url}")


def sweep(args: SweepArgs) -> int:
    settings = settings_of(args)
    enable_compile_cache()

    settings.sweep_dir.mkdir(parents=True, exist_ok=True)
    display = Display(settings, settings.progress)
    with StopSignal() as stop:  # Ctrl-C and SIGTERM: stop after the running epoch (twice: at once)
        worker = engine.Sweep(settings, on_event=display, stop=stop)
        display.sweep = worker
        with display:
            try:
                worker.run()
            finally:
                summary = engine.write_outputs(settings, worker.study, plots=True)
    print_summary(settings, worker.study, summary)
    if worker.interrupted:
        print("mbrl sweep: interrupted; the trials in flight were queued again: run the same command to continue")
        return 130
    return 0
