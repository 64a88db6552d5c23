"""Diagnosis: BC on a NeoRL-2 task with the raw observations (as the training program feeds them) and with the
observations standardised by the dataset's mean and std, everything else equal.

    python scripts/neorl2_obs_scale.py --task Simglucose --updates 20000 --episodes 30 --seeds 3

Simglucose's observation holds the patient's constants, up to about 340 in raw units; docs/neorl2.md reports
what this prints. Prints one JSON line per (scaling, seed) and one per scaling with the mean and stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="Simglucose")
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-seed", type=int, default=10_000)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from agents.bc import BC, BCConfig
    from envs.tasks import get_task
    from mbrl.core.types import Transitions
    from mbrl.datasets import load
    from mbrl.logging import mean_stderr
    from mbrl.core.score import normalized_score

    task = get_task(args.task)
    data = load(f"neorl2:{task.name}").transitions
    obs, action = np.asarray(data.obs), np.asarray(data.action)
    mean, std = obs.mean(axis=0), obs.std(axis=0) + 1e-3
    chunk, batch = 2_000, 256
    for standardised in (False, True):
        inputs = (obs - mean) / std if standardised else obs
        scores = []
        for seed in range(args.seeds):
            rows = np.random.default_rng(seed).integers(0, len(obs), (args.updates, batch))
            agent = BC(BCConfig(), obs.shape[1], action.shape[1])
            state, update = agent.init(jax.random.PRNGKey(seed)), jax.jit(agent.update_many)
            for start in range(0, args.updates, chunk):
                r = rows[start:start + chunk]
                zeros = jnp.zeros(r.shape)
                batches = Transitions(obs=jnp.asarray(inputs[r]), action=jnp.asarray(action[r]), reward=zeros,
                                      next_obs=jnp.asarray(inputs[r]), terminal=zeros.astype(bool), timeout=zeros.astype(bool))
                state, _ = update(state, batches, jax.random.PRNGKey(start))
            policy = jax.jit(lambda o, p=state.actor_params: agent.deterministic_action(p, o))
            env, returns = task.make_env(), []
            for episode in range(args.episodes):
                o, _ = env.reset(seed=args.eval_seed + seed * args.episodes + episode)
                total, done = 0.0, False
                while not done:
                    x = ((o - mean) / std if standardised else o).astype(np.float32)
                    o, r, terminated, truncated, _ = env.step(np.asarray(policy(jnp.asarray(x[None])))[0])
                    total, done = total + r, terminated or truncated
                returns.append(total)
            score = float(normalized_score(float(np.mean(returns)), task.ref_min_score, task.ref_max_score))
            scores.append(score)
            print(json.dumps({"task": task.name, "standardised_obs": standardised, "seed": seed, "score": round(score, 2),
                              "updates": args.updates, "episodes": args.episodes}), flush=True)
        m, se = mean_stderr(scores)
        print(json.dumps({"task": task.name, "standardised_obs": standardised, "score_mean": round(m, 2),
                          "score_stderr": round(se, 2), "seeds": args.seeds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
