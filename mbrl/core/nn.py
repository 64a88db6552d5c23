"""Network building blocks shared by world models and agents.

Ensembles carry a leading member axis on every parameter, so M members run as one batched
einsum rather than M separate networks (and rather than a Python loop over members).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,  # a.k.a. swish, the MBPO/MOPO choice
    "relu": jax.nn.relu,
    "leaky_relu": jax.nn.leaky_relu,
    "elu": jax.nn.elu,
    "gelu": jax.nn.gelu,
    "tanh": jnp.tanh,
}


# Initializations of the Dense layers: "flax" (lecun_normal kernels, zero biases), "torch" (PyTorch nn.Linear:
# kernel and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))) and "corl" (CORL's EDAC networks: nn.Linear kernels,
# biases 0.1, the output layer U(-b, b) with b from `EDAC_OUTPUT_BOUND`). Not named "edac": mbrl/ names no
# algorithm (tests/test_layering.py); the `sac.init` option keeps that name (`mbrl.agents.sac_n.NETWORK_INITS`).
INITS = ("flax", "corl", "torch")
# edge-of-reach agent_training/agent.py: the actor's mu/log_sigma U(±1e-3), the critics' last layer U(±3e-3).
EDAC_OUTPUT_BOUND = {"actor": 1e-3, "critic": 3e-3}


def _uniform(bound: float):
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def dense_init(init: str, fan_in: int, out_bound: float | None = None) -> dict:
    """`kernel_init`/`bias_init` for a Dense layer with `fan_in` inputs; `out_bound` marks EDAC's output layer."""
    if init == "flax":
        return {}  # Flax's own defaults, so the default program is unchanged
    bound = 1.0 / math.sqrt(fan_in)
    if init == "torch":
        return {"kernel_init": _uniform(bound), "bias_init": _uniform(bound)}
    if init == "corl":
        if out_bound is not None:
            return {"kernel_init": _uniform(out_bound), "bias_init": _uniform(out_bound)}
        return {"kernel_init": _uniform(bound), "bias_init": nn.initializers.constant(0.1)}
    raise ValueError(f"init: expected one of {INITS}, found {init!r}")


def truncated_normal_fan_in(key, shape, dtype=jnp.float32):
    """std = 1 / (2 sqrt(fan_in)), truncated at 2 std: the ensemble init of MBPO / mbrl-lib / OfflineRL-Kit.

    `shape` is (..., fan_in, fan_out); any leading axes (the member axis) are independent draws.
    """
    std = 1.0 / (2.0 * jnp.sqrt(shape[-2]))
    return std * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)


class EnsembleDense(nn.Module):
    """A dense layer per member: kernel (M, in, out), bias (M, out).

    Input (M, B, in) gives each member its own batch; input (B, in) is shared by all members
    (no broadcast copy is made). Output is always (M, B, out).
    """

    num_members: int
    features: int
    kernel_init: Callable = truncated_normal_fan_in

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        in_dim = x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (self.num_members, in_dim, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.num_members, self.features))
        if x.ndim == 2:
            y = jnp.einsum("bi,mio->mbo", x, kernel)
        else:
            y = jnp.einsum("mbi,mio->mbo", x, kernel)
        return y + bias[:, None, :]


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the feature axis with a separate scale and offset per member."""

    num_members: int
    epsilon: float = 1e-5

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (self.num_members, features))
        offset = self.param("bias", nn.initializers.zeros, (self.num_members, features))
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.epsilon)
        return y * scale[:, None, :] + offset[:, None, :]


class EnsembleMLP(nn.Module):
    """M independent MLPs as one batched computation: (B, in) or (M, B, in) -> (M, B, out)."""

    num_members: int
    hidden_dims: Sequence[int]
    out_dim: int
    activation: str = "silu"
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        for i, width in enumerate(self.hidden_dims):
            x = EnsembleDense(self.num_members, width, name=f"dense_{i}")(x)
            if self.layer_norm:
                x = EnsembleLayerNorm(self.num_members, name=f"norm_{i}")(x)
            x = act(x)
        return EnsembleDense(self.num_members, self.out_dim, name=f"dense_{len(self.hidden_dims)}")(x)


class MLP(nn.Module):
    """A plain MLP: (..., in) -> (..., out); LayerNorm (optional) after each hidden Dense, before the activation.

    `init_scheme` (one of INITS) picks the Dense initialisations; "flax" keeps `kernel_init` and zero biases.
    `edac_network` says which of EDAC's networks this is ("actor" or "critic"), for its output bound and hidden
    fans: edge-of-reach's critics (agent_training/agent.py VectorizedLinear) store (in, out) weights, so torch's
    kaiming_uniform_ takes the output width as the fan-in: their hidden kernels are U(±1/sqrt(width out)).
    """

    hidden_dims: Sequence[int]
    out_dim: int
    activation: str = "relu"
    layer_norm: bool = False
    kernel_init: Callable = nn.initializers.lecun_normal()
    init_scheme: str = "flax"
    edac_network: str = "critic"

    def _init(self, fan_in: int, out_bound: float | None = None) -> dict:
        if self.init_scheme == "flax":
            return {"kernel_init": self.kernel_init}
        return dense_init(self.init_scheme, fan_in, out_bound)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        for width in self.hidden_dims:
            fan = width if self.init_scheme == "corl" and self.edac_network == "critic" else x.shape[-1]
            x = nn.Dense(width, **self._init(fan))(x)
            if self.layer_norm:
                x = nn.LayerNorm()(x)
            x = act(x)
        return nn.Dense(self.out_dim, **self._init(x.shape[-1], EDAC_OUTPUT_BOUND[self.edac_network]))(x)