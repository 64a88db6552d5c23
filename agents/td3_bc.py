"""TD3+BC (Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning"), on real data only.

TD3 (a deterministic tanh actor, twin critics, target policy smoothing, delayed actor and target updates) with a
behaviour-cloning term in the actor loss:

    critics: y = r + γ (1 - terminal) min_i Q'_i(s', clip(π'(s') + clip(σ ε, -c, c), -1, 1)), ε ~ N(0, I)
    actor, every `policy_freq` updates: -λ mean Q_1(s, π(s)) + mean (π(s) - a)², λ = α / mean |Q_1(s, π(s))|
    (λ held constant in the gradient), then a Polyak step of the target actor and critics.

Actions live in [-1, 1], so σ and c are in the action range's units (sfujim/TD3_BC main.py scales both by
max_action). The paper standardises states by the dataset's mean and std: here the option `td3_bc.normalize_states`
turns on the run's `normalize_obs` (the standardisation inside the networks, stored with the run and exported).

The twin critics are one batched `CriticEnsemble` of 2 members; Q_1 is member 0. The delayed update runs inside
the compiled scan (`lax.cond` on the update count), so K updates are one program whatever K.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from mbrl.agents.base import AlgorithmEntry, scan_updates, traced, traced_values
from mbrl.agents.networks import CriticEnsemble, DeterministicActor, ObsScale, scaled
from mbrl.agents.presets import POSITION_DIMS
from mbrl.core import checks
from mbrl.core.nn import MLP
from mbrl.core.types import Transitions


@dataclasses.dataclass(frozen=True)
class TD3BCConfig:
    """TD3+BC's settings (section `td3_bc`). Defaults: sfujim/TD3_BC main.py and TD3_BC.py.

    hidden_sizes: hidden layer widths of the actor and each of the two critics.
    actor_lr: Adam learning rate of the actor.
    critic_lr: Adam learning rate of the critics.
    gamma: discount factor.
    tau: Polyak rate of the target actor and critics (applied on actor updates only).
    alpha: α in λ = α / mean|Q|, the weight of the Q term against the BC term.
    policy_noise: std of the target policy's smoothing noise, in action units (actions in [-1, 1]).
    noise_clip: the smoothing noise is clipped to [-noise_clip, noise_clip].
    policy_freq: the actor and the targets update once every this many critic updates.
    batch_size: rows per update.
    normalize_states: standardise observations by the dataset's mean and std, as the paper (turns on normalize_obs).
    """

    hidden_sizes: Sequence[int] = (256, 256)
    actor_lr: float = traced(3e-4)
    critic_lr: float = traced(3e-4)
    gamma: float = traced(0.99)
    tau: float = traced(5e-3)
    alpha: float = traced(2.5)
    policy_noise: float = traced(0.2)
    noise_clip: float = traced(0.5)
    policy_freq: int = 2
    batch_size: int = 256
    normalize_states: bool = True

    def __post_init__(self):
        checks.widths("td3_bc", self.hidden_sizes)
        checks.positive_ints("td3_bc", self, "policy_freq", "batch_size")
        checks.positive("td3_bc", self, "actor_lr", "critic_lr", "alpha")
        checks.non_negative("td3_bc", self, "policy_noise", "noise_clip")
        checks.rates("td3_bc", self, "gamma", "tau")


@struct.dataclass
class TD3BCState:
    actor_params: Any
    target_actor_params: Any
    critic_params: Any  # leading member axis of size 2
    target_critic_params: Any
    actor_opt_state: Any
    critic_opt_state: Any
    step: jax.Array  # updates done; the actor steps on every policy_freq-th


def smoothed_target_action(target_action, noise, policy_noise, noise_clip):
    """TD3's target policy smoothing: π'(s') + clip(σ ε, -c, c), clipped to the action box [-1, 1]."""
    return jnp.clip(target_action + jnp.clip(policy_noise * noise, -noise_clip, noise_clip), -1.0, 1.0)


class TD3BC(DeterministicActor):
    """`mbrl.agents.base.FlatLearner` on the real data only, and a `CriticJudge`: a deterministic Markov policy."""

    imagination = "none"

    def __init__(self, config: TD3BCConfig, obs_dim: int, act_dim: int, obs_scale: ObsScale | None = None):
        self.config = config
        self.obs_dim, self.act_dim = obs_dim, act_dim
        hidden = tuple(int(w) for w in config.hidden_sizes)
        self.actor = scaled(MLP(hidden, act_dim), obs_scale)
        self.critic = scaled(CriticEnsemble(hidden, 2), obs_scale)
        self.tx = optax.scale_by_adam()  # the learning rates are traced data (`hypers`)
        self.batch_size = config.batch_size

    def hypers(self) -> dict:
        return {"td3_bc": traced_values(self.config)}

    def init(self, key: jax.Array, hypers: dict) -> TD3BCState:
        del hypers  # nothing at init depends on them
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, self.obs_dim), jnp.float32)
        actor_params = self.actor.init(actor_key, obs)
        critic_params = self.critic.init(critic_key, obs, jnp.zeros((1, self.act_dim), jnp.float32))
        return TD3BCState(
            actor_params=actor_params,
            target_actor_params=jax.tree.map(jnp.copy, actor_params),  # distinct buffers (donation)
            critic_params=critic_params,
            target_critic_params=jax.tree.map(jnp.copy, critic_params),
            actor_opt_state=self.tx.init(actor_params),
            critic_opt_state=self.tx.init(critic_params),
            step=jnp.zeros((), jnp.int32),
        )

    def _step(self, params, grads, opt_state, lr):
        direction, opt_state = self.tx.update(grads, opt_state)
        return jax.tree.map(lambda p, d: p - lr * d, params, direction), opt_state

    # ----------------------------------------------------------------- losses

    def critic_loss(self, critic_params, state: TD3BCState, batch: Transitions, key, hypers: dict):
        """Sum over the two critics of the mean squared TD error to the smoothed, clipped double-Q target."""
        noise = jax.random.normal(key, batch.action.shape, batch.action.dtype)
        next_action = smoothed_target_action(self.deterministic_action(state.target_actor_params, batch.next_obs), noise,
                                             hypers["policy_noise"], hypers["noise_clip"])
        next_q = jnp.min(self.critic.apply(state.target_critic_params, batch.next_obs, next_action), axis=0)
        not_done = 1.0 - batch.terminal.astype(jnp.float32)
        target = jax.lax.stop_gradient(batch.reward + hypers["gamma"] * not_done * next_q)
        q = self.critic.apply(critic_params, batch.obs, batch.action)
        loss = jnp.sum(jnp.mean((q - target[None]) ** 2, axis=1))
        return loss, {"critic_loss": loss, "q_mean": jnp.mean(q), "target_mean": jnp.mean(target)}

    def actor_loss(self, actor_params, critic_params, batch: Transitions, hypers: dict):
        """-λ mean Q_1(s, π(s)) + mean (π(s) - a)², λ = α / mean|Q_1| held constant (sfujim/TD3_BC TD3_BC.py)."""
        pi = self.deterministic_action(actor_params, batch.obs)
        q = self.critic.apply(critic_params, batch.obs, pi)[0]
        lmbda = jax.lax.stop_gradient(hypers["alpha"] / jnp.mean(jnp.abs(q)))
        bc = jnp.mean((pi - batch.action) ** 2)
        loss = -lmbda * jnp.mean(q) + bc
        return loss, {"actor_loss": loss, "lambda": lmbda, "bc_loss": bc}

    # ----------------------------------------------------------------- update

    def update(self, state: TD3BCState, batch: Transitions, key: jax.Array, hypers: dict) -> tuple[TD3BCState, dict]:
        """One critic step; on every `policy_freq`-th update (the 2nd, 4th, ... as sfujim's `total_it`) one actor
        step against the updated critics and a Polyak step of both targets."""
        hypers = hypers["td3_bc"]
        (_, critic_metrics), grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
            state.critic_params, state, batch, key, hypers)
        critic_params, critic_opt_state = self._step(state.critic_params, grads, state.critic_opt_state,
                                                     hypers["critic_lr"])
        step = state.step + 1

        def actor_and_targets(_):
            (_, metrics), grads = jax.value_and_grad(self.actor_loss, has_aux=True)(
                state.actor_params, critic_params, batch, hypers)
            actor_params, actor_opt_state = self._step(state.actor_params, grads, state.actor_opt_state,
                                                       hypers["actor_lr"])
            target_actor = optax.incremental_update(actor_params, state.target_actor_params, hypers["tau"])
            target_critic = optax.incremental_update(critic_params, state.target_critic_params, hypers["tau"])
            return actor_params, actor_opt_state, target_actor, target_critic, metrics

        def hold(_):  # the actor's loss is still measured, so every update's metrics have the same keys
            _, metrics = self.actor_loss(state.actor_params, critic_params, batch, hypers)
            return (state.actor_params, state.actor_opt_state, state.target_actor_params, state.target_critic_params,
                    metrics)

        actor_params, actor_opt_state, target_actor, target_critic, actor_metrics = jax.lax.cond(
            step % self.config.policy_freq == 0, actor_and_targets, hold, None)
        new_state = TD3BCState(actor_params=actor_params, target_actor_params=target_actor, critic_params=critic_params,
                               target_critic_params=target_critic, actor_opt_state=actor_opt_state,
                               critic_opt_state=critic_opt_state, step=step)
        return new_state, dict(critic_metrics, **actor_metrics)

    def update_many(self, state: TD3BCState, batches: Transitions, key: jax.Array, hypers: dict):
        """K updates in one `lax.scan` over batches with a leading axis K; metrics averaged over K."""
        return scan_updates(lambda s, b, k: self.update(s, b, k, hypers), state, batches, key)

    # Capability (`mbrl.agents.base.CriticJudge`)

    def critic_values(self, agent_state: TD3BCState, obs, action):
        return self.critic.apply(agent_state.critic_params, obs, action)

    def critic_gamma(self) -> float:
        return self.config.gamma

    def heldout_td_error(self, agent_state: TD3BCState, batch: Transitions, key, hypers):
        _, metrics = self.critic_loss(agent_state.critic_params, agent_state, batch, key, hypers["td3_bc"])
        return metrics["critic_loss"] / 2.0  # per critic


def normalize_states(config) -> dict:
    """The paper's state standardisation is the run's `normalize_obs` (inside the networks, exported with them)."""
    return {"normalize_obs": True} if config.td3_bc.normalize_states else {}


# sfujim/TD3_BC main.py and TD3_BC.py: actor and twin critics of 2x256, Adam at 3e-4, batch 256, γ 0.99, τ 5e-3,
# policy noise 0.2 and noise clip 0.5 (times max_action: 1 here), policy_freq 2, α 2.5, states standardised;
# 1M updates, evaluated every 5,000 on 10 episodes.
TD3_BC = {"hidden_sizes": (256, 256), "actor_lr": 3e-4, "critic_lr": 3e-4, "batch_size": 256, "gamma": 0.99,
          "tau": 5e-3, "policy_noise": 0.2, "noise_clip": 0.5, "policy_freq": 2, "alpha": 2.5, "normalize_states": True}

PRESETS = {
    "paper": {
        "td3_bc": dict(TD3_BC),
        "schedule": {"epochs": 1000, "updates_per_epoch": 1000, "eval_every": 5, "eval_episodes": 10},
    },
    # Quick, sized for 2 CPU cores: the paper's agent for 20 epochs of 1,000 updates (20k of its 1M).
    "quick": {
        "td3_bc": dict(TD3_BC),
        "schedule": {"epochs": 20, "updates_per_epoch": 1000, "eval_every": 5, "eval_episodes": 5},
    },
}

# NeoRL-2 (keyed by task): the best (α, policy noise) of the benchmark's grid α ∈ {0.05, 0.1, 0.2} × noise ∈
# {0.5, 1.5, 2.5}, by the mean over its 3 seeds of Reward_Mean_Env in polixir/NeoRL2
# benchmark/results/<Task>-td3bc/log.csv. Its other settings (polixir/OfflineRL's TD3+BC config: 2x256, lr 3e-4,
# batch 256, noise clip 0.5, policy_freq 2, states standardised) are the paper's.
NEORL2: dict[str, tuple[float, float]] = {
    "dmsd": (0.2, 0.5),
    "pipeline": (0.2, 0.5),
    "randomfrictionhopper": (0.2, 0.5),
    "rocketrecovery": (0.2, 1.5),
    "safetyhalfcheetah": (0.05, 2.5),
    "simglucose": (0.2, 2.5),
}


def per_dataset(dataset: str | None) -> dict[str, Any]:
    """α and the policy noise for a NeoRL-2 task (`dmsd`), and the absolute position its networks ignore there
    (`mbrl.agents.presets.POSITION_DIMS`); empty otherwise (the paper used α 2.5 on every D4RL locomotion dataset)."""
    if dataset not in NEORL2:
        return {}
    alpha, policy_noise = NEORL2[dataset]
    hidden = {"ignore_obs_dims": POSITION_DIMS[dataset]} if dataset in POSITION_DIMS else {}
    return {"td3_bc": {"alpha": alpha, "policy_noise": policy_noise}, **hidden}


def make(config, obs_dim, act_dim, obs_scale):
    return TD3BC(config.td3_bc, obs_dim, act_dim, obs_scale)


# TD3+BC's search space (`mbrl sweep --algo td3-bc --space td3-bc`): NeoRL-2's grid (polixir/NeoRL2
# benchmark/results/<Task>-td3bc/log.csv: alpha {0.05, 0.1, 0.2} x policy noise {0.5, 1.5, 2.5}).
SPACE = {"td3_bc.alpha": {"choices": [0.05, 0.1, 0.2]}, "td3_bc.policy_noise": {"choices": [0.5, 1.5, 2.5]}}

ALGORITHM = AlgorithmEntry(
    name="td3-bc", sections={"td3_bc": TD3BCConfig}, make=make, presets=PRESETS, per_dataset=per_dataset,
    finalize=normalize_states, smoke={"td3_bc": {"hidden_sizes": [16, 16], "batch_size": 16}},
    space=SPACE,
)
