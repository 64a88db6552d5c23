"""`mbrl model fit` and `mbrl model eval`: fit a dynamics ensemble alone, and measure it.

`mbrl model fit` takes the same `--ensemble.*` and `--fit.*` options as `mbrl train` (generated from
`EnsembleConfig` and `FitConfig` by `mbrl.config`); absent ones keep those classes' defaults.

Eval reports, on the data the model never trained on (recorded in the saved model), the measures of
`world_models.metrics`: per-member holdout MSE, 1σ/2σ calibration, and open-loop k-step error for
k = 1, 5, 20, 100 on whole held-out episodes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from mbrl import config as config_io
from mbrl.core.errors import UserError
from world_models.ensemble import EnsembleConfig
from world_models.fit import FitConfig


def _hint(section: str, name: str, default) -> str:
    if (section, name) == ("ensemble", "learned_termination"):
        return "(default: True when the task has no termination function and the data has terminals)"
    return config_io.the_default(section, name, default)


def _arg(help_: str, metavar: str | None = None):
    return tyro.conf.arg(help=help_, metavar=metavar)


FitArgs = config_io.options_class(
    "FitArgs",
    "Fit a dynamics ensemble on a dataset and save it.",
    [
        ("dataset", Annotated[str, _arg("a .hdf5 (D4RL layout) or .npz (NeoRL layout) file, minari:DATASET_ID, "
                                        "or a made dataset such as hopper-medium", "SOURCE")]),
        ("task", Annotated[str | None, _arg("the task (hopper, halfcheetah, walker2d, ant): its termination "
                                            "function is stored with the model", "TASK")], dataclasses.field(default=None)),
        ("out", Annotated[Path | None, _arg("where to save the model (a directory); default runs/models/DATASET_NAME",
                                            "DIR")], dataclasses.field(default=None)),
        ("clip_actions", Annotated[bool, _arg("clip actions into the action space instead of refusing actions "
                                              "outside it")], dataclasses.field(default=False)),
        ("progress", Annotated[bool, _arg("show the progress bar")], dataclasses.field(default=True)),
    ],
    config_io.section_options({"ensemble": EnsembleConfig, "fit": FitConfig}, _hint),
)


@dataclasses.dataclass(frozen=True)
class EvalArgs:
    model_dir: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="DIR")]
    """A directory written by `mbrl model fit`."""
    dataset: Annotated[str | None, tyro.conf.arg(metavar="SOURCE")] = None
    """The dataset the model was fitted on, if it moved (default: the source recorded in the model)."""
    json: bool = False
    """Print one JSON object instead of tables."""


def _termination_fn(task: str | None):
    if task is None:
        return None
    from envs.tasks import get_task

    return get_task(task).termination_fn


def _absolute_source(source: str) -> str:
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source


def fit(args: FitArgs) -> int:
    """Fit a dynamics ensemble on a dataset and save it."""
    from rich.console import Console

    from mbrl.datasets import load
    from world_models.fit import fit_world_model

    given = config_io.given_options(args)
    fit_config = config_io.override(FitConfig(), given.get("fit", {}), "fit")
    config = config_io.override(EnsembleConfig(), given.get("ensemble", {}), "ensemble")  # checked before the load
    dataset = load(args.dataset, task=args.task, clip_actions=args.clip_actions)
    task = args.task or dataset.info.task
    termination_fn = _termination_fn(task)
    if "learned_termination" not in given.get("ensemble", {}):
        learned = termination_fn is None and bool(dataset.transitions.terminal.any())
        config = dataclasses.replace(config, learned_termination=learned)
    out = args.out or Path("runs") / "models" / dataset.info.name
    console = Console(stderr=True, highlight=False)
    console.print(
        f"fitting {config.num_members} members ({config.num_elites} elites, hidden {'x'.join(map(str, config.hidden_dims))}) "
        f"on {len(dataset):,} transitions of {dataset.info.name}"
        + (f", termination from task '{task}'" if termination_fn is not None else "")
        + (", learned termination head" if config.learned_termination else "")
    )
    result = fit_world_model(
        dataset,
        config=config,
        fit_config=fit_config,
        termination_fn=termination_fn,
        source=_absolute_source(args.dataset),
        task=task,
        progress=args.progress,
    )
    path = result.model.save(out)
    info = result.model.info
    elites = [int(e) for e in np.asarray(result.model.elites)]
    print(
        json.dumps(
            {
                "model": str(path),
                "epochs": info.epochs,
                "stop_reason": info.stop_reason,
                "fit_seconds": info.fit_seconds,
                "elites": elites,
                "holdout_mse": [round(m, 6) for m in info.holdout_mse],
                "holdout_rows": len(info.holdout_rows),
                "eval_episodes": list(info.eval_episodes),
            }
        )
    )
    return 0


# -------------------------------------------------------------------------------------------------
# Evaluation


def evaluate(args: EvalArgs) -> int:
    """Report a fitted model's holdout accuracy, calibration and open-loop error."""
    from mbrl.datasets import load
    from world_models.metrics import holdout_metrics, open_loop_errors
    from world_models.model import WorldModel

    model = WorldModel.load(args.model_dir)
    info = model.info
    source = args.dataset or info.source
    if not source:
        raise UserError(f"{args.model_dir}: the model records no dataset; pass --dataset SOURCE")
    dataset = load(source, task=info.task)
    if len(dataset) != info.num_transitions:
        raise UserError(
            f"{source}: has {len(dataset):,} transitions; the model in {args.model_dir} was fitted on "
            f"{info.num_transitions:,} (pass --dataset with the dataset it was fitted on)"
        )
    if dataset.transitions.obs_dim != model.obs_dim or dataset.transitions.act_dim != model.act_dim:
        raise UserError(
            f"{source}: obs/action dims {dataset.transitions.obs_dim}/{dataset.transitions.act_dim}; "
            f"the model expects {model.obs_dim}/{model.act_dim}"
        )
    holdout = dataset.transitions.slice(np.asarray(info.holdout_rows, dtype=np.int64))
    metrics = holdout_metrics(model, holdout)
    elites = [int(e) for e in np.asarray(model.elites)]
    open_loop = open_loop_errors(model, dataset.transitions, dataset.episode_starts, info.eval_episodes)
    report = {
        "model": str(args.model_dir),
        "dataset": source,
        "holdout_rows": len(holdout),
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
    }
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report)
    return 0


def _print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

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
        title=f"open-loop obs MSE on held-out episodes {report['eval_episodes']}", title_justify="left"
    )
    loop.add_column("k", justify="right")
    loop.add_column("mse (raw)", justify="right")
    loop.add_column("starts", justify="right")
    for k, value in report["open_loop_mse"].items():
        starts = report["open_loop_starts"][k]
        text = "n/a (no episode that long)" if starts == 0 else ("diverged" if value is None else f"{value:.4g}")
        loop.add_row(k, text, str(starts))
    console.print(loop)
