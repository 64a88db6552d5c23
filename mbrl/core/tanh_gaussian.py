"""The tanh-Gaussian policy in one home: its network and its distribution, for every agent that has one (SAC-N,
PPO, NEUBAY) and for the shipped behaviour policies (`mbrl.envs.behaviour`, which may import only `mbrl.core`).

pi(a|s) = tanh(u), u ~ N(mean(s), exp(log_std(s))), so a is in [-1, 1]:
- `TanhGaussianActor`: an MLP whose one output layer gives (mean, log_std), log_std clipped to
  [LOG_STD_MIN, LOG_STD_MAX];
- `sample_tanh_gaussian(mean, log_std, key)`: a reparameterised sample and its log-probability;
- `tanh_gaussian_log_prob(mean, log_std, action)`: the log-probability of a given action;
- `tanh_gaussian_log_prob_of_sample(mean, log_std, pre_tanh)`: the same for the action tanh(pre_tanh), from the
  Gaussian sample it came from (exact where the action saturates);
- `tanh_gaussian_mode(mean)`: the deterministic action.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from mbrl.core.nn import MLP

# Bounds on the actor's log standard deviation, as in the SAC reference implementations
# (rlkit / SpinningUp: LOG_STD_MIN=-20 there; -5 is the common, better-conditioned choice in
# CORL/EDAC and unifloral).
LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0


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
    last axis. Saturated actions (|a| = 1) are clipped to 1 - 1e-6 first, so the result stays finite: such an
    action reads as u = atanh(1 - 1e-6) = 7.25, whatever u it came from."""
    pre_tanh = jnp.arctanh(jnp.clip(action, -1.0 + ACTION_EPS, 1.0 - ACTION_EPS))
    return tanh_gaussian_log_prob_of_sample(mean, log_std, pre_tanh)


def tanh_gaussian_log_prob_of_sample(mean, log_std, pre_tanh):
    """log pi(a) of a = tanh(u) from its Gaussian sample u, summed over the last axis: exact for any u, where
    float32's tanh rounds |a| to 1 from |u| = 9 on and the action alone no longer tells u."""
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


def tanh_gaussian_mode(mean):
    """The deterministic action: tanh of the Gaussian's mean."""
    return jnp.tanh(mean)
