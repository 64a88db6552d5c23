"""The small interface every dynamics model offers to rollouts and training loops.

Rollouts (`world_models.rollout`) depend only on this protocol, so an analytic model with exact
dynamics can stand in for a learned ensemble in tests. A model may have memory (RWM-U's GRU): `step`
takes and returns a carry, `initial_carry(B)` is its value before any input. Markov models (the MLP
ensemble) return `()`; a model without `initial_carry` is taken to be Markov and called without a carry.
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
    carry: Any = ()  # the model's memory after this step (leaves lead with B); () for a Markov model


class DynamicsModel(Protocol):
    """What a rollout needs from a model. Implementations are pytrees, so they pass through `jit`."""

    @property
    def num_members(self) -> int: ...

    @property
    def elites(self) -> jax.Array:  # (num_elites,) int32 member indices
        ...

    def initial_carry(self, batch: int) -> Any:
        """The memory before any input, for `batch` trajectories; () for a Markov model."""
        ...

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
        """Predict one step.

        member: None picks a member per sample uniformly among the elites (MOPO/RAVL);
        an int array of shape (B,) uses that member for each sample (NEUBAY's posterior sample).
        carry: the memory of the inputs before this one (from `initial_carry` or a warm-up on real history).
        deterministic: use the member's mean instead of sampling from its Gaussian.
        uncertainty: name of a measure in `world_models.uncertainty.MEASURES`.
        """
        ...


