"""`mbrl data profile SOURCE [--world-model DIR]`: the facts about a dataset (and a model fitted on it) that settings
can be chosen from without a simulator, and what the rules of `mbrl.rules` choose from them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import tyro
from rich.console import Console
from rich.table import Table

from mbrl import config as config_io
from mbrl import rules
from mbrl.agents import registry
from mbrl.core.errors import UserError
from mbrl.core.files import write_text_atomic
from mbrl.datasets import load
from mbrl.datasets.profile import DataProfile, profile_data


@dataclasses.dataclass(frozen=True)
class ProfileArgs:
    source: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="SOURCE")]
    """A dataset as every command reads it: a .hdf5 or .npz file, minari:DATASET_ID, neorl2:TASK, or a made one."""
    task: Annotated[str | None, tyro.conf.arg(metavar="TASK")] = None
    """The task the data comes from (checks its dims and action space)."""
    json: bool = False
    """Print the profile as one JSON object instead of tables."""
    out: Annotated[Path | None, tyro.conf.arg(metavar="FILE")] = None
    """Also write the profile as JSON to this file."""
    seed: int = 0
    """Which half of the episodes the dynamics-dependence test holds out."""
    world_model: Annotated[Path | None, tyro.conf.arg(metavar="DIR")] = None
    """A world model fitted on this dataset (`mbrl model fit`): adds its calibration and k-step error."""
    compare: Annotated[Path | None, tyro.conf.arg(metavar="DIR")] = None
    """With --world-model: a model of another kind (a history model, `--model rwm`) fitted with the same seed, whose
    k-step error is set beside it."""
    algo: Annotated[str, tyro.conf.arg(metavar="ALGO")] = registry.DEFAULT
    """The algorithm whose quick preset the rules' choices are sized for (its sections, its update budget)."""


def profile(args: ProfileArgs) -> int:
    """Profile a dataset: the reward's scale, the actions against their bounds, the observations' scales, which
    observations track the time step and which the dynamics depend on."""
    if args.compare is not None and args.world_model is None:
        raise UserError("--compare: compares with --world-model DIR; give that too")
    base = config_io.quick_base(args.algo, args.source)
    dataset = load(args.source, task=args.task)
    found = profile_data(dataset, seed=args.seed)
    placed = rules.choices_for(found, config_io.updates_of(base),
                               {name: getattr(base, name) for name in registry.entry(args.algo).sections})
    report = found.to_json()
    model = None
    if args.world_model is not None:
        from mbrl.model_profile import profile_model  # lazy: JAX and the world models only with a model

        model = profile_model(args.world_model, args.source, args.compare, dataset=dataset)
        report["world_model"] = model.to_json()
        placed += [("imagination", choice) for choice in rules.model_choices(model)]
    report["choices"] = rules.placed_table(placed)
    if args.out is not None:
        write_text_atomic(args.out, json.dumps(report, indent=1) + "\n")
    if args.json:
        print(json.dumps(report))
    else:
        print_profile(found)
        if model is not None:
            print_model(report["world_model"])
        print_choices(report["choices"])
        if args.out is not None:
            print(f"wrote {args.out}")
    return 0


def print_profile(found: DataProfile) -> None:
    console = Console(highlight=False)
    summary = Table(title=f"profile of {found.source}", show_header=False, title_justify="left")
    summary.add_column("fact", style="bold")
    summary.add_column("value")
    summary.add_row("transitions, episodes", f"{found.transitions:,}, {found.episodes:,} (mean length "
                                             f"{found.mean_episode_length:.1f})")
    summary.add_row("reward per step", f"mean {found.reward_mean:.4g}, std {found.reward_std:.4g}, "
                                       f"mean |r| {found.reward_abs_mean:.4g}")
    summary.add_row("episode return", f"mean {found.return_mean:.4g}, std {found.return_std:.4g}")
    summary.add_row("observation scales", f"largest std / smallest {found.obs_scale_ratio:.3g}"
                                          + (" (unequal)" if found.unequal_scales else ""))
    summary.add_row("actions at a bound", _dims(found.pressed_actions))
    summary.add_row("observations tied to time", _dims(found.time_tied_observations)
                    + " (track the step, the dynamics ignore them)")
    console.print(summary)

    actions = Table(title="actions", title_justify="left")
    for column in ("dim", "low", "high", "at low", "at high", "mean", "std", "entropy"):
        actions.add_column(column, justify="right")
    for d, a in enumerate(found.actions):
        actions.add_row(str(d), _num(a.low), _num(a.high), f"{a.at_low:.1%}", f"{a.at_high:.1%}", f"{a.mean:.3g}",
                        f"{a.std:.3g}", "-" if a.entropy is None else f"{a.entropy:.2f}")
    console.print(actions)

    observations = Table(title="observations", title_justify="left")
    for column in ("dim", "mean", "std", "min", "max", "corr. with step", "error without it"):
        observations.add_column(column, justify="right")
    for d, o in enumerate(found.observations):
        observations.add_row(str(d), f"{o.mean:.3g}", f"{o.std:.3g}", f"{o.min:.3g}", f"{o.max:.3g}",
                             f"{o.time_correlation:+.2f}", f"{o.dynamics_error_increase:+.1%}")
    console.print(observations)


def print_model(model: dict) -> None:
    table = Table(title=f"{model['kind']} model {model['model']}", show_header=False, title_justify="left")
    table.add_column("fact", style="bold")
    table.add_column("value")
    if model["spread_over_error"] is not None:
        table.add_row("spread / error, ordinary rows", " ".join(f"{v:.3g}" for v in model["spread_over_error"]))
        jumps = model["spread_over_error_jumps"]
        table.add_row("targets that jump", ", ".join(map(str, model["jumping_targets"])) or "none")
        table.add_row(f"spread / error, {model['jump_rows']} jump rows",
                      "none" if jumps is None else " ".join(f"{v:.3g}" for v in jumps))
        table.add_row("variance stands for jumps", "yes" if model["variance_is_jumps"] else "no")
    errors = model["k_step_error"]
    table.add_row("k-step error / obs variance", ", ".join(f"{k}: {_num(v, '.3g')}" for k, v in errors.items()))
    table.add_row("trusted horizon", str(model["trusted_horizon"] or "none"))
    if model["compare"] is not None:
        other = model["compare"]
        table.add_row(f"{other['kind']} {other['model']}",
                      ", ".join(f"{k}: {_num(v, '.3g')}" for k, v in other["k_step_error"].items()))
        table.add_row(f"{other['kind']} better at", ", ".join(map(str, other["better_at"])) or "no horizon")
    Console(highlight=False).print(table)


def print_choices(choices: list[dict]) -> None:
    table = Table(title="what the rules choose (mbrl.rules)", title_justify="left")
    for column in ("setting", "value", "because"):
        table.add_column(column)
    for choice in choices:
        where = f"{choice['section']}." if choice["section"] else ""
        table.add_row(where + choice["field"], str(choice["value"]), choice["fact"])
    if not choices:
        table.add_row("-", "-", "nothing calls for a change from the defaults")
    Console(highlight=False).print(table)


def _dims(dims: list[int]) -> str:
    return ", ".join(map(str, dims)) if dims else "none"


def _num(value: float | None, spec: str = "g") -> str:
    return "-" if value is None else format(value, spec)
