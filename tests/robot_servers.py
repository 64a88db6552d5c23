"""The robot side in another process, for the deploy tests (test_deploy, test_ros2_dds, test_robot_chain): start a
server program and wait for its ready line, stop it, read the control loop's JSON-lines log, and check a deploy
against the in-process evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from mbrl.cli import main
from mbrl.evaluate import evaluate
from mbrl.export import policy_function

REPO = Path(__file__).resolve().parents[1]


def start(module: str, *args: str, ready: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`python -m MODULE ARGS` in its own process; (process, its first line) once that line starts with `ready`."""
    process = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=REPO, env=env)
    line = process.stdout.readline()
    assert line.startswith(ready), process.stderr.read()
    return process, line.strip()


def stop(process: subprocess.Popen) -> None:
    """SIGTERM: a server exits 0."""
    process.terminate()
    assert process.wait(timeout=10) == 0


def read_log(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def ticks(records: list[dict]) -> list[dict]:
    return [r for r in records if r["type"] == "tick"]


def serve_cart(declaration, robot: str) -> tuple[subprocess.Popen, str]:
    """`python -m mbrl.envs.robots.serve --step cart_robot:Cart --task DECLARATION --robot ROBOT` (tests/cart_robot.py,
    with tests/ on PYTHONPATH); (process, its ready line)."""
    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    ready = "ready on ros2:" if robot.startswith("ros2:") else "listening on "
    return start("mbrl.envs.robots.serve", "--step", "cart_robot:Cart", "--task", str(declaration), "--robot", robot,
                 ready=ready, env=env)


def deploy_reproduces_evaluation(export_dir, robot: str, log: Path, episode_steps: int, capsys) -> list[dict]:
    """`mbrl deploy` of conftest's `export_dir` on `robot` (a Hopper-v5 server with episodes of `episode_steps`): two
    episodes from seed 7, unpaced, no rate limit, with the lengths and returns of the JAX policy evaluated in this
    process with the same seeds and time limit; the deploy log's records."""
    path, spec = export_dir
    code = main(["deploy", str(path), "--robot", robot, "--episodes", "2", "--seed", "7", "--rate", "0",
                 "--max-delta", "None", "--log", str(log)])
    assert code == 0, capsys.readouterr().err
    records = read_log(log)
    summary = records[-1]
    assert summary["type"] == "summary" and summary["stop_reason"] == "done"
    policy = jax.jit(jax.vmap(policy_function(spec)))
    reference = evaluate(lambda inputs: np.asarray(policy(inputs.obs)), "Hopper-v5", episodes=2, seed=7,
                         env_kwargs={"max_episode_steps": episode_steps})
    assert [e["length"] for e in summary["episodes"]] == reference.lengths.tolist()
    np.testing.assert_allclose([e["return"] for e in summary["episodes"]], reference.returns, rtol=0.01)
    assert f"deploy on {robot}" in capsys.readouterr().out
    return records
