"""Sequence ("tape") storage for recurrent agents: whole trajectories as fixed-shape device arrays.

A `Tape` holds up to `capacity` trajectories, one per row of (capacity, max_len + 1) arrays. Row i
holds `length[i]` transitions: the agent saw `obs[i, t]`, took `action[i, t]`, got `reward[i, t]`
and `terminal[i, t]`, and saw `obs[i, t + 1]` next; `obs[i, length[i]]` is the last observation
(bootstrap from it unless the last transition is terminal). `real[i, t]` tells a dataset transition
from an imagined one, so a loss can weigh them apart (NEUBAY's `real_weight`).

Like NEUBAY's tape buffer (twni2016/neubay experience/agent_buffer.py, after Memoroids), a trajectory
is stored whole, so that the recurrent state at any step can be rebuilt from the episode's start.
Unlike it, everything is a pure function over static shapes (insert and sample run inside `jit`),
and training samples windows rather than whole tapes: `sample` cuts B windows of `length` steps at
uniformly drawn transitions, each preceded by `warmup` steps of history that rebuild the memory
(no loss there). Rows where the trajectory has not started are padding; its first step resets the
memory, so padding never leaks into the state.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from mbrl.core.errors import ConfigError
from mbrl.core.replay import ring_slots


@struct.dataclass
class Tape:
    obs: jax.Array  # (N, T + 1, obs_dim) float32
    action: jax.Array  # (N, T + 1, act_dim) float32, the last slot unused
    reward: jax.Array  # (N, T + 1) float32
    terminal: jax.Array  # (N, T + 1) bool
    real: jax.Array  # (N, T + 1) bool: a dataset transition (not imagined)
    length: jax.Array  # (N,) int32 transitions in the row
    insert_pos: jax.Array  # () int32, the next row to write
    size: jax.Array  # () int32, rows written (at most N)

    @property
    def capacity(self) -> int:
        return int(self.length.shape[-1])

    @property
    def max_len(self) -> int:
        return int(self.reward.shape[-1]) - 1

    def transitions(self) -> jax.Array:
        """Transitions stored over the written rows."""
        written = jnp.arange(self.length.shape[-1]) < self.size
        return jnp.sum(jnp.where(written, self.length, 0))


@struct.dataclass
class SequenceBatch:
    """B windows of R = warmup + length + 1 steps, as a recurrent agent's training batch.

    Row r of a window is a step the memory reads: `obs`, `prev_action`, `prev_reward` (zeros at an
    episode's first step, where `first` is True). `action`, `reward`, `terminal`, `real` describe the
    transition from row r to row r + 1. `loss_mask` is True on the transitions that train: rows
    warmup .. warmup + length - 1 that hold a stored transition. The last row only serves as next step.
    """

    obs: jax.Array  # (B, R, obs_dim)
    prev_action: jax.Array  # (B, R, act_dim)
    prev_reward: jax.Array  # (B, R)
    first: jax.Array  # (B, R) bool
    action: jax.Array  # (B, R, act_dim)
    reward: jax.Array  # (B, R)
    terminal: jax.Array  # (B, R) bool
    real: jax.Array  # (B, R) bool
    loss_mask: jax.Array  # (B, R) bool


def empty(capacity: int, max_len: int, obs_dim: int, act_dim: int) -> Tape:
    """A tape of `capacity` rows of up to `max_len` transitions, none written."""
    if capacity < 1 or max_len < 1:
        raise ConfigError(f"tape: expected a positive capacity and max_len, found {capacity} and {max_len}")
    steps = max_len + 1
    return Tape(
        obs=jnp.zeros((capacity, steps, obs_dim), jnp.float32),
        action=jnp.zeros((capacity, steps, act_dim), jnp.float32),
        reward=jnp.zeros((capacity, steps), jnp.float32),
        terminal=jnp.zeros((capacity, steps), bool),
        real=jnp.zeros((capacity, steps), bool),
        length=jnp.zeros(capacity, jnp.int32),
        insert_pos=jnp.zeros((), jnp.int32),
        size=jnp.zeros((), jnp.int32),
    )


def from_episodes(transitions, episode_starts, max_len: int) -> Tape:
    """A full tape of a dataset's episodes (host arrays), each cut to its first `max_len` transitions.

    `obs` of a row is the episode's observations followed by the last transition's `next_obs`.
    """
    starts = np.asarray(episode_starts, np.int64)
    rows = len(transitions.reward)
    if rows == 0 or len(starts) == 0:
        raise ConfigError("tape from episodes: the dataset has no transitions")
    ends = np.append(starts[1:], rows)
    lengths = np.minimum(ends - starts, max_len)
    count = len(starts)
    steps = max_len + 1
    obs = np.zeros((count, steps, transitions.obs.shape[-1]), np.float32)
    action = np.zeros((count, steps, transitions.action.shape[-1]), np.float32)
    reward = np.zeros((count, steps), np.float32)
    terminal = np.zeros((count, steps), bool)
    real = np.zeros((count, steps), bool)
    # One vectorised scatter: (episode, step) -> dataset row for every kept transition.
    episode = np.repeat(np.arange(count), lengths)
    step = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    source = starts[episode] + step
    obs[episode, step] = transitions.obs[source]
    action[episode, step] = transitions.action[source]
    reward[episode, step] = transitions.reward[source]
    terminal[episode, step] = transitions.terminal[source]
    real[episode, step] = True
    last = starts + lengths - 1
    obs[np.arange(count), lengths] = transitions.next_obs[last]
    return Tape(
        obs=jnp.asarray(obs),
        action=jnp.asarray(action),
        reward=jnp.asarray(reward),
        terminal=jnp.asarray(terminal),
        real=jnp.asarray(real),
        length=jnp.asarray(lengths, jnp.int32),
        insert_pos=jnp.zeros((), jnp.int32),
        size=jnp.asarray(count, jnp.int32),
    )


@functools.partial(jax.jit, donate_argnums=0)
def insert(tape: Tape, rows: Tape) -> Tape:
    """Write the rows of `rows` (B, T + 1, ...) that hold at least one transition, in order, into the ring.

    The ring is `mbrl.core.replay.ring_slots`, as the flat buffer's. Only `rows`' per-row fields are read
    (not its counters).
    """
    slots, insert_pos, size = ring_slots(tape.insert_pos, tape.size, tape.capacity, rows.length > 0)

    def put(store, new):
        return store.at[slots].set(new.astype(store.dtype), mode="drop")

    return Tape(
        obs=put(tape.obs, rows.obs),
        action=put(tape.action, rows.action),
        reward=put(tape.reward, rows.reward),
        terminal=put(tape.terminal, rows.terminal),
        real=put(tape.real, rows.real),
        length=put(tape.length, rows.length),
        insert_pos=insert_pos,
        size=size,
    )


def sample_transitions(tape: Tape, key: jax.Array, count: int) -> tuple[jax.Array, jax.Array]:
    """`count` (row, step) pairs uniform over the stored transitions: a row with probability
    proportional to its length, then a step uniform in it. With nothing stored: row 0, step 0."""
    row_key, step_key = jax.random.split(key)
    written = jnp.arange(tape.capacity) < tape.size
    weight = jnp.where(written, tape.length, 0).astype(jnp.float32)
    logits = jnp.where(weight > 0, jnp.log(jnp.maximum(weight, 1.0)), -jnp.inf)
    logits = jnp.where(jnp.any(weight > 0), logits, jnp.zeros_like(logits))
    row = jax.random.categorical(row_key, logits, shape=(count,))
    length = tape.length[row]
    step = jnp.floor(jax.random.uniform(step_key, (count,)) * length).astype(jnp.int32)
    return row, jnp.clip(step, 0, jnp.maximum(length - 1, 0))


def window(tape: Tape, row: jax.Array, start: jax.Array, length: int, warmup: int) -> SequenceBatch:
    """Windows of rows `row` (B,) starting their `length` training steps at `start` (B,), after `warmup`."""
    span = warmup + length + 1
    pos = start[:, None] - warmup + jnp.arange(span)[None, :]  # (B, R) step index inside the row
    steps = tape.max_len + 1
    row_length = tape.length[row][:, None]
    seen = (pos >= 0) & (pos <= row_length)  # an observation exists
    stored = (pos >= 0) & (pos < row_length)  # a transition leaves it
    has_prev = (pos >= 1) & (pos <= row_length)
    here = jnp.clip(pos, 0, steps - 1)
    prev = jnp.clip(pos - 1, 0, steps - 1)
    rows = row[:, None]

    def gather(field, index, mask):
        values = field[rows, index]
        return jnp.where(mask.reshape(mask.shape + (1,) * (values.ndim - 2)), values, jnp.zeros_like(values))

    train_rows = (jnp.arange(span) >= warmup) & (jnp.arange(span) < warmup + length)
    return SequenceBatch(
        obs=gather(tape.obs, here, seen),
        prev_action=gather(tape.action, prev, has_prev),
        prev_reward=gather(tape.reward, prev, has_prev),
        first=pos == 0,
        action=gather(tape.action, here, stored),
        reward=gather(tape.reward, here, stored),
        terminal=gather(tape.terminal, here, stored),
        real=gather(tape.real, here, stored),
        loss_mask=stored & train_rows[None, :],
    )


@functools.partial(jax.jit, static_argnames=("num_sequences", "length", "warmup"))
def sample(tape: Tape, key: jax.Array, num_sequences: int, length: int, warmup: int) -> SequenceBatch:
    """`num_sequences` windows whose first training step is uniform over the stored transitions."""
    row, start = sample_transitions(tape, key, num_sequences)
    return window(tape, row, start, length, warmup)
