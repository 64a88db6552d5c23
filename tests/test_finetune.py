"""`mbrl finetune` (WSRL) from a real offline MOPO run: the warm-up makes no update, by default no offline row is
ever sampled, a run killed with SIGKILL resumes with the uninterrupted run's metrics, SIGTERM stops a UDP robot
safely before the checkpoint, and the errors a user can cause."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from mbrl.cli import main
from mbrl.finetune import FinetuneConfig

REPO = Path(__file__).resolve().parents[1]
TINY = {"steps": 200, "warmup": 100, "update_every": 50, "eval_every": 100, "eval_episodes": 2}


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    """A MOPO run (2 critics of 16x16, 20 updates) on the shipped Hopper-v5 sample, with a tiny world model."""
    from mbrl.envs.tasks import TASKS
    from mbrl import config as config_io
    from mbrl import datasets
    from mbrl.datasets import SAMPLE_PATH
    from mbrl.train import run as train
    from mbrl.world_models.ensemble import EnsembleConfig
    from mbrl.world_models.fit import FitConfig, fit_world_model

    root = tmp_path_factory.mktemp("offline")
    model = fit_world_model(datasets.load(SAMPLE_PATH), config=EnsembleConfig(num_members=3, num_elites=2, hidden_dims=(16, 16)),
                            fit_config=FitConfig(max_epochs=2), termination_fn=TASKS["hopper"].termination_fn,
                            progress=False).model
    model.save(root / "wm")
    config = config_io.build("mopo", str(SAMPLE_PATH), "quick", {
        "sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": 16},
        "imagination": {"rollouts_per_epoch": 32, "horizon": 2, "retain_epochs": 2},
        "schedule": {"epochs": 2, "updates_per_epoch": 10, "eval_every": 2, "eval_episodes": 1},
        "logging": {"progress": False}})
    train(config, root / "run", world_model_dir=root / "wm")
    return root / "run"


def _records(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _finetune_argv(run_dir, out, robot="mujoco:Hopper-v5", **options):
    argv = ["finetune", str(run_dir), "--robot", robot, "--run-dir", str(out), "--no-progress"]
    for name, value in {**TINY, **options}.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


@pytest.fixture(scope="module")
def uninterrupted(offline_run, tmp_path_factory):
    """The reference fine-tuning run, in this process: 200 steps, the first 100 the warm-up."""
    out = tmp_path_factory.mktemp("ft") / "full"
    assert main(_finetune_argv(offline_run, out, checkpoint_every=100)) == 0
    return out


def test_the_warm_up_makes_no_update(offline_run, uninterrupted):
    from mbrl.checkpoint import Checkpointer
    from mbrl.finetune import online_learner
    from mbrl.train import load_run

    records = _records(uninterrupted)
    assert [(r["step"], r["phase"], r["updates"]) for r in records] == [(0, "offline", 0), (100, "warmup", 0), (200, "online", 400)]
    assert records[1]["train"] == {} and records[2]["train"]["critic_loss"]
    assert records[0]["eval"]["normalized_score"] == records[1]["eval"]["normalized_score"]  # the same frozen policy

    source = load_run(offline_run)
    config = FinetuneConfig(run=str(offline_run), robot="mujoco:Hopper-v5", **TINY)
    sac = online_learner(config, source)
    checkpoints = Checkpointer(uninterrupted / "checkpoints", max_to_keep=5)
    try:
        at_warmup_end, host = checkpoints.restore(sac.init(jax.random.PRNGKey(0)), 100)
        at_end, _ = checkpoints.restore(sac.init(jax.random.PRNGKey(0)), 200)
    finally:
        checkpoints.close()
    offline = jax.tree.map(lambda x: np.asarray(x[0]), source.state.agent)
    for name in ("actor_params", "critic_params", "target_critic_params", "log_alpha"):
        jax.tree.map(np.testing.assert_array_equal, getattr(at_warmup_end.agent, name), getattr(offline, name))
    assert int(at_warmup_end.buffer.size) == 100 and host["updates"] == 0
    assert int(at_end.buffer.size) == 200 and int(at_end.agent.step) == int(offline.step) + 400
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), at_end.agent.actor_params, offline.actor_params)
    assert any(jax.tree.leaves(changed))


def test_by_default_no_offline_row_is_ever_sampled(offline_run):
    """The batches an update chunk draws: none from the offline data by default, half with a ratio of 0.5."""
    from mbrl import datasets
    from mbrl.core import replay
    from mbrl.core.types import Transitions
    from mbrl.datasets import SAMPLE_PATH
    from mbrl.finetune import online_learner
    from mbrl.train import load_run

    source = load_run(offline_run)
    offline = replay.from_transitions(datasets.load(SAMPLE_PATH).transitions)
    marker = 1e6  # no observation of the data is near it
    rows = 64
    online = replay.insert(replay.empty(rows, 11, 3), Transitions(
        obs=np.full((rows, 11), marker, np.float32), action=np.zeros((rows, 3), np.float32), reward=np.zeros(rows, np.float32),
        next_obs=np.zeros((rows, 11), np.float32), terminal=np.zeros(rows, bool), timeout=np.zeros(rows, bool)), np.ones(rows, bool))
    for ratio, expected in ((0.0, 0), (0.5, 8)):
        config = FinetuneConfig(run=str(offline_run), robot="mujoco:Hopper-v5", retain_offline_ratio=ratio, **TINY)
        sac = online_learner(config, source)  # batch 16
        assert sac.config.offline_rows == expected
        batches = sac.chunk_batches(online, offline, jax.random.PRNGKey(1), 200)
        from_offline = np.asarray(batches.obs[..., 0] != marker)
        assert batches.obs.shape == (200, 16, 11)
        assert from_offline.sum() == 200 * expected
        assert from_offline[:, :expected].all()  # the leading rows of every batch


def _checkpoint_steps(run_dir):
    folder = Path(run_dir) / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def _mbrl(*argv):
    return subprocess.Popen([sys.executable, "-m", "mbrl.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env=os.environ.copy())


def test_kill_9_then_resume_gives_the_uninterrupted_runs_metrics(offline_run, uninterrupted, tmp_path):
    killed = tmp_path / "killed"
    process = _mbrl(*_finetune_argv(offline_run, killed, checkpoint_every=100))
    deadline = time.monotonic() + 300
    while not _checkpoint_steps(killed) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    _, err = process.communicate()
    assert process.returncode == -signal.SIGKILL, err
    assert _checkpoint_steps(killed)[-1] < 200
    # As a run directory of an older version: the safety layer's limits flat in finetune.json.
    saved = json.loads((killed / "finetune.json").read_text())
    (killed / "finetune.json").write_text(json.dumps({**{k: v for k, v in saved.items() if k != "safety"},
                                                      **{k: v for k, v in saved["safety"].items() if k != "safe_action"}}))
    resumed = _mbrl("finetune", "--resume", str(killed), "--no-progress")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert _records(killed) == _records(uninterrupted)
    assert (killed / "export" / "policy.onnx").is_file() and (killed / "learning_curve.png").is_file()


@pytest.fixture(scope="module")
def udp_server(tmp_path_factory):
    events = tmp_path_factory.mktemp("udp") / "events.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "mbrl.envs.robots.sim_server", "--env", "Hopper-v5", "--port", "0",
                                "--log", str(events)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    line = process.stdout.readline()
    assert line.startswith("listening on "), process.stderr.read()
    yield int(line.rsplit(":", 1)[1]), events
    process.terminate()
    assert process.wait(timeout=10) == 0


def test_finetune_over_udp_sigterm_stops_the_robot_then_checkpoints_and_resumes(offline_run, udp_server, tmp_path):
    port, events = udp_server
    out = tmp_path / "udp"
    robot = f"udp://127.0.0.1:{port}"
    process = _mbrl(*_finetune_argv(offline_run, out, robot=robot, steps=400, eval_episodes=0, checkpoint_every=400))
    ticks = out / "ticks.jsonl"
    deadline = time.monotonic() + 300
    while (not ticks.exists() or len(ticks.read_text().splitlines()) < 150) and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    stdout, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in stdout
    log = [json.loads(line) for line in ticks.read_text().splitlines()]
    stop = next(r for r in log if r["type"] == "safe_stop")
    assert stop["reason"] == "SIGTERM" and stop["acknowledged"]
    server_events = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert server_events[-2:] == ["stop", "bye"]  # the robot heard the safe stop before the process ended
    stopped_at = _checkpoint_steps(out)[-1]
    assert 100 < stopped_at < 400  # the signal's own checkpoint

    assert main(["finetune", "--resume", str(out), "--no-progress"]) == 0
    records = _records(out)
    assert [r["step"] for r in records] == [0, 100, 200, 300, 400]
    assert records[-1]["updates"] == 300 * 4 and records[-1]["online"]["episodes"] >= 1
    assert (out / "export" / "policy.json").is_file()


def test_finetune_over_ros2_dds_reproduces_the_in_process_robot(offline_run, uninterrupted, loopback_dds, tmp_path):
    """The same fine-tuning through `python -m mbrl.envs.robots.dds_sim` in another process: the same episodes,
    rows and updates as with the in-process MuJoCo robot, so the same metrics."""
    pytest.importorskip("cyclonedds", reason="cyclonedds is not installed: pip install 'offline-mbrl[ros2]'")
    prefix = f"/mbrl_finetune_{os.getpid()}"
    events = tmp_path / "events.jsonl"
    node = subprocess.Popen([sys.executable, "-m", "mbrl.envs.robots.dds_sim", "--env", "Hopper-v5", "--prefix", prefix,
                             "--log", str(events)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert node.stdout.readline().strip() == f"ready on ros2:{prefix}", node.stderr.read()
        out = tmp_path / "dds"
        assert main(_finetune_argv(offline_run, out, robot=f"ros2:{prefix}", checkpoint_every=100)) == 0
    finally:
        node.terminate()
        node.wait(timeout=10)
    assert _records(out) == _records(uninterrupted)
    log = [json.loads(line) for line in (out / "ticks.jsonl").read_text().splitlines()]
    assert next(r for r in log if r["type"] == "safe_stop")["acknowledged"]


def test_finetune_errors_print_one_line_and_exit_2(offline_run, tmp_path, capsys):
    cases = [
        (["finetune", str(tmp_path / "none"), "--robot", "mujoco:Hopper-v5"], "not a run directory"),
        (["finetune", str(offline_run)], "--robot"),
        (["finetune", str(offline_run), "--robot", "serial:/dev/ttyUSB0"], "unknown robot"),
        (["finetune", str(offline_run), "--robot", "mujoco:HalfCheetah-v5", "--run-dir", str(tmp_path / "hc")],
         "observations of dim 11"),
        (["finetune", str(offline_run), "--robot", "mujoco:Hopper-v5", "--steps", "120"], "multiple of --update-every"),
        (["finetune", str(offline_run), "--robot", "mujoco:Hopper-v5", "--retain-offline-ratio", "1.5"], "[0, 1]"),
        (["finetune", "--resume", str(offline_run), "--utd", "8"], "drop --utd"),
        (["finetune", "--resume", str(offline_run), "--max-delta", "0.1"], "drop --max-delta"),
        (["finetune", "--resume", str(tmp_path)], "not a fine-tuning run"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], (argv, err)
