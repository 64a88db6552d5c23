"""The one interface every learning algorithm implements, and what it asks of imagination.

An algorithm is a handful of pure functions over pytrees, so the training program (`mbrl.train`) can jit
them, `lax.scan` K updates and vmap a population (seeds and configurations alike) without knowing which
algorithm it runs:

- hypers: the values a sweep may vary that do not change array shapes (learning rates, gamma, tau,
  MOPO's lambda, EDAC's eta, ...), as a nested dict of float32 scalars keyed like the config's sections
  (`{"sac": {"actor_lr": ...}, "mopo": {"penalty_coef": ...}}`; which fields, `mbrl.agents.registry`). They
  are traced data: the training state carries them, so changing one never recompiles.
- `init(key, hypers)` -> the algorithm's state.
- `update_many(state, batches, key, hypers)` -> (state, metrics): K updates on batches with a leading K axis
  (flat `Transitions` or `SequenceBatch` windows, by `imagination`), metrics averaged over K.
- `act(actor_params, carry, inputs, key, deterministic)` -> (action in [-1, 1], carry): `inputs` is a
  `mbrl.core.types.PolicyInput`; Markov policies read `inputs.obs` and hand the carry back untouched.
- `initial_carry(batch)`: the policy's memory at an episode start; `()` for Markov policies.
- `actor_params(state)`: what acting needs (what is exported).

`imagination` says what the algorithm needs from the world model:
- "none": real data only (BC);
- "transitions": short rollouts as flat rows in a ring buffer, rewards through `model_reward(hypers,
  reward, uncertainty)` (MOPO, RAVL);
- "sequences": whole imagined trajectories after real prefixes, on a sequence tape (NEUBAY);
- "onpolicy": a fresh batch of long rollouts every iteration, from real histories, handed to the algorithm's
  `prepare(state, rollout, valid, hypers)` and used for that iteration's updates only (MOPO-PPO).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import jax

IMAGINATION_KINDS = ("none", "transitions", "sequences", "onpolicy")

Hypers = dict[str, dict[str, jax.Array]]


class Algorithm(Protocol):
    imagination: ClassVar[str]
    recurrent: ClassVar[bool]
    obs_dim: int
    act_dim: int

    def init(self, key: jax.Array, hypers: Hypers) -> Any: ...

    def update_many(self, state: Any, batches: Any, key: jax.Array, hypers: Hypers) -> tuple[Any, dict]: ...

    def act(self, actor_params: Any, carry: Any, inputs: Any, key: jax.Array, deterministic: bool) -> tuple[jax.Array, Any]: ...

    def initial_carry(self, batch: int) -> Any: ...

    def actor_params(self, state: Any) -> Any: ...


class FlatLearner(Algorithm, Protocol):
    """An algorithm on flat batches of transitions (imagination "none" or "transitions")."""

    batch_size: int  # rows per update


class TransitionLearner(FlatLearner, Protocol):
    """An algorithm on flat imagined transitions: it decides what an imagined reward is worth."""

    uncertainty: str  # the measure rollouts compute (`mbrl.world_models.uncertainty.MEASURES`)

    def model_reward(self, hypers: Hypers, reward: jax.Array, uncertainty: jax.Array) -> jax.Array: ...


class SequenceSettings(Protocol):
    """What sequence imagination reads of its algorithm's settings."""

    max_episode_steps: int  # a tape row's length: a real prefix and its imagined continuation
    parallel_size: int  # trajectories per collect
    tape_capacity: int
    num_sequences: int  # windows per update
    sequence_length: int
    warmup_length: int  # leading steps of a window that only warm the memory
    threshold_rows: int | None  # dataset rows the uncertainty threshold is measured on (None: all)
    model_noise: bool  # sample the model's aleatoric noise (else its mean)


class SequenceLearner(Algorithm, Protocol):
    """An algorithm on imagined trajectories after real prefixes ("sequences")."""

    uncertainty: str
    sequence_settings: SequenceSettings

    def uncertainty_quantile(self, hypers: Hypers) -> jax.Array: ...


class OnPolicyLearner(Algorithm, Protocol):
    """An algorithm on a fresh batch of long rollouts each iteration ("onpolicy")."""

    uncertainty: str
    head_mode: str  # "per_trajectory": one model head per imagined trajectory; else one per step
    updates_per_iteration: int  # the updates one batch of rollouts pays for

    def uncertainty_quantile(self, hypers: Hypers) -> jax.Array: ...

    def model_reward(self, hypers: Hypers, reward: jax.Array, uncertainty: jax.Array) -> jax.Array: ...

    def prepare(self, state: Any, rollout: Any, valid: jax.Array, hypers: Hypers) -> tuple[Any, Any, dict]: ...

    def minibatches(self, batch: Any, key: jax.Array) -> Any: ...


def as_hypers(values: dict[str, dict[str, float]]) -> Hypers:
    """Plain numbers -> the float32 scalars a training state carries."""
    import jax.numpy as jnp

    return {section: {name: jnp.asarray(v, jnp.float32) for name, v in fields.items()} for section, fields in values.items()}


def scan_updates(update, state, batches, key):
    """`update(state, batch, key)` over the leading K axis of `batches` in one `lax.scan`, metrics
    averaged over K: every algorithm's `update_many`."""
    import jax.numpy as jnp

    keys = jax.random.split(key, jax.tree.leaves(batches)[0].shape[0])
    state, metrics = jax.lax.scan(lambda s, xs: update(s, *xs), state, (batches, keys))
    return state, jax.tree.map(jnp.mean, metrics)
