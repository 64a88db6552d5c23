"""Imagined rollouts: a policy acting in a dynamics model, compiled as one `lax.scan` over time.

The batch of B trajectories is vectorised at every step and nothing returns to the host until the
whole horizon is done. The model is any `mbrl.world_models.base.DynamicsModel` (duck typed), passed as a
pytree argument; the config, the horizon and the policy function are static.

Step semantics (what "valid" means; the tests pin every rule down):
- Step t of trajectory b is *valid* iff the trajectory is still alive (no earlier terminal, no
  earlier cut), t < horizon, its length so far < its `max_length`, the model's uncertainty u at this
  step is <= the threshold, and the prediction is finite.
- The step that terminates IS valid, with terminal=True; nothing after it is.
- The step whose u exceeds the threshold is NOT valid: the trajectory is cut *before* using it, so a
  valid step never has u above the threshold (what NEUBAY needs). Non-finite predictions cut the same way.
- `timeout` marks the last valid step of a trajectory that ended without a terminal (cut by the
  horizon, `max_length` or the threshold): the agent should bootstrap there.
- `reward` is the model's reward (`raw_reward` too): a penalty is the algorithm's business
  (`mbrl.agents.mopo.penalized_reward`), applied where the rows are stored.
- Dead lanes keep being computed (static shapes) on a frozen state; their records are masked out.

Policy functions have the signature `policy_fn(policy_state, carry, inputs: PolicyInput, key) ->
(action, carry)`. The carry is any pytree whose leaves have the batch as leading axis (a recurrent
agent's memory); stateless agents return it untouched (`MarkovPolicy` wraps `act(state, obs, key)`).

Randomness: step t uses `fold_in(step_key, t)`, so the same key gives the same rollout and the
chunked rollout equals the unchunked one. With `batch_chunk`, each slice of the batch gets its own
key, so results differ from the unsliced run (same distribution).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from mbrl.core.errors import ConfigError
from mbrl.core.types import PolicyInput, Transitions
from mbrl.world_models.uncertainty import MEASURES

MEMBER_MODES = ("per_sample", "per_trajectory")
MEMBER_POOLS = ("elites", "all")
OUTPUTS = ("transitions", "stats")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How to imagine. Static under `jit`: one compile per distinct config.

    member_mode: "per_sample" lets the model pick an elite per sample and step (MOPO/RAVL);
        "per_trajectory" fixes one member per trajectory for the whole rollout (NEUBAY's posterior
        sample), drawn from `member_pool` unless `members=` is given to `rollout`.
    uncertainty: a measure name of `mbrl.world_models.uncertainty.MEASURES`, used for penalty and cut.
    threshold: cut a trajectory before a step whose u exceeds this. A value known only at run time
        (a data quantile, see `uncertainty_threshold`) is better passed as `rollout(threshold=...)`,
        which does not recompile when it changes.
    deterministic: step with each member's mean instead of sampling its Gaussian.
    outputs: "transitions" records everything; "stats" records only the (H, B) masks, rewards and
        uncertainties (for diagnostics of long rollouts without their memory).
    batch_chunk: evaluate each step on slices of this many trajectories (B must be a multiple):
        keeps the ensemble's activations in cache on CPUs; None evaluates the batch at once.
    record_carry: also record the carry each step's policy call returned (`ImaginedBatch.policy_carry`), with the
        transitions: what a policy keeps of its own action (PPO's Gaussian sample before the tanh).
    """

    member_mode: str = "per_sample"
    member_pool: str = "elites"
    uncertainty: str = "aleatoric_max"
    threshold: float | None = None
    deterministic: bool = False
    outputs: str = "transitions"
    batch_chunk: int | None = None
    record_carry: bool = False

    def __post_init__(self):
        for name, allowed in (("member_mode", MEMBER_MODES), ("member_pool", MEMBER_POOLS), ("outputs", OUTPUTS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"RolloutConfig.{name}: expected one of {allowed}, found {getattr(self, name)!r}")
        if self.batch_chunk is not None and self.batch_chunk < 1:
            raise ConfigError(f"RolloutConfig.batch_chunk: expected a positive int or None, found {self.batch_chunk}")
        if self.uncertainty not in MEASURES:
            raise ConfigError(
                f"RolloutConfig.uncertainty: expected one of {sorted(MEASURES)}, found {self.uncertainty!r}"
            )


PolicyFn = Callable[[Any, Any, PolicyInput, jax.Array], tuple[jax.Array, Any]]


@dataclasses.dataclass(frozen=True)
class MarkovPolicy:
    """A stateless `act(policy_state, obs, key) -> action` as a PolicyFn (the carry passes through).

    A frozen dataclass, so two wrappers of the same function are equal and share one compile.
    """

    act: Callable[[Any, jax.Array, jax.Array], jax.Array]

    def __call__(self, policy_state, carry, inputs: PolicyInput, key):
        return self.act(policy_state, inputs.obs, key), carry


@struct.dataclass
class RecurrentStart:
    """A recurrent policy's state where imagination begins (see `warm_up`)."""

    carry: Any
    prev_action: jax.Array  # (B, act_dim)
    prev_reward: jax.Array  # (B,)
    first: jax.Array  # (B,) bool

    @classmethod
    def fresh(cls, carry, batch: int, act_dim: int) -> RecurrentStart:
        """Imagination from an episode's first observation, with the policy's initial carry."""
        return cls(
            carry, jnp.zeros((batch, act_dim), jnp.float32), jnp.zeros(batch, jnp.float32), jnp.ones(batch, bool)
        )


@struct.dataclass
class RolloutState:
    """What the scan carries from one step to the next; also the place a chunked rollout resumes."""

    obs: jax.Array  # (B, obs_dim), frozen once the trajectory ended
    carry: Any
    model_carry: Any  # the world model's memory (leaves lead with B); () for a Markov model
    prev_action: jax.Array
    prev_reward: jax.Array
    first: jax.Array
    alive: jax.Array  # (B,) bool
    length: jax.Array  # (B,) int32 valid steps so far
    returns: jax.Array  # (B,) sum of raw rewards over valid steps
    terminated: jax.Array  # (B,) bool, ended by a terminal
    cut_by_uncertainty: jax.Array  # (B,) bool, ended because u crossed the threshold (or non-finite)
    t: jax.Array  # () int32, the next step's index


@struct.dataclass
class RolloutStats:
    """Per-trajectory summary (for logging the histogram of imagined lengths)."""

    lengths: jax.Array  # (B,) int32
    returns: jax.Array  # (B,) raw return over valid steps
    terminated: jax.Array  # (B,) bool
    cut_by_uncertainty: jax.Array  # (B,) bool
    members: jax.Array  # (B,) int32 member per trajectory, -1 when chosen per sample

    @property
    def mean_length(self) -> jax.Array:
        return jnp.mean(self.lengths.astype(jnp.float32))

    @property
    def max_length(self) -> jax.Array:
        return jnp.max(self.lengths)


@struct.dataclass
class ImaginedBatch:
    """A rollout's records, time-major (H, B, ...)."""

    transitions: Transitions | None  # None when cfg.outputs == "stats"
    raw_reward: jax.Array  # (H, B)
    uncertainty: jax.Array  # (H, B)
    valid: jax.Array  # (H, B) bool
    stats: RolloutStats
    final: RolloutState
    policy_carry: Any = None  # (H, B, ...) the policy's carry after each step, where cfg.record_carry

    def flat(self) -> tuple[Transitions, jax.Array]:
        """Transitions and validity as (H*B, ...) rows, time-major: what a replay buffer inserts."""
        rows = self.valid.size
        return jax.tree.map(lambda x: x.reshape(rows, *x.shape[2:]), self.transitions), self.valid.reshape(rows)


@struct.dataclass
class _Step:
    """One step's record for the scan's output (fields absent in "stats" mode are None)."""

    valid: jax.Array
    terminal: jax.Array
    raw_reward: jax.Array
    uncertainty: jax.Array
    obs: Any = None
    action: Any = None
    reward: Any = None
    next_obs: Any = None
    carry: Any = None


def _where(mask, new, old):
    """Per-trajectory select over pytrees whose leaves lead with the batch axis."""
    return jax.tree.map(lambda n, o: jnp.where(mask.reshape(mask.shape + (1,) * (n.ndim - 1)), n, o), new, old)


def _one_step(world_model, policy_fn, policy_state, cfg, horizon, state, members, max_length, threshold, key):
    """Advance B trajectories by one step; `state.t` is the same for all of them."""
    policy_key, model_key = jax.random.split(key)
    inputs = PolicyInput(state.obs, state.prev_action, state.prev_reward, state.first)
    action, carry = policy_fn(policy_state, state.carry, inputs, policy_key)
    out = model_step(world_model, model_key, state.obs, action, members, state.model_carry, cfg)
    u = out.uncertainty.astype(jnp.float32)
    finite = jnp.isfinite(out.next_obs).all(axis=-1) & jnp.isfinite(out.reward) & jnp.isfinite(u)
    confident = finite if threshold is None else finite & (u <= threshold)
    eligible = state.alive & (state.length < max_length) & (state.t < horizon)
    valid = eligible & confident
    terminal = valid & out.terminal
    raw_reward = out.reward.astype(jnp.float32)
    new_state = RolloutState(
        obs=_where(valid, out.next_obs, state.obs),
        carry=_where(valid, carry, state.carry),
        model_carry=_where(valid, out.carry, state.model_carry),
        prev_action=_where(valid, action, state.prev_action),
        prev_reward=jnp.where(valid, raw_reward, state.prev_reward),
        first=state.first & ~valid,
        alive=valid & ~out.terminal,
        length=state.length + valid,
        returns=state.returns + jnp.where(valid, raw_reward, 0.0),
        terminated=state.terminated | terminal,
        cut_by_uncertainty=state.cut_by_uncertainty | (eligible & ~confident),
        t=state.t + 1,
    )
    record = _Step(valid=valid, terminal=terminal, raw_reward=raw_reward, uncertainty=u)
    if cfg.outputs == "transitions":
        record = record.replace(obs=state.obs, action=action, reward=raw_reward, next_obs=out.next_obs)
        if cfg.record_carry:
            record = record.replace(carry=carry)
    return new_state, record


def model_step(world_model, key, obs, action, members, model_carry, cfg: RolloutConfig):
    """`world_model.step` with its carry (empty for a Markov model)."""
    return world_model.step(key, obs, action, members, carry=model_carry, deterministic=cfg.deterministic,
                            uncertainty=cfg.uncertainty)


def initial_model_carry(world_model, batch: int):
    return world_model.initial_carry(batch)


def _scan_steps(world_model, policy_fn, policy_state, cfg, horizon, num_steps, state, consts, step_key):
    """`num_steps` steps from `state` in one scan; returns (final state, records (num_steps, B, ...))."""
    members, max_length, threshold = consts
    batch = state.obs.shape[0]
    slice_size = cfg.batch_chunk or batch
    if batch % slice_size:
        raise ConfigError(f"RolloutConfig.batch_chunk: {slice_size} does not divide the batch of {batch} start states")
    num_slices = batch // slice_size

    def step(state, _):
        key = jax.random.fold_in(step_key, state.t)
        t = state.t
        if num_slices == 1:
            return _one_step(
                world_model, policy_fn, policy_state, cfg, horizon, state, members, max_length, threshold, key
            )
        # lax.map over slices of the batch: one slice's activations stay in cache through the layers.
        per_slice = jax.tree.map(
            lambda x: x.reshape(num_slices, slice_size, *x.shape[1:]), (state.replace(t=None), members, max_length)
        )

        def one_slice(args):
            index, (sub_state, sub_members, sub_max) = args
            sub_state = sub_state.replace(t=t)
            new, rec = _one_step(
                world_model,
                policy_fn,
                policy_state,
                cfg,
                horizon,
                sub_state,
                sub_members,
                sub_max,
                threshold,
                jax.random.fold_in(key, index),
            )
            return new.replace(t=None), rec

        new, rec = jax.lax.map(one_slice, (jnp.arange(num_slices), per_slice))
        new, rec = jax.tree.map(lambda x: x.reshape(batch, *x.shape[2:]), (new, rec))
        return new.replace(t=t + 1), rec

    return jax.lax.scan(step, state, None, length=num_steps)


def _prepare(key, world_model, start_obs, cfg, start, members, max_length, threshold, act_dim, model_carry):
    """Initial state and per-trajectory constants, shared by `rollout` and `rollout_chunked`."""
    if start_obs.ndim != 2:
        raise ConfigError(f"rollout: start_obs must be (B, obs_dim), found shape {tuple(start_obs.shape)}")
    batch = start_obs.shape[0]
    member_key, step_key = jax.random.split(key)
    if cfg.member_mode == "per_trajectory":
        if members is None:
            pool = world_model.elites if cfg.member_pool == "elites" else jnp.arange(world_model.num_members)
            members = jax.random.choice(member_key, jnp.asarray(pool, jnp.int32), (batch,))
        members = jnp.broadcast_to(jnp.asarray(members, jnp.int32), (batch,))
    elif members is not None:
        raise ConfigError("rollout: `members` was given but RolloutConfig.member_mode is 'per_sample'")
    if start is None:
        start = RecurrentStart(
            (), jnp.zeros((batch, act_dim), jnp.float32), jnp.zeros(batch, jnp.float32), jnp.zeros(batch, bool)
        )
    if threshold is None and cfg.threshold is not None:
        threshold = cfg.threshold
    threshold = None if threshold is None else jnp.asarray(threshold, jnp.float32)
    max_length = jnp.broadcast_to(
        jnp.asarray(jnp.iinfo(jnp.int32).max if max_length is None else max_length, jnp.int32), (batch,)
    )
    state = RolloutState(
        obs=jnp.asarray(start_obs, jnp.float32),
        carry=start.carry,
        model_carry=initial_model_carry(world_model, batch) if model_carry is None else model_carry,
        prev_action=jnp.asarray(start.prev_action, jnp.float32),
        prev_reward=jnp.asarray(start.prev_reward, jnp.float32),
        first=jnp.asarray(start.first, bool),
        alive=jnp.ones(batch, bool),
        length=jnp.zeros(batch, jnp.int32),
        returns=jnp.zeros(batch, jnp.float32),
        terminated=jnp.zeros(batch, bool),
        cut_by_uncertainty=jnp.zeros(batch, bool),
        t=jnp.zeros((), jnp.int32),
    )
    return state, (members, max_length, threshold), step_key


def _assemble(records: _Step, state: RolloutState, next_valid: jax.Array, members) -> ImaginedBatch:
    """Records of one scan -> ImaginedBatch; `next_valid` is the validity of the step after the last."""
    later_valid = jnp.concatenate([records.valid[1:], next_valid[None]], axis=0)
    transitions = None
    if records.obs is not None:
        transitions = Transitions(
            obs=records.obs,
            action=records.action,
            reward=records.reward,
            next_obs=records.next_obs,
            terminal=records.terminal,
            timeout=records.valid & ~records.terminal & ~later_valid,
        )
    stats = RolloutStats(
        lengths=state.length,
        returns=state.returns,
        terminated=state.terminated,
        cut_by_uncertainty=state.cut_by_uncertainty,
        members=jnp.full(state.length.shape, -1, jnp.int32) if members is None else members,
    )
    return ImaginedBatch(transitions, records.raw_reward, records.uncertainty, records.valid, stats, state,
                         policy_carry=records.carry)


def _action_dim(policy_fn, policy_state, start_obs, start):
    """The action width: from the recurrent start, else by abstract evaluation of a stateless policy."""
    if start is not None:
        return start.prev_action.shape[-1]
    batch = start_obs.shape[0]
    probe = PolicyInput(start_obs, jnp.zeros((batch, 0)), jnp.zeros(batch), jnp.zeros(batch, bool))
    action = jax.eval_shape(lambda: policy_fn(policy_state, (), probe, jax.random.PRNGKey(0))[0])
    return action.shape[-1]


@functools.partial(jax.jit, static_argnames=("policy_fn", "horizon", "cfg"))
def rollout(
    key: jax.Array,
    world_model,
    policy_fn: PolicyFn,
    policy_state,
    start_obs: jax.Array,
    horizon: int,
    cfg: RolloutConfig = RolloutConfig(),
    *,
    start: RecurrentStart | None = None,
    members: jax.Array | None = None,
    max_length: jax.Array | None = None,
    threshold: jax.Array | None = None,
    model_carry: Any = None,
) -> ImaginedBatch:
    """Imagine `horizon` steps from B start states; records are (horizon, B, ...).

    start: a recurrent policy's carry and previous action/reward (from `warm_up` or
        `RecurrentStart.fresh`); None for a stateless policy.
    members: (B,) or scalar int member per trajectory (cfg.member_mode "per_trajectory" only).
    max_length: (B,) or scalar int, the most steps a trajectory may take (NEUBAY: the episode's
        remaining horizon).
    threshold: scalar, overrides cfg.threshold without recompiling.
    model_carry: a recurrent world model's memory at the start states (its `warm_up` on their real history);
        None: its `initial_carry`.
    """
    if horizon < 1:
        raise ConfigError(f"rollout: horizon must be a positive number of steps, found {horizon}")
    act_dim = _action_dim(policy_fn, policy_state, start_obs, start)
    state, consts, step_key = _prepare(key, world_model, start_obs, cfg, start, members, max_length, threshold, act_dim,
                                       model_carry)
    state, records = _scan_steps(world_model, policy_fn, policy_state, cfg, horizon, horizon, state, consts, step_key)
    return _assemble(records, state, jnp.zeros_like(state.alive), consts[0])


@functools.partial(
    jax.jit, static_argnames=("policy_fn", "horizon", "cfg", "chunk", "consume"), donate_argnames=("consume_state",)
)
def rollout_chunked(
    key: jax.Array,
    world_model,
    policy_fn: PolicyFn,
    policy_state,
    start_obs: jax.Array,
    horizon: int,
    cfg: RolloutConfig,
    *,
    chunk: int,
    consume: Callable[[Any, ImaginedBatch], Any],
    consume_state,
    start: RecurrentStart | None = None,
    members: jax.Array | None = None,
    max_length: jax.Array | None = None,
    threshold: jax.Array | None = None,
    model_carry: Any = None,
) -> tuple[Any, RolloutStats]:
    """The same rollout in chunks of `chunk` steps, each handed to `consume` inside the compiled call.

    Memory holds two chunks (not the horizon): a chunk is consumed once the next one is computed,
    so its last row's `timeout` is exact. `consume(consume_state, batch) -> consume_state` is pure,
    for example writing the chunk into a tape's rows (NEUBAY). Steps past `horizon` in the last chunk
    are invalid. The rollout stops at the first chunk boundary where no trajectory can take another
    step (the remaining chunks would be all invalid). Same key, same transitions as `rollout`.
    """
    if chunk < 1 or horizon < 1:
        raise ConfigError(f"rollout_chunked: horizon and chunk must be positive, found {horizon} and {chunk}")
    act_dim = _action_dim(policy_fn, policy_state, start_obs, start)
    state, consts, step_key = _prepare(key, world_model, start_obs, cfg, start, members, max_length, threshold, act_dim,
                                       model_carry)
    run = functools.partial(_scan_steps, world_model, policy_fn, policy_state, cfg, horizon, chunk)
    num_chunks = -(-horizon // chunk)
    state, pending = run(state, consts, step_key)

    def unfinished(carry):
        index, state, *_ = carry
        can_step = state.alive & (state.length < consts[1]) & (state.t < horizon)
        return (index < num_chunks - 1) & jnp.any(can_step)

    def body(carry):
        index, state, pending, consume_state = carry
        pending_state = state
        state, records = run(state, consts, step_key)
        consume_state = consume(consume_state, _assemble(pending, pending_state, records.valid[0], consts[0]))
        return index + 1, state, records, consume_state

    _, state, pending, consume_state = jax.lax.while_loop(
        unfinished, body, (jnp.zeros((), jnp.int32), state, pending, consume_state))
    last = _assemble(pending, state, jnp.zeros_like(state.alive), consts[0])
    return consume(consume_state, last), last.stats


@functools.partial(jax.jit, static_argnames=("policy_fn",))
def warm_up(
    key, policy_fn: PolicyFn, policy_state, carry, prefix: Transitions, prefix_mask: jax.Array | None = None
) -> RecurrentStart:
    """Run a recurrent policy over a real history prefix: one scan of `policy_fn` over its rows.

    prefix: real transitions, time-major (L, B, ...), starting at an episode's first step. Rows
        where `prefix_mask` (L, B) is False are padding and leave the carry untouched; pad on the
        left so that every trajectory's last real row is row L-1 and its imagination starts at
        `prefix.next_obs[-1]`. The policy's actions are discarded: the real ones become
        `prev_action`. A trajectory with no real row gets `first=True` and its initial carry.
    """
    length, batch = prefix.reward.shape
    mask = jnp.ones((length, batch), bool) if prefix_mask is None else jnp.asarray(prefix_mask, bool)
    start = RecurrentStart(
        carry,
        jnp.zeros((batch, prefix.action.shape[-1]), jnp.float32),
        jnp.zeros(batch, jnp.float32),
        jnp.ones(batch, bool),
    )

    def step(start, row):
        index, obs, action, reward, row_valid = row
        inputs = PolicyInput(obs, start.prev_action, start.prev_reward, start.first)
        _, carry = policy_fn(policy_state, start.carry, inputs, jax.random.fold_in(key, index))
        new = RecurrentStart(_where(row_valid, carry, start.carry), action, reward, jnp.zeros_like(start.first))
        return _where(row_valid, new, start), None

    rows = (jnp.arange(length), prefix.obs, prefix.action, prefix.reward, mask)
    start, _ = jax.lax.scan(step, start, rows)
    return start


def dataset_uncertainty(
    world_model,
    obs: jax.Array,
    actions: jax.Array,
    *,
    uncertainty: str = "epistemic_std",
    batch_size: int = 8192,
    key: jax.Array | None = None,
) -> jax.Array:
    """The model's uncertainty at each dataset (obs, action) pair, (N,).

    What NEUBAY's truncation threshold is a quantile of. Computed in batches of `batch_size` rows in one
    compiled `lax.map`, with each member's mean (deterministic), so memory stays at one batch of activations.
    """
    if obs.ndim != 2 or actions.ndim != 2 or obs.shape[0] != actions.shape[0] or obs.shape[0] == 0:
        raise ConfigError(
            f"dataset_uncertainty: expected obs (N, obs_dim) and actions (N, act_dim) with the same N > 0, "
            f"found {tuple(obs.shape)} and {tuple(actions.shape)}"
        )
    key = jax.random.PRNGKey(0) if key is None else key
    return _dataset_uncertainty(world_model, jnp.asarray(obs, jnp.float32), jnp.asarray(actions, jnp.float32), key,
                                uncertainty, min(batch_size, obs.shape[0]))


def uncertainty_threshold(world_model, obs: jax.Array, actions: jax.Array, quantile: float, **kwargs) -> jax.Array:
    """Quantile `quantile` of `dataset_uncertainty` (1.0 = the max)."""
    if not 0.0 <= quantile <= 1.0:
        raise ConfigError(f"uncertainty_threshold: quantile must be in [0, 1], found {quantile}")
    return jnp.quantile(dataset_uncertainty(world_model, obs, actions, **kwargs), quantile)


@functools.partial(jax.jit, static_argnames=("uncertainty", "batch_size"))
def _dataset_uncertainty(world_model, obs, actions, key, uncertainty, batch_size):
    rows = obs.shape[0]
    padded = -(-rows // batch_size) * batch_size

    def pad(x):
        return jnp.pad(x, ((0, padded - rows), (0, 0))).reshape(padded // batch_size, batch_size, x.shape[-1])

    def batch_u(args):
        index, o, a = args
        out = world_model.step(jax.random.fold_in(key, index), o, a, None, deterministic=True, uncertainty=uncertainty)
        return out.uncertainty.astype(jnp.float32)

    return jax.lax.map(batch_u, (jnp.arange(padded // batch_size), pad(obs), pad(actions))).reshape(padded)[:rows]
