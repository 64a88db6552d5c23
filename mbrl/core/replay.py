"""Fixed-capacity replay buffers that live on the device as pytrees.

A `ReplayBuffer` is a ring: `insert` writes new rows after the last ones and, once full, over the
oldest. Written rows are always slots [0, size), so `sample` draws uniformly from them and never
returns an unwritten slot. Everything is a pure function of (buffer, batch, key) with static shapes:
it runs inside `jit`, `lax.scan` and `vmap` (one buffer per seed) with no Python-side state.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions


@struct.dataclass
class ReplayBuffer:
    """Storage (capacity, ...) per field, the next slot to write and the number of written slots."""

    data: Transitions
    insert_pos: jax.Array  # () int32
    size: jax.Array  # () int32

    @property
    def capacity(self) -> int:
        return int(self.data.reward.shape[-1])


def empty(capacity: int, obs_dim: int, act_dim: int) -> ReplayBuffer:
    """A buffer of `capacity` zeroed slots, none written."""
    if capacity < 1:
        raise ConfigError(f"replay buffer capacity: expected a positive int, found {capacity}")
    data = Transitions(
        obs=jnp.zeros((capacity, obs_dim), jnp.float32),
        action=jnp.zeros((capacity, act_dim), jnp.float32),
        reward=jnp.zeros(capacity, jnp.float32),
        next_obs=jnp.zeros((capacity, obs_dim), jnp.float32),
        terminal=jnp.zeros(capacity, bool),
        timeout=jnp.zeros(capacity, bool),
    )
    return ReplayBuffer(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def from_transitions(data: Transitions) -> ReplayBuffer:
    """A full buffer holding `data` (for example the real dataset)."""
    rows = len(data)
    if rows == 0:
        raise ConfigError("replay buffer from transitions: the transitions are empty")
    data = Transitions(
        obs=jnp.asarray(data.obs, jnp.float32),
        action=jnp.asarray(data.action, jnp.float32),
        reward=jnp.asarray(data.reward, jnp.float32),
        next_obs=jnp.asarray(data.next_obs, jnp.float32),
        terminal=jnp.asarray(data.terminal, bool),
        timeout=jnp.asarray(data.timeout, bool),
    )
    return ReplayBuffer(data, jnp.zeros((), jnp.int32), jnp.asarray(rows, jnp.int32))


@functools.partial(jax.jit, donate_argnums=0)
def insert(buffer: ReplayBuffer, batch: Transitions, valid: jax.Array) -> ReplayBuffer:
    """Write the rows of `batch` (N, ...) where `valid` (N,) is True, in order, after the last written row.

    Fixed shapes: destinations come from the cumulative sum of the mask and the other rows scatter
    out of range (dropped). `buffer` is donated (updated in place outside jit): use the returned one.
    """
    valid = jnp.asarray(valid, bool)
    slots, insert_pos, size = ring_slots(buffer.insert_pos, buffer.size, buffer.capacity, valid)
    data = jax.tree.map(
        lambda store, rows: store.at[slots].set(rows.astype(store.dtype), mode="drop"), buffer.data, batch
    )
    return ReplayBuffer(data=data, insert_pos=insert_pos, size=size)


def ring_slots(insert_pos, size, capacity: int, keep):
    """Where the kept rows of a batch go in a ring of `capacity` slots: (slots, new insert_pos, new size).

    The kept rows go in order after the last written one; the others get slot `capacity` (out of range:
    a scatter with mode="drop" ignores them). Fixed shapes: the destinations come from a cumulative sum.
    Of more kept rows than slots only the last `capacity` survive (a ring would overwrite the rest);
    dropping them here keeps the scatter free of duplicate indices, whose write order is undefined.
    The one ring of the project: the flat buffer here and the sequence tape both write through it.
    """
    rank = jnp.cumsum(keep, dtype=jnp.int32) - 1  # order of each kept row among the kept ones
    count = rank[-1] + 1 if keep.size else jnp.zeros((), jnp.int32)
    keep = keep & (rank >= count - capacity)
    slots = jnp.where(keep, (insert_pos + rank) % capacity, capacity)
    return slots, (insert_pos + count) % capacity, jnp.minimum(size + count, capacity)


@functools.partial(jax.jit, static_argnames=("batch_size",))
def sample(buffer: ReplayBuffer, key: jax.Array, batch_size: int) -> Transitions:
    """`batch_size` rows drawn uniformly with replacement from the written slots.

    An empty buffer has no rows to draw: the caller inserts first (slot 0, all zeros, comes back).
    """
    index = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buffer.size, 1))
    return jax.tree.map(lambda x: x[index], buffer.data)


def real_count(batch_size: int, real_fraction: float) -> int:
    """How many rows of a mixed batch come from the real data (rounded, static)."""
    if not 0.0 <= real_fraction <= 1.0:
        raise ConfigError(f"real_fraction: expected a value in [0, 1], found {real_fraction}")
    return int(round(batch_size * real_fraction))
