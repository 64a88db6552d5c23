"""Write the tiny sample dataset shipped in the package: mbrl/datasets/samples/hopper-sample.hdf5.

A few hundred real Hopper-v5 transitions from a uniform random policy, in D4RL layout (with
next_observations). It lets a fresh install run `mbrl data info` without making a dataset first.

    python scripts/make_sample.py [--transitions 400] [--seed 0] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "mbrl" / "datasets" / "samples" / "hopper-sample.hdf5"


def collect(transitions: int, seed: int) -> dict[str, np.ndarray]:
    env = gym.make("Hopper-v5")
    env.action_space.seed(seed)
    keys = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
    columns: dict[str, list] = {key: [] for key in keys}
    obs, _ = env.reset(seed=seed)
    for step in range(transitions):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        # Collection stops mid-episode at the end: that last step is cut, as by a time limit.
        truncated = truncated or step == transitions - 1
        for key, value in zip(columns, (obs, action, reward, next_obs, terminated, truncated and not terminated)):
            columns[key].append(value)
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    return {
        "observations": np.asarray(columns["observations"], np.float32),
        "actions": np.asarray(columns["actions"], np.float32),
        "rewards": np.asarray(columns["rewards"], np.float32),
        "next_observations": np.asarray(columns["next_observations"], np.float32),
        "terminals": np.asarray(columns["terminals"], bool),
        "timeouts": np.asarray(columns["timeouts"], bool),
    }


def write(path: Path, arrays: dict[str, np.ndarray], attrs: dict) -> None:
    """`arrays` as a D4RL-layout .hdf5 with file attributes `attrs`, written to a temporary file beside `path`, then
    renamed: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".hdf5.tmp", dir=path.parent)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as file:
            for key, array in arrays.items():
                file.create_dataset(key, data=array, compression="gzip", compression_opts=9, shuffle=True)
            file.attrs.update(attrs)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    arrays = collect(args.transitions, args.seed)
    write(args.out, arrays, {"task": "hopper", "env_id": "Hopper-v5", "policy": "uniform random", "seed": args.seed,
                             "made_by": "scripts/make_sample.py"})
    episodes = int(arrays["terminals"].sum() + arrays["timeouts"].sum())
    print(f"wrote {args.out}: {args.transitions} transitions, {episodes} episodes, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
