"""What a controller that knows DMSD's dynamics scores: the scale against which the agents' DMSD scores are read.

    python scripts/experiments/dmsd_ceiling.py [--episodes 100] > ceiling.jsonl

The controller is a two-step deadbeat law on the true Euler step (`mbrl.envs.neorl2.dmsd`): x_{t+1} does not depend on
the force at t, so it picks the force that brings the velocity to gain * (target - x_{t+1}) / dt, clipped to the
action bounds. It sees only the current observation (the targets' later jump is as unforeseen to it as to a
policy). Episodes reset with seeds 0..N-1; one JSON line per gain with the mean normalized score.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mbrl.core.score import normalized_score  # noqa: E402
from mbrl.core.types import find_spec  # noqa: E402
from mbrl.envs.neorl2.dmsd import DT, EPISODE_STEPS, FORCE_MAX, MASS, DMSDEnv, _transition_matrix  # noqa: E402


def deadbeat(obs: np.ndarray, matrix: np.ndarray, mass: float, gain: float) -> np.ndarray:
    state, target = obs[:4].astype(np.float64), obs[4:6].astype(np.float64)
    free = matrix @ state  # the next state without force
    velocity = gain * (target - free[:2]) / DT
    force = (velocity - free[2:]) * mass / DT
    return np.clip(force / FORCE_MAX, -1.0, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--gains", type=float, nargs="+", default=[1.0, 0.7, 0.5, 0.3])
    args = parser.parse_args()
    env, mass, spec = DMSDEnv(), MASS["train"], find_spec("DMSD")
    matrix = _transition_matrix(mass)
    for gain in args.gains:
        returns = []
        for seed in range(args.episodes):
            obs, _ = env.reset(seed=seed)
            total = 0.0
            for _ in range(EPISODE_STEPS):
                obs, reward, *_ = env.step(deadbeat(obs, matrix, mass, gain))
                total += reward
            returns.append(total)
        print(json.dumps({"gain": gain, "episodes": args.episodes, "return": round(float(np.mean(returns)), 1),
                          "normalized_score": round(float(normalized_score(np.mean(returns), spec.ref_min_score, spec.ref_max_score)), 2)}))


if __name__ == "__main__":
    main()
