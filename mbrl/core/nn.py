"""Network building blocks shared by world models and agents.

Ensembles carry a leading member axis on every parameter, so M members run as one batched
einsum rather than M separate networks (and rather than a Python loop over members).
"""

from __future__ import annotations

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
    """A plain MLP: (..., in) -> (..., out)."""

    hidden_dims: Sequence[int]
    out_dim: int
    activation: str = "relu"
    layer_norm: bool = False
    kernel_init: Callable = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        for width in self.hidden_dims:
            x = nn.Dense(width, kernel_init=self.kernel_init)(x)
            if self.layer_norm:
                x = nn.LayerNorm()(x)
            x = act(x)
        return nn.Dense(self.out_dim, kernel_init=self.kernel_init)(x)
