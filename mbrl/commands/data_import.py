"""`mbrl data import SOURCE --task robot.toml --out DIR`: a robot's own logs as a Minari dataset every command reads.

The importers (`mbrl.datasets.importers`) read the log into episodes in the declaration's channel order; here
the rewards come from the log or the declared reward function, terminations from the declared termination
function (an episode ends at its first terminated transition; the rest of the log goes on as a new episode),
the last transition of every other episode is truncated, and the actions are checked against their bounds.
The dataset's metadata keeps the declaration's path, so `mbrl train --dataset DIR` knows the task.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import tyro
from rich.console import Console
from rich.table import Table

from mbrl.core.declaration import Declaration, is_declaration_path, read_declaration
from mbrl.core.errors import ConfigError, DatasetError
from mbrl.datasets import importers
from mbrl.datasets.minari_io import DECLARATION_KEY
from mbrl.datasets.validate import FLOAT32_MAX
from mbrl.envs.lockstep import Episode


@dataclasses.dataclass(frozen=True)
class ImportArgs:
    source: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="SOURCE")]
    """A ROS 2 bag folder (or its .db3/.mcap file), a LeRobot dataset folder or parquet file, or a .csv/.parquet
    table with one row per control tick."""
    task: Annotated[str, tyro.conf.arg(metavar="ROBOT.TOML")]
    """The robot's declaration (robot.toml): its channels, control rate, reward and termination, [import] settings."""
    out: Annotated[str, tyro.conf.arg(metavar="DIR")]
    """The dataset folder to write (a bare NAME is a folder in the current directory)."""
    format: Literal["auto", "ros2", "lerobot", "table"] = "auto"
    """What SOURCE is; auto tells by its layout."""
    clip_actions: bool = False
    """Clip actions into their declared bounds instead of refusing the first one outside them."""
    force: bool = False
    """Replace OUT if it exists."""
    json: bool = False
    """Print the summary as one JSON object."""


def import_logs(args: ImportArgs) -> int:
    if not is_declaration_path(args.task):
        raise ConfigError(f"--task {args.task!r}: expected a robot's declaration file (robot.toml)")
    decl = read_declaration(args.task)
    out = Path(args.out).expanduser().absolute()
    if out.exists() and not args.force:
        raise ConfigError(f"--out {out}: already exists; pass --force to replace it")
    from mbrl.envs.tasks import get_task  # lazy: 0.36 s more for `mbrl data import --help` (measured)

    task = get_task(str(decl.path))
    imported = importers.read(args.source, decl, args.format)
    episodes, summary = finish_episodes(imported, decl, task.reward_fn, task.termination_fn, args.clip_actions)
    _write(out, decl, imported, episodes, args.force)
    summary.update(out=str(out), task=decl.name, declaration=str(decl.path))
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    return 0


def finish_episodes(imported: importers.Imported, decl: Declaration, reward_fn, termination_fn, clip_actions: bool):
    """Checked, rewarded and terminated episodes (`mbrl.envs.lockstep.Episode`, float32) and the summary's numbers."""
    parts = imported.episodes
    if not parts:
        raise DatasetError(f"{imported.source}: no transitions; expected episodes of at least two ticks")
    locate = imported.locate
    obs_all = np.concatenate([ep.observations for ep in parts])
    _check_finite(obs_all, np.concatenate([ep.origins for ep in parts]), decl.observations, "observation", locate)
    act = np.concatenate([ep.actions for ep in parts])
    origins = np.concatenate([ep.origins[:-1] for ep in parts])  # the tick each transition starts at
    _check_finite(act, origins, decl.actions, "action", locate)
    low = np.array([c.low for c in decl.actions])
    high = np.array([c.high for c in decl.actions])
    outside = (act < low) | (act > high)
    clipped = int(outside.any(axis=1).sum())
    if clipped and not clip_actions:
        row, dim = np.argwhere(outside)[0]
        channel = decl.actions[dim]
        raise DatasetError(
            f"{locate(origins[row])}: action {channel.name!r} = {act[row, dim]:g} is outside its declared bounds "
            f"[{channel.low:g}, {channel.high:g}] ({decl.path}); pass --clip-actions to clip such actions")
    act = np.clip(act, low, high).astype(np.float32)
    obs = np.concatenate([ep.observations[:-1] for ep in parts]).astype(np.float32)
    next_obs = np.concatenate([ep.observations[1:] for ep in parts]).astype(np.float32)

    if all(ep.rewards is not None for ep in parts):
        rewards, reward_origin = np.concatenate([ep.rewards for ep in parts]), "the log"
    elif reward_fn is not None:
        rewards, reward_origin = np.asarray(reward_fn(obs, act, next_obs), np.float64), f"{decl.reward}"
    else:
        raise ConfigError(f"{decl.path}: no reward for {imported.source}: expected reward = \"file.py:function\" "
                          f"in the declaration, or a reward in the log ([import] reward_topic / reward_column, or "
                          f"LeRobot's next.reward)")
    bad = np.flatnonzero(~np.isfinite(rewards))
    if bad.size:
        raise DatasetError(f"{locate(origins[bad[0]])}: the reward ({reward_origin}) is {rewards[bad[0]]}; "
                           f"expected a finite number")
    terminated = (np.zeros(len(act), bool) if termination_fn is None
                  else np.asarray(termination_fn(obs, act, next_obs), bool).reshape(len(act)))

    episodes, start = [], 0
    for part in parts:
        stop = start + len(part.actions)
        cuts = np.flatnonzero(terminated[start:stop]) + 1  # an episode ends just after its terminated transition
        for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [stop - start]])):
            if b <= a:
                continue
            i, j = start + a, start + b
            flags = terminated[i:j].copy()
            truncated = np.zeros(j - i, bool)
            truncated[-1] = not flags[-1]
            episodes.append(Episode(
                observations=np.concatenate([obs[i:j], next_obs[j - 1:j]]), actions=act[i:j],
                rewards=rewards[i:j].astype(np.float32), terminations=flags, truncations=truncated,
                episode_return=float(np.sum(rewards[i:j], dtype=np.float64))))
        start = stop
    returns = np.array([ep.episode_return for ep in episodes])
    summary = {"source": imported.source, "format": imported.format, **imported.counts,
               "episodes": len(episodes), "transitions": int(len(act)), "terminations": int(terminated.sum()),
               "clipped_actions": clipped if clip_actions else 0, "rewards_from": reward_origin,
               "mean_return": float(returns.mean()), "min_return": float(returns.min()),
               "max_return": float(returns.max()), "notes": list(imported.notes)}
    return episodes, summary


def _check_finite(values: np.ndarray, origins: np.ndarray, channels, kind: str, locate) -> None:
    """validate.check_finite's rule (no NaN, no Inf, none beyond float32), naming the channel and the tick."""
    bad = np.argwhere(~(np.abs(values) <= FLOAT32_MAX))
    if bad.size:
        row, dim = bad[0]
        raise DatasetError(f"{locate(origins[row])}: {kind} {channels[dim].name!r} is {values[row, dim]}; "
                           f"expected a finite float32 value")


def _write(out: Path, decl: Declaration, imported: importers.Imported, episodes, force: bool) -> None:
    """Into `out` atomically (built beside it, then renamed); with `force`, an old `out` goes only once the new
    one is in place."""
    # lazy: gymnasium and mbrl.envs.collect (minari) add 0.08 s to `mbrl data import --help` (measured)
    import gymnasium as gym

    from mbrl.envs.collect import write_minari_folder

    slug = re.sub(r"[^\w-]+", "_", out.name).strip("_-") or "imported"
    dataset_id = f"mbrl/{decl.name}/{slug}-v0"
    spaces = (gym.spaces.Box(np.array([c.low for c in decl.observations], np.float32),
                             np.array([c.high for c in decl.observations], np.float32), dtype=np.float32),
              gym.spaces.Box(np.array([c.low for c in decl.actions], np.float32),
                             np.array([c.high for c in decl.actions], np.float32), dtype=np.float32))
    counts = {f"mbrl_import_{key}": int(value) for key, value in imported.counts.items()}
    metadata = {DECLARATION_KEY: str(decl.path), "mbrl_import_source": str(Path(imported.source).absolute()),
                "mbrl_import_format": imported.format, **counts}
    aside = None
    if out.exists():  # --force: keep the old one until the new one is written
        aside = Path(tempfile.mkdtemp(prefix=f".old-{out.name}-", dir=out.parent)) / "old"
        out.rename(aside)
    try:
        write_minari_folder(
            out, dataset_id, episodes, spaces=spaces, ref_scores=(decl.ref_min_score, decl.ref_max_score),
            algorithm_name="robot logs", metadata=metadata,
            description=f"{decl.name}: {imported.format} logs from {imported.source}, imported by `mbrl data import`.",
            code_permalink="https://github.com/offline-mbrl/offline-mbrl/blob/main/mbrl/commands/data_import.py")
    except BaseException:
        if aside is not None:
            aside.rename(out)
        raise
    finally:
        if aside is not None:
            shutil.rmtree(aside.parent, ignore_errors=True)


def _print_summary(summary: dict) -> None:
    table = Table(title=f"imported {summary['task']} ({summary['format']}) -> {summary['out']}", show_header=False,
                  title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [("source", summary["source"]),
            ("ticks", f"{summary['ticks']:,}"),
            ("kept", f"{summary['kept_ticks']:,} ticks: {summary['transitions']:,} transitions in "
                     f"{summary['episodes']:,} episodes"),
            ("stale ticks", f"{summary['stale_ticks']:,} dropped (an input older than max_age_s); "
                            f"{summary['stale_cuts']:,} episode cuts there"),
            ("short runs", f"{summary['short_dropped']:,} ticks dropped (no tick beside them to make a transition)"),
            ("gaps", f"{summary['gaps']:,} (episodes split there)"),
            ("episode markers", f"{summary['markers']:,}"),
            ("terminations", f"{summary['terminations']:,}"),
            ("rewards from", summary["rewards_from"]),
            ("episode return", f"mean {summary['mean_return']:.3f}, min {summary['min_return']:.3f}, "
                               f"max {summary['max_return']:.3f}")]
    if summary["clipped_actions"]:
        rows.append(("clipped actions", f"{summary['clipped_actions']:,}"))
    rows += [("note", note) for note in summary["notes"]]
    for row in rows:
        table.add_row(*row)
    Console(highlight=False).print(table)
