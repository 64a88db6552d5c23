"""Where does MOPO-PPO's uncertainty cut fall, against what the model's own autoregression costs?

    python scripts/experiments/onpolicy_cut.py --dataset hopper-medium --world-model rwm-hopper > cut.jsonl

`OnPolicyImagination` cuts an imagined trajectory before a step whose uncertainty u exceeds a quantile of u
measured one step ahead on the dataset's own steps (each after its real history). Imagined steps are
autoregressive, so u may grow past that cut even where the policy does exactly what the data did. This script
separates the two, from the collects' own kind of start (a dataset step with the model's history before it):
- `data_one_step`: the quantiles of the one-step u on the dataset's steps (the cut is one of them);
- `replay`: the dataset's own next actions fed to the model autoregressively for `--horizon` steps from
  starts whose episode lasts that long: any cut here is the model's, not the policy's;
- `initial_policy`: the agent's policy at initialisation (the first iteration's collect);
each with the share of trajectories cut by step k at each quantile's threshold, the median u at step k, and
for `replay` the open-loop error against the real observations. One JSON line per case. Diagnostics only.
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

from mbrl import config as config_io  # noqa: E402
from mbrl import datasets  # noqa: E402
from mbrl.core.errors import ConfigError  # noqa: E402
from mbrl.envs.tasks import find_task  # noqa: E402
from mbrl.imagination import ExploringPolicy  # noqa: E402
from mbrl.train import world_models_for  # noqa: E402
from mbrl.trainer import hypers_of, trainer_for  # noqa: E402
from mbrl.world_models.rollout import initial_model_carry, model_step, rollout  # noqa: E402

QUANTILES = (0.9, 0.99, 0.999, 1.0)
STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500)


def report_steps(horizon: int) -> list[int]:
    return [k for k in STEPS if k <= horizon]


def cut_profile(u: np.ndarray, thresholds: dict, horizon: int) -> dict:
    """u: (H, B) along B trajectories (NaN after a fall). Share cut by step k (running max of u above each
    threshold) and the median u at step k over the trajectories still standing."""
    running = np.fmax.accumulate(u, axis=0)
    steps = report_steps(horizon)
    out = {"median_u": {k: round(float(np.nanmedian(u[k - 1])), 5) for k in steps}}
    for q, value in thresholds.items():
        out[f"cut_by_step_at_q{q}"] = {k: round(float(np.mean(running[k - 1] > value)), 3) for k in steps}
        alive = (~(running > value) & ~np.isnan(u)).sum(axis=0)
        out[f"mean_length_at_q{q}"] = round(float(alive.mean()), 1)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--world-model", type=Path, required=True)
    parser.add_argument("--preset", default="quick", choices=["quick", "paper"])
    parser.add_argument("--starts", type=int, default=512)
    parser.add_argument("--horizon", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    config = config_io.build("mopo-ppo", args.dataset, args.preset,
                             {"seed": args.seed, "imagination": {"horizon": args.horizon}})
    dataset = datasets.load(config.dataset)
    task = find_task(dataset.info.task)
    trainer = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim)
    real = trainer.real_data(dataset)
    if not (args.world_model / "model.json").is_file():
        raise ConfigError(f"{args.world_model}: no fitted model there (mbrl model fit --out DIR)")
    world_model = world_models_for(config, dataset, task, [args.world_model.absolute()], progress=False)
    part = trainer.part
    ends, sorted_u = part.prepare(world_model, real)
    sorted_u = np.asarray(sorted_u)
    thresholds = {q: float(np.quantile(sorted_u, q)) for q in QUANTILES}
    print(json.dumps({"case": "data_one_step", "dataset": args.dataset, "world_model": str(args.world_model),
                      "history": int(world_model.history), "probes": int(len(sorted_u)),
                      "median_u": float(np.median(sorted_u)), "thresholds": thresholds}), flush=True)

    rng = np.random.default_rng(args.seed)
    history = world_model.history
    position = np.asarray(real.position)
    lengths = dataset.episode_lengths()
    episode_length = np.repeat(lengths, lengths)
    ends_np = np.asarray(ends)
    # Replay starts: row s, then rows s+1 .. s+H act in the model from next_obs[s] and stay in s's episode.
    long_enough = ends_np[position[ends_np] + args.horizon < episode_length[ends_np]]
    if not len(long_enough):
        raise ConfigError(f"{args.dataset}: no episode lasts {args.horizon} steps after a start")
    picked = jnp.asarray(rng.choice(long_enough, min(args.starts, len(long_enough)), replace=False), jnp.int32)
    batch = int(picked.shape[0])
    key = jax.random.PRNGKey(args.seed)
    cfg = part.rollout_config
    members = None  # each step's own member, unless the agent fixes one per trajectory
    if cfg.member_mode == "per_trajectory":
        members = jax.random.choice(key, jnp.asarray(world_model.elites, jnp.int32), (batch,))
    carry = part._warm_up(world_model, real, picked, history, last=history)
    if carry is None:  # a Markov model: its own empty carry, as a rollout starts it
        carry = initial_model_carry(world_model, batch)
    actions = real.action[picked[None, :] + 1 + jnp.arange(args.horizon)[:, None]]  # (H, B, A)
    truth = real.next_obs[picked[None, :] + 1 + jnp.arange(args.horizon)[:, None]]  # (H, B, O)

    @jax.jit
    def replay(key, obs, carry):
        def step(state, inputs):
            obs, carry = state
            k, action = inputs
            out = model_step(world_model, k, obs, action, members, carry, cfg)
            return (out.next_obs, out.carry), (out.next_obs, out.uncertainty.astype(jnp.float32))
        keys = jax.random.split(key, args.horizon)
        _, (pred, u) = jax.lax.scan(step, (obs, carry), (keys, actions))
        return pred, u

    pred, u = replay(key, real.next_obs[picked], carry)
    pred, u, truth_np = np.asarray(pred), np.asarray(u), np.asarray(truth)
    scale = np.asarray(dataset.transitions.obs).std(axis=0) + 1e-6
    error = np.sqrt((((pred - truth_np) / scale) ** 2).mean(axis=-1))  # (H, B), in the data's std units
    steps = report_steps(args.horizon)
    print(json.dumps({"case": "replay", "trajectories": batch, **cut_profile(u, thresholds, args.horizon),
                      "median_rms_error_std_units": {k: round(float(np.median(error[k - 1])), 4) for k in steps}}),
          flush=True)

    state = trainer.initial_state([args.seed], [hypers_of(config)])
    actor = jax.tree.map(lambda x: x[0], trainer.agent.actor_params(state.agent))
    for name, deterministic in (("initial_policy_sampled", False), ("initial_policy_mean", True)):
        imagined = rollout(key, world_model, ExploringPolicy(trainer.agent, deterministic), actor, real.next_obs[picked],
                           args.horizon, cfg, model_carry=carry, members=members)
        # Steps after a fall are not imagined: they cannot be cut.
        u_policy = np.where(np.asarray(imagined.valid), np.asarray(imagined.uncertainty), np.nan)
        done = np.asarray(imagined.stats.terminated)
        print(json.dumps({"case": name, "terminated": round(float(done.mean()), 3),
                          **cut_profile(u_policy, thresholds, args.horizon)}), flush=True)


if __name__ == "__main__":
    main()
