"""The SAC-N core that every SAC-style agent uses (online SAC, MOPO, RAVL/EDAC).

- N critics as one batched network; the TD target takes the min over the N target critics
  (SAC-N, An et al. 2021, "Uncertainty-Based Offline RL with Diversified Q-Ensemble"); N=2 is SAC.
- Automatic entropy tuning towards `target_entropy` (default -|A|, Haarnoja et al. 2018b).
- Optional EDAC gradient-diversity term, weight `eta`: the action-gradients of the N critics,
  each normalised, their pairwise dot products summed off the diagonal and divided by N-1.

Agents supply only batches (`mbrl.core.types.Transitions`): rewards may already carry a penalty
(MOPO), and `terminal` stops bootstrapping while `timeout` does not.
`update` is a pure function of (state, batch, key), so it can be jitted, `lax.scan`ned over K
updates (`update_many`) and vmapped over seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from agents.networks import CriticEnsemble, TanhGaussianActor, anchor_error, sample_tanh_gaussian
from mbrl.core.types import Transitions


@dataclasses.dataclass(frozen=True)
class SACNConfig:
    # Defaults: SAC (Haarnoja et al. 2018b, Table 1): 2x256, Adam 3e-4, batch 256, gamma 0.99, tau 5e-3.
    num_critics: int = 2
    hidden_sizes: Sequence[int] = (256, 256)
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 5e-3
    batch_size: int = 256
    eta: float = 0.0  # EDAC gradient-diversity weight; 0 disables the term (and its cost)
    target_entropy: float | None = None  # None: -act_dim
    init_alpha: float = 1.0
    # LayerNorm in every critic's hidden layers (Ball et al. 2023, "Efficient Online RL with Offline
    # Data"): it bounds Q on inputs far from the data, where plain MLPs extrapolate without limit.
    critic_layer_norm: bool = False
    # Weight of a behaviour-cloning term in the actor loss, as in TD3+BC (Fujimoto & Gu 2021) and
    # Unifloral's model-based ReBRAC (MoBRAC, Jackson et al. 2025), on the real rows of each batch. The
    # term is multiplied by the batch's mean |Q| so the weight means the same at any reward scale;
    # TD3+BC's alpha 2.5 is 1/2.5 = 0.4 here. 0 disables it.
    actor_bc_coef: float = 0.0


@struct.dataclass
class SACNState:
    actor_params: Any
    critic_params: Any  # leading member axis of size N
    target_critic_params: Any
    log_alpha: jax.Array
    actor_opt_state: Any
    critic_opt_state: Any
    alpha_opt_state: Any
    step: jax.Array


def edac_diversity(action_grads: jax.Array) -> jax.Array:
    """EDAC's ensemble-diversity loss from per-member action-gradients of shape (N, batch, act_dim).

    Mean over the batch of the sum of off-diagonal cosine similarities, divided by N-1.
    """
    num = action_grads.shape[0]
    unit = action_grads / (jnp.linalg.norm(action_grads, axis=-1, keepdims=True) + 1e-10)
    cosine = jnp.einsum("nba,mba->bnm", unit, unit)
    off_diagonal = cosine * (1.0 - jnp.eye(num, dtype=cosine.dtype))
    return jnp.mean(jnp.sum(off_diagonal, axis=(1, 2))) / (num - 1)


class SACN:
    """Networks, optimizers and the pure functions `init`, `update`, `update_many`, `act`."""

    def __init__(self, config: SACNConfig, obs_dim: int, act_dim: int, bc_rows: int | None = None):
        """`bc_rows`: the leading rows of every batch whose actions the BC term imitates (the real
        data of a mixed batch); None means all rows."""
        if config.num_critics < 1:
            raise ValueError(f"num_critics must be >= 1, got {config.num_critics}")
        if config.eta > 0 and config.num_critics < 2:
            raise ValueError("the EDAC term (eta > 0) needs num_critics >= 2")
        if config.actor_bc_coef > 0 and bc_rows == 0:
            raise ValueError("the actor's BC term (actor_bc_coef > 0) needs real rows in each batch")
        self.config = config
        self.bc_rows = bc_rows
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.actor = TanhGaussianActor(tuple(config.hidden_sizes), act_dim)
        self.critic = CriticEnsemble(config.hidden_sizes, config.num_critics, config.critic_layer_norm)
        self.actor_tx = optax.adam(config.actor_lr)
        self.critic_tx = optax.adam(config.critic_lr)
        self.alpha_tx = optax.adam(config.alpha_lr)
        self.target_entropy = float(-act_dim if config.target_entropy is None else config.target_entropy)

    # ----------------------------------------------------------------- init / act

    def init(self, key: jax.Array) -> SACNState:
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, self.obs_dim), jnp.float32)
        action = jnp.zeros((1, self.act_dim), jnp.float32)
        actor_params = self.actor.init(actor_key, obs)
        critic_params = self.critic.init(critic_key, obs, action)
        log_alpha = jnp.asarray(jnp.log(self.config.init_alpha), jnp.float32)
        return SACNState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=jax.tree.map(jnp.copy, critic_params),  # distinct buffers (donation)
            log_alpha=log_alpha,
            actor_opt_state=self.actor_tx.init(actor_params),
            critic_opt_state=self.critic_tx.init(critic_params),
            alpha_opt_state=self.alpha_tx.init(log_alpha),
            step=jnp.zeros((), jnp.int32),
        )

    def act(self, actor_params, obs, key, deterministic: bool = False):
        """Actions in [-1, 1] for a batch (or a single) observation; `deterministic` is tanh(mean)."""
        mean, log_std = self.actor.apply(actor_params, obs)
        if deterministic:
            return jnp.tanh(mean)
        action, _ = sample_tanh_gaussian(mean, log_std, key)
        return action

    def sample(self, actor_params, obs, key):
        mean, log_std = self.actor.apply(actor_params, obs)
        return sample_tanh_gaussian(mean, log_std, key)

    # ----------------------------------------------------------------- losses

    def critic_loss(self, critic_params, state: SACNState, batch: Transitions, key):
        """Sum over members of the mean squared TD error, plus eta * the EDAC diversity term."""
        next_action, next_logp = self.sample(state.actor_params, batch.next_obs, key)
        next_q = self.critic.apply(state.target_critic_params, batch.next_obs, next_action)
        alpha = jnp.exp(state.log_alpha)
        next_v = jnp.min(next_q, axis=0) - alpha * next_logp
        not_done = 1.0 - batch.terminal.astype(jnp.float32)
        target = jax.lax.stop_gradient(batch.reward + self.config.gamma * not_done * next_v)
        q = self.critic.apply(critic_params, batch.obs, batch.action)
        td_loss = jnp.sum(jnp.mean((q - target[None]) ** 2, axis=1))
        metrics = {"critic_loss": td_loss, "q_mean": jnp.mean(q), "target_mean": jnp.mean(target)}
        loss = td_loss
        if self.config.eta > 0:
            diversity = edac_diversity(self.action_gradients(critic_params, batch.obs, batch.action))
            loss = loss + self.config.eta * diversity
            metrics["edac_diversity"] = diversity
        return loss, metrics

    def action_gradients(self, critic_params, obs, action):
        """dQ_i/da for every member i at the given (obs, action): (N, batch, act_dim)."""

        def member_grad(member_params):
            return jax.grad(lambda a: jnp.sum(self.critic.apply_member(member_params, obs, a)))(action)

        return jax.vmap(member_grad)(critic_params)

    def actor_loss(self, actor_params, critic_params, log_alpha, batch: Transitions, key):
        mean, log_std = self.actor.apply(actor_params, batch.obs)
        action, logp = sample_tanh_gaussian(mean, log_std, key)
        q = jnp.min(self.critic.apply(critic_params, batch.obs, action), axis=0)
        alpha = jnp.exp(log_alpha)
        loss = jnp.mean(alpha * logp - q)
        extra = {}
        if self.config.actor_bc_coef > 0:
            rows = slice(None, self.bc_rows)
            bc = anchor_error(mean[rows], batch.action[rows])
            # TD3+BC's ratio of the Q and BC terms, with the BC term scaled up rather than Q down, so
            # the temperature keeps its meaning in reward units for the critic's soft target.
            q_scale = jax.lax.stop_gradient(jnp.mean(jnp.abs(q)))
            loss = loss + self.config.actor_bc_coef * q_scale * bc
            extra = {"actor_bc": bc}
        return loss, (logp, extra)

    # ----------------------------------------------------------------- update

    def update(self, state: SACNState, batch: Transitions, key: jax.Array) -> tuple[SACNState, dict]:
        """One gradient step on critics, actor and temperature, then a Polyak target update."""
        critic_key, actor_key = jax.random.split(key)
        cfg = self.config

        (_, critic_metrics), critic_grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
            state.critic_params, state, batch, critic_key
        )
        updates, critic_opt_state = self.critic_tx.update(critic_grads, state.critic_opt_state)
        critic_params = optax.apply_updates(state.critic_params, updates)

        (actor_loss, (logp, actor_metrics)), actor_grads = jax.value_and_grad(self.actor_loss, has_aux=True)(
            state.actor_params, critic_params, state.log_alpha, batch, actor_key
        )
        updates, actor_opt_state = self.actor_tx.update(actor_grads, state.actor_opt_state)
        actor_params = optax.apply_updates(state.actor_params, updates)

        entropy_gap = jax.lax.stop_gradient(jnp.mean(logp) + self.target_entropy)
        alpha_grad = -entropy_gap  # d/dlog_alpha of -log_alpha * (logp + target_entropy)
        updates, alpha_opt_state = self.alpha_tx.update(alpha_grad, state.alpha_opt_state)
        log_alpha = optax.apply_updates(state.log_alpha, updates)

        target_critic_params = optax.incremental_update(critic_params, state.target_critic_params, cfg.tau)
        new_state = SACNState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=target_critic_params,
            log_alpha=log_alpha,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            alpha_opt_state=alpha_opt_state,
            step=state.step + 1,
        )
        metrics = dict(critic_metrics, **actor_metrics, actor_loss=actor_loss, alpha=jnp.exp(log_alpha),
                       entropy=-jnp.mean(logp))
        return new_state, metrics

    def update_many(self, state: SACNState, batches: Transitions, key: jax.Array) -> tuple[SACNState, dict]:
        """K updates in one `lax.scan` over batches with a leading axis K; metrics averaged over K."""
        keys = jax.random.split(key, batches.reward.shape[0])
        state, metrics = jax.lax.scan(lambda s, xs: self.update(s, *xs), state, (batches, keys))
        return state, jax.tree.map(jnp.mean, metrics)


class SACNAgent:
    """The agent interface of the training loop over one SAC-N core, with model rewards passed through.

    MOPO and RAVL are this with their own defaults; MOPO overrides `model_reward` with its penalty.
    """

    uses_model = True
    uncertainty = "aleatoric_max"  # the measure the rollouts compute (and log)

    def __init__(self, sac: SACNConfig, obs_dim: int, act_dim: int, bc_rows: int | None = None):
        self.core = SACN(sac, obs_dim, act_dim, bc_rows)
        self.batch_size = sac.batch_size

    def init(self, key: jax.Array) -> SACNState:
        return self.core.init(key)

    def update(self, state: SACNState, batch: Transitions, key: jax.Array):
        return self.core.update(state, batch, key)

    def update_many(self, state: SACNState, batches: Transitions, key: jax.Array):
        return self.core.update_many(state, batches, key)

    @staticmethod
    def actor_params(state: SACNState):
        return state.actor_params

    def act(self, actor_params, obs, key, deterministic: bool = False):
        return self.core.act(actor_params, obs, key, deterministic)

    def model_reward(self, reward: jax.Array, uncertainty: jax.Array) -> jax.Array:
        del uncertainty
        return reward
