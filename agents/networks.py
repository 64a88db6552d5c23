"""Agent networks: the critic ensemble (one batched network) and the observation scale; the tanh-Gaussian actor
and its distribution live in `mbrl.core.tanh_gaussian`.

The critic ensemble is a single `Critic` module whose parameters carry a leading member axis;
`CriticEnsemble` vmaps init and apply over that axis, so N critics are one batched computation
(batched matmuls), never a Python loop over members.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mbrl.core.nn import MLP

@dataclasses.dataclass(frozen=True)
class ObsScale:
    """A fixed standardisation of observations, (obs - mean) / std, from the training data: a constant of the
    agent's networks, so training, imagination, evaluation and export all see the same inputs. Without it an
    observation with a wide range (NeoRL-2 Simglucose's patient constants, up to ~340) saturates the first layer.
    `ignored`: dimensions the networks never see (held at 0), such as a robot's absolute position."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    ignored: tuple[int, ...] = ()

    @classmethod
    def of(cls, observations, ignored: Sequence[int] = ()) -> ObsScale:
        """The scale of `observations` (rows, obs_dim); a dimension constant over the data is centred, not scaled."""
        observations = np.asarray(observations, np.float64)
        mean, std = observations.mean(axis=0), observations.std(axis=0)
        std = np.where(std > 1e-6 * (1.0 + np.abs(mean)), std, 1.0)
        return cls(tuple(float(x) for x in mean), tuple(float(x) for x in std), tuple(int(d) for d in ignored))

    @classmethod
    def identity(cls, obs_dim: int, ignored: Sequence[int]) -> ObsScale:
        """No standardisation, only `ignored` held at 0."""
        return cls((0.0,) * obs_dim, (1.0,) * obs_dim, tuple(int(d) for d in ignored))

    @classmethod
    def from_json(cls, data: dict | None) -> ObsScale | None:
        return None if data is None else cls(tuple(data["mean"]), tuple(data["std"]), tuple(data.get("ignored", ())))

    def to_json(self) -> dict:
        return {"mean": list(self.mean), "std": list(self.std), **({"ignored": list(self.ignored)} if self.ignored else {})}

    def __call__(self, obs):
        scaled_obs = (obs - jnp.asarray(self.mean, jnp.float32)) / jnp.asarray(self.std, jnp.float32)
        if not self.ignored:
            return scaled_obs
        keep = np.ones(len(self.mean), np.float32)
        keep[list(self.ignored)] = 0.0
        return scaled_obs * jnp.asarray(keep)


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


def masked_mean(values, weights):
    """The mean of `values` weighted by `weights` (a bool mask or floats); 0 when every weight is 0."""
    weights = weights.astype(values.dtype)
    return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def gaussian_entropy(log_std):
    """Entropy of a diagonal Gaussian (summed over the last axis)."""
    return jnp.sum(log_std + 0.5 * (1.0 + jnp.log(2 * jnp.pi)), axis=-1)


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
        mlp = MLP(self.hidden_sizes, 1, layer_norm=self.layer_norm, init_scheme=self.init_scheme, edac_network="critic")
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


class DeterministicActor:
    """Acting for a Markov policy tanh(actor(obs)) (BC, TD3+BC): mix into an algorithm whose `self.actor` is the
    network and whose state holds `actor_params`."""

    recurrent = False

    def deterministic_action(self, actor_params, obs):
        return jnp.tanh(self.actor.apply(actor_params, obs))

    def act(self, actor_params, carry, inputs, key=None, deterministic: bool = True):
        del key, deterministic  # a deterministic policy
        return self.deterministic_action(actor_params, inputs.obs), carry

    def initial_carry(self, batch: int):
        return ()

    @staticmethod
    def actor_params(state):
        return state.actor_params
