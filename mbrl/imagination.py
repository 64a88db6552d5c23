"""What an algorithm learns from, as parts that plug into the one training epoch (`mbrl.trainer`).

An algorithm's `imagination` kind (`mbrl.agents.base`) picks one part:

- `RealOnly` ("none", BC): batches of real rows; no world model.
- `FlatImagination` ("transitions", MOPO, RAVL): each collect rolls the policy out for `horizon` steps
  from dataset states (one compiled `lax.scan` over time), passes the model rewards through the
  algorithm's `model_reward` (MOPO's penalty) and writes the rows into a ring buffer that keeps
  `retain_epochs` collects. A collect earns the epoch's K updates; a batch is `num_real` real rows,
  then model rows (the BC anchor imitates the leading real rows).
- `OnPolicyImagination` ("onpolicy", MOPO-PPO): a fresh batch of long rollouts every iteration, from real
  histories the recurrent model is warmed up on, turned by the agent into one PPO iteration and then dropped.
- `SequenceImagination` ("sequences", NEUBAY; twni2016/neubay experience/collector.py `ContCollector`):
  1. draw `parallel_size` steps uniformly over the dataset's observations (episode e, step p);
  2. warm the actor's memory on the real prefix 0..p-1 of episode e (`mbrl.world_models.rollout.warm_up`);
  3. draw ONE member per trajectory among the elites and roll it out from the real observation at step p
     with `mbrl.world_models.rollout.rollout_chunked`, until the episode's remaining horizon runs out, the
     task's termination fires, or epistemic_std exceeds the threshold (its `unc_quantile` quantile over
     the dataset's transitions, under the elites; the quantile is traced data);
  4. store prefix + imagination as one tape row (the prefix marked real) and earn
     ceil(utd · transitions stored) updates (`neubay.utd`; the prefix counts, as in neubay).
  Batches are windows of the tape (`mbrl.core.sequence_replay.sample`).

Every part has the same pure surface: `real_data(dataset)`, `empty()`, `initial_counters()`,
`collect(agent_state, store, counters, real, world_model, aux, hypers, key) -> (store, counters, metrics,
earned)` (the part holds its agent from `make(agent, config)`) and `sample(real, store, key, count)`; `prepare(world_model, real)` computes, once per
model on the host, what collects need besides the model (NEUBAY: the dataset's sorted uncertainties).
`fixed_credit` is the static number of updates a collect earns when it does not depend on the data; a part
whose `retains_store` is False hands its collect's data to that epoch's updates only (on-policy). A part
without a fixed credit (None) also gives `epoch_metrics(counters, store, collects, collect_means, aux, hypers)`,
the epoch's summary from its collects' metrics averaged over the epoch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from mbrl.agents.base import SequenceSettings, capability
from mbrl.core import replay, sequence_replay
from mbrl.core.errors import DatasetError
from mbrl.core.replay import ReplayBuffer
from mbrl.core.sequence_replay import Tape
from mbrl.core.types import PolicyInput, Transitions
from mbrl.world_models.model import WorldModel
from mbrl.world_models.rollout import (RecurrentStart, RolloutConfig, dataset_uncertainty, model_step, rollout,
                                       rollout_chunked, warm_up)

# Rollouts of many start states step in slices of this many trajectories, so that one slice's ensemble
# activations stay in the CPU's cache.
ROLLOUT_SLICE = 2000
HISTOGRAM_BINS = 10


@dataclasses.dataclass(frozen=True)
class ExploringPolicy:
    """An algorithm's sampling policy as a `mbrl.world_models.rollout` PolicyFn (`deterministic`: its greedy
    policy, for estimates of what it would score). A frozen dataclass: two wrappers of the same algorithm
    are equal, so they share one compile."""

    agent: Any
    deterministic: bool = False

    def __call__(self, actor_params, carry, inputs: PolicyInput, key):
        return self.agent.act(actor_params, carry, inputs, key, self.deterministic)


@dataclasses.dataclass(frozen=True)
class SampleRecordingPolicy:
    """An on-policy learner's sampling policy as a PolicyFn whose carry is what its `explore` returns beside the
    action; `on_policy_rollout` records it, so the learner scores each action by the sample it came from."""

    agent: Any

    def __call__(self, actor_params, carry, inputs: PolicyInput, key):
        return self.agent.explore(actor_params, inputs, key)


def on_policy_rollout(key, world_model, agent, actor_params, start_obs, horizon: int, cfg: RolloutConfig, **kwargs):
    """`rollout` of an on-policy learner's sampling policy, its samples in `policy_carry` (H, B, act_dim)."""
    batch, act_dim = start_obs.shape[0], agent.act_dim
    start = RecurrentStart(jnp.zeros((batch, act_dim), jnp.float32), jnp.zeros((batch, act_dim), jnp.float32),
                           jnp.zeros(batch, jnp.float32), jnp.zeros(batch, bool))
    return rollout(key, world_model, SampleRecordingPolicy(agent), actor_params, start_obs, horizon,
                   dataclasses.replace(cfg, record_carry=True), start=start, **kwargs)


def _mean_where(values, mask):
    return jnp.sum(jnp.where(mask, values, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


class RealOnly:
    """Batches of the dataset's rows, nothing imagined."""

    uses_model = False
    retains_store = True  # the store a collect returns is the next collect's

    def __init__(self, agent, config):
        self.agent = agent
        self.fixed_credit = config.schedule.updates_per_epoch
        self.batch_size = agent.batch_size

    def real_data(self, dataset) -> ReplayBuffer:
        return replay.from_transitions(dataset.transitions)

    def prepare(self, world_model, real):
        return None

    def empty(self):
        return None

    def initial_counters(self):
        return ()

    def collect(self, agent_state, store, counters, real, world_model, aux, hypers, key):
        return store, counters, {}, self.fixed_credit

    def sample(self, real: ReplayBuffer, store, key, count: int) -> Transitions:
        rows = replay.sample(real, key, count * self.batch_size)
        return jax.tree.map(lambda x: x.reshape(count, -1, *x.shape[1:]), rows)


class FlatImagination(RealOnly):
    """Short rollouts into a ring buffer; mixed batches of real rows first, then model rows."""

    uses_model = True

    def __init__(self, agent, config):
        super().__init__(agent, config)

        imagination = config.imagination
        self.horizon = imagination.horizon
        self.starts = imagination.rollouts_per_epoch
        self.capacity = self.starts * self.horizon * imagination.retain_epochs
        chunk = ROLLOUT_SLICE if self.starts > ROLLOUT_SLICE and self.starts % ROLLOUT_SLICE == 0 else None
        self.rollout_config = RolloutConfig(uncertainty=agent.uncertainty, batch_chunk=chunk,
                                            deterministic=not imagination.model_noise)
        self.num_real = replay.real_count(self.batch_size, imagination.real_ratio)
        self.obs_dim, self.act_dim = agent.obs_dim, agent.act_dim

    def empty(self) -> ReplayBuffer:
        return replay.empty(self.capacity, self.obs_dim, self.act_dim)

    def collect(self, agent_state, store: ReplayBuffer, counters, real: ReplayBuffer, world_model, aux, hypers, key):
        start_key, rollout_key = jax.random.split(key)
        starts = jax.random.randint(start_key, (self.starts,), 0, real.size)
        imagined = rollout(rollout_key, world_model, ExploringPolicy(self.agent), self.agent.actor_params(agent_state),
                           real.data.obs[starts], self.horizon, self.rollout_config)
        rows, valid = imagined.flat()
        raw, u = imagined.raw_reward.reshape(-1), imagined.uncertainty.reshape(-1)
        rows = rows.replace(reward=self.agent.model_reward(hypers, raw, u))
        store = replay.insert(store, rows, valid)
        metrics = {
            "rollout_length": imagined.stats.mean_length,
            "rollout_terminated": jnp.mean(imagined.stats.terminated.astype(jnp.float32)),
            "model_reward": _mean_where(raw, valid),
            "model_uncertainty": _mean_where(u, valid),
            "model_buffer_size": store.size.astype(jnp.float32),
        }
        return store, counters, metrics, self.fixed_credit

    def sample(self, real: ReplayBuffer, store: ReplayBuffer, key, count: int) -> Transitions:
        """`count` batches at once, (count, batch, ...): `num_real` real rows, then model rows.

        The buffers do not change during the updates that use them, so gathering up front is the same
        draw as gathering inside the scan, and faster on CPU (one large gather instead of many small ones).
        """
        real_key, model_key = jax.random.split(key)
        parts = []
        if self.num_real:
            parts.append(replay.sample(real, real_key, count * self.num_real))
        if self.batch_size - self.num_real:
            parts.append(replay.sample(store, model_key, count * (self.batch_size - self.num_real)))
        parts = [jax.tree.map(lambda x: x.reshape(count, -1, *x.shape[1:]), p) for p in parts]
        return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *parts)


@struct.dataclass
class CollectStats:
    """A collect's summary (imagined lengths exclude the real prefix)."""

    imagined_length_mean: jax.Array
    imagined_length_max: jax.Array
    imagined_length_median: jax.Array
    prefix_length_mean: jax.Array
    terminated: jax.Array  # fraction of trajectories ended by the termination function
    cut_by_uncertainty: jax.Array  # fraction cut at the threshold
    imagined_return: jax.Array  # mean sum of model rewards over the imagined steps
    transitions: jax.Array  # prefix + imagined transitions stored
    length_histogram: jax.Array  # (HISTOGRAM_BINS,) fraction of trajectories per bin of imagined length

    @classmethod
    def zeros(cls) -> CollectStats:
        z = jnp.zeros((), jnp.float32)
        return cls(z, z, z, z, z, z, z, z, jnp.zeros(HISTOGRAM_BINS, jnp.float32))


@struct.dataclass
class SequenceCounters:
    collects: jax.Array  # () int32: collects so far
    last: CollectStats  # the latest collect's summary


def start_steps(real: Tape, key, count: int):
    """`count` (episode, step) pairs uniform over the dataset's observations, the last one of each episode
    included (neubay experience/world_buffer.py `HistorySampler.sample`): the collects' starts."""
    row_key, step_key = jax.random.split(key)
    written = jnp.arange(real.capacity) < real.size
    logits = jnp.where(written, jnp.log(real.length.astype(jnp.float32) + 1.0), -jnp.inf)
    episode = jax.random.categorical(row_key, logits, shape=(count,))
    length = real.length[episode]
    step = jnp.floor(jax.random.uniform(step_key, length.shape) * (length + 1)).astype(jnp.int32)
    return episode, jnp.minimum(step, length)


def posterior_members(world_model):
    """The model restricted to its elites (neubay keeps the `collect.ensemble_size` = 100 members of 128
    with the lowest holdout error and measures uncertainty among them only). Other models pass through."""
    if not isinstance(world_model, WorldModel):
        return world_model
    count = world_model.elites.shape[-1]
    if count == world_model.config.num_members:
        return world_model
    params = jax.tree.map(lambda p: p[world_model.elites], world_model.params)
    config = dataclasses.replace(world_model.config, num_members=count, num_elites=count)
    return world_model.replace(params=params, elites=jnp.arange(count, dtype=jnp.int32), config=config)


def quantile_of_sorted(sorted_values: jax.Array, quantile) -> jax.Array:
    """`jnp.quantile`'s linear interpolation on already sorted values (a traced quantile; negative: +inf,
    no truncation)."""
    n = sorted_values.shape[-1]
    position = jnp.clip(quantile, 0.0, 1.0) * (n - 1)
    low = jnp.floor(position).astype(jnp.int32)
    high = jnp.minimum(low + 1, n - 1)
    fraction = position - low
    step = (sorted_values[high] - sorted_values[low]) * fraction
    value = jnp.where(fraction > 0, sorted_values[low] + step, sorted_values[low])  # inf - inf is nan
    return jnp.where(quantile < 0, jnp.inf, value)


class SequenceImagination:
    """Long imagined trajectories after real prefixes, on a tape; a collect earns ceil(utd · stored). Its
    algorithm is an `mbrl.agents.base.SequenceLearner`."""

    uses_model = True
    retains_store = True
    fixed_credit = None

    def __init__(self, agent, config):
        self.agent = agent
        self.settings: SequenceSettings = agent.sequence_settings
        self.per_seed_model = config.imagination.per_seed_model
        self.obs_dim, self.act_dim = agent.obs_dim, agent.act_dim
        self.rollout_config = RolloutConfig(member_mode="per_trajectory", member_pool="elites", uncertainty="epistemic_std",
                                            deterministic=not self.settings.model_noise)
        self._aux_cache: tuple[Any, Any, Any] | None = None

    def real_data(self, dataset) -> Tape:
        """The dataset's episodes as a tape (episodes cut at max_episode_steps, as neubay's histories)."""
        return sequence_replay.from_episodes(dataset.transitions, dataset.episode_starts, self.settings.max_episode_steps)

    def prepare(self, world_model, real: Tape) -> jax.Array:
        """The sorted epistemic_std of the posterior members over the dataset's (obs, action) pairs (per
        model when the seeds have their own), computed once per model and dataset; the threshold is its
        `unc_quantile` quantile, taken inside the compiled collect."""
        cached = self._aux_cache
        if cached is not None and cached[0] is world_model and cached[1] is real:
            return cached[2]
        lengths = np.asarray(real.length)[: int(real.size)]
        steps = np.arange(real.max_len + 1)[None, :] < lengths[:, None]
        obs = np.asarray(real.obs)[: int(real.size)][steps]
        actions = np.asarray(real.action)[: int(real.size)][steps]
        rows = self.settings.threshold_rows
        if rows is not None and rows < len(obs):
            pick = np.random.default_rng(0).choice(len(obs), rows, replace=False)
            obs, actions = obs[pick], actions[pick]

        def one(model):
            return jnp.sort(dataset_uncertainty(posterior_members(model), obs, actions, uncertainty="epistemic_std"))

        if self.per_seed_model:
            count = jax.tree.leaves(world_model)[0].shape[0]
            value = jnp.stack([one(jax.tree.map(lambda x, i=i: x[i], world_model)) for i in range(count)])
        else:
            value = one(world_model)
        self._aux_cache = (world_model, real, value)
        return value

    def empty(self) -> Tape:
        cfg = self.settings
        return sequence_replay.empty(cfg.tape_capacity, cfg.max_episode_steps, self.obs_dim, self.act_dim)

    def initial_counters(self) -> SequenceCounters:
        return SequenceCounters(jnp.zeros((), jnp.int32), CollectStats.zeros())

    def collect(self, agent_state, tape: Tape, counters: SequenceCounters, real: Tape, world_model, sorted_u, hypers, key):
        """Imagine `parallel_size` trajectories from real prefixes and insert them into the tape."""
        cfg = self.settings
        model = posterior_members(world_model)
        threshold = self.threshold(sorted_u, hypers)
        batch, horizon = cfg.parallel_size, cfg.max_episode_steps
        start_key, warm_key, member_key, roll_key = jax.random.split(key, 4)
        episode, offset = start_steps(real, start_key, batch)
        lanes = jnp.arange(batch)
        rows = Tape(obs=real.obs[episode], action=real.action[episode], reward=real.reward[episode],
                    terminal=real.terminal[episode], real=real.real[episode], length=real.length[episode],
                    insert_pos=real.insert_pos, size=real.size)

        # The real prefix, time-major and left-padded, so that its last row is step offset - 1.
        steps = offset[None, :] - horizon + jnp.arange(horizon)[:, None]  # (horizon, B)
        in_prefix = steps >= 0
        at = jnp.clip(steps, 0, horizon)
        obs = rows.obs[lanes[None, :], at]
        prefix = Transitions(obs=obs, action=rows.action[lanes[None, :], at], reward=rows.reward[lanes[None, :], at],
                             next_obs=obs, terminal=in_prefix & False, timeout=in_prefix & False)
        policy = ExploringPolicy(self.agent)
        actor = self.agent.actor_params(agent_state)
        start = warm_up(warm_key, policy, actor, self.agent.initial_carry(batch), prefix, in_prefix)

        remaining = jnp.where(offset < rows.length, horizon - offset, 0)
        if cfg.max_rollout_length is not None:
            remaining = jnp.minimum(remaining, cfg.max_rollout_length)
        members = jax.random.choice(member_key, model.elites, (batch,))
        rows, stats = _imagine_onto_rows(roll_key, model, policy, actor, rows, offset, start, members, remaining,
                                         threshold, horizon, cfg.rollout_chunk, self.rollout_config)
        imagined = stats.lengths
        rows = rows.replace(length=offset + imagined)
        tape = sequence_replay.insert(tape, rows)

        lengths = imagined.astype(jnp.float32)
        edges = jnp.linspace(0.0, horizon, HISTOGRAM_BINS + 1)
        bins = jnp.clip(jnp.searchsorted(edges, lengths, side="right") - 1, 0, HISTOGRAM_BINS - 1)
        last = CollectStats(
            imagined_length_mean=jnp.mean(lengths),
            imagined_length_max=jnp.max(lengths),
            imagined_length_median=jnp.median(lengths),
            prefix_length_mean=jnp.mean(offset.astype(jnp.float32)),
            terminated=jnp.mean(stats.terminated.astype(jnp.float32)),
            cut_by_uncertainty=jnp.mean(stats.cut_by_uncertainty.astype(jnp.float32)),
            imagined_return=jnp.mean(stats.returns),
            transitions=jnp.sum(offset + imagined).astype(jnp.float32),
            length_histogram=jnp.zeros(HISTOGRAM_BINS).at[bins].add(1.0) / batch,
        )
        earned = jnp.maximum(jnp.ceil(last.transitions * cfg.utd), 1.0).astype(jnp.int32)
        return tape, SequenceCounters(counters.collects + 1, last), {"imagined_length_mean": last.imagined_length_mean}, earned

    def epoch_metrics(self, counters: SequenceCounters, tape: Tape, collects, collect_means: dict, sorted_u,
                      hypers) -> dict:
        """The epoch's summary: the last collect's stats, and the mean imagined length over the epoch's
        collects (`collect_means`: each collect's metrics averaged over them; each collect has parallel_size
        trajectories, so this is the mean over all of them; an epoch that collected nothing repeats the
        last collect's)."""
        last = counters.last
        metrics = {field.name: getattr(last, field.name) for field in dataclasses.fields(CollectStats)
                   if field.name != "length_histogram"}
        metrics["imagined_length_mean_epoch"] = jnp.where(
            collects > 0, collect_means["imagined_length_mean"], last.imagined_length_mean)
        width = self.settings.max_episode_steps // HISTOGRAM_BINS
        for i in range(HISTOGRAM_BINS):
            metrics[f"imagined_length_hist_{i * width:04d}_{(i + 1) * width:04d}"] = last.length_histogram[i]
        metrics.update(
            collects=collects.astype(jnp.float32),
            collects_total=counters.collects.astype(jnp.float32),
            tape_rows=tape.size.astype(jnp.float32),
            tape_transitions=tape.transitions().astype(jnp.float32),
            uncertainty_threshold=self.threshold(sorted_u, hypers),
        )
        return metrics

    def threshold(self, sorted_u, hypers):
        return quantile_of_sorted(sorted_u, self.agent.uncertainty_quantile(hypers))

    def sample(self, real: Tape, tape: Tape, key, count: int) -> sequence_replay.SequenceBatch:
        cfg = self.settings
        keys = jax.random.split(key, count)
        return jax.vmap(lambda k: sequence_replay.sample(tape, k, cfg.num_sequences, cfg.sequence_length,
                                                         cfg.warmup_length))(keys)


def _imagine_onto_rows(key, model, policy, actor, rows: Tape, offset, start, members, remaining, threshold, horizon,
                       chunk, rollout_config):
    """Roll out from each lane's real observation at `offset` and write the imagined steps into `rows` after
    the prefix, chunk by chunk inside the compiled rollout (memory: two chunks, not the horizon)."""
    lanes = jnp.arange(offset.shape[0])

    def consume(written, part):
        rows, imagined = written
        tr = part.transitions
        steps = part.valid.shape[0]
        pos = offset[None, :] + imagined[None, :] + jnp.arange(steps)[:, None]  # (chunk, B)
        pos = jnp.where(part.valid, pos, horizon + 1)  # invalid steps scatter out of range
        lane = jnp.broadcast_to(lanes[None, :], pos.shape)
        rows = rows.replace(
            obs=rows.obs.at[lane, pos + 1].set(tr.next_obs, mode="drop"),
            action=rows.action.at[lane, pos].set(tr.action, mode="drop"),
            reward=rows.reward.at[lane, pos].set(part.raw_reward, mode="drop"),
            terminal=rows.terminal.at[lane, pos].set(tr.terminal, mode="drop"),
            real=rows.real.at[lane, pos].set(False, mode="drop"),
        )
        return rows, imagined + jnp.sum(part.valid, axis=0, dtype=jnp.int32)

    start_obs = rows.obs[lanes, offset]
    (rows, _), stats = rollout_chunked(key, model, policy, actor, start_obs, horizon, rollout_config, chunk=chunk,
                                       consume=consume, consume_state=(rows, jnp.zeros_like(offset)), start=start,
                                       members=members, max_length=remaining, threshold=threshold)
    return rows, stats


@struct.dataclass
class RealSteps:
    """The dataset's rows in episode order, with each row's step within its episode (where histories start)."""

    obs: jax.Array
    action: jax.Array
    next_obs: jax.Array
    terminal: jax.Array
    position: jax.Array  # (N,) int32: the row's step in its episode


class OnPolicyImagination:
    """Fresh imagined trajectories every iteration, used once (MOPO-PPO; Li et al. 2025, RWM-U); its algorithm
    is an `mbrl.agents.base.OnPolicyLearner`.

    A collect draws `rollouts_per_epoch` dataset steps s whose episode has a history of the model's length L
    up to s (all steps for a Markov model), warms the model up on steps s-L+1..s, and imagines `horizon` steps
    from the observation after s (`mbrl.world_models.rollout.rollout`, the model's carry from the warm-up). Model
    rewards go through the agent's `model_reward` (the λ·u penalty); a trajectory is cut, and bootstrapped,
    before a step whose uncertainty exceeds `threshold_quantile` of the model's uncertainty on the dataset's
    own steps. The agent turns the rollout into one iteration's batch (`prepare`: values, log-probs, GAE), which
    earns its `ppo.learning_epochs × ppo.minibatches` minibatch updates; nothing is kept for later epochs. An agent
    whose `demonstrations` is true also gets as many dataset rows, drawn uniformly, for its behaviour-cloning phase.
    """

    uses_model = True
    retains_store = False

    def __init__(self, agent, config):
        self.agent = agent
        self.horizon = config.imagination.horizon
        self.envs = config.imagination.rollouts_per_epoch
        self.fixed_credit = agent.updates_per_iteration
        member_mode = "per_trajectory" if agent.head_mode == "per_trajectory" else "per_sample"
        self.rollout_config = RolloutConfig(member_mode=member_mode, member_pool="elites",
                                            uncertainty=agent.uncertainty)
        self._aux_cache: tuple[Any, Any, Any] | None = None

    def real_data(self, dataset) -> RealSteps:
        t = dataset.transitions
        starts = np.asarray(dataset.episode_starts)
        position = np.arange(len(t)) - np.repeat(starts, np.diff(np.append(starts, len(t))))
        return RealSteps(jnp.asarray(t.obs), jnp.asarray(t.action), jnp.asarray(t.next_obs),
                         jnp.asarray(t.terminal, bool), jnp.asarray(position, jnp.int32))

    def prepare(self, world_model, real: RealSteps):
        """Once per model and dataset: the rows a history may end at, and the sorted uncertainty of the model on
        the dataset's steps (after reading each step's history), whose quantile is the cut."""
        cached = self._aux_cache
        if cached is not None and cached[0] is world_model and cached[1] is real:
            return cached[2]
        history = world_model.history
        position, terminal = np.asarray(real.position), np.asarray(real.terminal)
        ends = np.flatnonzero((position >= max(history - 1, 0)) & ~terminal).astype(np.int32)
        if not len(ends):
            raise DatasetError(f"no episode has the {history} steps of history the world model reads before it imagines")
        probe = ends[np.linspace(0, len(ends) - 1, min(len(ends), THRESHOLD_PROBES)).round().astype(int)]
        carry = self._warm_up(world_model, real, probe, history, last=history - 1)
        measure_config = dataclasses.replace(self.rollout_config, deterministic=True)
        out = jax.jit(model_step, static_argnames=("cfg",))(world_model, jax.random.PRNGKey(0), real.obs[probe],
                                                            real.action[probe], None, carry, cfg=measure_config)
        value = (jnp.asarray(ends), jnp.sort(out.uncertainty.astype(jnp.float32)))
        self._aux_cache = (world_model, real, value)
        return value

    @staticmethod
    def _warm_up(world_model, real: RealSteps, ends, history: int, last: int):
        """The model's carry after reading `last` real steps from row end - history + 1 on, for each row of `ends`:
        up to the row itself when `last` == history, up to the row before when history - 1. None for a Markov
        model (or nothing to read)."""
        if not history or not last:
            return None
        rows = ends[:, None] - history + 1 + jnp.arange(last)[None, :]
        return world_model.warm_up(real.obs[rows], real.action[rows])

    def empty(self):
        return ()

    def initial_counters(self):
        return ()

    def collect(self, agent_state, store, counters, real: RealSteps, world_model, aux, hypers, key):
        ends, sorted_u = aux
        pick_key, rollout_key = jax.random.split(key)
        history = world_model.history
        picked = ends[jax.random.randint(pick_key, (self.envs,), 0, ends.shape[0])]
        carry = self._warm_up(world_model, real, picked, history, last=history)
        threshold = quantile_of_sorted(sorted_u, self.agent.uncertainty_quantile(hypers))
        imagined = on_policy_rollout(rollout_key, world_model, self.agent, self.agent.actor_params(agent_state),
                                     real.next_obs[picked], self.horizon, self.rollout_config, model_carry=carry,
                                     threshold=threshold)
        rows = imagined.transitions.replace(
            reward=self.agent.model_reward(hypers, imagined.raw_reward, imagined.uncertainty))
        demonstrations = None
        if capability(self.agent, "demonstrations"):  # dataset rows for a behaviour-cloning phase
            index = jax.random.randint(jax.random.fold_in(key, 1), (imagined.valid.size,), 0, real.obs.shape[0])
            demonstrations = (real.obs[index], real.action[index])
        _, batch, metrics = self.agent.prepare(agent_state, rows, imagined.valid, hypers, imagined.policy_carry,
                                               demonstrations=demonstrations)
        stats = imagined.stats
        metrics = {**metrics,
                   "imagined_length_mean": stats.mean_length,
                   "imagined_return": jnp.mean(stats.returns),
                   "rollout_terminated": jnp.mean(stats.terminated.astype(jnp.float32)),
                   "rollout_cut_by_uncertainty": jnp.mean(stats.cut_by_uncertainty.astype(jnp.float32)),
                   "model_reward": _mean_where(imagined.raw_reward, imagined.valid),
                   "model_uncertainty": _mean_where(imagined.uncertainty, imagined.valid),
                   "uncertainty_threshold": threshold}
        return batch, counters, metrics, self.fixed_credit

    def sample(self, real, store, key, count: int):
        batches = self.agent.minibatches(store, key)
        assert batches.index.shape[0] == count, (batches.index.shape, count)
        return batches


# Dataset steps at which the model's own uncertainty is measured for the threshold quantile.
THRESHOLD_PROBES = 4096

PARTS = {"none": RealOnly, "transitions": FlatImagination, "sequences": SequenceImagination,
         "onpolicy": OnPolicyImagination}


def make(agent, config):
    """The part for the algorithm's `imagination` kind."""
    return PARTS[agent.imagination](agent, config)
