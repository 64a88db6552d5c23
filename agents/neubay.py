"""NEUBAY (Ni et al. 2025, "Long-Horizon Model-Based Offline Reinforcement Learning Without Conservatism",
arXiv 2512.04341): a history-dependent SAC agent trained, without any penalty, on long rollouts of one
sampled world model each (a posterior sample), plus the real histories they start from.

The agent (twni2016/neubay online_rl/ac_modules.py, ac_losses.py):
- actor and critic each own an encoder: a Block (Dense, LayerNorm, leaky ReLU) over
  (obs, previous action, previous reward), then a recurrent memory (`mbrl.agents.memory`: LRU or GRU);
- REDQ critics (Chen et al. 2021): N = 10 heads on the critic encoder; the TD target takes the min over
  2 heads of the target critic drawn at random each update, the actor maximises the mean over all heads;
- a Huber TD loss; every loss is a weighted mean real_weight · (real steps) + (1 - real_weight) ·
  (imagined steps);
- per-part optimisers: a small learning rate for the encoders, a larger one for the heads, each a chain
  of NaN zeroing, global-norm clipping and AdamW with a cosine schedule (the actor's decays to 0).

Defaults: configs/d4rl_loco/base.yaml of that repository (fields cited below); the per-dataset values
(encoder lr, real_weight, fixed alpha) are in `mbrl.agents.neubay_presets`.

`init`, `update` and `act` are pure. The recurrent carry is explicit: `act(actor_params,
carry, inputs, key, deterministic)` returns the action and the next carry, with `inputs` any object with `obs`,
`prev_action`, `prev_reward` and `first` (a `mbrl.core.types.PolicyInput`).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from mbrl.agents.memory import Memory, MemoryConfig, initial_carry
from mbrl.agents import neubay_presets
from mbrl.agents.base import AlgorithmEntry, scan_updates, static_when_zero, traced, traced_values
from mbrl.agents.networks import ObsScale, anchor_error, masked_mean
from mbrl.agents.sac_n import SACNState, narrow_action_notice, sac_tail
from mbrl.core import checks
from mbrl.core.tanh_gaussian import LOG_STD_MAX, LOG_STD_MIN, sample_tanh_gaussian, tanh_gaussian_mode
from mbrl.core.errors import ConfigError
from mbrl.core.sequence_replay import SequenceBatch


@dataclasses.dataclass(frozen=True)
class NeubayConfig:
    """NEUBAY's agent and imagination settings (source: neubay configs/d4rl_loco/base.yaml).

    memory, d_model, d_hidden, memory_layers, r_min, r_max: `model.memory` (LRU 256/128, 2 layers, r ≤ 0.9).
    parallel_scan: run the LRU over a sequence with `lax.associative_scan` (log-depth: for accelerators)
        instead of a sequential scan (cheaper to compile, as fast on a few CPU cores). Same parameters.
    head_hidden, head_layers, num_critics, sampled_critics: `model.head_d_hidden` 256,
        `model.head_n_layers` 2, `model.num_critics` 10, `model.sampled_critics` 2.
    init_alpha, target_entropy_ratio: `model.init_alpha` 0.2, `model.target_alpha_ratio` 1.0 (target
        entropy -ratio·|A|); None keeps alpha fixed (the hopper presets).
    target_entropy: not in NEUBAY. The target entropy itself, in place of -ratio·|A| (set: alpha is tuned towards
        it whatever the ratio). Where the data's actions sit against a bound (Simglucose) the preset lowers it as
        every SAC-based agent's (`mbrl.agents.presets.TARGET_ENTROPY`).
    *_encoder_lr, *_head_lr, *_lr_ratio, alpha_lr, weight_decay, adam_eps, gradient_scale, gamma, tau,
        real_weight: `train.*` (1e-5, 1e-4, critic ratio 1.0 = constant, actor ratio 0.0 = cosine decay
        to 0 over the run, 1e-4, 0, 1e-8, clip at 1000, 0.99, 0.005, 0.05).
    lr_decay_steps: the cosine schedule's length; None uses the run's total updates (`train.grad_steps`).
    num_sequences, sequence_length, warmup_length: a batch is B windows of L training steps, each after
        W steps of history that only rebuild the memory. The paper trains on tapes of 2,048 steps that
        start at episode starts (`train.batch_size`); 8 windows of 256 with 1,000 steps of history
        cover the same transitions with exact histories. With an LRU of |λ| ≤ 0.9, 0.9^64 < 1e-3: 64
        steps of history already rebuild the state to that precision (the quick preset).
    parallel_size: trajectories imagined per collect (`collect.parallel_size` 100).
    utd: updates per collected transition, real prefix included (`train.utd` 0.05).
    tape_capacity: trajectories kept. The paper keeps 40M transitions (`train.buffer_size`), i.e. at
        least 40,000 trajectories of at most 1,000 steps.
    unc_quantile: truncate where epistemic_std exceeds this quantile of its values on the dataset
        (`collect.unc_quantile` 1.0 = the max); negative disables truncation.
    max_rollout_length: None rolls out until the episode's remaining horizon (`collect.max_rollout_len` -1).
    max_episode_steps: the task's episode limit (1,000 for the MuJoCo locomotion tasks).
    rollout_chunk: steps per compiled chunk of a rollout; the rollout stops at the first chunk
        boundary where no trajectory is alive.
    threshold_rows: dataset rows used for the quantile (None: all, as the paper).
    model_noise: step each trajectory's member by a draw of its Gaussian, mean + eps · std (neubay
        offline_world/cont_ensemble.py `_step`); False steps with the member's mean. The posterior sample
        (one member per trajectory) is kept either way. MuJoCo itself is deterministic, and under a
        short fit the draws can topple a good policy's hopper (`scripts/experiments/imagined_horizon.py` measures
        both; docs/findings.md has the figures).
    actor_bc_coef: not in NEUBAY. A BC term in the actor loss on the real steps of each window (the real
        prefixes): the squared distance of tanh(mean) to the data's action, times the windows' mean |Q|
        (TD3+BC's ratio, as `sac.actor_bc_coef` of the SAC-N core). It keeps a short-trained policy near
        the data, where the world model stays accurate and imagination can last. 0 (default): off.
    """

    memory: str = "lru"
    parallel_scan: bool = False
    d_model: int = 256
    d_hidden: int = 128
    memory_layers: int = 2
    r_min: float = 0.0
    r_max: float = 0.9
    head_hidden: int = 256
    head_layers: int = 2
    num_critics: int = 10
    sampled_critics: int = 2
    init_alpha: float = traced(0.2)
    target_entropy_ratio: float | None = 1.0
    target_entropy: float | None = None
    critic_encoder_lr: float = traced(1e-5)
    critic_head_lr: float = traced(1e-4)
    actor_encoder_lr: float = traced(1e-5)
    actor_head_lr: float = traced(1e-4)
    critic_lr_ratio: float = 1.0
    actor_lr_ratio: float = 0.0
    lr_decay_steps: int | None = None
    alpha_lr: float = traced(1e-4)
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    gradient_scale: float = 1000.0
    gamma: float = traced(0.99)
    tau: float = traced(0.005)
    real_weight: float = traced(0.05)
    backup_entropy: bool = True
    num_sequences: int = 8
    sequence_length: int = 256
    warmup_length: int = 1000
    parallel_size: int = 100
    utd: float = 0.05
    tape_capacity: int = 40_000
    unc_quantile: float = traced(1.0)
    max_rollout_length: int | None = None
    max_episode_steps: int = 1000
    rollout_chunk: int = 50
    threshold_rows: int | None = None
    model_noise: bool = True
    actor_bc_coef: float = static_when_zero(0.0)

    def __post_init__(self):
        checks.positive_ints("neubay", self, "head_hidden", "head_layers", "num_critics", "sampled_critics",
                             "num_sequences", "sequence_length", "parallel_size", "tape_capacity", "max_episode_steps",
                             "rollout_chunk")
        if self.warmup_length < 0:
            raise ConfigError(f"neubay.warmup_length: expected an int >= 0, found {self.warmup_length}")
        if self.sampled_critics > self.num_critics:
            raise ConfigError(
                f"neubay.sampled_critics: expected at most num_critics={self.num_critics}, found {self.sampled_critics}"
            )
        if not 0.0 <= self.real_weight <= 1.0:
            raise ConfigError(f"neubay.real_weight: expected a value in [0, 1], found {self.real_weight}")
        checks.non_negative("neubay", self, "actor_bc_coef")
        checks.positive("neubay", self, "utd")
        if self.unc_quantile > 1.0:
            raise ConfigError(f"neubay.unc_quantile: expected a value <= 1 (negative: no truncation), found {self.unc_quantile}")
        checks.optional_positive_ints("neubay", self, "max_rollout_length", "lr_decay_steps", "threshold_rows")
        try:
            self.memory_config  # validates the memory fields
        except ConfigError as exc:  # named as this section's fields
            message = str(exc)
            raise ConfigError("neubay." + message.removeprefix("memory.") if message.startswith("memory.")
                              else "neubay." + message) from None

    @property
    def memory_config(self) -> MemoryConfig:
        return MemoryConfig(self.memory, self.d_model, self.d_hidden, self.memory_layers, self.r_min, self.r_max,
                            parallel_scan=self.parallel_scan)

    @property
    def batch_steps(self) -> int:
        """Training transitions per update (at most)."""
        return self.num_sequences * self.sequence_length


class Block(nn.Module):
    """Dense -> LayerNorm -> leaky ReLU (neubay online_rl/common.py `Block`)."""

    features: int

    @nn.compact
    def __call__(self, x):
        return jax.nn.leaky_relu(nn.LayerNorm()(nn.Dense(self.features)(x)))


class Encoder(nn.Module):
    """(T, in) steps -> (T, d_model) history features and the memory's carry."""

    memory: MemoryConfig

    @nn.compact
    def __call__(self, x, first, carry):
        return Memory(self.memory, name="memory")(Block(self.memory.d_model, name="pre")(x), first, carry)


def _small_uniform(key, shape, dtype=jnp.float32):
    # neubay `final_linear`: U(±sqrt(0.01 / fan_in)), so initial Q-values are near 0.
    limit = math.sqrt(0.01 / shape[0])
    return jax.random.uniform(key, shape, dtype, -limit, limit)


class CriticHead(nn.Module):
    hidden: int
    layers: int

    @nn.compact
    def __call__(self, x):
        for _ in range(self.layers):
            x = Block(self.hidden)(x)
        return nn.Dense(1, kernel_init=_small_uniform)(x)[..., 0]


class ActorHead(nn.Module):
    hidden: int
    layers: int
    act_dim: int

    @nn.compact
    def __call__(self, x):
        for _ in range(self.layers):
            x = Block(self.hidden)(x)
        mean, log_std = jnp.split(nn.Dense(2 * self.act_dim)(x), 2, axis=-1)
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)  # EDAC's (-5, 2), as neubay


# NEUBAY's state is SAC-N's, and `sac_tail` ends both updates: here actor_params is {"encoder", "head"} and
# critic_params {"encoder", "heads"}, the heads with a leading axis of num_critics.
NeubayState = SACNState


def _labels(params):
    return {name: jax.tree.map(lambda _, n=name: "encoder" if n == "encoder" else "head", part)
            for name, part in params.items()}


def weighted_mean(per_step, mask, real, real_weight):
    """real_weight · mean over real steps + (1 - real_weight) · mean over imagined steps (each over `mask`)."""
    real_loss = masked_mean(per_step, mask & real)
    imag_loss = masked_mean(per_step, mask & ~real)
    return real_weight * real_loss + (1.0 - real_weight) * imag_loss, real_loss, imag_loss


class Neubay:
    """Networks, optimisers and the pure functions of `mbrl.agents.base.Algorithm` (a recurrent policy)."""

    imagination = "sequences"
    recurrent = True
    uncertainty = "epistemic_std"

    def __init__(self, config: NeubayConfig, obs_dim: int, act_dim: int, total_updates: int | None = None,
                 obs_scale: ObsScale | None = None):
        self.config = config
        self.obs_scale = obs_scale  # the observations' standardisation at the encoder's input (None: raw)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.memory = config.memory_config
        self.encoder = Encoder(self.memory)
        self.critic_head = CriticHead(config.head_hidden, config.head_layers)
        self.actor_head = ActorHead(config.head_hidden, config.head_layers, act_dim)
        decay_steps = max(int(config.lr_decay_steps or total_updates or 1), 1)
        self.critic_tx = self._optimizer(config.critic_lr_ratio, decay_steps)
        self.actor_tx = self._optimizer(config.actor_lr_ratio, decay_steps)
        self.alpha_tx = optax.scale_by_adam()
        ratio = config.target_entropy_ratio
        if config.target_entropy is not None:
            self.target_entropy = float(config.target_entropy)
        else:
            self.target_entropy = None if ratio is None else -float(act_dim) * ratio

    def hypers(self) -> dict:
        return {"neubay": traced_values(self.config)}

    def data_notice(self, actions) -> str | None:
        """`mbrl.agents.base.DataNoticer`: whether the temperature's target entropy is out of the data's reach."""
        if self.target_entropy is None:
            return None
        return narrow_action_notice(self.target_entropy, actions, "--neubay.target-entropy")

    @property
    def sequence_settings(self) -> NeubayConfig:
        """What sequence imagination reads (`mbrl.imagination.SequenceSettings`): its section holds them."""
        return self.config

    def uncertainty_quantile(self, hypers) -> jax.Array:
        """The quantile of the dataset's uncertainties past which an imagined trajectory stops (traced)."""
        return hypers["neubay"]["unc_quantile"]

    def _optimizer(self, lr_ratio, decay_steps):
        """AdamW's direction times the cosine schedule's factor; `_step` multiplies in each part's learning
        rate, which is traced data."""
        cfg = self.config
        # One flat vector per part: a handful of ops instead of a few per parameter leaf (compiles
        # in a fraction of the time, same arithmetic).
        chain = optax.flatten(optax.chain(
            optax.zero_nans(),
            optax.clip_by_global_norm(cfg.gradient_scale),
            optax.scale_by_adam(eps=cfg.adam_eps),
            optax.add_decayed_weights(cfg.weight_decay),
            optax.scale_by_schedule(optax.cosine_decay_schedule(1.0, decay_steps, alpha=lr_ratio)),
        ))
        return optax.multi_transform({"encoder": chain, "head": chain}, _labels)

    @staticmethod
    def _step(tx, params, grads, opt_state, encoder_lr, head_lr):
        direction, opt_state = tx.update(grads, opt_state, params)
        lrs = {name: encoder_lr if name == "encoder" else head_lr for name in params}
        return {name: jax.tree.map(lambda p, d, lr=lrs[name]: p - lr * d, params[name], direction[name])
                for name in params}, opt_state

    # ----------------------------------------------------------------- init / act

    @property
    def input_dim(self) -> int:
        return self.obs_dim + self.act_dim + 1

    def initial_carry(self, batch: int):
        return initial_carry(self.memory, (batch,))

    def init(self, key: jax.Array, hypers: dict) -> NeubayState:
        h = hypers["neubay"]
        keys = jax.random.split(key, 4)
        x = jnp.zeros((1, self.input_dim), jnp.float32)
        first = jnp.ones((1,), bool)
        carry = initial_carry(self.memory)
        feature = jnp.zeros((1, self.memory.d_model + self.act_dim), jnp.float32)
        actor_params = {
            "encoder": self.encoder.init(keys[0], x, first, carry),
            "head": self.actor_head.init(keys[1], jnp.zeros((1, self.memory.d_model), jnp.float32)),
        }
        head_keys = jax.random.split(keys[3], self.config.num_critics)
        critic_params = {
            "encoder": self.encoder.init(keys[2], x, first, carry),
            "heads": jax.vmap(self.critic_head.init, in_axes=(0, None))(head_keys, feature),
        }
        log_alpha = jnp.log(jnp.asarray(h["init_alpha"], jnp.float32))
        return NeubayState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=jax.tree.map(jnp.copy, critic_params),
            log_alpha=log_alpha,
            actor_opt_state=self.actor_tx.init(actor_params),
            critic_opt_state=self.critic_tx.init(critic_params),
            alpha_opt_state=self.alpha_tx.init(log_alpha),
            step=jnp.zeros((), jnp.int32),
        )

    @staticmethod
    def actor_params(state: NeubayState):
        return state.actor_params

    def _inputs(self, obs, prev_action, prev_reward):
        obs = obs if self.obs_scale is None else self.obs_scale(obs)
        return jnp.concatenate([obs, prev_action, prev_reward[..., None]], axis=-1).astype(jnp.float32)

    def act(self, actor_params, carry, inputs, key, deterministic: bool = False):
        """One step for B trajectories: (action (B, act_dim) in [-1, 1], next carry)."""
        x = self._inputs(inputs.obs, inputs.prev_action, inputs.prev_reward)

        def one(xi, fi, ci):
            y, c = self.encoder.apply(actor_params["encoder"], xi[None], fi[None], ci)
            return y[0], c

        y, carry = jax.vmap(one)(x, jnp.asarray(inputs.first, bool), carry)
        mean, log_std = self.actor_head.apply(actor_params["head"], y)
        if deterministic:
            return tanh_gaussian_mode(mean), carry
        action, _ = sample_tanh_gaussian(mean, log_std, key)
        return action, carry

    def encode(self, encoder_params, batch: SequenceBatch) -> jax.Array:
        """History features (B, R, d_model) of every row of the windows, from the initial carry."""
        x = self._inputs(batch.obs, batch.prev_action, batch.prev_reward)
        carry = initial_carry(self.memory, (x.shape[0],))
        apply = lambda xs, fs, c: self.encoder.apply(encoder_params, xs, fs, c)[0]  # noqa: E731
        return jax.vmap(apply)(x, batch.first, carry)

    def head_values(self, heads_params, features, action) -> jax.Array:
        """Q of every head in `heads_params` (leading head axis): (heads, ...). Not `CriticJudge.critic_values`: these
        critics read encoded histories, not an (obs, action) pair."""
        x = jnp.concatenate([features, action], axis=-1)
        return jax.vmap(self.critic_head.apply, in_axes=(0, None))(heads_params, x)

    # ----------------------------------------------------------------- losses

    def _split(self, batch: SequenceBatch):
        """(warmup rows W, training steps L): training transitions are rows W .. W+L-1."""
        length = self.config.sequence_length
        span = batch.obs.shape[1]
        if span < length + 1:
            raise ConfigError(f"neubay: windows of {span} rows cannot hold sequence_length {length} + 1")
        return span - length - 1, length

    def critic_loss(self, critic_params, state: NeubayState, actor_features, batch: SequenceBatch, key, h):
        """`actor_features`: the actor encoder's features of the batch (B, R, d_model), for a' ~ π(h')."""
        cfg = self.config
        w, n = self._split(batch)
        action_key, head_key = jax.random.split(key)
        q = self.head_values(critic_params["heads"], self.encode(critic_params["encoder"], batch)[:, w : w + n],
                             batch.action[:, w : w + n])  # (N, B, L)
        mean, log_std = self.actor_head.apply(state.actor_params["head"], actor_features[:, w + 1 :])
        next_action, next_logp = sample_tanh_gaussian(mean, log_std, action_key)
        target_params = state.target_critic_params
        picked = jax.random.choice(head_key, cfg.num_critics, (cfg.sampled_critics,), replace=False)
        target_heads = jax.tree.map(lambda p: p[picked], target_params["heads"])
        target_features = self.encode(target_params["encoder"], batch)[:, w + 1 :]
        next_q = jnp.min(self.head_values(target_heads, target_features, next_action), axis=0)
        if cfg.backup_entropy:
            next_q = next_q - jnp.exp(state.log_alpha) * next_logp
        not_done = 1.0 - batch.terminal[:, w : w + n].astype(jnp.float32)
        target = jax.lax.stop_gradient(batch.reward[:, w : w + n] + h["gamma"] * not_done * next_q)
        per_step = jnp.mean(optax.huber_loss(q, target[None], delta=1.0), axis=0)
        mask, real = batch.loss_mask[:, w : w + n], batch.real[:, w : w + n]
        loss, real_loss, imag_loss = weighted_mean(per_step, mask, real, h["real_weight"])
        q_mean, real_q, imag_q = weighted_mean(jnp.mean(q, axis=0), mask, real, 0.5)
        metrics = {"critic_loss": loss, "critic_loss_real": real_loss, "critic_loss_imag": imag_loss,
                   "q_real": real_q, "q_imag": imag_q, "target_mean": weighted_mean(target, mask, real, 0.5)[0]}
        return loss, metrics

    def actor_loss(self, head_params, actor_features, critic_params, log_alpha, batch: SequenceBatch, key, h):
        """Differentiable in the head's parameters and in the encoder's features (B, R, d_model)."""
        cfg = self.config
        w, n = self._split(batch)
        mean, log_std = self.actor_head.apply(head_params, actor_features[:, w : w + n])
        action, logp = sample_tanh_gaussian(mean, log_std, key)
        features = jax.lax.stop_gradient(self.encode(critic_params["encoder"], batch)[:, w : w + n])
        q = jnp.mean(self.head_values(critic_params["heads"], features, action), axis=0)
        mask, real = batch.loss_mask[:, w : w + n], batch.real[:, w : w + n]
        loss, real_loss, imag_loss = weighted_mean(jnp.exp(log_alpha) * logp - q, mask, real, h["real_weight"])
        extra = {}
        if cfg.actor_bc_coef > 0:
            bc = anchor_error(mean, batch.action[:, w : w + n], mask & real)
            q_scale = jax.lax.stop_gradient(masked_mean(jnp.abs(q), mask))
            loss = loss + h["actor_bc_coef"] * q_scale * bc
            extra = {"actor_bc": bc}
        return loss, (real_loss, imag_loss, jax.lax.stop_gradient(-logp), extra)

    # ----------------------------------------------------------------- update

    def update(self, state: NeubayState, batch: SequenceBatch, key: jax.Array,
               hypers: dict) -> tuple[NeubayState, dict]:
        """One gradient step on the critics, then actor and temperature (the order of neubay's `sac_update`), then
        SAC's tail (`sac_tail`): the Polyak target update, which reads only the new critics, wherever it is written."""
        h = hypers["neubay"]
        critic_key, actor_key = jax.random.split(key)
        # The actor encoder's features serve both losses: one forward pass, its backward pulled later.
        actor_features, encoder_vjp = jax.vjp(lambda p: self.encode(p, batch), state.actor_params["encoder"])
        (_, critic_metrics), critic_grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
            state.critic_params, state, jax.lax.stop_gradient(actor_features), batch, critic_key, h
        )
        critic_params, critic_opt_state = self._step(self.critic_tx, state.critic_params, critic_grads,
                                                     state.critic_opt_state, h["critic_encoder_lr"], h["critic_head_lr"])

        (actor_loss, (real_pi, imag_pi, entropy, actor_extra)), (head_grads, feature_grads) = jax.value_and_grad(
            self.actor_loss, argnums=(0, 1), has_aux=True
        )(state.actor_params["head"], actor_features, critic_params, state.log_alpha, batch, actor_key, h)
        actor_grads = {"encoder": encoder_vjp(feature_grads)[0], "head": head_grads}
        actor_params, actor_opt_state = self._step(self.actor_tx, state.actor_params, actor_grads, state.actor_opt_state,
                                                   h["actor_encoder_lr"], h["actor_head_lr"])

        w, n = self._split(batch)
        mask, real = batch.loss_mask[:, w : w + n], batch.real[:, w : w + n]
        log_alpha, alpha_opt_state = state.log_alpha, state.alpha_opt_state
        if self.target_entropy is not None:
            def alpha_loss(la):
                return weighted_mean(jnp.exp(la) * (entropy - self.target_entropy), mask, real, h["real_weight"])[0]

            direction, alpha_opt_state = self.alpha_tx.update(jax.grad(alpha_loss)(log_alpha), alpha_opt_state)
            log_alpha = log_alpha - h["alpha_lr"] * direction

        new_state = sac_tail(state, h["tau"], actor_params, actor_opt_state, critic_params, critic_opt_state,
                             log_alpha, alpha_opt_state)
        metrics = dict(
            critic_metrics,
            **actor_extra,
            actor_loss=actor_loss,
            actor_loss_real=real_pi,
            actor_loss_imag=imag_pi,
            entropy=weighted_mean(entropy, mask, real, 0.5)[0],
            alpha=jnp.exp(log_alpha),
            critic_grad_norm=optax.global_norm(critic_grads),
            actor_grad_norm=optax.global_norm(actor_grads),
            train_steps=jnp.sum(mask.astype(jnp.float32)),
        )
        return new_state, metrics

    def update_many(self, state: NeubayState, batches: SequenceBatch, key: jax.Array, hypers: dict):
        """K updates in one `lax.scan` over windows with a leading axis K; metrics averaged over K."""
        return scan_updates(lambda s, b, k: self.update(s, b, k, hypers), state, batches, key)


def make(config, obs_dim, act_dim, obs_scale):
    total = config.schedule.epochs * config.schedule.updates_per_epoch
    return Neubay(config.neubay, obs_dim, act_dim, total_updates=total, obs_scale=obs_scale)


def compiled_schedule(config) -> dict:
    # Without its own decay length, the learning rate's cosine runs over the run's total updates.
    return {"epochs": config.schedule.epochs} if config.neubay.lr_decay_steps is None else {}


ALGORITHM = AlgorithmEntry(
    name="neubay", sections={"neubay": NeubayConfig}, make=make, presets=neubay_presets.PRESETS,
    per_dataset=neubay_presets.per_dataset, model_kind="mlp", imagination_fields=("per_seed_model",),
    compiled_schedule=compiled_schedule,
    smoke={"neubay": {"d_model": 8, "d_hidden": 8, "memory_layers": 1, "head_hidden": 16, "head_layers": 1,
                      "num_critics": 3, "sampled_critics": 2, "num_sequences": 2, "sequence_length": 8,
                      "warmup_length": 8, "parallel_size": 4, "tape_capacity": 16, "max_episode_steps": 100,
                      "rollout_chunk": 20, "utd": 0.5}},
)
