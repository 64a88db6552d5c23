"""Online SAC on the SAC-N core (N=2 for SAC): the env steps on the host, the updates run on the device in chunks.

Every `chunk_steps` env steps the host hands the new transitions to one compiled call that inserts them
into a device-resident replay buffer and runs `utd * chunk_steps` updates in a `lax.scan`, each sampling
its batch inside `jit` (update-to-data ratio 1 in SAC; fine-tuning runs higher). Between chunks the policy
is fixed, as in SpinningUp's `update_every=50`. A batch may take a fixed share of its rows from a second,
fixed buffer (offline data kept during fine-tuning), passed to each call rather than held in the state.

Agents do not import `envs`: the callers step the env and hand the rows over. Behaviour training steps a
gymnasium env through the one env loop (`mbrl.envs.lockstep.Lockstep`, scripts/train_behaviour.py); fine-tuning on
a robot drives the deploy control loop (`mbrl.finetune`). Both feed the same `OnlineSAC.chunk`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from mbrl.agents.sac_n import SACN, SACNConfig, SACNState
from mbrl.core import replay
from mbrl.core.errors import ConfigError
from mbrl.core.replay import ReplayBuffer
from mbrl.core.types import Transitions


@dataclasses.dataclass(frozen=True)
class SACConfig:
    # SAC (Haarnoja et al. 2018b): 2 critics of 2x256, lr 3e-4, batch 256, UTD 1, 1M replay buffer.
    # 10k uniform-random warm-up steps: SpinningUp's start_steps and rl-zoo's learning_starts for MuJoCo.
    sacn: SACNConfig = SACNConfig()
    buffer_capacity: int = 1_000_000
    warmup_steps: int = 10_000
    chunk_steps: int = 50
    utd: int = 1  # updates per new transition
    offline_rows: int = 0  # rows of every batch drawn from the fixed buffer (the leading rows)

    def __post_init__(self):
        if isinstance(self.utd, bool) or not isinstance(self.utd, int) or self.utd < 1:
            raise ConfigError(f"utd: expected a positive int (updates per new transition), found {self.utd!r}")
        if not 0 <= self.offline_rows <= self.sacn.batch_size:
            raise ConfigError(f"offline_rows: expected 0..batch_size ({self.sacn.batch_size}), found {self.offline_rows}")


@struct.dataclass
class OnlineState:
    agent: SACNState
    buffer: ReplayBuffer
    key: jax.Array


class OnlineSAC:
    """Pure pieces of online SAC: `init`, `act`, and `chunk` (insert new rows, then K updates)."""

    def __init__(self, config: SACConfig, obs_dim: int, act_dim: int, obs_scale=None):
        """`obs_scale`: the offline run's observation standardisation (`mbrl.agents.networks.ObsScale`), if any."""
        if config.buffer_capacity % config.chunk_steps:
            raise ValueError("buffer_capacity must be a multiple of chunk_steps")
        self.config = config
        self.core = SACN(config.sacn, obs_dim, act_dim, obs_scale=obs_scale)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        # The buffer and the agent state are donated: updated in place, never copied per chunk.
        self.insert_only = jax.jit(self._insert_only, donate_argnums=0)
        self.insert_and_update = jax.jit(self._insert_and_update, donate_argnums=0)
        self.policy_step = jax.jit(self._policy_step, static_argnames="deterministic")

    def init(self, key: jax.Array) -> OnlineState:
        return jax.jit(self._init)(key)  # compiled, so every leaf is its own buffer (donation)

    def _init(self, key: jax.Array) -> OnlineState:
        agent_key, key = jax.random.split(key)
        buffer = replay.empty(self.config.buffer_capacity, self.obs_dim, self.act_dim)
        return OnlineState(agent=self.core.init(agent_key, self.core.hypers()), buffer=buffer, key=key)

    def _policy_step(self, actor_params, obs, key, step, deterministic=False):
        return self.core.act(actor_params, obs, jax.random.fold_in(key, step), deterministic)

    def _insert_only(self, state: OnlineState, rows: Transitions):
        return state.replace(buffer=replay.insert(state.buffer, rows, jnp.ones(rows.reward.shape[0], bool)))

    def _insert_and_update(self, state: OnlineState, rows: Transitions, fixed: ReplayBuffer | None, hypers: dict,
                           anchor_params=None):
        """`fixed`: the buffer a batch's `offline_rows` leading rows come from (None: none);
        `hypers`: the core's traced values for this chunk (`SACN.hypers()` for the config's), e.g. a decaying BC weight;
        `anchor_params`: the frozen actor a BC term imitates (`SACN.actor_loss`)."""
        buffer = replay.insert(state.buffer, rows, jnp.ones(rows.reward.shape[0], bool))
        key, sample_key, update_key = jax.random.split(state.key, 3)
        batches = self.chunk_batches(buffer, fixed, sample_key, rows.reward.shape[0] * self.config.utd)
        agent, metrics = self.core.update_many(state.agent, batches, update_key, hypers, anchor_params)
        return OnlineState(agent=agent, buffer=buffer, key=key), metrics

    def chunk(self, state: OnlineState, rows: Transitions, steps: int, fixed: ReplayBuffer | None, hypers: dict,
              anchor_params=None) -> tuple[OnlineState, dict | None]:
        """One chunk, the rows of env steps up to `steps`, in one compiled call: inserted only while `steps` is
        within the warm-up (`warmup_steps`; metrics None), else inserted then `utd * len(rows)` updates
        (`_insert_and_update`'s arguments). The one rule every online loop feeds its chunks through."""
        if steps <= self.config.warmup_steps:
            return self.insert_only(state, rows), None
        return self.insert_and_update(state, rows, fixed, hypers, anchor_params)

    def deterministic_policy(self) -> Callable:
        """A jitted batch policy `(actor_params, obs_batch, key) -> tanh(mean)`."""
        return make_policy(self.core, deterministic=True)

    def chunk_batches(self, buffer: ReplayBuffer, fixed: ReplayBuffer | None, key: jax.Array, updates: int) -> Transitions:
        """The batches of `updates` updates, (updates, batch, ...): `offline_rows` leading rows of each from `fixed`,
        the rest from `buffer`. The buffers do not change during a chunk, so all batches are gathered at once
        before the scan (on CPU, one large gather is cheaper than one small gather per update)."""
        batch, from_fixed = self.config.sacn.batch_size, self.config.offline_rows
        if from_fixed and fixed is None:
            raise ConfigError(f"online SAC: {from_fixed} rows of every batch come from a fixed buffer, and none was given")
        shaped = lambda flat: jax.tree.map(lambda x: x.reshape(updates, -1, *x.shape[1:]), flat)  # noqa: E731
        if not from_fixed:
            return shaped(replay.sample(buffer, key, updates * batch))
        own_key, fixed_key = jax.random.split(key)
        own = shaped(replay.sample(buffer, own_key, updates * (batch - from_fixed)))
        kept = shaped(replay.sample(fixed, fixed_key, updates * from_fixed))
        return jax.tree.map(lambda a, b: jnp.concatenate([a, b.astype(a.dtype)], axis=1), kept, own)


def make_policy(core: SACN, deterministic: bool) -> Callable:
    """A jitted batch policy `(actor_params, obs_batch, key) -> actions in [-1, 1]`."""
    return jax.jit(functools.partial(core.act, deterministic=deterministic))
