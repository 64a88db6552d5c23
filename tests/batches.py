"""Batches of random transitions for the agents' unit tests (one builder, so every test's batch is drawn alike)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mbrl.core.types import Transitions


def random_batch(seed: int, rows: int, obs_dim: int, act_dim: int, terminal: bool = False, action_bound: float = 0.9,
                 reward_shift: float = 0.0) -> Transitions:
    """Normal observations, rewards (plus `reward_shift`) and next observations, uniform actions within
    ±`action_bound`, drawn in that order from `numpy.random.default_rng(seed)`; every row terminal with `terminal`,
    else every third; no timeouts."""
    rng = np.random.default_rng(seed)
    return Transitions(
        obs=jnp.asarray(rng.normal(size=(rows, obs_dim)), jnp.float32),
        action=jnp.asarray(rng.uniform(-action_bound, action_bound, size=(rows, act_dim)), jnp.float32),
        reward=jnp.asarray(rng.normal(size=rows) + reward_shift, jnp.float32),
        next_obs=jnp.asarray(rng.normal(size=(rows, obs_dim)), jnp.float32),
        terminal=jnp.ones(rows, bool) if terminal else jnp.asarray(np.arange(rows) % 3 == 0),
        timeout=jnp.zeros(rows, bool),
    )
