"""NeoRL-2's released files as they are: every file loads, `-val` files are held-out data, the table's scores."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from mbrl.core.errors import DatasetError
from mbrl.datasets import load
from neorl2_files import neorl2_file

# NeoRL-2's published table (benchmark/tables/normscores.tex), the "data" column, and the rows per file.
DATA_SCORES = {"DMSD": 56.64, "SafetyHalfCheetah": 73.56, "Simglucose": 73.87}
TRAIN_FILES = {"DMSD": "DMSD-high-100000-train.npz", "SafetyHalfCheetah": "SafetyHalfCheetah-high-100000-train.npz",
               "Simglucose": "Simglucose-high-100000-train.npz", "Pipeline": "Pipeline-high-100000-train.npz"}
VAL_FILES = {"DMSD": "DMSD-high-20000-val.npz", "SafetyHalfCheetah": "SafetyHalfCheetah-high-20000-val.npz",
             "Simglucose": "Simglucose-high-20000-val.npz", "Pipeline": "Pipeline-high-20000-val.npz",
             "RandomFrictionHopper": "RandomFrictionHopper-high-20000-val.npz",
             "RocketRecovery": "RocketRecovery-high-20000-val.npz"}


@pytest.mark.parametrize("task,name", [*TRAIN_FILES.items(), *VAL_FILES.items()])
def test_every_released_file_loads_with_its_task_and_episodes(task, name):
    path = neorl2_file(name)
    dataset = load(path)
    assert dataset.info.format == "neorl2-npz" and dataset.info.task == task
    with np.load(path) as raw:
        done, truncated = raw["done"].astype(bool), raw["truncated"].astype(bool)
        np.testing.assert_array_equal(dataset.transitions.reward, raw["reward"])
    # An episode ends exactly where done or truncated is set, and the next row starts the next one.
    ends = np.flatnonzero(done | truncated)
    np.testing.assert_array_equal(dataset.episode_starts[1:], ends[:-1] + 1 if ends[-1] == len(done) - 1 else ends + 1)
    np.testing.assert_array_equal(dataset.transitions.terminal, done)
    assert not np.any(dataset.transitions.terminal & dataset.transitions.timeout)
    assert (dataset.heldout is not None) == (name in TRAIN_FILES.values())


@pytest.mark.parametrize("task", list(DATA_SCORES))
def test_the_train_files_score_the_published_data_column(task):
    dataset = load(neorl2_file(TRAIN_FILES[task]))
    score = dataset.info.normalized_score(dataset.episode_returns().mean())
    assert round(float(score), 2) == DATA_SCORES[task]
    assert dataset.heldout.info.source.endswith(VAL_FILES[task])


def test_data_info_prints_the_score_and_the_held_out_file():
    path = neorl2_file(TRAIN_FILES["DMSD"])
    done = subprocess.run([sys.executable, "-m", "mbrl.cli", "data", "info", str(path)], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "mean 56.64" in done.stdout and "DMSD" in done.stdout
    assert VAL_FILES["DMSD"] in done.stdout


def test_neorl2_names_find_the_files_under_mbrl_data_dir(tmp_path, monkeypatch):
    for name in (TRAIN_FILES["DMSD"], VAL_FILES["DMSD"]):
        source = neorl2_file(name)
        (tmp_path / "neorl2").mkdir(exist_ok=True)
        (tmp_path / "neorl2" / name).symlink_to(source)
    monkeypatch.setenv("MBRL_DATA_DIR", str(tmp_path))
    train, val = load("neorl2:DMSD"), load("neorl2:dmsd-val")
    assert (len(train), len(val), train.info.task, val.info.task) == (100_000, 20_000, "DMSD", "DMSD")
    assert train.info.name == "neorl2:DMSD" and val.heldout is None
    np.testing.assert_array_equal(train.heldout.transitions.obs, val.transitions.obs)
    with pytest.raises(DatasetError, match=r"neorl2:Simglucose: no file Simglucose-train.npz .* download"):
        load("neorl2:Simglucose")
    with pytest.raises(DatasetError, match=r"neorl2:Fusion: unknown NeoRL-2 dataset; expected neorl2:TASK"):
        load("neorl2:Fusion")


def test_a_val_file_of_other_dims_is_refused(tmp_path):
    arrays = {"obs": np.zeros((4, 3), np.float32), "next_obs": np.zeros((4, 3), np.float32),
              "action": np.zeros((4, 1), np.float32), "reward": np.zeros(4, np.float32),
              "done": np.zeros(4, np.float32), "truncated": np.array([0, 1, 0, 1], np.float32)}
    np.savez(tmp_path / "Arm-train.npz", **arrays)
    np.savez(tmp_path / "Arm-val.npz", **{**arrays, "obs": np.zeros((4, 2), np.float32),
                                            "next_obs": np.zeros((4, 2), np.float32)})
    with pytest.raises(DatasetError, match=r"Arm-val.npz: obs/action dims 2/1 differ from those of .*Arm-train.npz"):
        load(tmp_path / "Arm-train.npz")
