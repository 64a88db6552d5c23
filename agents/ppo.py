"""PPO (Schulman et al. 2017) on imagined on-policy rollouts: the learner of MOPO-PPO.

The recipe and its defaults follow rsl_rl (leggedrobotics/rsl_rl, `rsl_rl/algorithms/ppo.py` and
`config/example_config.yaml`): separate actor and critic MLPs (3x256 ELU), a state-independent learned
noise, GAE(0.99, 0.95), 5 epochs of 4 minibatches per iteration, the clipped surrogate (0.2) and clipped
value loss (coefficient 1.0), Adam at 1e-3 with the adaptive-KL schedule (desired KL 0.01), global-norm
clipping at 1.0 and advantages normalised over the whole batch.

Deliberate differences from rsl_rl:
- The policy is a tanh-squashed Gaussian, a = tanh(u), u ~ N(mean(s), exp(log_std)): a world model is
  stepped with the actions, so they must stay in [-1, 1]. A stored action is scored by the Gaussian sample u it
  came from (`explore` returns it, the rollout records it), not by inverting the tanh: float32 rounds tanh(u) to 1
  from |u| = 9 on, and an inverted saturated action reads as u = 7.25 wherever the mean is. The entropy bonus and
  the KL of the adaptive schedule are the Gaussian's, in closed form (as rsl_rl's).
- GAE is computed per trajectory over the (H, B) rollout with its masks: a terminal stops the bootstrap, a
  timeout (or the end of the valid rows) bootstraps with V(next_obs) and cuts the recursion. rsl_rl instead
  folds gamma * V(obs) into the reward at a timeout.
- Padding rows (invalid steps of the rollout) carry weight 0 in every mean (statistics and losses).
- The observation normaliser (rsl_rl's `EmpiricalNormalization`: a count-weighted running mean/var,
  normalising with (x - mean) / (std + 0.01)) is updated once per iteration in `prepare` on the valid
  observations, lives in the state and is part of `actor_params`, so an exported policy has it baked in.
  The critic reads the normalised observations too. Normalised observations are not clipped.

One iteration, as the training program drives it (`mbrl.imagination.OnPolicyImagination`):
    _, batch, m = ppo.prepare(state, rollout.transitions, rollout.valid, hypers, rollout.policy_carry)  # H*B rows
    state, m = ppo.update_many(state, ppo.minibatches(batch, key), key, hypers)   # K = epochs * minibatches
The batch carries the updated normaliser, which `update_many` adopts.
Everything is pure and static in its config, so `prepare` and `update_many` jit and vmap over a population.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from mbrl.agents.base import traced, traced_values
from mbrl.agents.networks import gaussian_entropy, masked_mean
from mbrl.core.tanh_gaussian import tanh_gaussian_log_prob, tanh_gaussian_log_prob_of_sample, tanh_gaussian_mode
from mbrl.core.errors import ConfigError
from mbrl.core.nn import ACTIVATIONS, MLP
from mbrl.core.types import PolicyInput, Transitions

SCHEDULES = ("adaptive", "fixed")

# rsl_rl ppo.py `update`: the adaptive schedule's factor and the bounds it clamps the rate to.
LR_FACTOR = 1.5
LR_MIN, LR_MAX = 1e-5, 1e-2
NORMALIZER_EPS = 1e-2  # rsl_rl EmpiricalNormalization's eps: (x - mean) / (std + eps)
ADVANTAGE_EPS = 1e-8  # rsl_rl compute_returns: (A - mean) / (std + 1e-8)
LOG_RATIO_BOUND = 20.0  # |log pi/pi_old| above this counts as this (e^20: far outside any clip)
DEMO_ACTION_BOUND = 1.0 - 1e-3  # |a| of a dataset action the cloning phase fits (atanh 3.8)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO's settings (defaults: rsl_rl algorithms/ppo.py and config/example_config.yaml).

    hidden_sizes: hidden layer widths of the actor and of the critic (separate networks)
    activation: activation of the hidden layers (one of mbrl.core.nn.ACTIVATIONS)
    learning_rate: Adam's initial learning rate (the adaptive schedule changes it)
    learning_epochs: passes over each iteration's rollout
    minibatches: minibatches per pass; the rollout's rows must divide into them
    clip: PPO's ratio clip, also the value clip
    clip_value_loss: clip the value prediction around the old value (the max of both squared errors)
    value_loss_coef: weight of the value loss
    entropy_coef: weight of the entropy bonus (of the pre-tanh Gaussian); rsl_rl's example config has 0.01
    gamma: discount factor
    lam: GAE's lambda
    desired_kl: the KL the adaptive schedule aims at (lr / 1.5 above twice it, lr * 1.5 below half of it)
    schedule: "adaptive" (KL-driven learning rate in [1e-5, 1e-2]) or "fixed"
    max_grad_norm: global-norm clip of the gradients of actor, critic and noise together
    init_noise_std: initial standard deviation of the Gaussian before the tanh
    normalize_obs: normalise observations with running statistics of the imagined rollouts
    bc_init_iterations: the first this many iterations fit the actor's mean and noise to the dataset's actions by
        maximum likelihood (behaviour cloning, at the initial learning rate) instead of PPO's surrogate, so that PPO
        starts from the data's policy, where the model's rollouts are trustworthy (BPPO, Zhuang et al. 2023, starts
        PPO from BC); the critic learns from the imagined rollouts all along. 0: PPO from a random policy (rsl_rl)
    bc_coef: after that phase, this weight times the same negative log-likelihood joins PPO's loss (an anchor to the
        data's actions, as the SAC-based agents' quick presets have). 0: none
    """

    hidden_sizes: tuple[int, ...] = (256, 256, 256)
    activation: str = "elu"
    learning_rate: float = traced(1e-3)  # the initial rate: the adaptive schedule carries the current one in PPOState
    learning_epochs: int = 5
    minibatches: int = 4
    clip: float = traced(0.2)
    clip_value_loss: bool = True
    value_loss_coef: float = traced(1.0)
    entropy_coef: float = traced(0.005)
    gamma: float = traced(0.99)
    lam: float = traced(0.95)
    desired_kl: float = traced(0.01)
    schedule: str = "adaptive"
    max_grad_norm: float = 1.0
    init_noise_std: float = 1.0
    normalize_obs: bool = True
    bc_init_iterations: int = 0
    bc_coef: float = 0.0

    def __post_init__(self):
        def fail(name, expected):
            raise ConfigError(f"ppo.{name}: expected {expected}, found {getattr(self, name)!r}")

        def is_int(value):
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        def is_number(value):
            return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)

        sizes = self.hidden_sizes
        if not isinstance(sizes, (tuple, list)) or not sizes or not all(is_int(w) and w > 0 for w in sizes):
            fail("hidden_sizes", "a non-empty tuple of positive ints")
        object.__setattr__(self, "hidden_sizes", tuple(int(w) for w in sizes))
        if self.activation not in ACTIVATIONS:
            fail("activation", f"one of {sorted(ACTIVATIONS)}")
        if self.schedule not in SCHEDULES:
            fail("schedule", f"one of {SCHEDULES}")
        for name in ("learning_epochs", "minibatches"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                fail(name, "a positive int")
        if not is_int(self.bc_init_iterations) or self.bc_init_iterations < 0:
            fail("bc_init_iterations", "an int >= 0")
        for name in ("clip_value_loss", "normalize_obs"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "a bool")
        for name in ("learning_rate", "clip", "desired_kl", "max_grad_norm", "init_noise_std"):
            if not is_number(getattr(self, name)) or not getattr(self, name) > 0:
                fail(name, "a finite number > 0")
        for name in ("value_loss_coef", "entropy_coef", "bc_coef"):
            if not is_number(getattr(self, name)) or not getattr(self, name) >= 0:
                fail(name, "a finite number >= 0")
        if not is_number(self.gamma) or not 0.0 < self.gamma <= 1.0:
            fail("gamma", "a number in (0, 1]")
        if not is_number(self.lam) or not 0.0 <= self.lam <= 1.0:
            fail("lam", "a number in [0, 1]")

    @property
    def updates_per_iteration(self) -> int:
        return self.learning_epochs * self.minibatches

    def hypers(self) -> dict[str, jax.Array]:
        """The values `PPO` reads as traced data (the fields marked `traced`)."""
        return traced_values(self)


@struct.dataclass
class ObsNormalizer:
    """Running mean and variance of observations, merged batch by batch with weights (rsl_rl
    EmpiricalNormalization's update; a first update from count 0 takes the batch's statistics)."""

    mean: jax.Array  # (D,)
    var: jax.Array  # (D,), population variance
    count: jax.Array  # () float32, the total weight seen

    @classmethod
    def create(cls, dim: int) -> ObsNormalizer:
        return cls(jnp.zeros(dim, jnp.float32), jnp.ones(dim, jnp.float32), jnp.zeros((), jnp.float32))

    def update(self, obs: jax.Array, weights: jax.Array | None = None) -> ObsNormalizer:
        """Merge the weighted rows of `obs` (N, D); rows of weight 0 are ignored (they may hold anything)."""
        weights = jnp.ones(obs.shape[0], jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
        obs = jnp.where(weights[:, None] > 0, obs, 0.0)
        total = jnp.sum(weights)
        batch_mean = jnp.sum(weights[:, None] * obs, axis=0) / jnp.maximum(total, 1e-12)
        batch_var = jnp.sum(weights[:, None] * (obs - batch_mean) ** 2, axis=0) / jnp.maximum(total, 1e-12)
        count = self.count + total
        rate = jnp.where(count > 0, total / jnp.maximum(count, 1e-12), 0.0)
        delta = batch_mean - self.mean
        mean = self.mean + rate * delta
        # rsl_rl's var + rate (batch_var - var + delta (batch_mean - mean)), rearranged: its last term is
        # delta^2 (1 - rate) exactly, but computed from batch_mean - mean it cancels, and a dimension constant at
        # 339 (Simglucose) came out at -4e-4, whose square root is NaN. This form cannot go below 0.
        var = (1.0 - rate) * self.var + rate * batch_var + rate * (1.0 - rate) * delta**2
        return ObsNormalizer(mean, var, count)

    def normalize(self, obs: jax.Array) -> jax.Array:
        return (obs - self.mean) / (jnp.sqrt(self.var) + NORMALIZER_EPS)


@struct.dataclass
class PPOPolicy:
    """What acting needs (`PPO.actor_params`): the normaliser, the actor's parameters and the noise."""

    obs_norm: ObsNormalizer
    actor: Any
    log_std: jax.Array  # (act_dim,)


@struct.dataclass
class PPOState:
    actor: Any
    critic: Any
    log_std: jax.Array  # (act_dim,), state-independent
    opt_state: Any  # one Adam over {"actor", "critic", "log_std"}, as rsl_rl's one optimizer
    obs_norm: ObsNormalizer
    learning_rate: jax.Array  # () float32, the rate the adaptive schedule has reached
    steps: jax.Array  # () int32, gradient steps taken


@struct.dataclass
class PPOBatch:
    """One iteration's rollout as N = H*B rows (time-major flattening). `obs` is raw: `update_many`
    normalises it with the state's normaliser, the one `prepare` computed the old quantities with."""

    obs: jax.Array  # (N, obs_dim)
    sample: jax.Array  # (N, act_dim), the Gaussian sample u of the action tanh(u)
    old_log_prob: jax.Array  # (N,)
    old_mean: jax.Array  # (N, act_dim), the Gaussian's mean before the tanh
    old_log_std: jax.Array  # (N, act_dim)
    old_value: jax.Array  # (N,)
    advantage: jax.Array  # (N,), normalised over the valid rows, 0 on padding
    returns: jax.Array  # (N,), GAE return (raw advantage + V), 0 on padding
    weight: jax.Array  # (N,) float32: 1 valid, 0 padding
    obs_norm: Any = None  # the normaliser the old quantities were computed with (`update_many` adopts it)
    demo_obs: jax.Array | None = None  # (N, obs_dim) raw dataset observations for the BC phase, or None
    demo_action: jax.Array | None = None  # (N, act_dim) the dataset's actions there


@struct.dataclass
class PPOMinibatches:
    rows: PPOBatch  # (N, ...), once (not repeated per update)
    index: jax.Array  # (K, N // minibatches) int32 row indices, K = learning_epochs * minibatches


def gaussian_kl(old_mean, old_log_std, mean, log_std):
    """KL(old || new) of diagonal Gaussians, summed over the last axis (rsl_rl's adaptive-schedule KL)."""
    var_ratio = jnp.exp(2.0 * (old_log_std - log_std))
    mean_term = (old_mean - mean) ** 2 * jnp.exp(-2.0 * log_std)
    return jnp.sum(log_std - old_log_std + 0.5 * (var_ratio + mean_term) - 0.5, axis=-1)


def adapt_learning_rate(learning_rate, kl, desired_kl):
    """rsl_rl ppo.py `update`: kl > 2 desired -> lr / 1.5 (at least 1e-5); 0 < kl < desired / 2 ->
    lr * 1.5 (at most 1e-2); otherwise unchanged."""
    lower = jnp.maximum(LR_MIN, learning_rate / LR_FACTOR)
    higher = jnp.minimum(LR_MAX, learning_rate * LR_FACTOR)
    return jnp.where(kl > 2.0 * desired_kl, lower, jnp.where((kl < desired_kl / 2.0) & (kl > 0.0), higher, learning_rate))


def gae(reward, value, next_value, terminal, timeout, valid, gamma, lam):
    """Generalised advantage estimates over time-major (H, ...) arrays, per trajectory.

    delta_t = r_t + gamma V(next_obs_t) (1 - terminal_t) - V(obs_t);
    A_t = delta_t + gamma lam (1 - end_t) A_{t+1}, end_t = terminal_t | timeout_t | ~valid_{t+1}
    (valid_H = False); A_t = 0 where ~valid_t. Non-finite values on invalid rows do not leak.
    """
    valid = jnp.asarray(valid, bool)
    next_valid = jnp.concatenate([valid[1:], jnp.zeros_like(valid[:1])], axis=0)
    terminal = jnp.asarray(terminal, bool)
    end = terminal | jnp.asarray(timeout, bool) | ~next_valid
    bootstrap = jnp.where(terminal, 0.0, next_value)
    delta = jnp.where(valid, reward + gamma * bootstrap - value, 0.0)

    def step(next_advantage, xs):
        d, e, v = xs
        advantage = jnp.where(v, d + jnp.where(e, 0.0, gamma * lam * next_advantage), 0.0)
        return advantage, advantage

    _, advantage = jax.lax.scan(step, jnp.zeros_like(delta[0]), (delta, end, valid), reverse=True)
    return advantage


class PPO:
    """`mbrl.agents.base.Algorithm` on on-policy imagined rollouts: `prepare` turns a rollout into a batch,
    `minibatches` shuffles it, `update_many` takes K = learning_epochs * minibatches steps on it."""

    imagination = "onpolicy"
    recurrent = False

    def __init__(self, config: PPOConfig, obs_dim: int, act_dim: int):
        self.config = config
        self.updates_per_iteration = config.updates_per_iteration
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.actor = MLP(config.hidden_sizes, act_dim, config.activation)
        self.critic = MLP(config.hidden_sizes, 1, config.activation)
        # Adam's direction after global-norm clipping; the (adapted) learning rate is traced state.
        self.tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.scale_by_adam())

    def hypers(self) -> dict[str, dict[str, jax.Array]]:
        return {"ppo": self.config.hypers()}

    def _normalize(self, obs_norm: ObsNormalizer, obs):
        return obs_norm.normalize(obs) if self.config.normalize_obs else obs

    # ----------------------------------------------------------------- init / act

    def init(self, key: jax.Array, hypers: dict) -> PPOState:
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, self.obs_dim), jnp.float32)
        params = {
            "actor": self.actor.init(actor_key, obs),
            "critic": self.critic.init(critic_key, obs),
            "log_std": jnp.full(self.act_dim, math.log(self.config.init_noise_std), jnp.float32),
        }
        return PPOState(
            actor=params["actor"],
            critic=params["critic"],
            log_std=params["log_std"],
            opt_state=self.tx.init(params),
            obs_norm=ObsNormalizer.create(self.obs_dim),
            learning_rate=jnp.asarray(hypers["ppo"]["learning_rate"], jnp.float32),
            steps=jnp.zeros((), jnp.int32),
        )

    @staticmethod
    def actor_params(state: PPOState) -> PPOPolicy:
        return PPOPolicy(state.obs_norm, state.actor, state.log_std)

    def initial_carry(self, batch: int):
        return ()

    def act(self, actor_params: PPOPolicy, carry, inputs: PolicyInput, key, deterministic: bool = False):
        """tanh(u), u ~ N(mean(s), exp(log_std)), in [-1, 1]; `deterministic`: tanh(mean(s))."""
        if deterministic:
            return tanh_gaussian_mode(self._mean(actor_params, inputs.obs)), carry
        return self.explore(actor_params, inputs, key)[0], carry

    def explore(self, actor_params: PPOPolicy, inputs: PolicyInput, key):
        """A sampled action a = tanh(u) and its Gaussian sample u, which `prepare` scores it by."""
        mean = self._mean(actor_params, inputs.obs)
        sample = mean + jnp.exp(actor_params.log_std) * jax.random.normal(key, mean.shape, mean.dtype)
        return jnp.tanh(sample), sample

    def _mean(self, actor_params: PPOPolicy, obs):
        return self.actor.apply(actor_params.actor, self._normalize(actor_params.obs_norm, obs))

    def value(self, state: PPOState, obs) -> jax.Array:
        return self.critic.apply(state.critic, self._normalize(state.obs_norm, obs))[..., 0]

    # ----------------------------------------------------------------- rollout -> batch

    @property
    def demonstrations(self) -> bool:
        """Whether `prepare` wants dataset rows (`demonstrations=`) for its behaviour-cloning phase."""
        return self.config.bc_init_iterations > 0 or self.config.bc_coef > 0

    def prepare(self, state: PPOState, rollout: Transitions, valid, hypers: dict, samples, demonstrations=None):
        """rollout: time-major Transitions (H, B, ...) as mbrl.world_models.rollout returns them (reward already
        penalised by the caller), valid (H, B) bool, samples (H, B, act_dim) the Gaussian samples u of the actions
        (`explore`; the rollout's `policy_carry`). 1) update the obs normaliser with the valid obs (if
        normalize_obs); 2) with the updated normaliser compute old mean/log_std/log_prob of the stored
        actions and V(obs), V(next_obs); 3) GAE over time, per trajectory (`gae`); invalid rows get A = 0
        and weight 0; returns = A + V(obs); 4) normalise advantages over valid rows; 5) flatten to H*B rows.

        demonstrations: (obs, action) dataset rows, N of them, for the behaviour-cloning phase (`demonstrations`).

        Returns (state with the updated normaliser, PPOBatch, metrics: reward_mean, value_mean,
        return_mean over valid rows, valid_fraction)."""
        hp = hypers["ppo"]
        valid = jnp.asarray(valid, bool)
        rows = valid.size
        shape = valid.shape

        def flat(x):
            return x.reshape(rows, *x.shape[valid.ndim:])

        weight = flat(valid).astype(jnp.float32)
        keep = weight[:, None] > 0
        raw_obs = flat(rollout.obs)
        obs_norm = state.obs_norm.update(raw_obs, weight) if self.config.normalize_obs else state.obs_norm
        state = state.replace(obs_norm=obs_norm)
        # Padding rows may hold anything (a cut step's non-finite prediction). They take the normaliser's mean,
        # which it maps to 0: any other value, in a dimension constant over the valid rows, would reach the
        # networks scaled by 1 / eps, and its weight-0 loss terms would overflow to NaN all the same.
        obs = jnp.where(keep, raw_obs, obs_norm.mean)
        next_obs = jnp.where(keep, flat(rollout.next_obs), obs)
        sample = jnp.where(keep, flat(samples), 0.0)
        reward = jnp.where(valid, rollout.reward, 0.0)

        norm_obs = self._normalize(obs_norm, obs)
        mean = self.actor.apply(state.actor, norm_obs)
        log_std = jnp.broadcast_to(state.log_std, mean.shape)
        old_log_prob = tanh_gaussian_log_prob_of_sample(mean, log_std, sample)
        values = self.critic.apply(state.critic, jnp.concatenate([norm_obs, self._normalize(obs_norm, next_obs)]))[..., 0]
        value, next_value = values[:rows].reshape(shape), values[rows:].reshape(shape)

        advantage = gae(reward, value, next_value, rollout.terminal, rollout.timeout, valid, hp["gamma"], hp["lam"])
        returns = jnp.where(valid, advantage + value, 0.0)
        advantage, returns, value = flat(advantage), flat(returns), flat(value)
        # rsl_rl compute_returns: (A - mean) / (std + 1e-8) over the batch (unbiased std, as torch's).
        count = jnp.sum(weight)
        adv_mean = jnp.sum(weight * advantage) / jnp.maximum(count, 1.0)
        adv_var = jnp.sum(weight * (advantage - adv_mean) ** 2) / jnp.maximum(count - 1.0, 1.0)
        advantage = jnp.where(weight > 0, (advantage - adv_mean) / (jnp.sqrt(adv_var) + ADVANTAGE_EPS), 0.0)

        batch = PPOBatch(obs=obs, sample=sample, old_log_prob=old_log_prob, old_mean=mean, old_log_std=log_std,
                         old_value=jnp.where(weight > 0, value, 0.0), advantage=advantage, returns=returns,
                         weight=weight, obs_norm=obs_norm)
        if self.demonstrations:
            if demonstrations is None:
                raise ConfigError("ppo.bc_init_iterations, ppo.bc_coef: behaviour cloning needs the dataset's rows")
            batch = batch.replace(demo_obs=demonstrations[0], demo_action=demonstrations[1])
        metrics = {
            "reward_mean": masked_mean(flat(reward), weight),
            "value_mean": masked_mean(value, weight),
            "return_mean": masked_mean(returns, weight),
            "valid_fraction": jnp.mean(weight),
        }
        return state, batch, metrics

    def minibatches(self, batch: PPOBatch, key: jax.Array) -> PPOMinibatches:
        """A fresh permutation of the N rows per learning epoch, each split into `minibatches` index rows."""
        rows = batch.weight.shape[0]
        count = self.config.minibatches
        if rows % count:
            raise ConfigError(f"ppo.minibatches: expected a divisor of the {rows} rollout rows (horizon x "
                              f"environments), found {count}")
        keys = jax.random.split(key, self.config.learning_epochs)
        order = jax.vmap(lambda k: jax.random.permutation(k, rows))(keys)
        return PPOMinibatches(rows=batch, index=order.reshape(self.config.updates_per_iteration, rows // count).astype(jnp.int32))

    # ----------------------------------------------------------------- updates

    def loss(self, params: dict, obs, rows: PPOBatch, hp: dict, demo_obs=None, cloning=None):
        """PPO's loss on a minibatch (normalised obs), weighted by `rows.weight`; aux: the metrics. While `cloning`
        (traced bool), the actor's part is the negative log-likelihood of the dataset's actions at `demo_obs`
        (normalised) instead of the surrogate and the entropy bonus."""
        clip, weight = hp["clip"], rows.weight
        mean = self.actor.apply(params["actor"], obs)
        log_std = jnp.broadcast_to(params["log_std"], mean.shape)
        log_prob = tanh_gaussian_log_prob_of_sample(mean, log_std, rows.sample)
        # Bounded before exp: a ratio past float32's range (e^89) makes the surrogate's gradient NaN; rows that far
        # out of the trust region carry no gradient.
        ratio = jnp.exp(jnp.clip(log_prob - rows.old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
        surrogate = jnp.maximum(-rows.advantage * ratio, -rows.advantage * jnp.clip(ratio, 1.0 - clip, 1.0 + clip))
        surrogate_loss = masked_mean(surrogate, weight)

        value = self.critic.apply(params["critic"], obs)[..., 0]
        value_error = (value - rows.returns) ** 2
        if self.config.clip_value_loss:  # rsl_rl: the max of the unclipped and clipped squared errors
            clipped = rows.old_value + jnp.clip(value - rows.old_value, -clip, clip)
            value_error = jnp.maximum(value_error, (clipped - rows.returns) ** 2)
        value_loss = masked_mean(value_error, weight)

        entropy = gaussian_entropy(params["log_std"])  # state-independent noise: the same for every row
        actor_loss = surrogate_loss - hp["entropy_coef"] * entropy
        extra = {}
        if demo_obs is not None:
            demo_mean = self.actor.apply(params["actor"], demo_obs)
            demo_log_std = jnp.broadcast_to(params["log_std"], demo_mean.shape)
            # Saturated data actions would pull the mean to atanh(1 - 1e-6) = 7.3: clip them nearer.
            demo_action = jnp.clip(rows.demo_action, -DEMO_ACTION_BOUND, DEMO_ACTION_BOUND)
            bc_loss = -jnp.mean(tanh_gaussian_log_prob(demo_mean, demo_log_std, demo_action))
            actor_loss = jnp.where(cloning, bc_loss, actor_loss + self.config.bc_coef * bc_loss)
            extra = {"bc_loss": bc_loss}
        loss = actor_loss + hp["value_loss_coef"] * value_loss
        kl = masked_mean(gaussian_kl(rows.old_mean, rows.old_log_std, jax.lax.stop_gradient(mean),
                                     jax.lax.stop_gradient(log_std)), weight)
        metrics = {
            "surrogate_loss": surrogate_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "kl": kl,
            "clip_fraction": masked_mean((jnp.abs(ratio - 1.0) > clip).astype(jnp.float32), weight),
            **extra,
        }
        return loss, metrics

    def gradients(self, state: PPOState, rows: PPOBatch, hypers: dict):
        """The loss's metrics and its gradients for {"actor", "critic", "log_std"} on a minibatch, and whether the
        step is in the cloning phase (None without demonstrations)."""
        params = {"actor": state.actor, "critic": state.critic, "log_std": state.log_std}
        obs = self._normalize(state.obs_norm, rows.obs)
        demo_obs = cloning = None
        if self.demonstrations:
            demo_obs = self._normalize(state.obs_norm, rows.demo_obs)
            cloning = state.steps < self.config.bc_init_iterations * self.updates_per_iteration
        (_, metrics), grads = jax.value_and_grad(self.loss, has_aux=True)(params, obs, rows, hypers["ppo"], demo_obs,
                                                                           cloning)
        return metrics, grads, cloning

    def update(self, state: PPOState, rows: PPOBatch, hypers: dict) -> tuple[PPOState, dict]:
        """One minibatch step: the KL at the current parameters adapts the learning rate (rsl_rl: before
        the step), then one clipped Adam step with it."""
        hp = hypers["ppo"]
        params = {"actor": state.actor, "critic": state.critic, "log_std": state.log_std}
        metrics, grads, cloning = self.gradients(state, rows, hypers)
        learning_rate = state.learning_rate
        if self.config.schedule == "adaptive":
            adapted = adapt_learning_rate(learning_rate, metrics["kl"], hp["desired_kl"])
            # Cloning's KL says nothing of PPO's step size: the rate waits for PPO.
            learning_rate = adapted if cloning is None else jnp.where(cloning, learning_rate, adapted)
        direction, opt_state = self.tx.update(grads, state.opt_state)
        params = jax.tree.map(lambda p, d: p - learning_rate * d, params, direction)
        new_state = PPOState(actor=params["actor"], critic=params["critic"], log_std=params["log_std"],
                             opt_state=opt_state, obs_norm=state.obs_norm, learning_rate=learning_rate,
                             steps=state.steps + 1)
        metrics.update(learning_rate=learning_rate, policy_std=jnp.mean(jnp.exp(state.log_std)))
        return new_state, metrics

    def update_many(self, state: PPOState, batches: PPOMinibatches, key: jax.Array, hypers: dict):
        """K = learning_epochs * minibatches steps in one `lax.scan` over `batches.index` (rows gathered
        inside the scan); metrics averaged over K. The state takes the batch's normaliser first: the training
        program hands `prepare`'s batch on, not its state. No randomness: `key` is unused."""
        del key
        state = state.replace(obs_norm=batches.rows.obs_norm)
        rows = batches.rows.replace(obs_norm=None)

        def step(state, index):
            return self.update(state, jax.tree.map(lambda x: x[index], rows), hypers)

        state, metrics = jax.lax.scan(step, state, batches.index)
        return state, jax.tree.map(jnp.mean, metrics)
