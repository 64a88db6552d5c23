"""`mbrl data info` and `mbrl data list`: summaries, and one line on stderr with exit 2 on bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import h5py
import minari
import numpy as np
import pytest
from minari.data_collector import EpisodeBuffer

from mbrl.cli import main
from mbrl.core import dataset_registry as registry
from mbrl.datasets import SAMPLE_PATH

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _mbrl_command() -> list[str]:
    script = Path(sys.executable).parent / "mbrl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mbrl.cli"]


def _run_console_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*_mbrl_command(), *args], capture_output=True, text=True, timeout=120, env=os.environ.copy())


def _write_hopper_hdf5(path: Path, rows: int = 20, **overrides) -> Path:
    """A D4RL-layout file of real Hopper-v5 steps (random actions, seeded)."""
    env = gym.make("Hopper-v5")
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    columns = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}
    for step in range(rows):
        action = rng.uniform(-1, 1, 3).astype(np.float32)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        cut = truncated or step == rows - 1
        for key, value in zip(columns, (obs, action, reward, next_obs, terminated, cut and not terminated)):
            columns[key].append(value)
        obs = env.reset()[0] if terminated or cut else next_obs
    arrays = {key: np.asarray(value) for key, value in columns.items()}
    for key, (row, value) in overrides.items():
        arrays[key] = arrays[key].astype(np.float64)
        arrays[key][row] = value
    with h5py.File(path, "w") as file:
        for key, array in arrays.items():
            file.create_dataset(key, data=array)
    return path


def _one_error_line(err: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mbrl: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_console_script_summarises_the_shipped_sample():
    result = _run_console_script("data", "info", str(SAMPLE_PATH))
    assert result.returncode == 0, result.stderr
    for needle in ("transitions", "episodes", "obs dim", "episode return", "normalized score", "hopper"):
        assert needle in result.stdout, (needle, result.stdout)


def test_console_script_on_a_bad_file_exits_2_with_one_line(tmp_path):
    path = _write_hopper_hdf5(tmp_path / "hopper-nan.hdf5", rewards=(4, np.nan))
    result = _run_console_script("data", "info", str(path))
    assert result.returncode == 2
    _one_error_line(result.stderr, str(path), "'rewards'", "row 4", "nan")
    assert result.stdout == ""


def _write_text(path: Path) -> Path:
    path.write_text("not a dataset\n")
    return path


BAD_SOURCES = {
    "nan observation": (
        lambda d: _write_hopper_hdf5(d / "hopper-a.hdf5", observations=(3, np.nan)),
        ["'observations'", "row 3"],
    ),
    "action out of range": (
        lambda d: _write_hopper_hdf5(d / "hopper-b.hdf5", actions=(6, 2.5)),
        ["'actions'", "row 6", "--clip-actions"],
    ),
    "terminal not boolean": (lambda d: _write_hopper_hdf5(d / "c.hdf5", terminals=(2, 3)), ["'terminals'", "row 2"]),
    "text named .hdf5": (
        lambda d: _write_text(d / "broken.hdf5"),
        ["broken.hdf5", "not a readable HDF5 file"],
    ),
    "npz not a zip": (lambda d: _write_text(d / "data.npz"), ["data.npz", "not a zip archive"]),
    "unknown extension": (lambda d: _write_text(d / "data.txt"), ["data.txt", "unknown file type"]),
    "missing file": (lambda d: d / "nothing-here.hdf5", ["nothing-here.hdf5", "no such file"]),
    "directory": (lambda d: d, ["is a directory"]),
}


@pytest.mark.parametrize("case", list(BAD_SOURCES))
def test_data_info_on_bad_input_exits_2_with_one_line(case, tmp_path, capsys):
    make, needles = BAD_SOURCES[case]
    path = make(tmp_path)
    code = main(["data", "info", str(path)])
    captured = capsys.readouterr()
    assert code == 2
    _one_error_line(captured.err, str(path), *needles)
    assert captured.out == ""


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["data", "info", "hopper-medium"], ["hopper-medium", "mbrl data make hopper-medium"]),
        (["data", "info", "minari:nobody/hopper/none-v0"], ["minari:nobody/hopper/none-v0", "never downloaded"]),
        (["data", "info", str(SAMPLE_PATH), "--task", "humanoid"], ["--task", "humanoid"]),
        (["data", "info", str(SAMPLE_PATH), "--task", "walker2d"], ["hopper-sample.hdf5", "walker2d"]),
    ],
)
def test_data_info_on_unknown_names_exits_2_with_one_line(argv, needles, capsys):
    code = main(argv)
    assert code == 2
    _one_error_line(capsys.readouterr().err, *needles)


def test_data_info_clip_actions_accepts_what_it_clips(tmp_path, capsys):
    path = _write_hopper_hdf5(tmp_path / "hopper-wide.hdf5", actions=(6, 2.5))
    assert main(["data", "info", str(path), "--clip-actions"]) == 0
    fields = _table_fields(capsys.readouterr().out)
    # Every row is kept (the out-of-range action is clipped, not dropped), inside the hopper's bounds.
    assert fields["transitions"] == "20" and fields["episodes"] == "1"
    assert fields["action space"] == "[-1, 1] per dimension"


def _table_fields(out: str) -> dict[str, str]:
    """The `field │ value` rows of a printed rich table."""
    rows = (line.strip().strip("│").split("│") for line in out.splitlines() if line.count("│") == 3)
    return {field.strip(): value.strip() for field, value in rows}


def test_data_info_without_a_known_task_says_so(tmp_path, capsys):
    path = _write_hopper_hdf5(tmp_path / "unnamed.hdf5")
    assert main(["data", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "unknown" in out and "normalized score" in out
    assert main(["data", "info", str(path), "--task", "hopper"]) == 0
    assert "hopper" in capsys.readouterr().out


def _minari_from_hopper_steps(dataset_id: str, root: Path, steps: int = 8) -> None:
    """A small Minari dataset written by Minari's own writer from real Hopper-v5 steps."""
    env = gym.make("Hopper-v5")
    obs, _ = env.reset(seed=1)
    observations, actions, rewards = [obs], [], []
    for _ in range(steps):
        action = np.zeros(3, np.float32)
        obs, reward, *_ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(reward)
    buffer = EpisodeBuffer(
        observations=observations,
        actions=actions,
        rewards=rewards,
        terminations=[False] * steps,
        truncations=[False] * (steps - 1) + [True],
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        minari.create_dataset_from_buffers(dataset_id, [buffer], env="Hopper-v5", algorithm_name="zeros")


def test_data_list_marks_made_datasets_and_other_minari_ones(tmp_path, monkeypatch, capsys):
    made_root, minari_root = tmp_path / "made", tmp_path / "minari"
    monkeypatch.setenv("MBRL_DATA_DIR", str(made_root))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(minari_root))
    _minari_from_hopper_steps(registry.minari_id("hopper", "random"), made_root)
    _minari_from_hopper_steps("someone/hopper/zeros-v0", minari_root)

    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    hopper_row = next(line for line in out.splitlines() if "hopper " in line and "│" in line)
    assert "made (8)" in hopper_row, out
    walker_row = next(line for line in out.splitlines() if "walker2d" in line)
    assert "made" not in walker_row
    for level in registry.LEVELS:
        assert level in out
    assert "minari:someone/hopper/zeros-v0" in out and "Hopper-v5" in out

    # The made dataset loads by name, and `data info` summarises it.
    assert main(["data", "info", "hopper-random"]) == 0
    fields = _table_fields(capsys.readouterr().out)
    assert fields["transitions"] == "8" and fields["format"] == "Minari dataset", fields


def test_data_list_with_nothing_local_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MBRL_DATA_DIR", str(tmp_path / "made"))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "no other local Minari datasets" in out
    assert not (tmp_path / "minari").exists() and not (tmp_path / "made").exists()
