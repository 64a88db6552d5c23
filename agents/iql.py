"""IQL (Kostrikov et al. 2022, "Offline Reinforcement Learning with Implicit Q-Learning"), on the real data only.

Every update, in the order of ikostrikov/implicit_q_learning learner.py `_update_jit`:
1. V(s) regresses on the target critics' min Q(s, a_data) by the expectile loss |tau - 1(u < 0)| u^2, u = Q - V
   (critic.py `update_v`): an upper expectile of Q over the data's actions, so no action outside the data is queried;
2. the actor maximises exp(beta (Q - V)) log pi(a_data | s), the weight clipped at `max_weight` (actor.py `update`);
3. twin Q critics regress on r + gamma V(s') (critic.py `update_q`), then Polyak targets.

The actor is a Gaussian whose mean is tanh of an MLP's output and whose log std is one learned vector, clipped to
[-5, 2] (learner.py: `NormalTanhPolicy(state_dependent_std=False, tanh_squash_distribution=False, log_std_min=-5)`),
not a tanh-Gaussian: its likelihood of an action on the bounds (common in the data: actions clipped to [-1, 1]) is
finite, where a tanh-Gaussian needs atanh(+-1); acting takes the mean, or a sample clipped to [-1, 1] as the reference.
Its learning rate follows a cosine from `actor_lr` to 0 over the run's updates (learner.py `opt_decay_schedule`).
Not implemented: dropout in the actor (off for locomotion; the reference's kitchen config uses 0.1), and D4RL's
reward normalisation as a data transform (`reward_scale` takes its factor).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from mbrl.agents.base import AlgorithmEntry, scan_updates, traced, traced_values
from mbrl.agents.networks import CriticEnsemble, ObsScale, scaled
from mbrl.core import checks
from mbrl.core.errors import ConfigError
from mbrl.core.nn import MLP
from mbrl.core.types import Transitions

ACTOR_SCHEDULES = ("cosine", "constant")
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # learner.py's log_std_min; policy.py's LOG_STD_MAX


@dataclasses.dataclass(frozen=True)
class IQLConfig:
    """IQL's settings (section `iql`). Defaults: ikostrikov/implicit_q_learning configs/mujoco_config.py and
    train_offline.py (D4RL locomotion).

    hidden_sizes: hidden layer widths of the actor, each Q critic and V.
    actor_lr / critic_lr / value_lr: Adam learning rates (the actor's is the cosine's start).
    gamma: discount factor.
    tau: Polyak rate of the target critics.
    expectile: the expectile of Q that V fits (0.5: the mean; towards 1: the max over the data's actions).
    beta: the inverse temperature of the advantage weights exp(beta (Q - V)).
    max_weight: the clip of the advantage weights.
    batch_size: rows per update.
    actor_schedule: cosine (the actor's learning rate decays to 0 over the run's updates) or constant.
    reward_scale: rewards times this inside the updates (IQL's D4RL locomotion runs: 1000 / (the dataset's highest
        minus lowest episode return)); critic values and TD errors are reported in the data's reward units.
    """

    hidden_sizes: Sequence[int] = (256, 256)
    actor_lr: float = traced(3e-4)
    critic_lr: float = traced(3e-4)
    value_lr: float = traced(3e-4)
    gamma: float = traced(0.99)
    tau: float = traced(5e-3)
    expectile: float = traced(0.7)
    beta: float = traced(3.0)
    max_weight: float = traced(100.0)
    batch_size: int = 256
    actor_schedule: str = "cosine"
    reward_scale: float = 1.0

    def __post_init__(self):
        checks.widths("iql", self.hidden_sizes)
        checks.positive("iql", self, "actor_lr", "critic_lr", "value_lr", "max_weight", "reward_scale")
        checks.rates("iql", self, "gamma", "tau")
        if not 0.0 < self.expectile < 1.0:
            raise ConfigError(f"iql.expectile: expected a value in (0, 1), found {self.expectile}")
        checks.non_negative("iql", self, "beta")
        checks.positive_ints("iql", self, "batch_size")
        if self.actor_schedule not in ACTOR_SCHEDULES:
            raise ConfigError(f"iql.actor_schedule: expected one of {ACTOR_SCHEDULES}, found {self.actor_schedule!r}")


def expectile_loss(diff: jax.Array, expectile) -> jax.Array:
    """|tau - 1(u < 0)| u^2 elementwise (critic.py `loss`: weight tau where u > 0, 1 - tau elsewhere)."""
    return jnp.where(diff > 0, expectile, 1.0 - expectile) * diff**2


def advantage_weights(q: jax.Array, v: jax.Array, beta, max_weight) -> jax.Array:
    """exp(beta (Q - V)), at most `max_weight` (actor.py `update`)."""
    return jnp.minimum(jnp.exp(beta * (q - v)), max_weight)


def gaussian_log_prob(mean, log_std, action):
    return jnp.sum(-0.5 * ((action - mean) * jnp.exp(-log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi), axis=-1)


class GaussianActor(nn.Module):
    """(mean, log_std): mean tanh(MLP(s)) in [-1, 1], log_std one learned vector (state-independent), clipped."""

    hidden_sizes: Sequence[int]
    act_dim: int

    @nn.compact
    def __call__(self, obs):
        mean = jnp.tanh(MLP(self.hidden_sizes, self.act_dim)(obs))
        log_std = self.param("log_std", nn.initializers.zeros, (self.act_dim,))
        return mean, jnp.broadcast_to(jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX), mean.shape)


class ValueNet(nn.Module):
    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, obs):
        return MLP(self.hidden_sizes, 1)(obs)[..., 0]


@struct.dataclass
class IQLState:
    actor_params: Any
    critic_params: Any  # leading member axis of size 2
    target_critic_params: Any
    value_params: Any
    actor_opt_state: Any
    critic_opt_state: Any
    value_opt_state: Any
    step: jax.Array


class IQL:
    """`mbrl.agents.base.FlatLearner` on the real data (imagination "none"), a Markov Gaussian policy; a
    `CriticJudge` (its twin Q critics)."""

    imagination = "none"
    recurrent = False

    def __init__(self, config: IQLConfig, obs_dim: int, act_dim: int, total_updates: int,
                 obs_scale: ObsScale | None = None):
        """`total_updates`: the run's updates, the length of the actor's cosine."""
        self.config = config
        self.obs_dim, self.act_dim = obs_dim, act_dim
        hidden = tuple(int(w) for w in config.hidden_sizes)
        self.actor = scaled(GaussianActor(hidden, act_dim), obs_scale)
        self.critic = scaled(CriticEnsemble(hidden, 2), obs_scale)
        self.value = scaled(ValueNet(hidden), obs_scale)
        self.tx = optax.scale_by_adam()  # the learning rates are traced data (`hypers`)
        self.batch_size = config.batch_size
        self.decay_steps = max(int(total_updates), 1)

    def hypers(self) -> dict:
        return {"iql": traced_values(self.config)}

    def actor_lr_factor(self, step):
        """The actor's learning rate over `actor_lr` at update `step` (from 0): 0.5 (1 + cos(pi min(step, T) / T))
        with T the run's updates (optax.cosine_decay_schedule, as learner.py), or 1."""
        if self.config.actor_schedule == "constant":
            return jnp.ones((), jnp.float32)
        return optax.cosine_decay_schedule(1.0, self.decay_steps)(step)

    def init(self, key: jax.Array, hypers: dict) -> IQLState:
        del hypers  # nothing at init depends on them
        actor_key, critic_key, value_key = jax.random.split(key, 3)
        obs = jnp.zeros((1, self.obs_dim), jnp.float32)
        action = jnp.zeros((1, self.act_dim), jnp.float32)
        actor_params = self.actor.init(actor_key, obs)
        critic_params = self.critic.init(critic_key, obs, action)
        value_params = self.value.init(value_key, obs)
        return IQLState(actor_params=actor_params, critic_params=critic_params,
                        target_critic_params=jax.tree.map(jnp.copy, critic_params),  # distinct buffers (donation)
                        value_params=value_params, actor_opt_state=self.tx.init(actor_params),
                        critic_opt_state=self.tx.init(critic_params), value_opt_state=self.tx.init(value_params),
                        step=jnp.zeros((), jnp.int32))

    # ----------------------------------------------------------------- acting

    def act(self, actor_params, carry, inputs, key, deterministic: bool = False):
        mean, log_std = self.actor.apply(actor_params, inputs.obs)
        if deterministic:
            return mean, carry
        noise = jax.random.normal(key, mean.shape, mean.dtype)
        return jnp.clip(mean + jnp.exp(log_std) * noise, -1.0, 1.0), carry

    def initial_carry(self, batch: int):
        return ()

    @staticmethod
    def actor_params(state: IQLState):
        return state.actor_params

    # ----------------------------------------------------------------- losses

    def value_loss(self, value_params, target_critic_params, batch: Transitions, hypers: dict):
        q = jnp.min(self.critic.apply(target_critic_params, batch.obs, batch.action), axis=0)
        v = self.value.apply(value_params, batch.obs)
        return jnp.mean(expectile_loss(q - v, hypers["expectile"])), {"v_mean": jnp.mean(v)}

    def actor_loss(self, actor_params, target_critic_params, value_params, batch: Transitions, hypers: dict):
        q = jnp.min(self.critic.apply(target_critic_params, batch.obs, batch.action), axis=0)
        v = self.value.apply(value_params, batch.obs)
        weights = jax.lax.stop_gradient(advantage_weights(q, v, hypers["beta"], hypers["max_weight"]))
        mean, log_std = self.actor.apply(actor_params, batch.obs)
        loss = -jnp.mean(weights * gaussian_log_prob(mean, log_std, batch.action))
        return loss, {"advantage_mean": jnp.mean(q - v), "weight_mean": jnp.mean(weights)}

    def critic_loss(self, critic_params, value_params, batch: Transitions, hypers: dict):
        """Sum over the two critics of the mean squared error to r + gamma V(s') (critic.py `update_q`)."""
        next_v = self.value.apply(value_params, batch.next_obs)
        not_done = 1.0 - batch.terminal.astype(jnp.float32)
        target = jax.lax.stop_gradient(batch.reward * self.config.reward_scale + hypers["gamma"] * not_done * next_v)
        q = self.critic.apply(critic_params, batch.obs, batch.action)
        loss = jnp.sum(jnp.mean((q - target[None]) ** 2, axis=1))
        return loss, {"q_mean": jnp.mean(q), "target_mean": jnp.mean(target)}

    # ----------------------------------------------------------------- update

    def _step(self, params, grads, opt_state, lr):
        direction, opt_state = self.tx.update(grads, opt_state)
        return jax.tree.map(lambda p, d: p - lr * d, params, direction), opt_state

    def update(self, state: IQLState, batch: Transitions, key: jax.Array, hypers: dict):
        """V, then the actor against the new V, then the critics towards the new V, then the targets."""
        del key  # every term is a function of the batch
        h = hypers["iql"]
        (value_loss, value_metrics), grads = jax.value_and_grad(self.value_loss, has_aux=True)(
            state.value_params, state.target_critic_params, batch, h)
        value_params, value_opt_state = self._step(state.value_params, grads, state.value_opt_state, h["value_lr"])

        (actor_loss, actor_metrics), grads = jax.value_and_grad(self.actor_loss, has_aux=True)(
            state.actor_params, state.target_critic_params, value_params, batch, h)
        actor_lr = h["actor_lr"] * self.actor_lr_factor(state.step)
        actor_params, actor_opt_state = self._step(state.actor_params, grads, state.actor_opt_state, actor_lr)

        (critic_loss, critic_metrics), grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
            state.critic_params, value_params, batch, h)
        critic_params, critic_opt_state = self._step(state.critic_params, grads, state.critic_opt_state, h["critic_lr"])

        new_state = IQLState(actor_params=actor_params, critic_params=critic_params,
                             target_critic_params=optax.incremental_update(critic_params, state.target_critic_params,
                                                                           h["tau"]),
                             value_params=value_params, actor_opt_state=actor_opt_state,
                             critic_opt_state=critic_opt_state, value_opt_state=value_opt_state, step=state.step + 1)
        metrics = dict(value_metrics, **actor_metrics, **critic_metrics, value_loss=value_loss, actor_loss=actor_loss,
                       critic_loss=critic_loss, actor_lr=actor_lr)
        return new_state, metrics

    def update_many(self, state: IQLState, batches: Transitions, key: jax.Array, hypers: dict):
        """K updates in one `lax.scan` over batches with a leading axis K; metrics averaged over K."""
        return scan_updates(lambda s, b, k: self.update(s, b, k, hypers), state, batches, key)

    # Capability (`mbrl.agents.base.CriticJudge`)

    def critic_values(self, agent_state: IQLState, obs, action):
        return self.critic.apply(agent_state.critic_params, obs, action) / self.config.reward_scale

    def critic_gamma(self) -> float:
        return self.config.gamma

    def heldout_td_error(self, agent_state: IQLState, batch: Transitions, key, hypers):
        del key
        loss, _ = self.critic_loss(agent_state.critic_params, agent_state.value_params, batch, hypers["iql"])
        return loss / 2 / self.config.reward_scale**2  # per critic, in the data's reward units


# -------------------------------------------------------------------------------------------------
# Presets

# Paper (D4RL locomotion): ikostrikov/implicit_q_learning configs/mujoco_config.py (lr 3e-4 for actor, critic and
# value, 2x256, discount 0.99, expectile 0.7, temperature 3.0, dropout None, tau 0.005) and train_offline.py (batch
# 256, 1M steps, evaluation every 5,000 steps on 10 episodes); learner.py's default cosine schedule of the actor.
# The same values in OfflineRL-Kit run_example/run_iql.py (its cosine off by default: `--lr-decay`).
IQL_PAPER = {"hidden_sizes": (256, 256), "actor_lr": 3e-4, "critic_lr": 3e-4, "value_lr": 3e-4, "gamma": 0.99,
             "tau": 5e-3, "expectile": 0.7, "beta": 3.0, "max_weight": 100.0, "batch_size": 256,
             "actor_schedule": "cosine"}

# Quick: the same agent for a tenth of the paper's updates (the cosine over those): an update costs a few
# milliseconds on 2 CPU cores, so 100,000 fit the quick budget.
PRESETS = {
    "paper": {"iql": dict(IQL_PAPER),
              "schedule": {"epochs": 1000, "updates_per_epoch": 1000, "eval_every": 5, "eval_episodes": 10}},
    "quick": {"iql": dict(IQL_PAPER),
              "schedule": {"epochs": 100, "updates_per_epoch": 1000, "eval_every": 10, "eval_episodes": 5}},
}


def make(config, obs_dim, act_dim, obs_scale):
    total = config.schedule.epochs * config.schedule.updates_per_epoch
    return IQL(config.iql, obs_dim, act_dim, total, obs_scale)


def compiled_schedule(config) -> dict:
    # The cosine's length is the run's total updates.
    return {"epochs": config.schedule.epochs} if config.iql.actor_schedule == "cosine" else {}


# IQL's search space (`mbrl sweep --algo iql --space iql`): the expectile and the advantage temperature, between the
# paper's two settings (Kostrikov et al. 2022, Appendix B: 0.7 and 3 on the locomotion tasks, 0.9 and 10 on AntMaze).
# NeoRL-2 did not run IQL. The bounds are ours.
SPACE = {"iql.expectile": {"low": 0.5, "high": 0.95}, "iql.beta": {"low": 0.5, "high": 10.0, "log": True}}

ALGORITHM = AlgorithmEntry(
    name="iql", sections={"iql": IQLConfig}, make=make, presets=PRESETS, compiled_schedule=compiled_schedule,
    smoke={"iql": {"hidden_sizes": [16, 16], "batch_size": 16}},
    space=SPACE,
)
