"""The small interface every dynamics model offers to rollouts and training loops.

Rollouts (`world_models.rollout`) depend only on this protocol, so an analytic model with exact
dynamics can stand in for a learned ensemble in tests.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import struct


@struct.dataclass
class StepOutput:
    """One model step for a batch of B samples."""

    next_obs: jax.Array  # (B, obs_dim) float32
    reward: jax.Array  # (B,) float32, unpenalised
    terminal: jax.Array  # (B,) bool
    uncertainty: jax.Array  # (B,) float32, the measure named in the call


class DynamicsModel(Protocol):
    """What a rollout needs from a model. Implementations are pytrees, so they pass through `jit`."""

    @property
    def num_members(self) -> int: ...

    @property
    def elites(self) -> jax.Array:  # (num_elites,) int32 member indices
        ...

    def step(
        self,
        key: jax.Array,
        obs: jax.Array,
        action: jax.Array,
        member: jax.Array | None = None,
        *,
        deterministic: bool = False,
        uncertainty: str = "aleatoric_max",
    ) -> StepOutput:
        """Predict one step.

        member: None picks a member per sample uniformly among the elites (MOPO/RAVL);
        an int array of shape (B,) uses that member for each sample (NEUBAY's posterior sample).
        deterministic: use the member's mean instead of sampling from its Gaussian.
        uncertainty: name of a measure in `world_models.uncertainty.MEASURES`.
        """
        ...


