"""Why does a model-based agent score what it scores? Train it, and probe the world model along the policy's
own real episodes.

    python scripts/experiments/diagnose_agent.py --algo mopo --dataset hopper-medium --world-model wm --epochs 40 \
        --set imagination.horizon=20 --probe-every 4 > diag.jsonl

Every `--probe-every` epochs it prints one JSON line with:
- `real`: the deterministic policy's return, normalized score and length in the real MuJoCo env;
- `model_on_policy`: along those real episodes, the model's one-step error relative to the real state change
  (median and over the last 10 steps), its uncertainty (the agent's measure) and the largest |z-score| of
  the visited states against the data: how far the policy walks out of the data's support;
- `q_mean` against `discounted_return_to_go_mean` on those episodes: the critic's min-Q of the policy's own
  real steps against their actual discounted return (overestimation where the critic never trained);
- `model_from_reset`: the same policy rolled in the model from reset states of the real env for up to
  `--model-horizon` steps: its length, return and terminated fraction. If this matches `real`, the model
  foresees what happens and any gap is on the agent's side (its critic never trained on those states).
The first line (`"probe": "data"`) gives the uncertainty on the data for scale. Diagnostics only: the run
is not checkpointed.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from mbrl.envs import collect, lockstep  # noqa: E402
from mbrl.envs.tasks import find_task  # noqa: E402
from mbrl import config as config_io  # noqa: E402
from mbrl import datasets  # noqa: E402
from mbrl.core.errors import ConfigError  # noqa: E402
from mbrl.evaluate import normalized_score  # noqa: E402
from mbrl.train import world_models_for  # noqa: E402
from mbrl.trainer import hypers_of, trainer_for  # noqa: E402
from mbrl.world_models.rollout import MarkovPolicy, RolloutConfig, rollout  # noqa: E402


def parse_overrides(items: list[str]) -> dict:
    """`section.field=JSON` pairs -> nested overrides (`imagination.horizon=20`)."""
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, field = key.partition(".")
        if not sep or not dot:
            raise ConfigError(f"--set {item!r}: expected SECTION.FIELD=VALUE, e.g. imagination.horizon=20")
        try:
            out.setdefault(section, {})[field] = json.loads(value)
        except json.JSONDecodeError:
            out.setdefault(section, {})[field] = value
    return out


def real_episodes(task: str, act, episodes: int, seed: int) -> list[dict]:
    """Deterministic episodes in the real env, stepped together: observations, actions, rewards, next
    observations and return of each."""
    envs = [collect.make_env(task) for _ in range(episodes)]
    try:
        slots = lockstep.run(envs, lockstep.markov(act), functools.partial(collect.episode_seed, seed), episodes=1,
                             record=True)
    finally:
        for env in envs:
            env.close()
    return [{"obs": ep.observations[:-1], "action": ep.actions, "next_obs": ep.observations[1:], "reward": ep.rewards,
             "return": ep.episode_return} for (ep,) in slots]


def discounted_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """sum_k gamma^k r_{t+k} to the episode's end, for every t."""
    out = np.zeros(len(rewards), np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="mopo", choices=["mopo", "ravl"])
    parser.add_argument("--dataset", default="hopper-medium")
    parser.add_argument("--preset", default="quick", choices=["quick", "paper"])
    parser.add_argument("--world-model", type=Path, required=True, help="a fitted model (mbrl model fit --out DIR)")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probe-every", type=int, default=4)
    parser.add_argument("--probe-episodes", type=int, default=3)
    parser.add_argument("--model-starts", type=int, default=200)
    parser.add_argument("--model-horizon", type=int, default=300)
    parser.add_argument("--set", nargs="*", default=[], help="overrides SECTION.FIELD=VALUE")
    args = parser.parse_args(argv)

    overrides = parse_overrides(args.set)
    overrides.setdefault("schedule", {})["epochs"] = args.epochs
    overrides["seed"] = args.seed
    config = config_io.build(args.algo, args.dataset, args.preset, overrides)
    dataset = datasets.load(config.dataset)
    task = find_task(dataset.info.task)
    if task is None:
        raise ConfigError(f"{args.dataset}: the diagnosis needs a known task (its env and termination function)")
    trainer = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim)
    real = trainer.real_data(dataset)
    if not (args.world_model / "model.json").is_file():
        raise ConfigError(f"{args.world_model}: no fitted model there (mbrl model fit --out {args.world_model})")
    world_model = world_models_for(config, dataset, task, [args.world_model.absolute()], progress=False)
    uncertainty = trainer.part.rollout_config.uncertainty
    ref_min, ref_max = dataset.info.ref_min_score, dataset.info.ref_max_score

    obs = np.asarray(dataset.transitions.obs)
    mean, std = obs.mean(0), obs.std(0) + 1e-6
    step = jax.jit(lambda o, a: world_model.step(jax.random.PRNGKey(0), o, a, deterministic=True, uncertainty=uncertainty))
    rows = np.random.default_rng(0).choice(len(obs), min(5000, len(obs)), replace=False)
    u_data = np.asarray(step(jnp.asarray(obs[rows]), jnp.asarray(dataset.transitions.action[rows])).uncertainty)
    print(json.dumps({"probe": "data", "uncertainty": uncertainty, "mean": float(u_data.mean()),
                      "p99": float(np.quantile(u_data, 0.99)), "max": float(u_data.max())}), flush=True)

    state = trainer.initial_state([args.seed], [hypers_of(config)])
    single = lambda s: jax.tree.map(lambda x: x[0], trainer.agent.actor_params(s.agent))  # noqa: E731
    act = jax.jit(lambda p, o: trainer.agent.core.act(p, o, jax.random.PRNGKey(0), True))
    policy = MarkovPolicy(lambda p, o, k: trainer.agent.core.act(p, o, k, True))
    reset_env = collect.make_env(task.name)
    resets = np.stack([reset_env.reset(seed=20_000 + i)[0] for i in range(args.model_starts)])
    reset_env.close()
    critic = jax.jit(lambda p, o, a: jnp.min(trainer.agent.core.critic.apply(p, o, a), axis=0))
    gamma = config.sac.gamma
    start = time.perf_counter()
    for epoch in range(1, config.schedule.epochs + 1):
        state, metrics = trainer.run_epoch(state, real, world_model)
        if epoch % args.probe_every and epoch != config.schedule.epochs:
            continue
        params = single(state)
        critic_params = jax.tree.map(lambda x: x[0], state.agent.critic_params)
        episodes = real_episodes(task.name, lambda o: np.asarray(act(params, jnp.asarray(o))), args.probe_episodes, 10_000)
        probes = []
        for ep in episodes:
            out = step(jnp.asarray(ep["obs"]), jnp.asarray(ep["action"]))
            change = np.linalg.norm(ep["next_obs"] - ep["obs"], axis=1) + 1e-6
            error = np.linalg.norm(np.asarray(out.next_obs) - ep["next_obs"], axis=1) / change
            u = np.asarray(out.uncertainty)
            z = np.abs((ep["obs"] - mean) / std).max(axis=1)
            # The critic's value of the policy's own real steps against what they actually returned: the
            # real episode ends where the hopper falls, so a critic that never saw those states overestimates.
            q = np.asarray(critic(critic_params, jnp.asarray(ep["obs"]), jnp.asarray(ep["action"])))
            to_go = discounted_to_go(ep["reward"], gamma)
            probes.append({"length": len(u), "error_median": float(np.median(error)), "error_last10": float(error[-10:].mean()),
                           "uncertainty_mean": float(u.mean()), "uncertainty_last10": float(u[-10:].mean()),
                           "max_abs_z_mean": float(z.mean()), "q_mean": float(q.mean()),
                           "discounted_return_to_go_mean": float(to_go.mean())})
        imagined = rollout(jax.random.PRNGKey(epoch), world_model, policy, params, jnp.asarray(resets, jnp.float32),
                           args.model_horizon, RolloutConfig(uncertainty=uncertainty))
        returns = np.array([ep["return"] for ep in episodes])
        score = None if ref_min is None or ref_max is None else float(normalized_score(returns.mean(), ref_min, ref_max))
        train = {k: float(np.mean(v)) for k, v in jax.device_get(metrics).items()}
        print(json.dumps({
            "epoch": epoch, "updates": epoch * config.schedule.updates_per_epoch, "seconds": round(time.perf_counter() - start, 1),
            "real": {"return": float(returns.mean()), "score": score, "length": float(np.mean([p["length"] for p in probes]))},
            "model_on_policy": probes,
            "model_from_reset": {"length": float(imagined.stats.mean_length), "return": float(jnp.mean(imagined.stats.returns)),
                                 "terminated": float(jnp.mean(imagined.stats.terminated))},
            "train": {k: train[k] for k in ("q_mean", "alpha", "entropy", "model_reward", "model_uncertainty",
                                            "rollout_terminated") if k in train},
        }), flush=True)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
