"""Recurrent memories for history-dependent agents (NEUBAY): a stacked LRU or a GRU, in flax.

One call processes a sequence: `Memory.apply(params, x (T, in), first (T,), carry) -> (y (T, d_model),
carry)`, where `first[t]` resets the memory to its initial state before step t (an episode starts).
Acting is the same call with T = 1, vmapped over the batch, so a hidden state built step by step in a
rollout equals the one built in one pass over the sequence in training (up to float rounding).

LRU: the linear recurrent unit of Orvieto et al. 2023 ("Resurrecting Recurrent Neural Networks for Long
Sequences"), h_t = λ ⊙ h_{t-1} + γ ⊙ B x_t, y_t = Re(C h_t) + D ⊙ x_t, with a complex diagonal λ of
modulus in [r_min, r_max]. A sequence is one `lax.associative_scan` (parallel over time). Each layer is
pre-LayerNorm -> LRU -> GELU -> GLU -> residual, as in NEUBAY's `memory/lru.py` (twni2016/neubay, adapted
there from minimal-LRU and Memoroids). A reset multiplies the carry by 0, which equals restarting from
the zero initial state.

GRU: flax's `GRUCell` scanned over time with the same reset rule; sequential in time.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from mbrl.core import checks
from mbrl.core.errors import ConfigError

MEMORIES = ("lru", "gru")


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """Defaults: NEUBAY configs/d4rl_loco/base.yaml `model.memory` (d_model 256, d_hidden 128, 2 layers,
    r_min 0.0, r_max 0.9); max phase 2π from minimal-LRU."""

    kind: str = "lru"
    d_model: int = 256
    d_hidden: int = 128
    num_layers: int = 2
    r_min: float = 0.0
    r_max: float = 0.9
    max_phase: float = 6.28
    parallel_scan: bool = False

    def __post_init__(self):
        if self.kind not in MEMORIES:
            raise ConfigError(f"memory: expected one of {MEMORIES}, found {self.kind!r}")
        checks.positive_ints("memory", self, "d_model", "d_hidden", "num_layers")
        if not 0.0 <= self.r_min < self.r_max < 1.0:
            raise ConfigError(f"memory: expected 0 <= r_min < r_max < 1, found {self.r_min}, {self.r_max}")


def _nu_log_init(r_min, r_max, key, shape):
    # |λ| = exp(-exp(nu_log)) uniform on the ring r_min <= |λ| <= r_max (Orvieto et al. 2023, Lemma 3.2).
    u = jax.random.uniform(key, shape, minval=1e-6)
    return jnp.log(-0.5 * jnp.log(u * (r_max**2 - r_min**2) + r_min**2))


def _theta_log_init(max_phase, key, shape):
    return jnp.log(max_phase * jax.random.uniform(key, shape, minval=1e-6))


def _normal_init(scale):
    return lambda key, shape: jax.random.normal(key, shape) * scale


class LRULayer(nn.Module):
    """One residual LRU block over a sequence (T, d_model); carry (d_hidden,) complex64."""

    config: MemoryConfig

    @nn.compact
    def __call__(self, x, first, h0):
        cfg = self.config
        dm, dh = cfg.d_model, cfg.d_hidden
        nu_log = self.param("nu_log", functools.partial(_nu_log_init, cfg.r_min, cfg.r_max), (dh,))
        theta_log = self.param("theta_log", functools.partial(_theta_log_init, cfg.max_phase), (dh,))

        def gamma_init(_key):  # normalise the input so that ‖h‖ does not grow with 1/(1-|λ|²)
            modulus = jnp.exp(-jnp.exp(nu_log))
            return jnp.log(jnp.sqrt(1.0 - modulus**2))

        gamma_log = self.param("gamma_log", gamma_init)
        b_re = self.param("B_re", _normal_init(1.0 / jnp.sqrt(2.0 * dm)), (dh, dm))
        b_im = self.param("B_im", _normal_init(1.0 / jnp.sqrt(2.0 * dm)), (dh, dm))
        c_re = self.param("C_re", _normal_init(1.0 / jnp.sqrt(dh)), (dm, dh))
        c_im = self.param("C_im", _normal_init(1.0 / jnp.sqrt(dh)), (dm, dh))
        d = self.param("D", _normal_init(1.0), (dm,))

        skip = x
        u = nn.LayerNorm(name="norm")(x)
        lam = jnp.exp(-jnp.exp(nu_log) + 1j * jnp.exp(theta_log))
        gamma = jnp.exp(gamma_log)
        bu = jax.lax.complex(u @ b_re.T * gamma, u @ b_im.T * gamma)  # (T, dh); real u: 2 real products, not 4
        decay = jnp.where(first[:, None], 0.0, lam[None, :]).astype(jnp.complex64)  # a reset drops the carry
        bu = bu.at[0].add(decay[0] * h0)

        def compose(earlier, later):
            a1, b1 = earlier
            a2, b2 = later
            return a2 * a1, a2 * b1 + b2

        if self.config.parallel_scan:
            _, h = jax.lax.associative_scan(compose, (decay, bu))
        else:  # sequential: cheaper to compile, and as fast on a CPU's few cores
            def step(carry, ab):
                carry = ab[0] * carry + ab[1]
                return carry, carry

            _, h = jax.lax.scan(step, jnp.zeros_like(h0), (decay, bu))
        y = h.real @ c_re.T - h.imag @ c_im.T + d * u  # Re(C h)
        y = nn.gelu(y)
        y = nn.Dense(dm, name="out1")(y) * jax.nn.sigmoid(nn.Dense(dm, name="out2")(y))  # GLU
        return skip + y, h[-1]


class _GRUStep(nn.Module):
    features: int

    @nn.compact
    def __call__(self, h, inputs):
        x, first = inputs
        h = jnp.where(first, jnp.zeros_like(h), h)
        h, y = nn.GRUCell(self.features, name="cell")(h, x)
        return h, y


class GRULayer(nn.Module):
    """A GRU over a sequence (T, d_model) with resets; carry (d_model,) float32."""

    config: MemoryConfig

    @nn.compact
    def __call__(self, x, first, h0):
        scan = nn.scan(_GRUStep, variable_broadcast="params", split_rngs={"params": False}, in_axes=0, out_axes=0)
        h, y = scan(self.config.d_model, name="gru")(h0, (x, first))
        return y, h


class Memory(nn.Module):
    """Stacked memory layers: (T, d_model) real inputs -> (T, d_model) outputs, carry a tuple per layer."""

    config: MemoryConfig

    @nn.compact
    def __call__(self, x, first, carry):
        layer_cls = LRULayer if self.config.kind == "lru" else GRULayer
        new_carry = []
        for i in range(self.config.num_layers):
            x, h = layer_cls(self.config, name=f"layer_{i}")(x, first, carry[i])
            new_carry.append(h)
        return x, tuple(new_carry)


def initial_carry(config: MemoryConfig, batch_shape: tuple[int, ...] = ()) -> tuple[jax.Array, ...]:
    """The memory's state before an episode's first step: zeros, one array per layer."""
    if config.kind == "lru":
        return tuple(jnp.zeros((*batch_shape, config.d_hidden), jnp.complex64) for _ in range(config.num_layers))
    return tuple(jnp.zeros((*batch_shape, config.d_model), jnp.float32) for _ in range(config.num_layers))
