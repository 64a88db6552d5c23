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
import numpy as np
import optax
from flax import struct

from mbrl.agents.base import scan_updates, static_when_zero, traced, traced_values
from mbrl.agents.networks import CriticEnsemble, ObsScale, anchor_error, gaussian_entropy, scaled
from mbrl.core import checks
from mbrl.core.nn import INITS
from mbrl.core.tanh_gaussian import TanhGaussianActor, sample_tanh_gaussian, tanh_gaussian_mode
from mbrl.core.errors import ConfigError
from mbrl.core.replay import real_count
from mbrl.core.types import Transitions


UPDATE_ORDERS = ("critic_actor_alpha", "alpha_actor_critic")
# `sac.init` -> the network init scheme of `mbrl.core.nn` (which calls EDAC's "corl", after the code it follows).
NETWORK_INITS = dict(zip(("flax", "edac", "torch"), INITS))


@dataclasses.dataclass(frozen=True)
class SACNConfig:
    """The SAC-N core's settings (section `sac`). Defaults: SAC (Haarnoja et al. 2018b, Table 1): 2x256, Adam 3e-4,
    batch 256, gamma 0.99, tau 5e-3.

    num_critics: N critics; the TD target takes the min over N target critics.
    hidden_sizes: hidden layer widths of the actor and each critic.
    actor_lr: Adam learning rate of the actor.
    critic_lr: Adam learning rate of the critics.
    alpha_lr: Adam learning rate of the entropy temperature.
    gamma: discount factor.
    tau: Polyak rate of the target critics.
    batch_size: rows per update (real + model).
    eta: EDAC gradient-diversity weight (0: plain SAC-N, the term and its cost left out).
    target_entropy: entropy target of automatic tuning (default -act_dim).
    init_alpha: initial entropy temperature.
    critic_layer_norm: LayerNorm in each critic's hidden layers (Ball et al. 2023: it bounds Q on inputs far from
        the data, where plain MLPs extrapolate without limit).
    actor_bc_coef: weight of a BC term on the real rows in the actor loss, times the batch's mean |Q|, as in
        TD3+BC and Unifloral's model-based ReBRAC (TD3+BC's alpha 2.5 is 0.4 here; 0: off).
    update_order: critic_actor_alpha, or alpha_actor_critic as edge-of-reach's agent.py.
    init: flax (Flax defaults), edac (CORL/edge-of-reach: bias 0.1, small last layers) or torch (nn.Linear's).
    logp_epsilon: 0: exact tanh log-probability; > 0: log(1 - tanh^2 + eps) as the references (1e-6).
    alpha_max: clamp the temperature to at most this (OfflineRL-Kit: 1.0); empty: no clamp.
    """

    num_critics: int = 2
    hidden_sizes: Sequence[int] = (256, 256)
    actor_lr: float = traced(3e-4)
    critic_lr: float = traced(3e-4)
    alpha_lr: float = traced(3e-4)
    gamma: float = traced(0.99)
    tau: float = traced(5e-3)
    batch_size: int = 256
    eta: float = static_when_zero(0.0)
    target_entropy: float | None = None  # None: -act_dim
    init_alpha: float = traced(1.0)
    critic_layer_norm: bool = False
    actor_bc_coef: float = static_when_zero(0.0)
    # Static options for matching reference code: edge-of-reach agent_training/agent.py Agent.update
    # (alpha_actor_critic), its Actor/VectorizedCritic (edac), OfflineRL-Kit's nn.Linear (torch), the references'
    # log(1 - tanh^2 + eps) (1e-6), OfflineRL-Kit policy/model_free/sac.py's clamp (1.0).
    update_order: str = "critic_actor_alpha"
    init: str = "flax"
    logp_epsilon: float = 0.0
    alpha_max: float | None = None

    def __post_init__(self):
        checks.positive_ints("sac", self, "num_critics", "batch_size")
        checks.widths("sac", self.hidden_sizes)
        checks.positive("sac", self, "actor_lr", "critic_lr", "alpha_lr", "init_alpha")
        checks.rates("sac", self, "gamma", "tau")
        checks.non_negative("sac", self, "actor_bc_coef", "eta", "logp_epsilon")
        if self.eta > 0 and self.num_critics < 2:
            raise ConfigError(f"sac.eta: the EDAC term (eta={self.eta}) needs sac.num_critics >= 2, found {self.num_critics}")
        if self.update_order not in UPDATE_ORDERS:
            raise ConfigError(f"sac.update_order: expected one of {UPDATE_ORDERS}, found {self.update_order!r}")
        if self.init not in NETWORK_INITS:
            raise ConfigError(f"sac.init: expected one of {tuple(NETWORK_INITS)}, found {self.init!r}")
        if self.alpha_max is not None and not self.alpha_max > 0:
            raise ConfigError(f"sac.alpha_max: expected a value > 0 or None, found {self.alpha_max}")

    def hypers(self) -> dict[str, jax.Array]:
        """The values `SACN` reads as traced data (the fields marked `traced` or `static_when_zero`)."""
        return traced_values(self)


def real_rows(config) -> int:
    """The leading real rows of every mixed batch of a run's config (the BC anchor imitates these)."""
    return real_count(config.sac.batch_size, config.imagination.real_ratio)


def sac_rules(config) -> dict:
    """The rules of the `sac` section across sections, for the algorithms that train SAC-N on imagined data."""
    if config.sac.actor_bc_coef > 0 and real_rows(config) == 0:
        raise ConfigError(
            f"sac.actor_bc_coef: the BC term imitates the real rows of each batch, but imagination.real_ratio "
            f"{config.imagination.real_ratio} of batch {config.sac.batch_size} gives none")
    return {}


def narrow_action_notice(target: float, actions, option: str = "--sac.target-entropy") -> str | None:
    """A one-line note when the data's actions have less entropy (a Gaussian fitted per dimension) than the `target`
    entropy the temperature is tuned towards: the temperature then grows until the actor's actions leave the data's,
    as on Simglucose, whose insulin sits against its lower bound (docs/findings.md). None otherwise. `option` is the
    command-line option that sets the target."""
    actions = np.asarray(actions, dtype=np.float64)
    data_entropy = float(gaussian_entropy(jnp.log(np.maximum(actions.std(axis=0), 1e-6))))
    if data_entropy >= target:
        return None
    return (f"note: the data's actions have entropy {data_entropy:.2f} (a Gaussian per dimension), below SAC's target "
            f"entropy {target:g}; the temperature will push the actor away from them (docs/findings.md, Simglucose). "
            f"{option} below {data_entropy:.2f} keeps it near them")


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


def sac_tail(state, tau, actor_params, actor_opt_state, critic_params, critic_opt_state, log_alpha, alpha_opt_state):
    """The end of every SAC update (SAC-N's, NEUBAY's): `state` with the stepped actor, critics and temperature, the
    target critics moved towards the new critics by Polyak rate `tau`, and one more step. `state` is any state with
    `SACNState`'s fields (`NeubayState`); its type is kept."""
    return state.replace(
        actor_params=actor_params,
        critic_params=critic_params,
        target_critic_params=optax.incremental_update(critic_params, state.target_critic_params, tau),
        log_alpha=log_alpha,
        actor_opt_state=actor_opt_state,
        critic_opt_state=critic_opt_state,
        alpha_opt_state=alpha_opt_state,
        step=state.step + 1,
    )


def edac_diversity(action_grads: jax.Array) -> jax.Array:
    """EDAC's ensemble-diversity loss from per-member action-gradients of shape (N, batch, act_dim).

    Mean over the batch of the sum of off-diagonal cosine similarities, divided by N-1.
    """
    num = action_grads.shape[0]
    # The norm's own gradient is 0/0 at an exactly zero action-gradient (a member whose ReLU paths from the action are
    # all off); `where` keeps it at 0 there and the values elsewhere unchanged.
    nonzero = jnp.any(action_grads != 0, axis=-1, keepdims=True)
    norm = jnp.where(nonzero, jnp.linalg.norm(jnp.where(nonzero, action_grads, 1.0), axis=-1, keepdims=True), 0.0)
    unit = action_grads / (norm + 1e-10)
    cosine = jnp.einsum("nba,mba->bnm", unit, unit)
    off_diagonal = cosine * (1.0 - jnp.eye(num, dtype=cosine.dtype))
    return jnp.mean(jnp.sum(off_diagonal, axis=(1, 2))) / (num - 1)


class SACN:
    """Networks, optimizers and the pure functions `init`, `update`, `update_many`, `act`."""

    def __init__(self, config: SACNConfig, obs_dim: int, act_dim: int, bc_rows: int | None = None,
                 obs_scale: ObsScale | None = None):
        """`bc_rows`: the leading rows of every batch whose actions the BC term imitates (the real
        data of a mixed batch); None means all rows. Which terms exist (EDAC, BC) is static: a value of
        0 in the config leaves the term out of the program; otherwise its weight is traced data.
        `obs_scale`: the observations' standardisation inside the actor and critics (None: raw observations)."""
        self.config = config
        self.bc_rows = bc_rows
        self.obs_scale = obs_scale
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.use_edac = config.eta > 0
        self.use_bc = config.actor_bc_coef > 0
        init = NETWORK_INITS[config.init]
        self.actor = scaled(TanhGaussianActor(tuple(config.hidden_sizes), act_dim, init), obs_scale)
        self.critic = scaled(CriticEnsemble(config.hidden_sizes, config.num_critics, config.critic_layer_norm, init),
                             obs_scale)
        # Adam's direction only: the learning rate is traced data (`hypers`), applied in `_step`.
        self.tx = optax.scale_by_adam()
        self.target_entropy = float(-act_dim if config.target_entropy is None else config.target_entropy)

    def hypers(self) -> dict[str, jax.Array]:
        return self.config.hypers()

    def _step(self, params, grads, opt_state, lr):
        direction, opt_state = self.tx.update(grads, opt_state)
        return jax.tree.map(lambda p, d: p - lr * d, params, direction), opt_state

    def alpha(self, log_alpha):
        """The temperature every loss uses: exp(log_alpha), at most `alpha_max` (log_alpha itself is not clamped)."""
        alpha = jnp.exp(log_alpha)
        return alpha if self.config.alpha_max is None else jnp.minimum(alpha, self.config.alpha_max)

    # ----------------------------------------------------------------- init / act

    def init(self, key: jax.Array, hypers: dict) -> SACNState:
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, self.obs_dim), jnp.float32)
        action = jnp.zeros((1, self.act_dim), jnp.float32)
        actor_params = self.actor.init(actor_key, obs)
        critic_params = self.critic.init(critic_key, obs, action)
        log_alpha = jnp.log(jnp.asarray(hypers["init_alpha"], jnp.float32))
        return SACNState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=jax.tree.map(jnp.copy, critic_params),  # distinct buffers (donation)
            log_alpha=log_alpha,
            actor_opt_state=self.tx.init(actor_params),
            critic_opt_state=self.tx.init(critic_params),
            alpha_opt_state=self.tx.init(log_alpha),
            step=jnp.zeros((), jnp.int32),
        )

    def act(self, actor_params, obs, key, deterministic: bool = False):
        """Actions in [-1, 1] for a batch (or a single) observation; `deterministic` is tanh(mean)."""
        mean, log_std = self.actor.apply(actor_params, obs)
        if deterministic:
            return tanh_gaussian_mode(mean)
        action, _ = sample_tanh_gaussian(mean, log_std, key)
        return action

    def sample(self, actor_params, obs, key):
        mean, log_std = self.actor.apply(actor_params, obs)
        return sample_tanh_gaussian(mean, log_std, key, self.config.logp_epsilon)

    # ----------------------------------------------------------------- losses

    def td_target(self, state: SACNState, batch: Transitions, key, hypers: dict) -> jax.Array:
        """The soft TD target r + gamma (1 - terminal) (min_i Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(s')."""
        next_action, next_logp = self.sample(state.actor_params, batch.next_obs, key)
        next_q = self.critic.apply(state.target_critic_params, batch.next_obs, next_action)
        alpha = self.alpha(state.log_alpha)
        next_v = jnp.min(next_q, axis=0) - alpha * next_logp
        not_done = 1.0 - batch.terminal.astype(jnp.float32)
        return jax.lax.stop_gradient(batch.reward + hypers["gamma"] * not_done * next_v)

    def critic_loss(self, critic_params, state: SACNState, batch: Transitions, key, hypers: dict):
        """Sum over members of the mean squared TD error, plus eta * the EDAC diversity term."""
        target = self.td_target(state, batch, key, hypers)
        q = self.critic.apply(critic_params, batch.obs, batch.action)
        td_loss = jnp.sum(jnp.mean((q - target[None]) ** 2, axis=1))
        metrics = {"critic_loss": td_loss, "q_mean": jnp.mean(q), "target_mean": jnp.mean(target)}
        loss = td_loss
        if self.use_edac:
            diversity = edac_diversity(self.action_gradients(critic_params, batch.obs, batch.action))
            loss = loss + hypers["eta"] * diversity
            metrics["edac_diversity"] = diversity
        return loss, metrics

    def action_gradients(self, critic_params, obs, action):
        """dQ_i/da for every member i at the given (obs, action): (N, batch, act_dim)."""

        def member_grad(member_params):
            return jax.grad(lambda a: jnp.sum(self.critic.apply_member(member_params, obs, a)))(action)

        return jax.vmap(member_grad)(critic_params)

    def actor_loss(self, actor_params, critic_params, log_alpha, batch: Transitions, key, hypers: dict,
                   anchor_params=None):
        """`anchor_params`: a frozen actor whose deterministic actions the BC term imitates on every row, instead
        of the batch's actions on its leading `bc_rows` (fine-tuning's anchor to the warm-start policy)."""
        mean, log_std = self.actor.apply(actor_params, batch.obs)
        action, logp = sample_tanh_gaussian(mean, log_std, key, self.config.logp_epsilon)
        q = jnp.min(self.critic.apply(critic_params, batch.obs, action), axis=0)
        alpha = self.alpha(log_alpha)
        loss = jnp.mean(alpha * logp - q)
        extra = {}
        if self.use_bc:
            if anchor_params is None:
                rows = slice(None, self.bc_rows)
                bc = anchor_error(mean[rows], batch.action[rows])
            else:
                target = jnp.tanh(self.actor.apply(anchor_params, batch.obs)[0])
                bc = anchor_error(mean, jax.lax.stop_gradient(target))
            # TD3+BC's ratio of the Q and BC terms, with the BC term scaled up rather than Q down, so
            # the temperature keeps its meaning in reward units for the critic's soft target.
            q_scale = jax.lax.stop_gradient(jnp.mean(jnp.abs(q)))
            loss = loss + hypers["actor_bc_coef"] * q_scale * bc
            extra = {"actor_bc": bc}
        return loss, (logp, extra)

    # ----------------------------------------------------------------- update

    def update(self, state: SACNState, batch: Transitions, key: jax.Array, hypers: dict,
               anchor_params=None) -> tuple[SACNState, dict]:
        """One gradient step on critics, actor and temperature in `config.update_order`, then a Polyak target update.

        "critic_actor_alpha": the actor steps against the updated critics, the temperature on the actor loss's
        log-probs. "alpha_actor_critic": the temperature steps on a sample of the current actor, the actor against
        the current critics with the new temperature, the critics towards a target from the updated actor.
        """

        def critic_step(actor_params, log_alpha, key):
            (_, metrics), grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
                state.critic_params, state.replace(actor_params=actor_params, log_alpha=log_alpha), batch, key, hypers
            )
            params, opt_state = self._step(state.critic_params, grads, state.critic_opt_state, hypers["critic_lr"])
            return params, opt_state, metrics

        def actor_step(critic_params, log_alpha, key):
            (loss, (logp, metrics)), grads = jax.value_and_grad(self.actor_loss, has_aux=True)(
                state.actor_params, critic_params, log_alpha, batch, key, hypers, anchor_params
            )
            params, opt_state = self._step(state.actor_params, grads, state.actor_opt_state, hypers["actor_lr"])
            return params, opt_state, loss, logp, metrics

        def alpha_step(logp):
            entropy_gap = jax.lax.stop_gradient(jnp.mean(logp) + self.target_entropy)
            alpha_grad = -entropy_gap  # d/dlog_alpha of -log_alpha * (logp + target_entropy)
            return self._step(state.log_alpha, alpha_grad, state.alpha_opt_state, hypers["alpha_lr"])

        if self.config.update_order == "critic_actor_alpha":
            critic_key, actor_key = jax.random.split(key)
            critic_params, critic_opt_state, critic_metrics = critic_step(state.actor_params, state.log_alpha, critic_key)
            actor_params, actor_opt_state, actor_loss, logp, actor_metrics = actor_step(critic_params, state.log_alpha,
                                                                                        actor_key)
            log_alpha, alpha_opt_state = alpha_step(logp)
        else:  # "alpha_actor_critic"
            critic_key, actor_key, alpha_key = jax.random.split(key, 3)
            log_alpha, alpha_opt_state = alpha_step(self.sample(state.actor_params, batch.obs, alpha_key)[1])
            actor_params, actor_opt_state, actor_loss, logp, actor_metrics = actor_step(state.critic_params, log_alpha,
                                                                                        actor_key)
            critic_params, critic_opt_state, critic_metrics = critic_step(actor_params, log_alpha, critic_key)

        new_state = sac_tail(state, hypers["tau"], actor_params, actor_opt_state, critic_params, critic_opt_state,
                             log_alpha, alpha_opt_state)
        metrics = dict(critic_metrics, **actor_metrics, actor_loss=actor_loss, alpha=self.alpha(log_alpha),
                       entropy=-jnp.mean(logp))
        return new_state, metrics

    def update_many(self, state: SACNState, batches: Transitions, key: jax.Array,
                    hypers: dict, anchor_params=None) -> tuple[SACNState, dict]:
        """K updates in one `lax.scan` over batches with a leading axis K; metrics averaged over K."""
        return scan_updates(lambda s, b, k: self.update(s, b, k, hypers, anchor_params), state, batches, key)


class SACNAgent:
    """`mbrl.agents.base.TransitionLearner` over one SAC-N core, with model rewards passed through.

    MOPO and RAVL are this with their own defaults; MOPO overrides `model_reward` with its penalty.
    """

    imagination = "transitions"
    recurrent = False
    uncertainty = "aleatoric_max"  # the measure the rollouts compute (and log)

    def __init__(self, sac: SACNConfig, obs_dim: int, act_dim: int, bc_rows: int | None = None,
                 obs_scale: ObsScale | None = None):
        self.core = SACN(sac, obs_dim, act_dim, bc_rows, obs_scale)
        self.batch_size = sac.batch_size
        self.obs_dim, self.act_dim = obs_dim, act_dim

    def init(self, key: jax.Array, hypers: dict) -> SACNState:
        return self.core.init(key, hypers["sac"])

    def data_notice(self, actions) -> str | None:
        """`mbrl.agents.base.DataNoticer`: whether the temperature's target entropy is out of the data's reach."""
        return narrow_action_notice(self.core.target_entropy, actions)

    def update_many(self, state: SACNState, batches: Transitions, key: jax.Array, hypers: dict):
        return self.core.update_many(state, batches, key, hypers["sac"])

    @staticmethod
    def actor_params(state: SACNState):
        return state.actor_params

    def initial_carry(self, batch: int):
        return ()

    def act(self, actor_params, carry, inputs, key, deterministic: bool = False):
        return self.core.act(actor_params, inputs.obs, key, deterministic), carry

    def model_reward(self, hypers, reward: jax.Array, uncertainty: jax.Array) -> jax.Array:
        del hypers, uncertainty
        return reward

    # Capabilities (`mbrl.agents.base.CriticJudge`, `OnlineFinetuner`)

    def critic_values(self, agent_state: SACNState, obs, action):
        return self.core.critic.apply(agent_state.critic_params, obs, action)

    def critic_gamma(self) -> float:
        return self.core.config.gamma

    def heldout_td_error(self, agent_state: SACNState, batch: Transitions, key, hypers):
        _, metrics = self.core.critic_loss(agent_state.critic_params, agent_state, batch, key, hypers["sac"])
        return metrics["critic_loss"] / self.core.config.num_critics  # the TD part, without EDAC's diversity term

    def offline_anchor(self) -> float:
        return float(self.core.config.actor_bc_coef)

    def online_learner(self, settings, obs_scale):
        """Online SAC-N on these networks, without the EDAC term (WSRL's online phase is plain SAC); a BC anchor of
        weight `settings.anchor` towards the frozen warm-start policy."""
        from mbrl.agents.sac import (  # local: mbrl.agents.sac imports this module
            OnlineSAC,
            SACConfig,
        )

        offline = self.core.config
        sacn = dataclasses.replace(offline, actor_bc_coef=settings.anchor, eta=0.0)
        config = SACConfig(sacn=sacn, buffer_capacity=settings.capacity, warmup_steps=settings.warmup,
                           chunk_steps=settings.chunk_steps, utd=settings.utd,
                           offline_rows=real_count(offline.batch_size, settings.retain_offline_ratio))
        return OnlineSAC(config, self.obs_dim, self.act_dim, obs_scale)
