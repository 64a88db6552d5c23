"""`mbrl model fit` and `mbrl model eval`: fit a dynamics ensemble alone, and measure it.

Eval reports, on the data the model never trained on (recorded in the saved model):
- per-member holdout MSE (standardised units, as used for elites, and raw units);
- calibration: the fraction of holdout targets inside each member's predicted 1σ and 2σ
  (a calibrated Gaussian gives 0.683 and 0.954);
- open-loop k-step error for k = 1, 5, 20, 100 on whole held-out episodes: start from a real state,
  feed the real actions, follow the elites' mean prediction, compare with the real observation.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import tyro

from mbrl.core.errors import ConfigError, UserError

OPEN_LOOP_HORIZONS = (1, 5, 20, 100)
MAX_OPEN_LOOP_STARTS = 1024


@dataclasses.dataclass(frozen=True)
class FitArgs:
    dataset: Annotated[str, tyro.conf.arg(metavar="SOURCE")]
    """A .hdf5 (D4RL layout) or .npz (NeoRL layout) file, minari:DATASET_ID, or a made dataset such as hopper-medium."""
    task: Annotated[str | None, tyro.conf.arg(metavar="TASK")] = None
    """The task (hopper, halfcheetah, walker2d, ant): its termination function is stored with the model."""
    out: Path | None = None
    """Where to save the model (a directory); default runs/models/DATASET_NAME."""
    max_epochs: int | None = None
    """Stop after this many epochs even if the holdout loss still improves (default: early stopping only)."""
    max_seconds: float | None = None
    """Stop after this many seconds of fitting (checked after each epoch)."""
    members: int = 7
    """Ensemble size."""
    elites: int = 5
    """Members with the lowest holdout MSE that rollouts sample from."""
    layers: int = 4
    """Hidden layers per member."""
    width: int = 200
    """Units per hidden layer."""
    layer_norm: bool = False
    """LayerNorm blocks with a fixed soft log-std range [-5, 0.25] (NEUBAY) instead of learned bounds."""
    learned_termination: bool | None = None
    """Learn a termination head; default: only when the task has no termination function and the data has terminals."""
    holdout_ratio: float = 0.2
    """Fraction of transitions held out for early stopping, capped by --max-holdout."""
    max_holdout: int = 1000
    """Largest holdout."""
    eval_episodes: int = 2
    """Whole episodes kept out of fitting for open-loop evaluation (at most 10% of the episodes)."""
    sampling: Literal["bootstrap", "permutation"] = "bootstrap"
    """Per-member bootstrap resample, or each member's own permutation of all the data."""
    batch_size: int = 256
    """Minibatch per member."""
    lr: float = 1e-3
    """Adam learning rate."""
    seed: int = 0
    """Seed of the split, the initial weights and the minibatch order."""
    clip_actions: bool = False
    """Clip actions into the action space instead of refusing actions outside it."""
    progress: bool = True
    """Show the progress bar."""


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
    from world_models.ensemble import EnsembleConfig
    from world_models.fit import FitConfig, fit_world_model

    if args.layers < 1 or args.width < 1:
        raise ConfigError(f"--layers and --width must be >= 1, got {args.layers} and {args.width}")
    fit_config = FitConfig(
        holdout_ratio=args.holdout_ratio,
        max_holdout=args.max_holdout,
        eval_episodes=args.eval_episodes,
        sampling=args.sampling,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        max_epochs=args.max_epochs,
        max_seconds=args.max_seconds,
        seed=args.seed,
    )
    dataset = load(args.dataset, task=args.task, clip_actions=args.clip_actions)
    task = args.task or dataset.info.task
    termination_fn = _termination_fn(task)
    learned_termination = args.learned_termination
    if learned_termination is None:
        learned_termination = termination_fn is None and bool(dataset.transitions.terminal.any())
    config = EnsembleConfig(
        num_members=args.members,
        num_elites=args.elites,
        hidden_dims=(args.width,) * args.layers,
        layer_norm=args.layer_norm,
        learned_termination=learned_termination,
    )
    out = args.out or Path("runs") / "models" / dataset.info.name
    console = Console(stderr=True, highlight=False)
    console.print(
        f"fitting {config.num_members} members ({config.num_elites} elites, {args.layers}x{args.width}) on "
        f"{len(dataset):,} transitions of {dataset.info.name}"
        + (f", termination from task '{task}'" if termination_fn is not None else "")
        + (", learned termination head" if learned_termination else "")
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


def holdout_metrics(model, transitions) -> dict:
    """Per-member MSE (standardised and raw units) and 1σ/2σ coverage on `transitions`."""
    import jax
    import jax.numpy as jnp

    predict = jax.jit(type(model).member_predictions)
    means, stds = predict(model, jnp.asarray(transitions.obs), jnp.asarray(transitions.action))
    means, stds = np.asarray(means, np.float64), np.asarray(stds, np.float64)
    targets = np.concatenate([transitions.next_obs - transitions.obs, transitions.reward[:, None]], axis=1)
    error = means - targets[None]
    target_std = np.asarray(model.target_norm.std, np.float64)
    z = np.abs(error) / stds
    return {
        "mse": np.mean(np.square(error / target_std), axis=(1, 2)),
        "mse_raw": np.mean(np.square(error), axis=(1, 2)),
        "coverage_1sigma": np.mean(z <= 1.0, axis=(1, 2)),
        "coverage_2sigma": np.mean(z <= 2.0, axis=(1, 2)),
    }


def open_loop_errors(model, dataset, episodes, horizons=OPEN_LOOP_HORIZONS, max_starts=MAX_OPEN_LOOP_STARTS) -> dict:
    """MSE (raw units, mean over obs dims) between real obs and the elites' mean prediction k steps ahead.

    Every step of the held-out `episodes` is a start (evenly thinned to `max_starts`); a start counts
    for horizon k when its episode has k more real steps. Returns {k: (mse or None, starts used)}.
    """
    import jax
    import jax.numpy as jnp

    transitions = dataset.transitions
    bounds = np.append(dataset.episode_starts, len(transitions))
    starts, ends = [], []
    for e in episodes:
        rows = np.arange(bounds[e], bounds[e + 1])
        starts.append(rows)
        ends.append(np.full(len(rows), bounds[e + 1]))
    if not starts:
        return {k: (None, 0) for k in horizons}
    starts, ends = np.concatenate(starts), np.concatenate(ends)
    if len(starts) > max_starts:
        keep = np.linspace(0, len(starts) - 1, max_starts).round().astype(int)
        starts, ends = starts[keep], ends[keep]
    horizon = max(horizons)
    offsets = np.arange(horizon)[:, None]  # (K, 1)
    rows = starts[None, :] + offsets  # (K, S): the real step taken at each model step
    valid = rows < ends[None, :]
    rows = np.minimum(rows, ends[None, :] - 1)
    actions = jnp.asarray(transitions.action[rows])
    targets = jnp.asarray(transitions.next_obs[rows])
    @jax.jit
    def rollout(model, obs, actions, targets):  # the model is an argument, not baked-in constants
        def step(obs, xs):
            action, target = xs
            means, _ = model.member_predictions(obs, action)
            next_obs = obs + jnp.mean(means[model.elites], axis=0)[:, : model.obs_dim]
            return next_obs, jnp.mean(jnp.square(next_obs - target), axis=-1)

        _, errors = jax.lax.scan(step, obs, (actions, targets))
        return errors  # (K, S)

    errors = np.asarray(rollout(model, jnp.asarray(transitions.obs[starts]), actions, targets), np.float64)
    result = {}
    for k in horizons:
        mask = valid[k - 1]
        count = int(mask.sum())
        value = float(np.mean(errors[k - 1][mask])) if count else None
        result[k] = (value if value is None or math.isfinite(value) else None, count)
    return result


def evaluate(args: EvalArgs) -> int:
    """Report a fitted model's holdout accuracy, calibration and open-loop error."""
    from mbrl.datasets import load
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
    open_loop = open_loop_errors(model, dataset, info.eval_episodes)
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
