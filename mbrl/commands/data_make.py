"""`mbrl data make TASK-LEVEL`: make a D4RL-style dataset locally from the shipped behaviour policies.

What each level runs: `mbrl.envs.collect.plan_segments`. The same seed gives the same dataset.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated

import tyro
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from mbrl.envs import collect
from mbrl.core import dataset_registry as registry
from mbrl.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class MakeArgs:
    name: tyro.conf.Positional[str]
    """TASK-LEVEL, e.g. hopper-medium (levels: random, medium, medium-replay, expert, medium-expert)."""
    transitions: int | None = None
    """Number of transitions (default 1,000,000; for medium-replay the recorded run's length)."""
    seed: int = 0
    """Seed of the collection: the same seed gives the same dataset."""
    num_envs: Annotated[int, tyro.conf.arg(help="envs stepped in lockstep per policy call")] = 16
    force: bool = False
    """Rebuild even if a complete dataset with this id exists."""


def make(args: MakeArgs) -> int:
    task, level = registry.task_level(args.name)
    if args.transitions is not None and args.transitions < 1:
        raise ConfigError(f"--transitions must be a positive number of transitions, got {args.transitions}")
    if args.num_envs < 1:
        raise ConfigError(f"--num-envs must be >= 1, got {args.num_envs}")
    ds_id = registry.minari_id(task, level)
    if registry.is_made(task, level) and not args.force:
        print(f"{ds_id}: already made at {registry.data_dir() / ds_id} (pass --force to rebuild)")
        return 0
    segments = collect.plan_segments(task, level, args.transitions, args.seed)

    columns = (TextColumn(f"[bold]{ds_id}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, disable=os.environ.get("MBRL_NO_PROGRESS") == "1") as progress:
        bar = progress.add_task("collect", total=sum(s.steps for s in segments))
        made = collect.make_dataset(task, level, segments, args.seed, num_envs=args.num_envs,
                                    on_steps=lambda n: progress.advance(bar, n))
    print(
        f"{ds_id}: {made.transitions} transitions, {made.episodes} episodes, mean return {made.mean_return:.1f}, "
        f"normalized score {made.normalized_score:.1f} -> {made.path}"
    )
    return 0
