"""What a trained run's policies do in their task's simulator: each seed's deterministic actions, per action dimension
(mean and median over the steps its episodes ran), and its episodes' lengths and returns.

    python scripts/experiments/policy_actions.py RUN_DIR --episodes 10

Used for Simglucose, whose data doses insulin at -0.9915 on [-1, 1] (docs/neorl2.md, "RAVL and NEUBAY on
Simglucose"): a policy dosing more sends the simulated patients' glucose out of range and ends their episodes early.
Episode i of seed s resets with `--eval-seed` + s * episodes + i, as `mbrl eval` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from mbrl.envs.tasks import get_task  # noqa: E402
from mbrl.evaluate import evaluate, member_reset_seeds  # noqa: E402
from mbrl.train import load_run  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory written by `mbrl train`")
    parser.add_argument("--episodes", type=int, default=10, help="episodes per seed")
    parser.add_argument("--eval-seed", type=int, default=0)
    a = parser.parse_args(argv)
    if a.episodes < 1:
        parser.error(f"--episodes: expected a positive int, found {a.episodes}")
    loaded = load_run(a.run)
    if loaded.facts.get("task") is None:
        parser.error(f"{a.run}: run.json names no simulator task; this run's dataset has none to act in")
    seeds, members = list(loaded.seeds), len(loaded.seeds)
    policy = loaded.trainer.lockstep_policy(loaded.state, members, a.episodes)
    taken = []

    def recording(inputs):
        actions = policy(inputs)
        taken.append(actions)
        return actions

    result = evaluate(recording, get_task(loaded.facts["task"]), episodes=members * a.episodes,
                      seed=member_reset_seeds(seeds, a.episodes, a.eval_seed))
    actions = np.stack(taken, axis=1)  # (slots, steps, act_dim); a slot's steps after its episode's end are not its own
    for m, seed in enumerate(seeds):
        slots = range(m * a.episodes, (m + 1) * a.episodes)
        own = np.concatenate([actions[slot, : result.lengths[slot]] for slot in slots])
        lengths, returns = result.lengths[list(slots)], result.returns[list(slots)]
        mean = ", ".join(f"{v:.4f}" for v in own.mean(axis=0))
        median = ", ".join(f"{v:.4f}" for v in np.median(own, axis=0))
        print(f"seed {seed}: action mean [{mean}], median [{median}]; episode length mean {lengths.mean():.0f} (min "
              f"{lengths.min()}, max {lengths.max()}); return mean {returns.mean():.1f}")


if __name__ == "__main__":
    main()
