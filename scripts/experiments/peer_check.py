"""Side by side with the reference implementations: RAVL against anyasims/edge-of-reach, MOPO against
OfflineRL-Kit, on the same data, world model, update budget and evaluation.

Usage (run by hand; peers are not dependencies: `pip install torch tqdm` into the venv; CPU is enough):

    python scripts/experiments/peer_check.py ravl --side peer --peer PATH/edge-of-reach --world-model DIR --seed 0
    python scripts/experiments/peer_check.py ravl --side ours --world-model DIR --seed 0 [--set sac.init=flax]
    python scripts/experiments/peer_check.py ravl --side lockstep --peer PATH/edge-of-reach --world-model DIR --updates 100
    python scripts/experiments/peer_check.py mopo --side peer --peer PATH/OfflineRL-Kit --world-model DIR --updates 20000
    python scripts/experiments/peer_check.py mopo --side ours --world-model DIR --updates 20000

Each evaluation prints one JSON line (also appended to `--out`): the normalized score, then diagnostics
computed the same way for both sides on one fixed probe of real transitions (the same rows and the same
Gaussian noise for every run): `entropy` (exact change of variables), `entropy_eps` (the references'
log(1 - tanh² + 1e-6) form), `q_mean` (mean over critics of Q(s, a ~ π)), `min_q_real` (the min over critics,
averaged over the real states), `alpha`, `td_loss` (per critic, on the real rows, target with the exact log-prob)
and `edac_diversity` (RAVL). `train` holds each side's own means over the last epoch of updates.

Our side runs the `paper` preset (for RAVL, edge-of-reach's update order, initialisation and log-probability;
`--set sac.update_order=critic_actor_alpha --set sac.init=flax --set sac.logp_epsilon=0` for the defaults).

What is shared: the dataset (`mbrl.datasets.load`), the world model (`--world-model`, one of ours; the peer's
rollout code gets it through `OurModel*`, adapters that answer its model calls with our model's step, with
the same uncertainty penalty for MOPO), the evaluation (`mbrl.evaluate`, the reset seeds `mbrl train` uses).
What is each side's own: the agent, its updates, its rollout loop and replay buffers.

The peer checkouts are imported unmodified. Their imports of old gym, d4rl, wandb and tensorboard (type hints,
dataset download and logging, none used here) are replaced by empty placeholder modules. The peers' own
training scripts (edge-of-reach train_ravl_agent.py `train`, OfflineRL-Kit run_example/run_mopo.py and
policy_trainer/mb_policy_trainer.py) insist on CUDA, wandb and d4rl, so `peer_ravl` and `peer_mopo` repeat
their loops line for line with the peers' own classes: rollouts every 1,000 updates from 50,000 dataset
states, 5 epochs of model data retained, int(5% x 256) real rows per batch, and for MOPO the actor's cosine
learning-rate schedule over the full run's 3,000 epochs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROBE_ROWS = 2560
PROBE_SEED = 2024
UPDATES_PER_EPOCH = 1000
ROLLOUTS_PER_EPOCH = 50_000
RETAIN_EPOCHS = 5
BATCH = 256
REAL_RATIO = 0.05
GAMMA = 0.99
LOGP_EPS = 1e-6


# --------------------------------------------------------------------------------------------- shared parts

def _placeholder_attribute(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return object  # a base class or type hint (gym.Env, SummaryWriter, ...)


def placeholder_modules():
    """Empty stand-ins for imports the peers make but this harness never exercises."""
    for name in ("gym", "gym.spaces", "gym.envs", "gym.envs.mujoco", "gym.envs.mujoco.mujoco_env", "d4rl", "d4rl.gym_mujoco",
                 "wandb", "pyrallis", "torch.utils.tensorboard"):
        try:
            __import__(name)
        except Exception:
            module = types.ModuleType(name)
            module.__path__ = []  # a package, so that its submodules import
            module.__getattr__ = _placeholder_attribute
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)


class Setting:
    """The dataset, world model, task and probe every side of one comparison shares."""

    def __init__(self, algo: str, dataset: str, world_model: str):
        import jax
        from mbrl.envs.tasks import TASKS
        from mbrl import config as config_io
        from mbrl import datasets
        from mbrl.train import dataset_reference_scores
        from mbrl.world_models.registry import load_model

        self.algo = algo
        self.dataset = datasets.load(dataset)
        self.task = TASKS[self.dataset.info.task]
        self.ref_scores = dataset_reference_scores(self.dataset, self.task)
        self.model = load_model(Path(world_model), self.task.termination_fn)
        self.config = config_io.build(algo, dataset, "paper")
        self.horizon = self.config.imagination.horizon
        self.penalty = self.config.mopo.penalty_coef if algo == "mopo" else 0.0
        t = self.dataset.transitions
        self.arrays = {"observations": np.asarray(t.obs, np.float32), "actions": np.asarray(t.action, np.float32),
                       "next_observations": np.asarray(t.next_obs, np.float32),
                       "rewards": np.asarray(t.reward, np.float32), "terminals": np.asarray(t.terminal, np.float32)}
        rng = np.random.default_rng(PROBE_SEED)
        rows = rng.choice(len(t.obs), PROBE_ROWS, replace=False)
        self.probe = {k: v[rows] for k, v in self.arrays.items()}
        act_dim = self.probe["actions"].shape[1]
        self.noise = rng.standard_normal((PROBE_ROWS, act_dim))
        self.next_noise = rng.standard_normal((PROBE_ROWS, act_dim))
        self._step = jax.jit(lambda key, obs, act: self.model.step(key, obs, act, uncertainty="aleatoric_max"))
        self._key = jax.random.PRNGKey(0)

    def model_step(self, obs: np.ndarray, action: np.ndarray):
        """Our model's step for the peer's rollouts (padded to a fixed batch so it compiles once)."""
        import jax

        count = len(obs)
        pad = ROLLOUTS_PER_EPOCH - count
        if pad > 0:
            obs = np.concatenate([obs, np.zeros((pad, obs.shape[1]), obs.dtype)])
            action = np.concatenate([action, np.zeros((pad, action.shape[1]), action.dtype)])
        self._key, key = jax.random.split(self._key)
        out = self._step(key, obs, action)
        next_obs, reward, terminal, u = (np.asarray(x)[:count] for x in (out.next_obs, out.reward, out.terminal,
                                                                           out.uncertainty))
        from mbrl.agents.mopo import penalized_reward

        return next_obs, np.asarray(penalized_reward(reward, u, self.penalty)), terminal

    def evaluate(self, deterministic_policy, seed: int, episodes: int) -> dict:
        """`mbrl train`'s evaluation: episode i of training seed s resets with s * episodes + i."""
        from mbrl.core.score import normalized_score
        from mbrl.evaluate import evaluate

        result = evaluate(lambda inputs: deterministic_policy(np.asarray(inputs.obs, np.float32)), self.task,
                          episodes=episodes, seed=[seed * episodes + i for i in range(episodes)])
        return {"score": float(normalized_score(result.returns.mean(), *self.ref_scores)),
                "return": float(result.returns.mean()), "length": float(result.lengths.mean())}

    def diagnostics(self, policy_stats, q_values, alpha: float, diversity=None) -> dict:
        """The same measures for every side, from its actor's (mean, log_std), its critics and temperature."""
        p = self.probe
        mean, log_std = (np.asarray(x, np.float64) for x in policy_stats(p["observations"]))
        pre = mean + np.exp(log_std) * self.noise
        gauss, exact = gaussian_logp_and_correction(self.noise, log_std, pre)
        squashed32 = np.tanh(pre.astype(np.float32))
        eps_form = np.sum(np.log(1.0 - squashed32**2 + np.float32(LOGP_EPS)), axis=-1).astype(np.float64)
        action = np.tanh(pre).astype(np.float32)
        q = np.asarray(q_values(p["observations"], action, False), np.float64)

        next_mean, next_log_std = (np.asarray(x, np.float64) for x in policy_stats(p["next_observations"]))
        next_pre = next_mean + np.exp(next_log_std) * self.next_noise
        next_gauss, next_correction = gaussian_logp_and_correction(self.next_noise, next_log_std, next_pre)
        next_logp = next_gauss - next_correction
        next_q = np.asarray(q_values(p["next_observations"], np.tanh(next_pre).astype(np.float32), True), np.float64)
        target = p["rewards"] + GAMMA * (1.0 - p["terminals"]) * (next_q.min(0) - alpha * next_logp)
        data_q = np.asarray(q_values(p["observations"], p["actions"], False), np.float64)
        out = {
            "entropy": float(-np.mean(gauss - exact)),
            "entropy_eps": float(-np.mean(gauss - eps_form)),
            "q_mean": float(q.mean()),
            "min_q_real": float(q.min(0).mean()),
            "alpha": float(alpha),
            "td_loss": float(np.mean((data_q - target[None]) ** 2)),
            "saturated": float(np.mean(np.abs(pre) > 5.0)),
        }
        if diversity is not None:
            out["edac_diversity"] = float(diversity(p["observations"], p["actions"]))
        return out


def gaussian_logp_and_correction(noise, log_std, pre_tanh):
    """The tanh-Gaussian log-probability's two sums in float64: log N(pre_tanh) and the exact log(1 - tanh²)
    (`mbrl.agents.networks.sample_tanh_gaussian`'s stable form, here in numpy for either side's outputs)."""
    gauss = np.sum(-0.5 * noise**2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)
    correction = np.sum(2.0 * (np.log(2.0) - pre_tanh - np.logaddexp(0.0, -2.0 * pre_tanh)), axis=-1)
    return gauss, correction


def emit(record: dict, out: Path | None):
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with out.open("a") as f:
            f.write(line + "\n")


def means(records: list[dict]) -> dict:
    keys = {k for r in records for k, v in r.items() if isinstance(v, (int, float)) and v is not None}
    return {k: float(np.mean([r[k] for r in records if r.get(k) is not None])) for k in sorted(keys)}


# --------------------------------------------------------------------------------------------- ours

def ours(setting: Setting, args, overrides: dict):
    import jax

    from mbrl.agents.sac_n import edac_diversity
    from mbrl import config as config_io
    from mbrl.trainer import host_metrics, hypers_of, trainer_for

    epochs = args.updates // UPDATES_PER_EPOCH
    base = {"seed": args.seed, "schedule": {"epochs": epochs, "updates_per_epoch": UPDATES_PER_EPOCH}}
    config = config_io.build(setting.algo, args.dataset, "paper", config_io.merge_overrides(base, overrides))
    info = setting.dataset.info
    trainer = trainer_for(config, info.obs_dim, info.act_dim)
    real = trainer.real_data(setting.dataset)
    model = setting.model
    state = trainer.initial_state([args.seed], [hypers_of(config)])
    core = trainer.agent.core
    actor_apply = jax.jit(core.actor.apply)
    critic_apply = jax.jit(core.critic.apply)
    diversity_fn = jax.jit(lambda params, obs, act: edac_diversity(core.action_gradients(params, obs, act)))
    member = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        state, metrics = trainer.run_epoch(state, real, model)
        if (epoch * UPDATES_PER_EPOCH) % args.eval_every and epoch != epochs:
            continue
        agent = member(state.agent)
        train = {k: v[0] for k, v in host_metrics(metrics).items()}
        alpha = float(core.alpha(agent.log_alpha))

        def policy_stats(obs):
            return actor_apply(agent.actor_params, obs)

        def q_values(obs, act, target):
            return critic_apply(agent.target_critic_params if target else agent.critic_params, obs, act)

        def deterministic(obs):
            return np.tanh(np.asarray(actor_apply(agent.actor_params, obs)[0]))

        diversity = (lambda o, a: diversity_fn(agent.critic_params, o, a)) if core.use_edac else None
        record = {"algo": setting.algo, "side": "ours", "variant": args.variant, "seed": args.seed,
                  "updates": epoch * UPDATES_PER_EPOCH, "seconds": round(time.perf_counter() - start, 1)}
        record.update(setting.evaluate(deterministic, args.seed, args.episodes))
        record.update(setting.diagnostics(policy_stats, q_values, alpha, diversity))
        record["train"] = {k: train[k] for k in ("entropy", "alpha", "critic_loss", "q_mean", "edac_diversity")
                           if k in train}
        emit(record, args.out)


# --------------------------------------------------------------------------------------------- peers

def _torch():
    import torch

    torch.set_num_threads(int(os.environ.get("PEER_THREADS", "1")))
    return torch


def edge_of_reach_agent(setting: Setting, args):
    """edge-of-reach's RAVL agent with train_ravl_agent.py's TrainConfig defaults, seeded as its `train` seeds it:
    (torch, actor, agent). Puts the checkout (`args.peer`) on the import path."""
    torch = _torch()
    sys.path.insert(0, str(Path(args.peer).resolve()))
    placeholder_modules()
    from agent_training.agent import Actor, Agent, VectorizedCritic
    from shared.utils import set_seed

    set_seed(args.seed)
    obs_dim, act_dim = setting.arrays["observations"].shape[1], setting.arrays["actions"].shape[1]
    actor = Actor(obs_dim, act_dim, 256, 1.0)
    critic = VectorizedCritic(obs_dim, act_dim, 256, 10)
    agent = Agent(actor=actor, actor_optimizer=torch.optim.Adam(actor.parameters(), lr=3e-4), critic=critic,
                  critic_optimizer=torch.optim.Adam(critic.parameters(), lr=3e-4), gamma=0.99, tau=5e-3, eta=1.0,
                  auto_alpha=True, alpha_learning_rate=3e-4, target_entropy=None, alpha=0.1, device="cpu")
    return torch, actor, agent


def peer_ravl(setting: Setting, args):
    """edge-of-reach train_ravl_agent.py `train`, with its TrainConfig defaults, on `setting`'s model."""
    torch, actor, agent = edge_of_reach_agent(setting, args)
    from agent_training.rollout_generation import RolloutGenerator
    from shared.data_buffer import DataBuffer

    class OurModel:
        """Answers RolloutGenerator's model calls with our world model's step."""

        def transition_function_torch(self, state, action):
            next_obs, reward, done = setting.model_step(state.numpy(), action.numpy())
            return torch.from_numpy(next_obs), torch.from_numpy(reward), torch.from_numpy(done), {}

    obs_dim, act_dim = setting.arrays["observations"].shape[1], setting.arrays["actions"].shape[1]
    real = DataBuffer(obs_dim, act_dim, len(setting.arrays["observations"]), as_numpy=False)
    real.load_d4rl_dataset(setting.arrays)
    imagined = DataBuffer(obs_dim, act_dim, ROLLOUTS_PER_EPOCH * setting.horizon * RETAIN_EPOCHS, as_numpy=False)
    generator = RolloutGenerator(model=OurModel(), actor=actor, steps_k=setting.horizon,
                                 num_rollouts=ROLLOUTS_PER_EPOCH, buffer=imagined)

    @torch.no_grad()
    def policy_stats(obs):
        hidden = actor.trunk(torch.from_numpy(obs))
        return actor.mu(hidden).numpy(), torch.clip(actor.log_sigma(hidden), -5, 2).numpy()

    @torch.no_grad()
    def q_values(obs, act, target):
        return (agent.target_critic if target else agent.critic)(torch.from_numpy(obs), torch.from_numpy(act)).numpy()

    def diversity(obs, act):
        return agent._critic_diversity_loss(torch.from_numpy(obs), torch.from_numpy(act)).item()

    def deterministic(obs):
        return np.tanh(policy_stats(obs)[0])

    start = time.perf_counter()
    updates, epoch_infos = 0, []
    for epoch in range(args.updates // UPDATES_PER_EPOCH):
        generator.generate_rollouts(real.sample(ROLLOUTS_PER_EPOCH)[0])
        epoch_infos = []
        for _ in range(UPDATES_PER_EPOCH):
            n_real = int(REAL_RATIO * BATCH)
            real_batch, model_batch = real.sample(n_real), imagined.sample(BATCH - n_real)
            epoch_infos.append(agent.update([torch.cat([a, b]) for a, b in zip(real_batch, model_batch)]))
            updates += 1
        if updates % args.eval_every and epoch != args.updates // UPDATES_PER_EPOCH - 1:
            continue
        train = means(epoch_infos)
        record = {"algo": "ravl", "side": "peer", "variant": args.variant, "seed": args.seed, "updates": updates,
                  "seconds": round(time.perf_counter() - start, 1)}
        record.update(setting.evaluate(deterministic, args.seed, args.episodes))
        record.update(setting.diagnostics(policy_stats, q_values, agent.alpha.item(), diversity))
        record["train"] = {"entropy": train["batch_entropy"], "alpha": train["alpha"],
                           "critic_loss": train["critic_loss"], "q_mean": train["q_policy_mean"]}
        emit(record, args.out)


def lockstep_ravl(setting: Setting, args, overrides: dict):
    """Both RAVL agents in one process from the same weights (edge-of-reach's initial ones, copied into ours),
    given the same batches of real rows and the same Gaussian noise (what our update's keys draw, handed to the
    peer's `Normal.rsample` in its draw order: temperature, actor, critic target). With no other randomness
    left, any difference that is not float rounding is a difference of the algorithm. A control runs ours a
    second time from the same weights moved by one float32 step each (np.nextafter): how fast two runs of one
    algorithm part from rounding alone. Prints one JSON line per checkpoint: each network's distance from the
    peer's (and the control's from ours), relative to how far the peer's (ours) has moved."""
    import jax
    import jax.numpy as jnp

    from mbrl import config as config_io
    from mbrl.core.types import Transitions
    from mbrl.trainer import hypers_of, trainer_for

    torch, actor, agent = edge_of_reach_agent(setting, args)
    obs_dim, act_dim = setting.arrays["observations"].shape[1], setting.arrays["actions"].shape[1]

    config = config_io.build("ravl", args.dataset, "paper", config_io.merge_overrides({"seed": args.seed}, overrides))
    core = trainer_for(config, obs_dim, act_dim).agent.core
    hypers = hypers_of(config)["sac"]
    if core.config.update_order != "alpha_actor_critic":
        print("peer_check: --side lockstep needs sac.update_order=alpha_actor_critic (edge-of-reach's order of draws)",
              file=sys.stderr)
        raise SystemExit(2)

    def peer_params():
        """The peer's actor, critics and target critics in our parameter layout (numpy)."""
        t = lambda x: x.detach().numpy().copy()  # noqa: E731
        layers = [actor.trunk[0], actor.trunk[2], actor.trunk[4]]
        actor_tree = {f"Dense_{i}": {"kernel": t(l.weight).T, "bias": t(l.bias)} for i, l in enumerate(layers)}
        actor_tree["Dense_3"] = {"kernel": np.concatenate([t(actor.mu.weight).T, t(actor.log_sigma.weight).T], 1),
                                 "bias": np.concatenate([t(actor.mu.bias), t(actor.log_sigma.bias)])}

        def critic_tree(net):
            layers = [net.critic[i] for i in (0, 2, 4, 6)]
            return {"params": {"MLP_0": {f"Dense_{i}": {"kernel": t(l.weight), "bias": t(l.bias)[:, 0]}
                                         for i, l in enumerate(layers)}}}

        return {"actor": {"params": {"MLP_0": actor_tree}}, "critic": critic_tree(agent.critic),
                "target": critic_tree(agent.target_critic), "log_alpha": t(agent.log_alpha)[0]}

    start = peer_params()
    state = core.init(jax.random.PRNGKey(args.seed), hypers)
    shape = lambda tree: jax.tree.map(jnp.shape, tree)  # noqa: E731
    assert shape(state.actor_params) == shape(start["actor"]), "actor layouts differ"
    assert shape(state.critic_params) == shape(start["critic"]), "critic layouts differ"
    state = state.replace(
        actor_params=start["actor"], critic_params=start["critic"], target_critic_params=start["target"],
        log_alpha=jnp.asarray(start["log_alpha"]))
    state = jax.tree.map(jnp.asarray, state)
    state = state.replace(actor_opt_state=core.tx.init(state.actor_params),
                          critic_opt_state=core.tx.init(state.critic_params),
                          alpha_opt_state=core.tx.init(state.log_alpha))
    nudge = lambda tree: jax.tree.map(lambda x: jnp.nextafter(x, jnp.inf), tree)  # noqa: E731
    control = state.replace(actor_params=nudge(state.actor_params), critic_params=nudge(state.critic_params),
                            target_critic_params=nudge(state.target_critic_params))
    update = jax.jit(core.update)

    @jax.jit
    def update_noise(key):
        """The three draws of our update (the order of `SACN.update`'s split for alpha_actor_critic)."""
        critic_key, actor_key, alpha_key = jax.random.split(key, 3)
        draw = lambda k: jax.random.normal(k, (BATCH, act_dim), jnp.float32)  # noqa: E731
        return draw(alpha_key), draw(actor_key), draw(critic_key)

    queue: list = []
    normal = torch.distributions.Normal

    def rsample(self, sample_shape=torch.Size()):
        noise = queue.pop(0)
        assert tuple(noise.shape) == tuple(self.loc.shape), "draw shapes differ"
        return self.loc + noise * self.scale

    normal.rsample = rsample

    def distance(ours_tree, peer_tree, origin):
        leaves = lambda tree: np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])  # noqa: E731
        ours_v, peer_v, origin_v = leaves(ours_tree), leaves(peer_tree), leaves(origin)
        return float(np.linalg.norm(ours_v - peer_v) / max(np.linalg.norm(peer_v - origin_v), 1e-30))

    rng = np.random.default_rng(args.seed)
    key = jax.random.PRNGKey(args.seed + 1)
    checkpoints = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}
    data = setting.arrays
    for step in range(1, args.updates + 1):
        rows = rng.integers(0, len(data["observations"]), BATCH)
        batch = {k: v[rows] for k, v in data.items()}
        key, step_key = jax.random.split(key)
        queue.extend(torch.from_numpy(np.asarray(n)) for n in update_noise(step_key))
        agent.update([torch.from_numpy(batch[k]) if k not in ("rewards", "terminals")
                      else torch.from_numpy(batch[k])[:, None]
                      for k in ("observations", "actions", "rewards", "next_observations", "terminals")])
        assert not queue, "the peer drew a different number of samples"
        transitions = Transitions(obs=batch["observations"], action=batch["actions"], reward=batch["rewards"],
                                  next_obs=batch["next_observations"], terminal=batch["terminals"] > 0.5,
                                  timeout=np.zeros(BATCH, bool))
        state, _ = update(state, transitions, step_key, hypers)
        control, _ = update(control, transitions, step_key, hypers)
        if step not in checkpoints and step != args.updates:
            continue
        peer = peer_params()
        probe = jnp.asarray(setting.probe["observations"])
        ours_mean, ours_log_std = core.actor.apply(state.actor_params, probe)
        with torch.no_grad():
            hidden = actor.trunk(torch.from_numpy(setting.probe["observations"]))
            peer_log_std = torch.clip(actor.log_sigma(hidden), -5, 2).numpy()
        record = {"algo": "ravl", "side": "lockstep", "seed": args.seed, "updates": step,
                  "actor": distance(state.actor_params, peer["actor"], start["actor"]),
                  "critic": distance(state.critic_params, peer["critic"], start["critic"]),
                  "target_critic": distance(state.target_critic_params, peer["target"], start["target"]),
                  "actor_control": distance(control.actor_params, state.actor_params, start["actor"]),
                  "critic_control": distance(control.critic_params, state.critic_params, start["critic"]),
                  "log_alpha": float(state.log_alpha), "log_alpha_peer": float(peer["log_alpha"]),
                  "mean_log_std": float(jnp.mean(ours_log_std)), "mean_log_std_peer": float(np.mean(peer_log_std)),
                  "max_abs_mean_diff": float(np.max(np.abs(np.asarray(ours_mean) - actor.mu(hidden).detach().numpy())))}
        emit(record, args.out)


def peer_mopo(setting: Setting, args):
    """OfflineRL-Kit run_example/run_mopo.py `train` and MBPolicyTrainer.train with their defaults (hopper-medium:
    rollout length 5, penalty 5.0 as in our preset), on `setting`'s model."""
    torch = _torch()
    sys.path.insert(0, str(Path(args.peer).resolve()))
    placeholder_modules()
    from offlinerlkit.buffer import ReplayBuffer
    from offlinerlkit.modules import ActorProb, Critic, TanhDiagGaussian
    from offlinerlkit.nets import MLP
    from offlinerlkit.policy import MOPOPolicy

    class OurModel:
        """Answers MOPOPolicy.rollout's `dynamics.step` with our world model's penalised step."""

        def step(self, obs, action):
            next_obs, reward, done = setting.model_step(obs.astype(np.float32), action.astype(np.float32))
            return next_obs, reward[:, None], done[:, None], {}

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    obs_dim, act_dim = setting.arrays["observations"].shape[1], setting.arrays["actions"].shape[1]
    total_epochs = 3000  # run_mopo.py --epoch: the cosine schedule's length
    actor_backbone = MLP(input_dim=obs_dim, hidden_dims=[256, 256])
    critic1_backbone = MLP(input_dim=obs_dim + act_dim, hidden_dims=[256, 256])
    critic2_backbone = MLP(input_dim=obs_dim + act_dim, hidden_dims=[256, 256])
    dist = TanhDiagGaussian(latent_dim=256, output_dim=act_dim, unbounded=True, conditioned_sigma=True, max_mu=1.0)
    actor = ActorProb(actor_backbone, dist, "cpu")
    critic1, critic2 = Critic(critic1_backbone, "cpu"), Critic(critic2_backbone, "cpu")
    actor_optim = torch.optim.Adam(actor.parameters(), lr=1e-4)
    critic1_optim = torch.optim.Adam(critic1.parameters(), lr=3e-4)
    critic2_optim = torch.optim.Adam(critic2.parameters(), lr=3e-4)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(actor_optim, total_epochs)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha = (-act_dim, log_alpha, torch.optim.Adam([log_alpha], lr=1e-4))
    policy = MOPOPolicy(OurModel(), actor, critic1, critic2, actor_optim, critic1_optim, critic2_optim, tau=0.005,
                        gamma=0.99, alpha=alpha)
    data = {k: (v if k not in ("rewards", "terminals") else v[:, None]) for k, v in setting.arrays.items()}
    real = ReplayBuffer(len(data["observations"]), (obs_dim,), np.float32, act_dim, np.float32, "cpu")
    real.load_dataset(data)
    fake = ReplayBuffer(ROLLOUTS_PER_EPOCH * setting.horizon * RETAIN_EPOCHS, (obs_dim,), np.float32, act_dim,
                        np.float32, "cpu")

    @torch.no_grad()
    def policy_stats(obs):
        dist = actor(obs)
        return dist.loc.numpy(), torch.log(dist.scale).numpy()

    @torch.no_grad()
    def q_values(obs, act, target):
        one, two = (policy.critic1_old, policy.critic2_old) if target else (critic1, critic2)
        return np.stack([one(obs, act).numpy()[:, 0], two(obs, act).numpy()[:, 0]])

    def deterministic(obs):
        return np.tanh(policy_stats(obs)[0])

    start = time.perf_counter()
    updates = 0
    epochs = args.updates // UPDATES_PER_EPOCH
    for epoch in range(epochs):
        policy.train()
        infos = []
        for _ in range(UPDATES_PER_EPOCH):
            if updates % UPDATES_PER_EPOCH == 0:
                starts = real.sample(ROLLOUTS_PER_EPOCH)["observations"].cpu().numpy()
                transitions, _ = policy.rollout(starts, setting.horizon)
                fake.add_batch(**transitions)
            n_real = int(BATCH * REAL_RATIO)
            info = policy.learn({"real": real.sample(batch_size=n_real), "fake": fake.sample(batch_size=BATCH - n_real)})
            updates += 1
            infos.append(info)
        lr_scheduler.step()
        if updates % args.eval_every and epoch != epochs - 1:
            continue
        policy.eval()
        with torch.no_grad():
            obs = torch.from_numpy(setting.arrays["observations"][:BATCH])
            _, logp = policy.actforward(obs)
        train = means(infos)
        record = {"algo": "mopo", "side": "peer", "variant": args.variant, "seed": args.seed, "updates": updates,
                  "seconds": round(time.perf_counter() - start, 1)}
        record.update(setting.evaluate(deterministic, args.seed, args.episodes))
        record.update(setting.diagnostics(policy_stats, q_values, float(policy._alpha)))
        record["train"] = {"alpha": train.get("alpha"), "critic_loss": train["loss/critic1"] + train["loss/critic2"],
                           "actor_lr": actor_optim.param_groups[0]["lr"], "entropy": float(-logp.mean())}
        emit(record, args.out)


# --------------------------------------------------------------------------------------------- main

def parse_set(items: list[str]) -> dict:
    """`section.field=value` pairs as nested overrides (values parsed as JSON where they can be)."""
    out: dict = {}
    for item in items:
        path, _, text = item.partition("=")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        node = out
        *parents, leaf = path.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algo", choices=("ravl", "mopo"))
    parser.add_argument("--side", choices=("ours", "peer", "lockstep"), required=True,
                        help="lockstep (ravl): both agents from the same weights, batches and noise")
    parser.add_argument("--peer", help="the peer's checkout (edge-of-reach for ravl, OfflineRL-Kit for mopo)")
    parser.add_argument("--world-model", required=True, help="a world model directory of ours, used by both sides")
    parser.add_argument("--dataset", default="hopper-medium")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--eval-every", type=int, default=2000)
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="a config override for our side (repeatable)")
    parser.add_argument("--variant", default=None, help="a label for this run's lines")
    parser.add_argument("--out", type=Path, default=None, help="also append the JSON lines to this file")
    args = parser.parse_args()
    if args.side in ("peer", "lockstep") and not args.peer:
        parser.error(f"--side {args.side} needs --peer PATH")
    if args.side == "lockstep" and args.algo != "ravl":
        parser.error("--side lockstep: ravl only")
    if args.updates % UPDATES_PER_EPOCH and args.side != "lockstep":
        parser.error(f"--updates: a multiple of {UPDATES_PER_EPOCH}")
    args.variant = args.variant or ("reference" if args.side == "peer" else (",".join(args.set) or "default"))
    setting = Setting(args.algo, args.dataset, args.world_model)
    if args.side == "ours":
        ours(setting, args, parse_set(args.set))
    elif args.side == "lockstep":
        lockstep_ravl(setting, args, parse_set(args.set))
    elif args.algo == "ravl":
        peer_ravl(setting, args)
    else:
        peer_mopo(setting, args)


if __name__ == "__main__":
    main()
