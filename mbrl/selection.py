"""Which checkpoint of a run `mbrl export` takes: the last one, or, with `--select.by fqe|model`, per training seed
the one whose estimate from the data alone is best, judged after training (`mbrl.ope`).

The choice is `selected.json` in the run directory:

    {"by": "fqe", "epochs": [E0, E1, ...],           # per training seed, the chosen checkpoint's epoch
     "candidates": [{"epoch": E, "fqe": [V0, ...], "fqe_low": [L0, ...]}, ...]}

A checkpoint is judged by its estimate's pessimistic end, as the sweep's objectives are: for FQE the low end of its
interval (the heads' mean less one standard deviation), for the model the elites' mean return less their spread. A
policy is chosen for a value the estimator is sure of.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mbrl import config as config_io
from mbrl.core.errors import ConfigError
from mbrl.core.files import write_text_atomic
from mbrl.ope.fqe import FQEConfig
from mbrl.ope.holdout import fqe_values, split_holdout
from mbrl.ope.model_return import model_returns

SELECTED_FILE = "selected.json"
METHODS = ("last", "fqe", "model")


def check_selection(config) -> None:
    """Refuse, before anything is written, a choice the run cannot make: `model` needs a Markov world model (of the
    algorithm's kind: it imagines from single states) shared by the members."""
    kind = config_io.model_kind(config.algo)
    if config.select.by == "model" and (kind is None or kind.is_recurrent or config.imagination.per_seed_model):
        raise ConfigError(f"select.by model: a {config.algo} run here has no MLP world model shared by its seeds to "
                          "judge its checkpoints in; choose --select.by fqe or last")


def select_checkpoint(trainer, checkpointer, like, dataset, world_model, config, progress: bool = False) -> dict:
    """Judge every checkpoint in `checkpointer` (states shaped like `like`) by `config.select.by` on `dataset` (in
    `world_model` for `model`); the selection."""
    by = config.select.by
    judge, settings = (_fqe_judge(trainer, dataset, config) if by == "fqe" else
                       _model_judge(trainer, dataset, world_model, config))
    candidates = []
    for epoch in checkpointer.all_epochs():
        state, _ = checkpointer.restore(like, epoch)
        values = judge(state)
        candidates.append({"epoch": int(epoch), by: [v for v, _ in values], f"{by}_low": [low for _, low in values]})
        if progress:
            print(f"select: epoch {epoch}: {by} low end {', '.join(f'{low:.3g}' for _, low in values)}", flush=True)
    members = len(candidates[0][f"{by}_low"])
    epochs = [max(candidates, key=lambda c: c[f"{by}_low"][m])["epoch"] for m in range(members)]
    return {"by": by, "epochs": epochs, "candidates": candidates, by: settings}


def _fqe_judge(trainer, dataset, config):
    select = config.select
    train, heldout = split_holdout(dataset, select.holdout, seed=config.seed)
    if heldout is None or len(heldout) == 0:
        raise ConfigError(f"select.holdout {select.holdout}: holds out no episode of {dataset.num_episodes}; FQE checks "
                          "its fit on held-out episodes (a larger fraction, or a dataset with a -val file)")
    fqe = FQEConfig(steps=select.fqe_steps, min_steps=min(FQEConfig.min_steps, select.fqe_steps // 2), seed=config.seed)
    return (lambda state: fqe_values(trainer, state, train, heldout, fqe),
            {"steps": select.fqe_steps, "gamma": fqe.gamma, "heads": fqe.heads})


def _model_judge(trainer, dataset, world_model, config):
    horizon = int(dataset.episode_lengths().max())

    def judge(state):
        returns = model_returns(trainer, state, world_model, dataset, starts=config.select.starts, horizon=horizon,
                                seed=config.seed)  # (members, elites)
        return [(float(np.mean(r)), float(np.mean(r) - np.std(r))) for r in returns]

    return judge, {"starts": config.select.starts, "horizon": horizon, "elites": len(world_model.elites)}


def write_selection(run_dir: Path, selection: dict) -> None:
    write_text_atomic(Path(run_dir) / SELECTED_FILE, json.dumps(selection, indent=1) + "\n")


def selected_epoch(run_dir: str | Path, member: int) -> int | None:
    """The epoch chosen for training seed `member`, or None (no selection: the latest checkpoint)."""
    path = Path(run_dir) / SELECTED_FILE
    if not path.is_file():
        return None
    try:
        return int(json.loads(path.read_text())["epochs"][member])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ConfigError(f"{path}: expected a list 'epochs' with one epoch per training seed ({exc})") from None
