"""Device replay buffers: masked insert, ring wrap-around, sampling only written slots, mixing, vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl.core import replay
from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions

OBS, ACT = 3, 2


def _rows(ids) -> Transitions:
    """Rows whose every field encodes its id (ids start at 1, so zeroed unwritten slots are id 0)."""
    ids = np.asarray(ids, np.float32)
    return Transitions(
        obs=jnp.asarray(np.repeat(ids[:, None], OBS, 1)),
        action=jnp.asarray(np.repeat(-ids[:, None], ACT, 1)),
        reward=jnp.asarray(ids),
        next_obs=jnp.asarray(np.repeat(ids[:, None] + 0.5, OBS, 1)),
        terminal=jnp.asarray(ids % 3 == 0),
        timeout=jnp.asarray(ids % 5 == 0),
    )


def _check_consistent(data: Transitions, ids: np.ndarray):
    """Every field of each row is the one of row id `ids`."""
    np.testing.assert_array_equal(data.obs, np.repeat(ids[:, None], OBS, 1))
    np.testing.assert_array_equal(data.action, np.repeat(-ids[:, None], ACT, 1))
    np.testing.assert_array_equal(data.next_obs, np.repeat(np.where(ids > 0, ids + 0.5, 0.0)[:, None], OBS, 1))
    np.testing.assert_array_equal(data.terminal, (ids % 3 == 0) & (ids > 0))
    np.testing.assert_array_equal(data.timeout, (ids % 5 == 0) & (ids > 0))


def test_masked_insert_writes_exactly_the_valid_rows_in_order():
    buffer = replay.empty(10, OBS, ACT)
    valid = np.array([1, 0, 1, 1, 0, 0, 1], bool)
    buffer = replay.insert(buffer, _rows(np.arange(1, 8)), jnp.asarray(valid))
    assert int(buffer.size) == 4 and int(buffer.insert_pos) == 4
    ids = np.asarray(buffer.data.reward)
    np.testing.assert_array_equal(ids, [1, 3, 4, 7, 0, 0, 0, 0, 0, 0])
    _check_consistent(buffer.data, ids)
    unchanged = replay.insert(buffer, _rows(np.arange(50, 57)), jnp.zeros(7, bool))
    assert int(unchanged.size) == 4 and int(unchanged.insert_pos) == 4
    np.testing.assert_array_equal(unchanged.data.reward, ids)


def test_ring_wraps_around_like_a_python_ring():
    capacity = 7
    rng = np.random.default_rng(0)
    buffer = replay.empty(capacity, OBS, ACT)
    ring, pos, size, next_id = np.zeros(capacity), 0, 0, 1
    for rows in (5, 4, 6, 9, 20, 3):  # 9 and 20 valid rows can exceed the capacity in one insert
        ids = np.arange(next_id, next_id + rows)
        next_id += rows
        valid = rng.random(rows) < 0.8
        buffer = replay.insert(buffer, _rows(ids), jnp.asarray(valid))
        for i in ids[valid]:
            ring[pos], pos, size = i, (pos + 1) % capacity, min(size + 1, capacity)
        np.testing.assert_array_equal(buffer.data.reward, ring)
        assert int(buffer.insert_pos) == pos and int(buffer.size) == size
        _check_consistent(buffer.data, np.asarray(buffer.data.reward))


def test_sample_returns_only_written_slots():
    buffer = replay.empty(64, OBS, ACT)
    buffer = replay.insert(buffer, _rows(np.arange(1, 12)), jnp.ones(11, bool))
    batch = replay.sample(buffer, jax.random.PRNGKey(0), 2048)
    ids = np.asarray(batch.reward)
    assert set(ids) == set(range(1, 12))  # every written slot, no unwritten (id 0) one
    _check_consistent(batch, ids)
    # after wrap-around every slot is written and each may come back
    buffer = replay.insert(buffer, _rows(np.arange(100, 200)), jnp.ones(100, bool))
    ids = np.asarray(replay.sample(buffer, jax.random.PRNGKey(1), 4096).reward)
    assert set(ids) == set(range(136, 200))


def test_buffers_vmap_over_seeds():
    seeds = 3
    buffers = jax.vmap(lambda _: replay.empty(8, OBS, ACT))(jnp.arange(seeds))
    masks = jnp.asarray(np.random.default_rng(1).random((seeds, 6)) < 0.5)
    rows = jax.tree.map(lambda x: jnp.stack([x] * seeds), _rows(np.arange(1, 7)))
    buffers = jax.jit(jax.vmap(replay.insert))(buffers, rows, masks)
    for s in range(seeds):
        expected = np.arange(1, 7)[np.asarray(masks[s])]
        assert int(buffers.size[s]) == len(expected)
        np.testing.assert_array_equal(buffers.data.reward[s, : len(expected)], expected)
    batches = jax.vmap(lambda b, k: replay.sample(b, k, 32))(buffers, jax.random.split(jax.random.PRNGKey(0), seeds))
    for s in range(seeds):
        assert set(np.asarray(batches.reward[s])) <= set(np.arange(1, 7)[np.asarray(masks[s])]) | (
            {0} if not masks[s].any() else set()
        )


def test_bad_capacity_raises():
    with pytest.raises(ConfigError, match="capacity"):
        replay.empty(0, OBS, ACT)
