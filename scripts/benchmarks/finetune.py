"""Online fine-tuning throughput (`mbrl finetune`, WSRL).

- `finetune_step`: online env steps/s of the whole fine-tuning program on Hopper-v5 through the mujoco adapter,
  the safety layer and the control loop, at UTD 4 with MOPO's SAC (2 critics and an actor of 2x256, batch 256):
  every 50 steps one compiled call inserts them and runs 200 updates. Timed after the first chunk (the compile),
  with no warm-up and no evaluation. Beside it, the same program's two halves alone: the update chunks
  (`updates_per_s`) and the control loop with the update chunks left out (`loop_steps_per_s`), to show which
  bounds it. The offline run it starts from is a 1-update MOPO run on the shipped Hopper sample.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from mbrl import config as config_io, train
from mbrl.datasets import SAMPLE_PATH
from mbrl.finetune import FinetuneConfig, run


def _offline_run(root: Path) -> Path:
    config = config_io.build("mopo", str(SAMPLE_PATH), "quick", {
        "imagination": {"rollouts_per_epoch": 16, "horizon": 1},
        "ensemble": {"num_members": 2, "num_elites": 1, "hidden_dims": [16, 16]},
        "fit": {"max_epochs": 1},
        "schedule": {"epochs": 1, "updates_per_epoch": 1, "eval_every": 1, "eval_episodes": 1},
        "logging": {"progress": False},
    })
    train.run(config, root / "offline")
    return root / "offline"


def _rate(records: list[dict]) -> float:
    """Steps/s between the first and the last record (the compile falls before the first)."""
    first, last = records[1], records[-1]
    return (last["step"] - first["step"]) / (last["seconds"] - first["seconds"])


def finetune_step(quick: bool) -> dict:
    steps, chunk = (1_000, 50) if quick else (4_000, 50)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        offline = _offline_run(root)
        common = dict(run=str(offline), robot="mujoco:Hopper-v5", steps=steps, warmup=0, utd=4, update_every=chunk,
                      eval_every=chunk, eval_episodes=0)
        start = time.perf_counter()
        full = run(FinetuneConfig(**common), root / "full", progress=False).records
        seconds = time.perf_counter() - start
        # The loop alone: everything inside the warm-up, where chunks only insert their rows.
        loop = run(FinetuneConfig(**{**common, "warmup": steps}), root / "loop", progress=False).records
    steps_per_s = _rate(full)
    loop_rate = _rate(loop)
    # Each online step costs one loop step and 4 updates: the updates' own rate follows from the two.
    update_seconds_per_step = 1.0 / steps_per_s - 1.0 / loop_rate
    return {
        "value": round(steps_per_s, 1),
        "unit": "online env steps/s (UTD 4)",
        "updates_per_s": round(4.0 / update_seconds_per_step, 1) if update_seconds_per_step > 0 else None,
        "loop_steps_per_s": round(loop_rate, 1),
        "steps_timed": steps - chunk,
        "utd": 4,
        "update_every": chunk,
        "robot": "mujoco:Hopper-v5",
        "sac": "2 critics, 2x256, batch 256",
        "run_seconds": round(seconds, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


FIGURES = {"finetune_step": finetune_step}
