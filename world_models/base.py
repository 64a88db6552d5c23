"""The small interface every dynamics model offers to rollouts and training loops.

Rollouts (`mbrl.world_models.rollout`) depend only on this protocol, so an analytic model with exact
dynamics can stand in for a learned ensemble in tests. A model declares what it is: `is_recurrent`, the
`history` it reads before it predicts, `initial_carry(B)` (its memory before any input) and `warm_up` (the
carry after reading real history). A model with memory (RWM-U's GRU) takes and returns a carry in `step`;
a Markov model (the MLP ensemble, or a test's analytic model built on `MarkovModel`) has an empty one.
"""

from __future__ import annotations

import dataclasses
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


@struct.dataclass
class Normalizer:
    mean: jax.Array
    std: jax.Array

    def normalize(self, x):
        return (x - self.mean) / self.std

    def denormalize(self, y):
        return y * self.std + self.mean


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """Where the model came from; hashable, so it can be a static pytree field."""

    source: str = ""
    task: str | None = None
    num_transitions: int = 0
    holdout_rows: tuple[int, ...] = ()  # dataset rows used as the holdout
    eval_episodes: tuple[int, ...] = ()  # dataset episodes kept out of fitting entirely
    # "heldout": holdout rows and eval episodes index the dataset's held-out data (a NeoRL-2 -val file), and
    # every training row was fitted; "" : they index the dataset itself.
    holdout_from: str = ""
    holdout_episodes: tuple[int, ...] = ()  # whole episodes used as the holdout (the recurrent model)
    holdout_mse: tuple[float, ...] = ()  # per member, standardised target units
    epochs: int = 0
    fit_seconds: float = 0.0
    stop_reason: str = ""
    seed: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ModelInfo:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("holdout_rows", "eval_episodes", "holdout_episodes", "holdout_mse"):
            values[name] = tuple(values.get(name, ()))
        return cls(**values)


class DynamicsModel(Protocol):
    """What a rollout needs from a model. Implementations are pytrees, so they pass through `jit`."""

    is_recurrent: bool  # it has memory: warm it up on real history before imagining from a state

    @property
    def history(self) -> int:
        """Real steps it reads (`warm_up`) before imagining; 0 for a Markov model."""
        ...

    def warm_up(self, obs: jax.Array, action: jax.Array, carry: Any = None) -> Any:
        """The carry after reading real pairs obs (B, L, obs_dim), action (B, L, act_dim); () for a Markov model."""
        ...

    @property
    def num_members(self) -> int: ...

    @property
    def elites(self) -> jax.Array:  # (num_elites,) int32 member indices
        ...

    def initial_carry(self, batch: int) -> Any:
        """The memory before any input, for `batch` trajectories; () for a Markov model."""
        ...

    def step(self, key: jax.Array, obs: jax.Array, action: jax.Array, member: jax.Array | None = None,
             **options) -> StepOutput:
        """Predict one step. The options, by keyword: `carry` (default ()), `deterministic` (default False) and
        `uncertainty` (default "aleatoric_max" for a Markov model).

        member: None picks a member per sample uniformly among the elites (MOPO/RAVL);
        an int array of shape (B,) uses that member for each sample (NEUBAY's posterior sample).
        carry: the memory of the inputs before this one (from `initial_carry` or a warm-up on real history).
        deterministic: use the member's mean instead of sampling from its Gaussian.
        uncertainty: name of a measure in `mbrl.world_models.uncertainty.MEASURES`.
        """
        ...


class TaskFunctions:
    """A model's copy with the task's own termination or reward function in place of the learnt one (mix it into a
    flax struct with `termination_fn` and `reward_fn` fields)."""

    def with_termination_fn(self, termination_fn):
        return self.replace(termination_fn=termination_fn)

    def with_reward_fn(self, reward_fn):
        return self.replace(reward_fn=reward_fn)


class MarkovModel:
    """What a model without memory declares (mix it into a pytree class that defines `step`, `num_members` and
    `elites`): no history, an empty carry, and a warm-up that reads nothing."""

    is_recurrent = False

    @property
    def history(self) -> int:
        return 0

    def initial_carry(self, batch: int):
        return ()

    def warm_up(self, obs, action, carry=None):
        return ()
