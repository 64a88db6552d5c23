"""Every algorithm along the path a user takes: `mbrl train`, `mbrl train --resume` from one of its checkpoints that
gives exactly the uninterrupted run's metrics, then `mbrl eval`, `mbrl export` (checked by onnxruntime against JAX),
and `mbrl deploy --robot mujoco:...`. One algorithm (SIGKILLED) is resumed from a real process SIGKILLed once it has
written a checkpoint; what a kill can break (the checkpoint's atomic write, the run directory read back) is the same
for every algorithm, what each one must save (its own state) is checked for each.

The data is a real Hopper-v5 run of a random policy written in D4RL layout with h5py; one tiny world model
is fitted once and given to every model-based run with `--world-model`. The algorithms without a world model run
in `test_end_to_end_model_free.py`, so that the two halves run side by side. Compiles are shared between the
processes through the on-disk cache that `mbrl train` keeps.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mbrl.agents import registry
from mbrl.world_models import registry as model_registry
from mbrl import config as config_io
from mbrl.cli import main as cli_main

# The sections every algorithm of a kind shares, at tiny sizes; each algorithm's own come from its entry's `smoke`.
SHARED = {
    "rwm": {"num_heads": 3, "gru_layers": 1, "gru_hidden": 16, "head_hidden": [16], "history": 4, "forecast": 3},
    "rwm_fit": {"batch_size": 16, "steps_per_epoch": 5, "max_epochs": 1},
    "imagination": {"rollouts_per_epoch": 32, "horizon": 2, "retain_epochs": 2},
    "schedule": {"epochs": 4, "updates_per_epoch": 10, "eval_every": 2, "eval_episodes": 2, "checkpoint_every": 1},
    "logging": {"progress": False},
}
SIGKILLED = "mopo"


def tiny_config(algo: str, dataset: str):
    entry = registry.entry(algo)
    reads = (*config_io.sections_read(algo), *registry.COMMON_SECTIONS)
    own = {name: dict(values) for name, values in SHARED.items() if name in reads}
    own.update({name: dict(values) for name, values in entry.smoke.items()})
    if "imagination" in own:
        own["imagination"] = {k: v for k, v in own["imagination"].items() if k in entry.imagination_fields}
    return config_io.build(algo, dataset, "quick", own)


@pytest.fixture(scope="module")
def world_model_dir(hopper_tiny_path, tmp_path_factory):
    from mbrl.envs.tasks import TASKS
    from mbrl import datasets
    from mbrl.world_models.ensemble import EnsembleConfig
    from mbrl.world_models.fit import FitConfig, fit_world_model

    result = fit_world_model(datasets.load(hopper_tiny_path), config=EnsembleConfig(num_members=3, num_elites=2,
                             hidden_dims=(16, 16)), fit_config=FitConfig(max_epochs=2),
                             termination_fn=TASKS["hopper"].termination_fn, progress=False)
    return result.model.save(tmp_path_factory.mktemp("model") / "world_model")


def _train_argv(config_path, run_dir, world_model_dir, uses_model):
    argv = ["train", "--config", str(config_path), "--run-dir", str(run_dir)]
    return argv + (["--world-model", str(world_model_dir)] if uses_model else [])


def _mbrl(*argv, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "mbrl.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=os.environ.copy(), **kwargs)


def _records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: r[k] for k in ("epoch", "updates", "train", "eval") if k in r} for r in map(json.loads, lines)]


def _checkpoints(run_dir):
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


@pytest.mark.parametrize("algo", [name for name, entry in registry.ALGORITHMS.items() if entry.uses_model])
def test_train_resume_eval_export_deploy(algo, hopper_tiny_path, world_model_dir, tmp_path, capsys):
    train_resume_eval_export_deploy(algo, hopper_tiny_path, world_model_dir, tmp_path, capsys)


def train_resume_eval_export_deploy(algo, hopper_tiny_path, world_model_dir, tmp_path, capsys):
    """The whole path for one algorithm (`world_model_dir`: the fitted MLP ensemble, None for a model-free one)."""
    config = tiny_config(algo, str(hopper_tiny_path))
    config_path = tmp_path / "config.json"
    config_io.save(config, config_path)
    # The MLP ensemble is fitted once for all; mopo-ppo's first run fits its default RWM-U, which its resumed run
    # then reuses.
    kind = registry.entry(algo).model_kind
    # The shared model is the MLP ensemble (the registry's default kind); an algorithm of another kind fits its own.
    own_kind = kind is not None and kind != model_registry.DEFAULT
    uses_model = kind == model_registry.DEFAULT

    full = tmp_path / "full"
    assert cli_main(_train_argv(config_path, full, world_model_dir, uses_model)) == 0
    expected = _records(full)
    assert [r["epoch"] for r in expected] == [1, 2, 3, 4] and expected[-1]["eval"] is not None
    if own_kind:
        assert json.loads((full / "world_model" / "model.json").read_text())["format"] == model_registry.kind(kind).format
        world_model_dir, uses_model = full / "world_model", True

    if algo == SIGKILLED:
        # The same run in another process, killed without warning once its first checkpoint is on disk.
        resumed = tmp_path / "killed"
        process = _mbrl(*_train_argv(config_path, resumed, world_model_dir, uses_model))
        deadline = time.monotonic() + 600
        while not _checkpoints(resumed) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        _, err = process.communicate()
        assert process.returncode == -signal.SIGKILL, err  # killed mid-run, not finished
        done = _checkpoints(resumed)
        assert done and done[-1] < 4
        process = _mbrl("train", "--resume", str(resumed))
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
    else:
        # The run as it stood after epoch 3: its checkpoint holds everything epoch 4 needs (the resume cuts the
        # metrics back to the checkpoint's epoch).
        resumed = tmp_path / "resumed"
        shutil.copytree(full, resumed)
        shutil.rmtree(resumed / "checkpoints" / "4")
        assert _checkpoints(resumed) == [3]
        assert cli_main(["train", "--resume", str(resumed)]) == 0
    assert _records(resumed) == expected

    capsys.readouterr()
    assert cli_main(["eval", str(full), "--episodes", "2"]) == 0
    score = expected[-1]["eval"]["normalized_score"][0]
    assert f"normalized score {score:.1f}" in capsys.readouterr().out  # the run's own last evaluation, again

    export = tmp_path / "export"
    assert cli_main(["export", str(full), "--out", str(export)]) == 0
    spec = json.loads((export / "policy.json").read_text())
    assert (export / "policy.onnx").is_file()
    assert (spec["state"] is not None) == (algo == "neubay")  # a recurrent export describes its carry
    capsys.readouterr()
    assert cli_main(["deploy", str(export), "--robot", "mujoco:Hopper-v5", "--episodes", "1"]) == 0
    returns = [line for line in capsys.readouterr().out.splitlines() if line.startswith("return ")]
    assert len(returns) == 1 and np.isfinite(float(returns[0].split()[1]))
