"""Replay the PPO iteration where a MOPO-PPO run's KL jumps, one minibatch at a time.

    python scripts/experiments/ppo_replay.py --config RUN/config.json --world-model RUN/world_model \
        --out replay-dir --kl-above 1.0 --after 150 > replay.jsonl

Trains the run's config from scratch (the training program is deterministic for a seed, so the same iteration comes
back), keeps host copies of the states before each of the last iterations, stops at the first iteration past `--after`
whose mean KL exceeds `--kl-above`, and replays that iteration: the collect, then each of its minibatch steps with the
gradient norms, the learning rate, the batch's largest |log-ratio| and mean move of the Gaussian mean (in standard
deviations), and the stored samples, actions, old means and advantages of the rows with the largest log-ratios.
One JSON line per step. Diagnostics only (docs/findings.md, "MOPO-PPO").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from mbrl import config as config_io  # noqa: E402
from mbrl.core.tanh_gaussian import tanh_gaussian_log_prob_of_sample  # noqa: E402
from mbrl.train import prepare_run  # noqa: E402


def _first_member(tree):
    return jax.tree.map(lambda x: jnp.asarray(x[0]), tree)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a MOPO-PPO run's config.json")
    parser.add_argument("--world-model", required=True, help="the run's world model directory")
    parser.add_argument("--out", required=True, help="a new run directory for the rerun")
    parser.add_argument("--kl-above", type=float, default=1.0)
    parser.add_argument("--after", type=int, default=150, help="ignore iterations up to this one (the cloning phase)")
    parser.add_argument("--worst-rows", type=int, default=5)
    args = parser.parse_args(argv)

    config = config_io.load(Path(args.config))
    spec = prepare_run(config, args.out, world_model_dir=args.world_model, progress=False)
    trainer, real, world_model = spec.trainer, spec.real, spec.world_model
    agent, part = trainer.agent, trainer.part
    state, before = spec.state, None
    for iteration in range(1, config.schedule.epochs + 1):
        before = jax.device_get(state)
        state, metrics = trainer.run_epoch(state, real, world_model, spec.layout)
        kl = float(np.asarray(metrics["kl"]).reshape(-1)[0])
        if iteration % 50 == 0:
            print(f"iteration {iteration}: KL {kl:.4g}", file=sys.stderr, flush=True)
        if iteration > args.after and kl > args.kl_above:
            break
    else:
        print(json.dumps({"found": False, "iterations": config.schedule.epochs}))
        return
    print(json.dumps({"found": True, "iteration": iteration, "kl": kl}), flush=True)

    start = _first_member(before)
    hypers = start.hypers
    aux = part.prepare(world_model, real)
    _, collect_key, sample_key, _ = jax.random.split(start.key, 4)
    batch, _, _, _ = jax.jit(part.collect)(start.agent, start.store, start.counters, real, world_model, aux, hypers,
                                           collect_key)
    minibatches = part.sample(real, batch, sample_key, agent.updates_per_iteration)
    rows = minibatches.rows.replace(obs_norm=None)
    valid = rows.weight > 0

    @jax.jit
    def step(agent_state, index):
        chosen = jax.tree.map(lambda x: x[index], rows)
        _, grads, _ = agent.gradients(agent_state, chosen, hypers)
        new, step_metrics = agent.update(agent_state, chosen, hypers)
        mean = agent._mean(agent.actor_params(new), rows.obs)
        log_ratio = tanh_gaussian_log_prob_of_sample(mean, jnp.broadcast_to(new.log_std, mean.shape),
                                                     rows.sample) - rows.old_log_prob
        log_ratio = jnp.where(valid, log_ratio, 0.0)
        moved = jnp.abs(mean - rows.old_mean) * jnp.exp(-rows.old_log_std)
        out = {
            "kl": step_metrics["kl"], "clip_fraction": step_metrics["clip_fraction"],
            "surrogate_loss": step_metrics["surrogate_loss"], "learning_rate": step_metrics["learning_rate"],
            "grad_norm": {name: optax.global_norm(g) for name, g in grads.items()},
            "max_abs_log_ratio": jnp.max(jnp.abs(log_ratio)),
            "mean_move_std": jnp.sum(jnp.where(valid[:, None], moved, 0.0)) / (jnp.sum(valid) * moved.shape[-1]),
        }
        return new, out, log_ratio

    agent_state = start.agent.replace(obs_norm=minibatches.rows.obs_norm)
    host = jax.tree.map(np.asarray, rows)
    for k in range(minibatches.index.shape[0]):
        agent_state, out, log_ratio = step(agent_state, minibatches.index[k])
        record = {"step": k, **jax.tree.map(float, jax.device_get(out))}
        worst = np.argsort(-np.abs(np.asarray(log_ratio)))[: args.worst_rows]
        record["worst_rows"] = [{"log_ratio": float(log_ratio[i]), "sample": host.sample[i].tolist(),
                                 "action": np.tanh(host.sample[i]).tolist(), "old_mean": host.old_mean[i].tolist(),
                                 "advantage": float(host.advantage[i])} for i in worst]
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
