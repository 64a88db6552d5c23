"""Agent networks: the tanh-Gaussian actor and the critic ensemble (one batched network).

The critic ensemble is a single `Critic` module whose parameters carry a leading member axis;
`CriticEnsemble` vmaps init and apply over that axis, so N critics are one batched computation
(batched matmuls), never a Python loop over members.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# Bounds on the actor's log standard deviation, as in the SAC reference implementations
# (rlkit / SpinningUp: LOG_STD_MIN=-20 there; -5 is the common, better-conditioned choice in
# CORL/EDAC and unifloral).
LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0

# Initializations of the Dense layers: "flax" (lecun_normal kernels, zero biases), "torch" (PyTorch nn.Linear:
# kernel and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))) and "edac" (CORL's EDAC networks: nn.Linear kernels,
# biases 0.1, the output layer U(-b, b) with b from `EDAC_OUTPUT_BOUND`).
INITS = ("flax", "edac", "torch")
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
    if init == "edac":
        if out_bound is not None:
            return {"kernel_init": _uniform(out_bound), "bias_init": _uniform(out_bound)}
        return {"kernel_init": _uniform(bound), "bias_init": nn.initializers.constant(0.1)}
    raise ValueError(f"init: expected one of {INITS}, found {init!r}")


@dataclasses.dataclass(frozen=True)
class ObsScale:
    """A fixed standardisation of observations, (obs - mean) / std, from the training data: a constant of the
    agent's networks, so training, imagination, evaluation and export all see the same inputs. Without it an
    observation with a wide range (NeoRL-2 Simglucose's patient constants, up to ~340) saturates the first layer."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, observations) -> ObsScale:
        """The scale of `observations` (rows, obs_dim); a dimension constant over the data is centred, not scaled."""
        observations = np.asarray(observations, np.float64)
        mean, std = observations.mean(axis=0), observations.std(axis=0)
        std = np.where(std > 1e-6 * (1.0 + np.abs(mean)), std, 1.0)
        return cls(tuple(float(x) for x in mean), tuple(float(x) for x in std))

    @classmethod
    def from_json(cls, data: dict | None) -> ObsScale | None:
        return None if data is None else cls(tuple(data["mean"]), tuple(data["std"]))

    def to_json(self) -> dict:
        return {"mean": list(self.mean), "std": list(self.std)}

    def __call__(self, obs):
        return (obs - jnp.asarray(self.mean, jnp.float32)) / jnp.asarray(self.std, jnp.float32)


class Scaled:
    """`network` (a Flax module or `CriticEnsemble`) whose first input is standardised by an `ObsScale`: the same
    parameters and the same init/apply signatures as the network itself."""

    def __init__(self, network, scale: ObsScale):
        self.network, self.scale = network, scale

    def init(self, key, obs, *rest):
        return self.network.init(key, self.scale(obs), *rest)

    def apply(self, params, obs, *rest):
        return self.network.apply(params, self.scale(obs), *rest)

    def apply_member(self, params, obs, *rest):
        return self.network.apply_member(params, self.scale(obs), *rest)


def scaled(network, scale: ObsScale | None):
    """`network` behind `scale`, or itself when there is none."""
    return network if scale is None else Scaled(network, scale)


class MLP(nn.Module):
    hidden_sizes: Sequence[int]
    out_dim: int
    layer_norm: bool = False  # LayerNorm after each hidden Dense, before the ReLU
    init_scheme: str = "flax"  # one of INITS (not `init`, which is Module.init)
    # Which of EDAC's networks this is ("actor" or "critic"), for its output bound and hidden fans: edge-of-reach's
    # critics (agent_training/agent.py VectorizedLinear) store (in, out) weights, so torch's kaiming_uniform_
    # takes the output width as the fan-in: their hidden kernels are U(±1/sqrt(width out)).
    edac_network: str = "critic"

    @nn.compact
    def __call__(self, x):
        for size in self.hidden_sizes:
            fan = size if self.init_scheme == "edac" and self.edac_network == "critic" else x.shape[-1]
            x = nn.Dense(size, **dense_init(self.init_scheme, fan))(x)
            if self.layer_norm:
                x = nn.LayerNorm()(x)
            x = nn.relu(x)
        out_init = dense_init(self.init_scheme, x.shape[-1], EDAC_OUTPUT_BOUND[self.edac_network])
        return nn.Dense(self.out_dim, **out_init)(x)


class TanhGaussianActor(nn.Module):
    """pi(a|s) = tanh(N(mu(s), sigma(s))), scaled to [-1, 1]; returns (mean, log_std) of the Gaussian."""

    hidden_sizes: Sequence[int]
    act_dim: int
    init_scheme: str = "flax"  # one of INITS

    @nn.compact
    def __call__(self, obs):
        # One Dense head of mean and log_std (exported policies and checkpoints rely on this structure); its
        # elementwise initializers are those of EDAC's separate mu and log_sigma heads.
        out = MLP(self.hidden_sizes, 2 * self.act_dim, init_scheme=self.init_scheme, edac_network="actor")(obs)
        mean, log_std = jnp.split(out, 2, axis=-1)
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


# Stored actions are clipped to [-1 + eps, 1 - eps] before atanh, so a saturated action's log-probability is finite.
ACTION_EPS = 1e-6


def tanh_log_det(pre_tanh):
    """log(1 - tanh(u)^2) summed over the last axis, as 2 (log 2 - u - softplus(-2u)) (SpinningUp's stable form)."""
    return jnp.sum(2.0 * (jnp.log(2.0) - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh)), axis=-1)


def tanh_gaussian_log_prob(mean, log_std, action):
    """log pi(a) of an action a in [-1, 1] under a = tanh(u), u ~ N(mean, exp(log_std)), summed over the
    last axis. Saturated actions (|a| = 1) are clipped to 1 - 1e-6 first, so the result stays finite."""
    pre_tanh = jnp.arctanh(jnp.clip(action, -1.0 + ACTION_EPS, 1.0 - ACTION_EPS))
    z = (pre_tanh - mean) * jnp.exp(-log_std)
    gaussian_logp = jnp.sum(-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), axis=-1)
    return gaussian_logp - tanh_log_det(pre_tanh)


def sample_tanh_gaussian(mean, log_std, key, epsilon: float = 0.0):
    """A reparameterised sample and its log-probability under the tanh-squashed Gaussian.

    `epsilon` (static): 0 is the exact correction; > 0 is log(1 - tanh(u)^2 + epsilon), the references' form,
    which caps the correction at log(epsilon) per dimension where float32 tanh saturates.
    """
    std = jnp.exp(log_std)
    noise = jax.random.normal(key, mean.shape, mean.dtype)
    pre_tanh = mean + std * noise
    action = jnp.tanh(pre_tanh)
    gaussian_logp = jnp.sum(-0.5 * noise**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), axis=-1)
    if epsilon > 0:
        correction = jnp.sum(jnp.log(1.0 - action**2 + epsilon), axis=-1)
    else:
        correction = tanh_log_det(pre_tanh)
    return action, gaussian_logp - correction


def masked_mean(values, weights):
    """The mean of `values` weighted by `weights` (a bool mask or floats); 0 when every weight is 0."""
    weights = weights.astype(values.dtype)
    return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def anchor_error(mean, data_action, weights=None):
    """Mean squared distance between the deterministic action tanh(mean) and the data's action, over the
    rows with nonzero `weights` (all rows when None): the BC term of TD3+BC-style anchors. On samples
    instead of tanh(mean), such a term would fight the entropy target."""
    error = jnp.sum((jnp.tanh(mean) - data_action) ** 2, axis=-1)
    return jnp.mean(error) if weights is None else masked_mean(error, weights)


class Critic(nn.Module):
    """Q(s, a) for one member."""

    hidden_sizes: Sequence[int]
    layer_norm: bool = False
    init_scheme: str = "flax"  # one of INITS

    @nn.compact
    def __call__(self, obs, action):
        mlp = MLP(self.hidden_sizes, 1, self.layer_norm, init_scheme=self.init_scheme, edac_network="critic")
        return mlp(jnp.concatenate([obs, action], axis=-1))[..., 0]


class CriticEnsemble:
    """N critics as one batched network: parameters with a leading member axis of size N."""

    def __init__(self, hidden_sizes: Sequence[int], num_members: int, layer_norm: bool = False, init_scheme: str = "flax"):
        self.member = Critic(tuple(hidden_sizes), layer_norm, init_scheme)
        self.num_members = num_members

    def init(self, key, obs, action):
        keys = jax.random.split(key, self.num_members)
        return jax.vmap(self.member.init, in_axes=(0, None, None))(keys, obs, action)

    def apply(self, params, obs, action):
        """Q-values of every member: (N, batch). obs/action are shared by all members."""
        return jax.vmap(self.member.apply, in_axes=(0, None, None))(params, obs, action)

    def apply_member(self, member_params, obs, action):
        """One member's Q-values, for per-member action gradients."""
        return self.member.apply(member_params, obs, action)
