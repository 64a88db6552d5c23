"""Which checkpoint of a run `mbrl export` takes: the last one, or, with `--select.by fqe`, per training seed the
one whose FQE estimate is best, judged from the data alone after training (`mbrl.ope.fqe`).

The choice is `selected.json` in the run directory:

    {"by": "fqe", "epochs": [E0, E1, ...],           # per training seed, the chosen checkpoint's epoch
     "candidates": [{"epoch": E, "fqe": [V0, ...], "fqe_low": [L0, ...]}, ...]}

A checkpoint is judged by the low end of FQE's interval (the heads' mean less one standard deviation), as the
sweep's FQE objective is: a policy is chosen for a value FQE is sure of.
"""

from __future__ import annotations

import json
from pathlib import Path

from mbrl.core.errors import ConfigError
from mbrl.core.files import write_text_atomic

SELECTED_FILE = "selected.json"
METHODS = ("last", "fqe")


def select_by_fqe(trainer, checkpointer, like, dataset, config, progress: bool = False) -> dict:
    """Judge every checkpoint in `checkpointer` (states shaped like `like`) by FQE on `dataset`; the selection."""
    from mbrl.ope.fqe import FQEConfig
    from mbrl.sweep.objective import fqe_values, split_holdout

    select = config.select
    train, heldout = split_holdout(dataset, select.holdout, seed=config.seed)
    if heldout is None or len(heldout) == 0:
        raise ConfigError(f"select.holdout {select.holdout}: holds out no episode of {dataset.num_episodes}; FQE checks "
                          "its fit on held-out episodes (a larger fraction, or a dataset with a -val file)")
    fqe = FQEConfig(steps=select.fqe_steps, min_steps=min(FQEConfig.min_steps, select.fqe_steps // 2), seed=config.seed)
    candidates = []
    for epoch in checkpointer.all_epochs():
        state, _ = checkpointer.restore(like, epoch)
        values = fqe_values(trainer, state, train, heldout, fqe)
        candidates.append({"epoch": int(epoch), "fqe": [v for v, _ in values], "fqe_low": [low for _, low in values]})
        if progress:
            print(f"select: epoch {epoch}: FQE low end {', '.join(f'{low:.3g}' for _, low in values)}", flush=True)
    members = len(candidates[0]["fqe_low"])
    epochs = [max(candidates, key=lambda c: c["fqe_low"][m])["epoch"] for m in range(members)]
    return {"by": "fqe", "epochs": epochs, "candidates": candidates,
            "fqe": {"steps": select.fqe_steps, "gamma": fqe.gamma, "heads": fqe.heads}}


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
