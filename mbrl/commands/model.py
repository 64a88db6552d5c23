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
from mbrl.world_models.ensemble import EnsembleConfig
from mbrl.world_models.fit import CHECKPOINT_DIR, FitConfig, FitControl, FitInterrupted, fit_world_model
from mbrl.world_models.metrics import history_holdout_metrics, holdout_metrics, open_loop_errors
from mbrl.world_models.recurrent import RecurrentConfig, load_model
from mbrl.world_models.recurrent_fit import RecurrentFitConfig, fit_recurrent_model

MODEL_KINDS = ("mlp", "rwm")
_SECTIONS = {"mlp": ("ensemble", "fit"), "rwm": ("rwm", "rwm_fit")}


def _hint(section: str, name: str, default) -> str:
    if (section, name) in (("ensemble", "learned_termination"), ("rwm", "learned_termination")):
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
        ("model", Annotated[str, _arg("mlp (the probabilistic MLP ensemble) or rwm (RWM-U: a GRU with ensemble "
                                      "heads)", "{mlp,rwm}")], dataclasses.field(default="mlp")),
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
    config_io.section_options({"ensemble": EnsembleConfig, "fit": FitConfig, "rwm": RecurrentConfig,
                               "rwm_fit": RecurrentFitConfig}, _hint),
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


def _fit(kind: str, dataset_source: str, task: str | None, clip_actions: bool, given: dict, out: Path | None, *,
         progress: bool, checkpoint_seconds: float, resume: bool) -> int:
    from mbrl.checkpoint import Checkpointer  # lazy: orbax loads only when a fit starts

    if kind not in MODEL_KINDS:
        raise UserError(f"--model: expected one of {', '.join(MODEL_KINDS)}, found {kind!r}")
    other = [name for k, names in _SECTIONS.items() if k != kind for name in names if name in given]
    if other:
        raise UserError(f"{', '.join('--' + n.replace('_', '-') + '.*' for n in other)}: not read by --model "
                        f"{kind}, which reads " + ", ".join(f"--{n.replace('_', '-')}.*" for n in _SECTIONS[kind]))
    arch_name, fit_name = _SECTIONS[kind]
    arch_class, fit_class = (EnsembleConfig, FitConfig) if kind == "mlp" else (RecurrentConfig, RecurrentFitConfig)
    fit_config = config_io.override(fit_class(), given.get(fit_name, {}), fit_name)
    config = config_io.override(arch_class(), given.get(arch_name, {}), arch_name)  # checked before the load
    dataset = load(dataset_source, task=task, clip_actions=clip_actions)
    task = task or dataset.info.task
    task_fns = _task_fns(task)
    termination_fn = task_fns.get("termination_fn")
    if "learned_termination" not in given.get(arch_name, {}):
        learned = termination_fn is None and bool(dataset.transitions.terminal.any())
        config = dataclasses.replace(config, learned_termination=learned)
    out = (out or Path("runs") / "models" / (dataset.info.name + ("-rwm" if kind == "rwm" else ""))).absolute()
    checkpoints = out / CHECKPOINT_DIR
    identity = {"model": kind, "dataset": dataset_source, "task": task, "clip_actions": clip_actions, "given": given}
    if not resume:
        if checkpoints.is_dir() and any(checkpoints.iterdir()):
            raise UserError(f"{out}: holds an interrupted fit ({checkpoints}); continue it with mbrl model fit --resume "
                            f"{out}, or remove {checkpoints} to start afresh")
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / FIT_ARGS, json.dumps(identity, indent=1))
    console = Console(stderr=True, highlight=False)
    if kind == "mlp":
        shape = f"{config.num_members} members ({config.num_elites} elites, hidden {'x'.join(map(str, config.hidden_dims))})"
    else:
        shape = (f"RWM-U (GRU {config.gru_layers}x{config.gru_hidden}, {config.num_heads} heads of "
                 f"{'x'.join(map(str, config.head_hidden))}, history {config.history}, forecast {config.forecast})")
    console.print(
        f"fitting {shape} on {len(dataset):,} transitions of {dataset.info.name}"
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
    fit_fn = fit_world_model if kind == "mlp" else fit_recurrent_model
    try:
        with StopSignal() as stop:
            control = FitControl(checkpointer, every_seconds=checkpoint_seconds, resume=resume, stop=stop,
                                 identity=identity)
            result = fit_fn(dataset, config=config, fit_config=fit_config, source=dataset_source, task=task,
                            progress=progress, control=control, **task_fns)
    except FitInterrupted as interrupted:
        console.print(f"stopped by {signal.Signals(interrupted.signum).name} after epoch {interrupted.epoch}; its "
                      f"checkpoint is in {checkpoints}. Continue with: mbrl model fit --resume {out}", soft_wrap=True)
        return 128 + interrupted.signum
    finally:
        checkpointer.close()
    path = result.model.save(out)
    info = result.model.info
    elites = [int(e) for e in np.asarray(result.model.elites)]
    print(json.dumps({
        "model": str(path),
        "kind": kind,
        "epochs": info.epochs,
        "stop_reason": info.stop_reason,
        "fit_seconds": info.fit_seconds,
        "elites": elites,
        "holdout_mse": [round(m, 6) for m in info.holdout_mse],
        "holdout_rows": len(info.holdout_rows),
        "holdout_episodes": len(info.holdout_episodes),
        "eval_episodes": list(info.eval_episodes),
    }))
    return 0


# -------------------------------------------------------------------------------------------------
# Evaluation


def evaluate(args: EvalArgs) -> int:
    """Report a fitted model's holdout accuracy, calibration and open-loop error."""
    model = load_model(args.model_dir)
    recurrent = model.is_recurrent
    info = model.info
    source = args.dataset or info.source
    if not source:
        raise UserError(f"{args.model_dir}: the model records no dataset; pass --dataset SOURCE")
    dataset = load(source, task=info.task)
    _check_dataset(args.model_dir, model, dataset, source)
    compare = None
    if args.compare is not None:
        compare = load_model(args.compare)
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
    if recurrent:
        metrics, holdout_count = history_holdout_metrics(model, dataset.transitions, dataset.episode_starts,
                                                         info.holdout_episodes)
    else:
        holdout = dataset.transitions.slice(np.asarray(info.holdout_rows, dtype=np.int64))
        metrics, holdout_count = holdout_metrics(model, holdout), len(holdout)
    elites = [int(e) for e in np.asarray(model.elites)]
    history = model.history if recurrent else 0
    if compare is not None and compare.is_recurrent:
        history = max(history, compare.history)  # both models on starts with the longer history behind them
    open_loop = open_loop_errors(model, dataset.transitions, dataset.episode_starts, info.eval_episodes,
                                 history=history if not recurrent else None)
    report = {
        "model": str(args.model_dir),
        "dataset": source,
        "kind": _kind(model),
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
                                 history=None if compare.is_recurrent else history)
        report["compare"] = {"model": str(args.compare), "kind": _kind(compare),
                             "open_loop_mse": {str(k): v for k, (v, _) in other.items()}}
    if args.plot:
        # Imported here: matplotlib adds about 0.27 s to every `mbrl model` command that draws nothing.
        from mbrl.model_plots import plot_open_loop

        plots = plot_open_loop(model, dataset.transitions, dataset.episode_starts, info.eval_episodes,
                               Path(args.model_dir) / "plots", f"{_kind(model)} model of {source}")
        report["plots"] = [str(p) for p in plots]
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report)
        for path in report.get("plots", []):
            print(f"wrote {path}")
    return 0


def _kind(model) -> str:
    return "rwm" if model.is_recurrent else "mlp"


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
