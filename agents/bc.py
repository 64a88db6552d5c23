"""Behaviour cloning: a deterministic actor regressed onto the dataset's actions (real data only).

The baseline of OfflineRL-Kit (offlinerlkit/policy/model_free/bc.py, run_example/run_bc.py): an MLP
of 2x256 with a tanh output, mean squared error to the data's actions, Adam at 3e-4, batch 256.
Model-free: the training loop never imagines rollouts for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from mbrl.agents.base import AlgorithmEntry, scan_updates, traced, traced_values
from mbrl.agents.networks import DeterministicActor, ObsScale, scaled
from mbrl.core import checks
from mbrl.core.nn import MLP
from mbrl.core.types import Transitions


@dataclasses.dataclass(frozen=True)
class BCConfig:
    """Behaviour cloning's settings (section `bc`).

    hidden_sizes: hidden layer widths of the actor.
    learning_rate: Adam learning rate.
    batch_size: rows per update.
    """

    hidden_sizes: Sequence[int] = (256, 256)
    learning_rate: float = traced(3e-4)
    batch_size: int = 256

    def __post_init__(self):
        checks.widths("bc", self.hidden_sizes)
        checks.positive("bc", self, "learning_rate")
        checks.positive_ints("bc", self, "batch_size")


@struct.dataclass
class BCState:
    actor_params: Any
    opt_state: Any
    step: jax.Array


class BC(DeterministicActor):
    """`mbrl.agents.base.Algorithm` on the real data only: a deterministic Markov policy."""

    imagination = "none"

    def __init__(self, config: BCConfig, obs_dim: int, act_dim: int, obs_scale: ObsScale | None = None):
        self.config = config
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.actor = scaled(MLP(tuple(int(w) for w in config.hidden_sizes), act_dim), obs_scale)
        self.tx = optax.scale_by_adam()  # the learning rate is traced data (`hypers`)
        self.batch_size = config.batch_size

    def hypers(self) -> dict:
        return {"bc": traced_values(self.config)}

    def init(self, key: jax.Array, hypers: dict) -> BCState:
        del hypers  # nothing at init depends on them
        params = self.actor.init(key, jnp.zeros((1, self.obs_dim), jnp.float32))
        return BCState(actor_params=params, opt_state=self.tx.init(params), step=jnp.zeros((), jnp.int32))

    def loss(self, actor_params, batch: Transitions):
        return jnp.mean(jnp.square(self.deterministic_action(actor_params, batch.obs) - batch.action))

    def update(self, state: BCState, batch: Transitions, key: jax.Array, hypers: dict):
        del key
        lr = hypers["bc"]["learning_rate"]
        loss, grads = jax.value_and_grad(self.loss)(state.actor_params, batch)
        direction, opt_state = self.tx.update(grads, state.opt_state)
        params = jax.tree.map(lambda p, d: p - lr * d, state.actor_params, direction)
        return BCState(actor_params=params, opt_state=opt_state, step=state.step + 1), {"bc_loss": loss}

    def update_many(self, state: BCState, batches: Transitions, key: jax.Array, hypers: dict):
        """K updates in one `lax.scan` over batches with a leading axis K; metrics averaged over K."""
        return scan_updates(lambda s, b, k: self.update(s, b, k, hypers), state, batches, key)


# OfflineRL-Kit run_example/run_bc.py: a deterministic 2x256 actor, lr 3e-4, batch 256, 200 epochs of 1,000
# steps, on the real data only. Quick: 20 epochs.
PRESETS = {
    "paper": {
        "bc": {"hidden_sizes": (256, 256), "learning_rate": 3e-4, "batch_size": 256},
        "schedule": {"epochs": 200, "updates_per_epoch": 1000, "eval_every": 10, "eval_episodes": 10},
    },
    "quick": {
        "bc": {"hidden_sizes": (256, 256), "learning_rate": 3e-4, "batch_size": 256},
        "schedule": {"epochs": 20, "updates_per_epoch": 1000, "eval_every": 5, "eval_episodes": 5},
    },
}


def make(config, obs_dim, act_dim, obs_scale):
    return BC(config.bc, obs_dim, act_dim, obs_scale)


# BC's search space (`mbrl sweep --algo bc --space bc`): the deterministic actor's optimiser and size, the dimensions
# of NeoRL-2's grid for BC (polixir/OfflineRL offlinerl/config/algo/bc_config.py: actor learning rate in {1e-5, 1e-3},
# width in {64, 1024}, depth in {1, 5}; default 1e-3, 2 x 256), plus the batch size. The bounds are ours. Sizes change
# array shapes: trials that differ in them train as separate populations, so they have few values.
SPACE = {
    "bc.learning_rate": {"low": 1e-5, "high": 3e-3, "log": True},
    "bc.batch_size": {"choices": [256, 1024]},
    "bc.hidden_sizes": {"choices": [[256, 256], [256, 256, 256], [512, 512]]},
}

ALGORITHM = AlgorithmEntry(name="bc", sections={"bc": BCConfig}, make=make, presets=PRESETS,
                           smoke={"bc": {"hidden_sizes": [16, 16], "batch_size": 16}},
                           space=SPACE)
