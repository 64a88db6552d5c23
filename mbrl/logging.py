"""Where a run's metrics go: `metrics.jsonl` (always), a rich progress bar, TensorBoard and W&B (optional).

One JSON object per line and epoch; values measured per seed are lists in seed order. TensorBoard and
W&B are imported only when asked for (the `tracking` extra).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)

from mbrl.core.errors import MissingDependencyError
from mbrl.core.files import write_text_atomic
from mbrl.core.score import score_key, score_label

METRICS_FILE = "metrics.jsonl"


def mean_stderr(values) -> tuple[float, float]:
    """Mean and standard error over seeds (stderr 0 for one seed)."""
    values = np.asarray(values, np.float64)
    if values.size == 0:
        return float("nan"), float("nan")
    if values.size == 1:
        return float(values[0]), 0.0
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(values.size))


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a crash: everything after it is dropped
                break
    return records


def truncate_metrics(path: str | Path, last_epoch: int, key: str = "epoch") -> None:
    """Keep only the records whose `key` (epochs; env steps for fine-tuning) is <= `last_epoch` (those a
    resumed run does not redo)."""
    path = Path(path)
    kept = [r for r in read_metrics(path) if r.get(key, 0) <= last_epoch]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


class _TensorBoard:
    def __init__(self, run_dir: Path):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MissingDependencyError(
                    "logging.tensorboard needs tensorboardX: pip install 'offline-mbrl[tracking]'"
                ) from None
        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run_dir: Path, project: str, config: dict):
        try:
            import wandb
        except ImportError:
            raise MissingDependencyError("logging.wandb needs wandb: pip install 'offline-mbrl[tracking]'") from None
        self.run = wandb.init(project=project, dir=str(run_dir), config=config, name=run_dir.name, resume="allow")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


def _scalars(record: dict) -> dict[str, float]:
    """Flatten a record to `section/name` -> seed mean, for the trackers."""
    out = {}
    for section in ("train", "eval"):
        for name, values in record.get(section, {}).items():
            if isinstance(values, list) and values and all(isinstance(v, (int, float)) for v in values):
                out[f"{section}/{name}"] = float(np.mean(values))
    return out


class RunLogger:
    """Appends epoch records to `metrics.jsonl` and forwards scalars to the optional trackers."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = False, wandb: bool = False,
                 wandb_project: str = "offline-mbrl", config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.sinks: list[Any] = []
        if tensorboard:
            self.sinks.append(_TensorBoard(self.run_dir))
        if wandb:
            self.sinks.append(_WandB(self.run_dir, wandb_project, config or {}))
        self._file = open(self.path, "a")

    def log(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        scalars = _scalars(record)
        for sink in self.sinks:
            sink.log(scalars, int(record.get("updates", record.get("epoch", 0))))

    def close(self) -> None:
        self._file.close()
        for sink in self.sinks:
            sink.close()


class Progress:
    """A rich progress bar over epochs (or another `unit`) with the ETA and the last evaluation's score."""

    def __init__(self, total_epochs: int, start_epoch: int, description: str, enabled: bool = True, unit: str = "epochs"):
        self._bar = RichProgress(
            TextColumn(f"[bold]{description}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=Console(stderr=True),
            disable=not enabled,
        )
        self._task = self._bar.add_task("train", total=total_epochs, completed=start_epoch, status="compiling")

    def __enter__(self):
        self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self._bar.__exit__(*exc)

    def update(self, epoch: int, status: str) -> None:
        self._bar.update(self._task, completed=epoch, status=status)


def plot_learning_curve(records: list[dict], path: str | Path, title: str, x_key: str = "updates",
                        x_label: str = "gradient updates") -> Path | None:
    """Normalized score (or return) vs updates (or `x_key`), mean ± stderr over seeds, written atomically as PNG."""
    matplotlib.use("Agg")

    points = [r for r in records if r.get("eval")]
    if not points:
        return None
    key = score_key(*(r["eval"] for r in points))
    x = np.array([r[x_key] for r in points], np.float64)
    stats = np.array([mean_stderr(r["eval"][key]) for r in points])
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(x, stats[:, 0], marker="o", lw=1.5)
    ax.fill_between(x, stats[:, 0] - stats[:, 1], stats[:, 0] + stats[:, 1], alpha=0.25)
    seeds = len(points[-1]["eval"][key])
    ax.set_xlabel(x_label)
    estimated = any(r["eval"].get("estimate") for r in points)
    ax.set_ylabel(f"{score_label(key)}, estimated in the world model" if estimated else score_label(key))
    ax.set_title(f"{title}\n{seeds} seed{'s' if seeds > 1 else ''}, mean ± stderr", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path
