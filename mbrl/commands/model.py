"""`mbrl model fit` and `mbrl model eval`: fit a world model alone, and measure it.

`mbrl model fit` fits the MLP ensemble (`--model mlp`, the default) or RWM-U (`--model rwm`), with the same
`--ensemble.*` / `--fit.*` or `--rwm.*` / `--rwm-fit.*` options as `mbrl train` (generated from the config
classes by `mbrl.config`); absent ones keep those classes' defaults. A long fit saves a checkpoint in
OUT/fit-checkpoint every `--checkpoint-seconds` and on Ctrl-C or SIGTERM; `mbrl model fit --resume OUT`
continues it (the finished model replaces the checkpoint).

Eval reports, on the data the model never trained on (recorded in the saved model), the measures of
`mbrl.world_models.metrics`: per-member holdout MSE, 1σ/2σ calibration, and open-loop k-step error for
k = 1, 5, 20, 100 on whole held-out episodes. `--compare DIR` puts a second model's k-step error beside it,
on the same starts (those with the recurrent model's history behind them). `--plot` draws the open-loop
predictions of a few held-out episodes (`mbrl.model_plots`).
"""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro
from rich.console import Console
from rich.table import Table

from mbrl import config as config_io
from mbrl.core.errors import UserError
from mbrl.core.files import write_text_atomic
from mbrl.core.signals import StopSignal
from mbrl.datasets import load
from mbrl.world_models import registry as model_registry
from mbrl.world_models.fitting import CHECKPOINT_DIR, FitControl, FitInterrupted
from mbrl.world_models.metrics import open_loop_errors

_ARCHITECTURES = {kind.architecture_section for kind in model_registry.KINDS.values()}


def _hint(section: str, name: str, default) -> str:
    if name == "learned_termination" and section in _ARCHITECTURES:
        return "(default: True when the task has no termination function and the data has terminals)"
    return config_io.the_default(section, name, default)


def _arg(help_: str, metavar: str | None = None):
    return tyro.conf.arg(help=help_, metavar=metavar)


FitArgs = config_io.options_class(
    "FitArgs",
    "Fit a world model on a dataset and save it.",
    [
        ("dataset", Annotated[str | None, _arg("a .hdf5 (D4RL layout) or .npz (NeoRL layout) file, minari:DATASET_ID, "
                                               "or a made dataset such as hopper-medium (required unless --resume)",
                                               "SOURCE")], dataclasses.field(default=None)),
        ("model", Annotated[str, _arg(" or ".join(f"{k.name} ({k.about})" for k in model_registry.KINDS.values()),
                                      "{" + ",".join(model_registry.KINDS) + "}")],
         dataclasses.field(default=model_registry.DEFAULT)),
        ("task", Annotated[str | None, _arg("the task (hopper, halfcheetah, walker2d, ant): its termination "
                                            "function is stored with the model", "TASK")], dataclasses.field(default=None)),
        ("out", Annotated[Path | None, _arg("where to save the model (a directory); default runs/models/DATASET_NAME",
                                            "DIR")], dataclasses.field(default=None)),
        ("clip_actions", Annotated[bool, _arg("clip actions into the action space instead of refusing actions "
                                              "outside it")], dataclasses.field(default=False)),
        ("progress", Annotated[bool, _arg("show the progress bar (in a log file: one line an epoch)")],
         dataclasses.field(default=True)),
        ("checkpoint_seconds", Annotated[float, _arg("save a checkpoint in OUT/fit-checkpoint every this many "
                                                     "seconds (and on Ctrl-C or SIGTERM)", "SECONDS")],
         dataclasses.field(default=300.0)),
        ("resume", Annotated[Path | None, _arg("continue the interrupted fit into this directory (its --out) from its "
                                               "last checkpoint, with the options it was started with", "DIR")],
         dataclasses.field(default=None)),
    ],
    config_io.section_options(model_registry.SECTIONS, _hint),
)


@dataclasses.dataclass(frozen=True)
class EvalArgs:
    model_dir: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="DIR")]
    """A directory written by `mbrl model fit`."""
    dataset: Annotated[str | None, tyro.conf.arg(metavar="SOURCE")] = None
    """The dataset the model was fitted on, if it moved (default: the source recorded in the model)."""
    compare: Annotated[Path | None, tyro.conf.arg(metavar="DIR")] = None
    """Another saved model (for example the MLP ensemble beside RWM-U): its open-loop error on the same starts."""
    json: bool = False
    """Print one JSON object instead of tables."""
    plot: bool = False
    """Also write PNGs of open-loop predictions against the truth on held-out episodes (per observation dimension,
    1σ and 2σ bands, the uncertainty along them) to DIR/plots/."""


def _task_fns(task: str | None) -> dict:
    """The task's reward and termination functions, for the model's imagined steps."""
    if task is None:
        return {}
    from mbrl.envs.tasks import get_task  # lazy: 0.39 s more for `mbrl model fit --help` (measured)

    return get_task(task).model_fns()


def _absolute_source(source: str) -> str:
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source


FIT_ARGS = "fit-args.json"  # beside the checkpoints: what --resume needs to rebuild the fit


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def fit(args: FitArgs) -> int:
    """Fit a world model on a dataset and save it (or, with --resume, continue an interrupted fit)."""
    if args.checkpoint_seconds < 0:
        raise UserError(f"--checkpoint-seconds: expected a value >= 0, found {args.checkpoint_seconds}")
    if args.resume is not None:
        extra = [_flag(name) for name in ("dataset", "model", "task", "out", "clip_actions")
                 if getattr(args, name) != getattr(FitArgs(), name)]
        extra += [f"{_flag(section)}.{_flag(name)[2:]}" for section, names in config_io.given_options(args).items()
                  for name in names]
        if extra:
            raise UserError(f"--resume continues a fit with the options it was started with; drop {', '.join(extra)}")
        out = args.resume.absolute()
        try:
            recorded = json.loads((out / FIT_ARGS).read_text())
            kind, dataset_source, task = recorded["model"], recorded["dataset"], recorded["task"]
            clip_actions, given = bool(recorded["clip_actions"]), dict(recorded["given"])
        except FileNotFoundError:
            raise UserError(f"{out}: no interrupted fit here (no {FIT_ARGS}); start one with mbrl model fit --out {out}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{out / FIT_ARGS}: unreadable or missing field ({exc})") from None
    else:
        if args.dataset is None:
            raise UserError("--dataset: required (or --resume DIR to continue an interrupted fit)")
        kind, dataset_source, task, clip_actions = args.model, _absolute_source(args.dataset), args.task, args.clip_actions
        given, out = config_io.given_options(args), args.out
    return _fit(kind, dataset_source, task, clip_actions, given, out, progress=args.progress,
                checkpoint_seconds=args.checkpoint_seconds, resume=args.resume is not None)


def _kind_of(name: str):
    if name not in model_registry.KINDS:
        raise UserError(f"--model: expected one of {', '.join(model_registry.KINDS)}, found {name!r}")
    return model_registry.KINDS[name]


def _configs(kind, given: dict):
    """The kind's architecture and fit sections from the options given; another kind's options are refused."""
    option = lambda name: "--" + name.replace("_", "-") + ".*"  # noqa: E731
    other = [name for name in model_registry.SECTIONS if name not in kind.sections and name in given]
    if other:
        raise UserError(f"{', '.join(option(n) for n in other)}: not read by --model {kind.name}, which reads "
                        + ", ".join(option(n) for n in kind.sections))
    (arch_name, arch_class), (fit_name, fit_class) = kind.sections.items()
    fit_config = config_io.override(fit_class(), given.get(fit_name, {}), fit_name)
    return config_io.override(arch_class(), given.get(arch_name, {}), arch_name), fit_config  # checked before the load


def _fit(kind_name: str, dataset_source: str, task: str | None, clip_actions: bool, given: dict, out: Path | None, *,
         progress: bool, checkpoint_seconds: float, resume: bool) -> int:
    from mbrl.checkpoint import Checkpointer  # lazy: orbax loads only when a fit starts

    kind = _kind_of(kind_name)
    config, fit_config = _configs(kind, given)
    dataset = load(dataset_source, task=task, clip_actions=clip_actions)
    task = task or dataset.info.task
    task_fns = _task_fns(task)
    termination_fn = task_fns.get("termination_fn")
    if "learned_termination" not in given.get(kind.architecture_section, {}):
        learned = termination_fn is None and bool(dataset.transitions.terminal.any())
        config = dataclasses.replace(config, learned_termination=learned)
    suffix = "" if kind.name == model_registry.DEFAULT else f"-{kind.name}"
    out = (out or Path("runs") / "models" / (dataset.info.name + suffix)).absolute()
    checkpoints = out / CHECKPOINT_DIR
    identity = {"model": kind.name, "dataset": dataset_source, "task": task, "clip_actions": clip_actions,
                "given": given}
    if not resume:
        if checkpoints.is_dir() and any(checkpoints.iterdir()):
            raise UserError(f"{out}: holds an interrupted fit ({checkpoints}); continue it with mbrl model fit --resume "
                            f"{out}, or remove {checkpoints} to start afresh")
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / FIT_ARGS, json.dumps(identity, indent=1))
    console = Console(stderr=True, highlight=False)
    console.print(
        f"fitting {kind.describe(config)} on {len(dataset):,} transitions of {dataset.info.name}"
        + (f", termination from task '{task}'" if termination_fn is not None else "")
        + (f", reward from task '{task}'" if task_fns.get("reward_fn") is not None else "")
        + (", learned termination head" if config.learned_termination else ""),
        soft_wrap=True,
    )
    checkpointer = Checkpointer(checkpoints, max_to_keep=1)
    resume = resume and checkpointer.latest_epoch() is not None
    if resume:
        console.print(f"continuing from the checkpoint after epoch {checkpointer.latest_epoch()} in {checkpoints}",
                      soft_wrap=True)
    try:
        with StopSignal() as stop:
            control = FitControl(checkpointer, every_seconds=checkpoint_seconds, stop=stop, identity=identity)
            result = (kind.resume if resume else kind.fit)(
                dataset, config=config, fit_config=fit_config, source=dataset_source, task=task, progress=progress,
                control=control, **task_fns)
    except FitInterrupted as interrupted:
        console.print(f"stopped by {signal.Signals(interrupted.signum).name} after epoch {interrupted.epoch}; its "
                      f"checkpoint is in {checkpoints}. Continue with: mbrl model fit --resume {out}", soft_wrap=True)
        return 128 + interrupted.signum
    finally:
        checkpointer.close()
    _print_fit(kind, kind.save(result.model, out), result.model)
    return 0


def _print_fit(kind, path: Path, model) -> None:
    info = model.info
    print(json.dumps({
        "model": str(path),
        "kind": kind.name,
        "epochs": info.epochs,
        "stop_reason": info.stop_reason,
        "fit_seconds": info.fit_seconds,
        "elites": [int(e) for e in np.asarray(model.elites)],
        "holdout_mse": [round(m, 6) for m in info.holdout_mse],
        "holdout_rows": len(info.holdout_rows),
        "holdout_episodes": len(info.holdout_episodes),
        "eval_episodes": list(info.eval_episodes),
    }))


# -------------------------------------------------------------------------------------------------
# Evaluation


def evaluate(args: EvalArgs) -> int:
    """Report a fitted model's holdout accuracy, calibration and open-loop error."""
    kind = model_registry.saved_kind(args.model_dir)
    model = kind.load(args.model_dir)
    info = model.info
    source = args.dataset or info.source
    if not source:
        raise UserError(f"{args.model_dir}: the model records no dataset; pass --dataset SOURCE")
    dataset = load(source, task=info.task)
    _check_dataset(args.model_dir, model, dataset, source)
    compare = compare_kind = None
    if args.compare is not None:
        compare_kind = model_registry.saved_kind(args.compare)
        compare = compare_kind.load(args.compare)
        _check_dataset(args.compare, compare, dataset, source)
        if tuple(compare.info.eval_episodes) != tuple(info.eval_episodes):
            raise UserError(
                f"--compare {args.compare}: it keeps out episodes {list(compare.info.eval_episodes)}, {args.model_dir} "
                f"keeps out {list(info.eval_episodes)}; fit both with the same seed and eval episodes so that neither "
                "is scored on episodes it trained on")
    if info.holdout_from == "heldout":
        if dataset.heldout is None:
            raise UserError(f"{args.model_dir}: the model was checked on {source}'s held-out data (its -val file), "
                            "which is not beside it now")
        dataset = dataset.heldout
    if kind.holdout_metrics is None:
        raise UserError(f"{args.model_dir}: a {kind.name} model answers no holdout error or calibration")
    metrics, holdout_count = kind.holdout_metrics(model, dataset)
    elites = [int(e) for e in np.asarray(model.elites)]
    # A Markov model's history is 0; with --compare, both models on starts with the longer history behind them.
    history = max(model.history, compare.history if compare is not None else 0)
    open_loop = open_loop_errors(model, dataset.transitions, dataset.episode_starts, info.eval_episodes,
                                 history=None if kind.is_recurrent else history) if kind.k_step_error else {}
    report = {
        "model": str(args.model_dir),
        "dataset": source,
        "kind": kind.name,
        "holdout_rows": holdout_count,
        "elites": elites,
        "members": [
            {
                "member": m,
                "elite": m in elites,
                "holdout_mse": float(metrics["mse"][m]),
                "holdout_mse_raw": float(metrics["mse_raw"][m]),
                "coverage_1sigma": float(metrics["coverage_1sigma"][m]),
                "coverage_2sigma": float(metrics["coverage_2sigma"][m]),
            }
            for m in range(model.num_members)
        ],
        "elite_coverage_1sigma": float(np.mean(metrics["coverage_1sigma"][elites])),
        "elite_coverage_2sigma": float(np.mean(metrics["coverage_2sigma"][elites])),
        "eval_episodes": list(info.eval_episodes),
        "open_loop_mse": {str(k): v for k, (v, _) in open_loop.items()},
        "open_loop_starts": {str(k): n for k, (_, n) in open_loop.items()},
        "open_loop_history": history,
    }
    if compare is not None:
        other = open_loop_errors(compare, dataset.transitions, dataset.episode_starts, info.eval_episodes,
                                 history=None if compare_kind.is_recurrent else history)
        report["compare"] = {"model": str(args.compare), "kind": compare_kind.name,
                             "open_loop_mse": {str(k): v for k, (v, _) in other.items()}}
    if args.plot:
        # Imported here: matplotlib adds about 0.27 s to every `mbrl model` command that draws nothing.
        from mbrl.model_plots import plot_open_loop

        plots = plot_open_loop(model, dataset.transitions, dataset.episode_starts, info.eval_episodes,
                               Path(args.model_dir) / "plots", f"{kind.name} model of {source}")
        report["plots"] = [str(p) for p in plots]
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report)
        for path in report.get("plots", []):
            print(f"wrote {path}")
    return 0


def _check_dataset(model_dir, model, dataset, source) -> None:
    if len(dataset) != model.info.num_transitions:
        raise UserError(
            f"{source}: has {len(dataset):,} transitions; the model in {model_dir} was fitted on "
            f"{model.info.num_transitions:,} (pass --dataset with the dataset it was fitted on)"
        )
    if dataset.transitions.obs_dim != model.obs_dim or dataset.transitions.act_dim != model.act_dim:
        raise UserError(
            f"{source}: obs/action dims {dataset.transitions.obs_dim}/{dataset.transitions.act_dim}; "
            f"the model in {model_dir} expects {model.obs_dim}/{model.act_dim}"
        )


def _print_report(report: dict) -> None:
    console = Console(highlight=False)
    members = Table(title=f"holdout ({report['holdout_rows']} transitions)", title_justify="left")
    for column in ("member", "elite", "mse (std. units)", "mse (raw)", "inside 1σ", "inside 2σ"):
        members.add_column(column, justify="right")
    for row in report["members"]:
        members.add_row(
            str(row["member"]),
            "yes" if row["elite"] else "",
            f"{row['holdout_mse']:.4g}",
            f"{row['holdout_mse_raw']:.4g}",
            f"{row['coverage_1sigma']:.3f}",
            f"{row['coverage_2sigma']:.3f}",
        )
    console.print(members)
    console.print(
        f"elites inside 1σ: {report['elite_coverage_1sigma']:.3f} (calibrated: 0.683), "
        f"inside 2σ: {report['elite_coverage_2sigma']:.3f} (calibrated: 0.954)"
    )
    loop = Table(
        title=f"open-loop obs MSE on held-out episodes {report['eval_episodes']} (starts with "
              f"{report['open_loop_history']} steps of history)", title_justify="left"
    )
    compare = report.get("compare")
    loop.add_column("k", justify="right")
    loop.add_column(f"mse (raw), {report['kind']}", justify="right")
    if compare is not None:
        loop.add_column(f"{compare['kind']} {compare['model']}", justify="right")
    loop.add_column("starts", justify="right")

    def cell(value, starts):
        return "n/a (no episode that long)" if starts == 0 else ("diverged" if value is None else f"{value:.4g}")

    for k, value in report["open_loop_mse"].items():
        starts = report["open_loop_starts"][k]
        row = [k, cell(value, starts)]
        if compare is not None:
            row.append(cell(compare["open_loop_mse"][k], starts))
        loop.add_row(*row, str(starts))
    console.print(loop)
