"""How long can a fixed policy last in a world model, against the real env, from NEUBAY's start states?

    python scripts/experiments/imagined_horizon.py --dataset hopper-medium --world-model wm --policy expert > horizon.jsonl

NEUBAY's imagined length is bounded by three things: the episode's remaining horizon (a trajectory starts
at a uniform step of a real episode), the policy (does it keep the robot up?), and the model (does it
foresee that the robot stays up, within the uncertainty threshold?). This script separates them for a
shipped behaviour policy (`envs/behaviour`), from the same start states as NEUBAY's collects:
- `real`: the policy in the real MuJoCo env, set to each start state (hopper and walker2d observations
  hold the whole state but the x position), run until it falls or the remaining horizon runs out:
  the most a perfect model could give this policy;
- `model`: the same starts imagined in the model, one posterior member per trajectory (as NEUBAY),
  cut where epistemic_std exceeds its `--quantile` over the data, with and without that cut, and with
  the members' sampled or mean steps.
One JSON line per case: mean, median and max length, the fraction that fell (terminated), the fraction cut
by uncertainty, and the mean remaining horizon for scale. Diagnostics only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gymnasium  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from mbrl.core.tanh_gaussian import sample_tanh_gaussian  # noqa: E402
from mbrl.envs import behaviour, collect, lockstep  # noqa: E402
from mbrl.envs.tasks import get_task  # noqa: E402
from mbrl import datasets  # noqa: E402
from mbrl.core import sequence_replay  # noqa: E402
from mbrl.imagination import posterior_members, start_steps  # noqa: E402
from mbrl.world_models.model import load as load_model  # noqa: E402
from mbrl.world_models.rollout import MarkovPolicy, RolloutConfig, rollout, uncertainty_threshold  # noqa: E402


def summary(name: str, lengths, terminated, cut, remaining) -> dict:
    lengths = np.asarray(lengths, float)
    return {
        "case": name,
        "mean_length": round(float(lengths.mean()), 1),
        "median_length": float(np.median(lengths)),
        "max_length": int(lengths.max()),
        "terminated": round(float(np.mean(terminated)), 3),
        "cut_by_uncertainty": round(float(np.mean(cut)), 3),
        "full_horizon": round(float(np.mean(lengths >= remaining)), 3),
        "mean_remaining_horizon": round(float(np.mean(remaining)), 1),
    }


class StartAt(gymnasium.Wrapper):
    """An env whose resets set it to `start_obs` (hopper and walker2d observations hold the whole state but
    the x position, which is set to 0)."""

    def __init__(self, env, start_obs: np.ndarray):
        super().__init__(env)
        self.start_obs = start_obs

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        base = self.env.unwrapped
        nq = base.model.nq
        qpos = np.concatenate([[0.0], self.start_obs[: nq - 1]])
        qvel = self.start_obs[nq - 1 : nq - 1 + base.model.nv]
        base.set_state(qpos, qvel)
        return base._get_obs(), {}


def real_lengths(task: str, policy, start_obs: np.ndarray, remaining: np.ndarray, seed: int):
    """Run the lockstep `policy` in real envs, each set to its start observation, for one episode of at most
    its remaining horizon: the length of each and whether it fell (terminated)."""
    envs = [StartAt(collect.make_env(task), obs) for obs in start_obs]
    try:
        slots = lockstep.run(envs, policy, lambda slot, episode: seed + slot, episodes=1, steps=remaining.tolist())
    finally:
        for env in envs:
            env.close()
    lengths = np.array([len(slot[0]) if slot else 0 for slot in slots], int)
    fell = np.array([bool(slot[0].terminations[-1]) if slot else False for slot in slots])
    return lengths, fell


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--world-model", required=True)
    parser.add_argument("--policy", default="expert", help="a shipped behaviour policy: medium, expert, ...")
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument("--quantile", type=float, default=1.0)
    parser.add_argument("--threshold-rows", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--horizon", type=int, default=1000, help="the task's episode limit")
    parser.add_argument("--skip-real", action="store_true")
    args = parser.parse_args(argv)

    data = datasets.load(args.dataset)
    task_name = data.info.task
    task = get_task(task_name)
    obs_all, act_all = np.asarray(data.transitions.obs), np.asarray(data.transitions.action)
    rng = np.random.default_rng(args.seed)
    # The collects' own starts on the dataset's tape, whose row `length` of an episode is its last next_obs.
    real = sequence_replay.from_episodes(data.transitions, data.episode_starts, args.horizon)
    episode, step = jax.device_get(start_steps(real, jax.random.PRNGKey(args.seed), args.trajectories))
    start_obs = np.asarray(real.obs)[episode, step]
    remaining = np.where(step < np.asarray(real.length)[episode], args.horizon - step, 0)

    actor, params = behaviour.load_actor(task_name, args.policy)

    def act_mean(p, o, key):
        del key
        return jnp.tanh(actor.apply(p, o)[0])

    def act_sample(p, o, key):
        mean, log_std = actor.apply(p, o)
        return sample_tanh_gaussian(mean, log_std, key)[0]

    header = {"dataset": args.dataset, "world_model": args.world_model, "policy": args.policy,
              "trajectories": args.trajectories, "quantile": args.quantile}
    print(json.dumps({"probe": "setup", **header}), flush=True)

    if not args.skip_real:
        for name, fn in (("real_mean_action", act_mean), ("real_sampled_action", act_sample)):
            key = jax.random.PRNGKey(args.seed)
            jitted = jax.jit(fn)
            act = behaviour.stepped(lambda o, t: np.asarray(jitted(params, jnp.asarray(o), jax.random.fold_in(key, t))))
            lengths, fell = real_lengths(task_name, act, start_obs, remaining, args.seed)
            print(json.dumps(summary(name, lengths, fell, np.zeros_like(fell), remaining)), flush=True)

    model = posterior_members(load_model(args.world_model, termination_fn=task.termination_fn))
    pick = rng.choice(len(obs_all), min(args.threshold_rows, len(obs_all)), replace=False)
    threshold = uncertainty_threshold(model, jnp.asarray(obs_all[pick]), jnp.asarray(act_all[pick]), args.quantile,
                                      uncertainty="epistemic_std")
    print(json.dumps({"probe": "threshold", "epistemic_std": float(threshold),
                      "members": int(model.elites.shape[0])}), flush=True)
    members = jnp.asarray(rng.choice(np.asarray(model.elites), args.trajectories))
    key = jax.random.PRNGKey(args.seed + 1)
    for policy_name, fn in (("mean_action", act_mean), ("sampled_action", act_sample)):
        for deterministic in (False, True):
            for cut in (True, False):
                cfg = RolloutConfig(member_mode="per_trajectory", uncertainty="epistemic_std",
                                    deterministic=deterministic, outputs="stats")
                out = rollout(key, model, MarkovPolicy(fn), params, jnp.asarray(start_obs), args.horizon, cfg,
                              members=members, max_length=jnp.asarray(remaining, jnp.int32),
                              threshold=threshold if cut else jnp.float32(jnp.inf))
                stats = jax.device_get(out.stats)
                name = f"model_{policy_name}_{'mean_step' if deterministic else 'sampled_step'}_{'cut' if cut else 'no_cut'}"
                print(json.dumps(summary(name, stats.lengths, stats.terminated, stats.cut_by_uncertainty, remaining)),
                      flush=True)


if __name__ == "__main__":
    main()
