"""A probabilistic (Gaussian) MLP ensemble and its training loss.

Each member maps standardised (obs, action) to a diagonal Gaussian over standardised
(Δobs, reward), plus an optional termination logit. All members are one batched computation
over a leading member axis (`mbrl.core.nn.EnsembleDense`).

Defaults follow the MBPO/MOPO recipe as implemented in OfflineRL-Kit
(offlinerlkit/modules/dynamics_module.py, run_example/run_mopo.py) and mbrl-lib
(mbrl/models/gaussian_mlp.py): 7 members, 5 elites, 4x200 SiLU, learned soft log-variance
bounds initialised at 0.5 / -10 with a 0.01 penalty, and per-layer L2 weight decay.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import linen as nn

from mbrl.core.errors import ConfigError
from mbrl.core.nn import ACTIVATIONS, EnsembleDense, EnsembleLayerNorm

# OfflineRL-Kit run_mopo.py: --dynamics-weight-decay 2.5e-5 5e-5 7.5e-5 7.5e-5 1e-4 (4 hidden + output).
MOPO_WEIGHT_DECAYS = (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)
# NEUBAY (Ni et al. 2025, offline_world/modules.py): fixed soft clamp of log σ to [-5, 0.25].
NEUBAY_LOG_STD_RANGE = (-5.0, 0.25)


def observation_indices(name: str, values, obs_dim: int | None = None) -> tuple[int, ...]:
    """`values` as a tuple of distinct observation indices >= 0 (below `obs_dim` where given), or a `ConfigError`
    naming option `name`."""
    dims = tuple(values)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims) or len(set(dims)) != len(dims):
        raise ConfigError(f"{name}: expected distinct observation indices >= 0, found {dims!r}")
    if obs_dim is not None and dims and max(dims) >= obs_dim:
        raise ConfigError(f"{name}: {dims} names a dimension outside the {obs_dim} observation dimensions "
                          f"(0 to {obs_dim - 1})")
    return dims


@dataclasses.dataclass(frozen=True)
class EnsembleConfig:
    """Architecture of the dynamics ensemble.

    num_members / num_elites: members trained, and the ones with the lowest holdout MSE that rollouts use.
    hidden_dims: hidden layer widths of every member.
    activation: of the hidden layers (silu, relu, ...; `mbrl.core.nn.ACTIVATIONS`).
    layer_norm: LayerNorm after every hidden layer and a fixed soft log-σ range [-5, 0.25]
        (NEUBAY's choice for long rollouts) instead of learned log-variance bounds.
    weight_decays: L2 coefficient per dense layer (hidden layers then output); None gives
        MOPO's list for 4 hidden layers, else a linear ramp over the same range.
    learned_termination: add a termination logit head (for tasks with no known function).
    invariant_obs_dims: observation dimensions the dynamics do not depend on, such as a robot's absolute position
        along an open floor: the members never see them (their input is held at 0), and still predict their change.
    logvar_init_max / logvar_init_min / logvar_bound_penalty: the learned log-variance bounds' initial
        values and the weight of their penalty (without layer_norm).
    """

    num_members: int = 7
    num_elites: int = 5
    hidden_dims: tuple[int, ...] = (200, 200, 200, 200)
    activation: str = "silu"
    layer_norm: bool = False
    weight_decays: tuple[float, ...] | None = None
    logvar_init_max: float = 0.5  # OfflineRL-Kit / mbrl-lib initial learned bounds
    logvar_init_min: float = -10.0
    logvar_bound_penalty: float = 0.01  # OfflineRL-Kit `logvar_loss_coef`
    learned_termination: bool = False
    invariant_obs_dims: tuple[int, ...] = ()

    def __post_init__(self):
        # (a saved model's JSON gives a list)
        object.__setattr__(self, "invariant_obs_dims", observation_indices("ensemble.invariant_obs_dims",
                                                                           self.invariant_obs_dims))
        if isinstance(self.num_members, bool) or not isinstance(self.num_members, int) or self.num_members < 1:
            raise ConfigError(f"ensemble.num_members: expected a positive int, found {self.num_members!r}")
        if not 1 <= self.num_elites <= self.num_members:
            raise ConfigError(f"ensemble.num_elites: expected a value in [1, num_members={self.num_members}], found {self.num_elites}")
        if not self.hidden_dims or any(int(w) < 1 for w in self.hidden_dims):
            raise ConfigError(f"ensemble.hidden_dims: expected positive widths, found {tuple(self.hidden_dims)}")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"ensemble.activation: expected one of {', '.join(ACTIVATIONS)}, found {self.activation!r}")
        if self.weight_decays is not None and len(self.weight_decays) != len(self.hidden_dims) + 1:
            raise ConfigError(
                f"ensemble.weight_decays: expected one value per dense layer ({len(self.hidden_dims) + 1}: the hidden "
                f"layers and the output), found {len(self.weight_decays)}"
            )

    @property
    def layer_weight_decays(self) -> tuple[float, ...]:
        if self.weight_decays is not None:
            return tuple(self.weight_decays)
        n = len(self.hidden_dims) + 1
        if n == len(MOPO_WEIGHT_DECAYS):
            return MOPO_WEIGHT_DECAYS
        lo, hi = MOPO_WEIGHT_DECAYS[0], MOPO_WEIGHT_DECAYS[-1]
        return tuple(lo + (hi - lo) * i / max(n - 1, 1) for i in range(n))


def soft_clamp(x: jax.Array, low: jax.Array | float, high: jax.Array | float) -> jax.Array:
    """Smoothly keep x inside [low, high] with gradients everywhere (PETS, Chua et al. 2018)."""
    x = high - jax.nn.softplus(high - x)
    return low + jax.nn.softplus(x - low)


class GaussianEnsemble(nn.Module):
    """(B, in) or (M, B, in) standardised inputs -> mean, log-variance (M, B, out_dim) and termination logit.

    The termination logit is (M, B), or None without a learned termination head.
    """

    config: EnsembleConfig
    out_dim: int

    @nn.compact
    def __call__(self, x: jax.Array):
        cfg = self.config
        members = cfg.num_members
        act = ACTIVATIONS[cfg.activation]
        for i, width in enumerate(cfg.hidden_dims):
            x = EnsembleDense(members, int(width), name=f"dense_{i}")(x)
            if cfg.layer_norm:
                x = EnsembleLayerNorm(members, name=f"norm_{i}")(x)
            x = act(x)
        d = self.out_dim
        head = EnsembleDense(members, 2 * d + int(cfg.learned_termination), name=f"dense_{len(cfg.hidden_dims)}")(x)
        mean, raw = head[..., :d], head[..., d : 2 * d]
        if cfg.layer_norm:
            low, high = NEUBAY_LOG_STD_RANGE
            logvar = 2.0 * soft_clamp(raw, low, high)
        else:
            # One pair of bounds per member (OfflineRL-Kit shares one pair across members); per-member
            # bounds keep members independent, so keeping a member's best weights keeps its bounds too.
            max_logvar = self.param("max_logvar", nn.initializers.constant(cfg.logvar_init_max), (members, d))
            min_logvar = self.param("min_logvar", nn.initializers.constant(cfg.logvar_init_min), (members, d))
            logvar = soft_clamp(raw, min_logvar[:, None, :], max_logvar[:, None, :])
        term_logit = head[..., 2 * d] if cfg.learned_termination else None
        return mean, logvar, term_logit


def weight_decay_loss(params, config: EnsembleConfig) -> jax.Array:
    """Σ_layers wd_l · ½‖W_l‖² over all members (OfflineRL-Kit EnsembleLinear.get_decay_loss); biases are not decayed."""
    layers = params["params"]
    total = jnp.zeros((), jnp.float32)
    for i, wd in enumerate(config.layer_weight_decays):
        total = total + wd * 0.5 * jnp.sum(jnp.square(layers[f"dense_{i}"]["kernel"]))
    return total


def ensemble_loss(network: GaussianEnsemble, params, inputs, targets, terminals=None):
    """Training loss of the whole ensemble, summed over members.

    inputs (M, B, in) and targets (M, B, out_dim) are standardised; terminals (M, B) bool is used
    only with a learned termination head. Per member: the Gaussian NLL without constants,
    mean over batch and dims of (μ - y)² e^{-logvar} + logvar (OfflineRL-Kit / MBPO), plus
    BCE for the termination logit. Then weight decay and the log-variance bound penalty
    0.01 · (Σ max_logvar - Σ min_logvar), averaged over members.
    """
    config = network.config
    mean, logvar, term_logit = network.apply(params, inputs)
    inv_var = jnp.exp(-logvar)
    nll = jnp.mean(jnp.square(mean - targets) * inv_var + logvar, axis=(1, 2))  # (M,)
    loss = jnp.sum(nll) + weight_decay_loss(params, config)
    if not config.layer_norm:
        # Mean over members: equal to the recipe's 0.01 · (Σmax - Σmin) on one shared pair of bounds,
        # and each member's bounds feel the same pull relative to its NLL as the shared pair does.
        p = params["params"]
        spread = jnp.sum(p["max_logvar"]) - jnp.sum(p["min_logvar"])
        loss = loss + config.logvar_bound_penalty * spread / config.num_members
    metrics = {"nll": nll}
    if config.learned_termination:
        labels = terminals.astype(jnp.float32)
        bce = jnp.mean(jax.nn.softplus(term_logit) - labels * term_logit, axis=1)  # (M,)
        loss = loss + jnp.sum(bce)
        metrics["termination_bce"] = bce
    return loss, metrics


@functools.partial(jax.jit, static_argnums=(0, 2))
def init_params(network: GaussianEnsemble, key: jax.Array, in_dim: int):
    # One compiled call, cached per network: op-by-op initialisation compiles every random draw
    # separately (seconds on CPU).
    return network.init(key, jnp.zeros((1, in_dim), jnp.float32))
