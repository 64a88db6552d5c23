"""`WorldModel`: a fitted dynamics ensemble as a pytree that rollouts can `jit`, `scan` and `vmap`.

It holds the ensemble's parameters, the input and target normalizers, the elite indices and
metadata (where it was fitted, which rows and episodes were held out), and implements the
`mbrl.world_models.base.DynamicsModel` protocol. The termination function is a static field, passed in
by the caller (`world_models` never imports `envs`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from mbrl.world_models.base import MarkovModel, ModelInfo, Normalizer, StepOutput, TaskFunctions
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble
from mbrl.world_models.saved import SavedModel
from mbrl.world_models.uncertainty import get_measure

__all__ = ["FORMAT", "ModelInfo", "Normalizer", "WorldModel", "load", "sample_step"]  # ModelInfo, Normalizer: as before

FORMAT = "mbrl-world-model"


@struct.dataclass
class WorldModel(MarkovModel, TaskFunctions, SavedModel):
    """The MLP ensemble, fitted (`mbrl.world_models.fit`), saved and loaded as `SavedModel` in format `FORMAT`."""

    params: Any
    input_norm: Normalizer  # over concat(obs, action)
    target_norm: Normalizer  # over concat(Δobs, reward)
    elites: jax.Array  # (num_elites,) int32
    config: EnsembleConfig = struct.field(pytree_node=False)
    obs_dim: int = struct.field(pytree_node=False)
    act_dim: int = struct.field(pytree_node=False)
    info: ModelInfo = struct.field(pytree_node=False, default=ModelInfo())
    # jnp fn (obs, action, next_obs) -> (B,) bool; None uses the learned head, or never terminates.
    termination_fn: Callable | None = struct.field(pytree_node=False, default=None)
    # jnp fn (obs, action, next_obs) -> (B,) reward, the task's own rule; None uses the learned reward.
    reward_fn: Callable | None = struct.field(pytree_node=False, default=None)

    @property
    def num_members(self) -> int:
        return self.config.num_members

    @property
    def network(self) -> GaussianEnsemble:
        return GaussianEnsemble(self.config, self.obs_dim + 1)

    def _forward(self, obs: jax.Array, action: jax.Array):
        """All members, raw units: means, stds (M, B, obs_dim + 1) over (Δobs, reward), termination logits."""
        x = self.input_norm.normalize(jnp.concatenate([obs, action], axis=-1))
        mean, logvar, term_logit = self.network.apply(self.params, x)
        means = self.target_norm.denormalize(mean)
        stds = jnp.exp(0.5 * logvar) * self.target_norm.std
        return means, stds, term_logit

    def member_predictions(self, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Every member's Gaussian over (Δobs, reward) in raw units: means and stds, (M, B, obs_dim + 1)."""
        means, stds, _ = self._forward(obs, action)
        return means, stds

    def step(
        self,
        key: jax.Array,
        obs: jax.Array,
        action: jax.Array,
        member: jax.Array | None = None,
        *,
        carry: Any = (),
        deterministic: bool = False,
        uncertainty: str = "aleatoric_max",
    ) -> StepOutput:
        """Predict one step for a batch (see `mbrl.world_models.base.DynamicsModel.step`); the carry is empty.

        All members run in one batched pass (the uncertainty needs them all); each sample then
        takes its member's prediction. The uncertainty uses every member, as MOPO does.
        """
        measure = get_measure(uncertainty)  # an unknown name fails before any computation
        means, stds, term_logit = self._forward(obs, action)
        return sample_step(key, obs, action, means, stds, term_logit, member, self.elites, self.termination_fn,
                           deterministic, measure, reward_fn=self.reward_fn)

    FORMAT = FORMAT  # class constants (not fields): `SavedModel`'s
    CONFIG = EnsembleConfig


def sample_step(key, obs, action, means, stds, term_logit, member, elites, termination_fn, deterministic, measure,
                carry=(), reward_fn=None) -> StepOutput:
    """One step from every member's Gaussian over (Δobs, reward) in raw units, (M, B, obs_dim + 1): each
    sample takes its member's prediction (None: a random elite per sample), mean or sampled; the reward from
    the task's `reward_fn` of the predicted next obs, else the prediction; the terminal from
    `termination_fn`, else the learned logits (M, B), else never; the uncertainty from all members."""
    obs_dim = obs.shape[-1]
    batch = obs.shape[0]
    member_key, noise_key = jax.random.split(key)
    if member is None:
        member = elites[jax.random.randint(member_key, (batch,), 0, elites.shape[0])]
    member = jnp.asarray(member, jnp.int32)
    samples = jnp.arange(batch)
    mean, std = means[member, samples], stds[member, samples]
    prediction = mean if deterministic else mean + std * jax.random.normal(noise_key, mean.shape, mean.dtype)
    next_obs = obs + prediction[:, :obs_dim]
    reward = prediction[:, obs_dim]
    if reward_fn is not None:
        reward = jnp.asarray(reward_fn(obs, action, next_obs), reward.dtype).reshape(batch)
    if termination_fn is not None:
        terminal = jnp.asarray(termination_fn(obs, action, next_obs), bool).reshape(batch)
    elif term_logit is not None:
        terminal = term_logit[member, samples] > 0.0
    else:
        terminal = jnp.zeros(batch, bool)
    return StepOutput(next_obs=next_obs, reward=reward, terminal=terminal, uncertainty=measure(means, stds), carry=carry)


def load(path: str | os.PathLike, termination_fn: Callable | None = None, reward_fn: Callable | None = None) -> WorldModel:
    return WorldModel.load(path, termination_fn, reward_fn)
