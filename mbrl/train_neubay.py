"""NEUBAY's training epoch: imagine long rollouts in one posterior sample each, keep them on a tape,
and train the recurrent agent on windows of it. `mbrl.train.trainer_for` hands `--algo neubay` here.

One collect (twni2016/neubay experience/collector.py `ContCollector`, offline_world/cont_ensemble.py
`LearnedContEnv`), all inside one compiled program:
1. draw `parallel_size` steps uniformly over the dataset's observations (episode e, step p);
2. warm the actor's memory on the real prefix 0..p-1 of episode e (`world_models.rollout.warm_up`);
3. draw ONE member per trajectory among the elites (the 100 best of 128 by holdout error) and roll it
   out from the real observation at step p, in chunks of `rollout_chunk` steps, until the episode's
   remaining horizon (max_episode_steps - p) runs out, the task's termination function fires, or
   epistemic_std exceeds the threshold (its `unc_quantile` quantile over the dataset's transitions,
   under the elites) - the rollout stops at the first chunk boundary where nothing is alive;
4. store prefix + imagination as one tape row (the prefix marked real) and earn
   ceil(utd · transitions stored) updates (`train.utd`; the prefix counts, as in neubay).

An epoch is exactly `schedule.updates_per_epoch` updates: it collects whenever the earned updates are
spent, so the update budget (and the evaluation points) are those of the other agents while the ratio
of updates to data is the paper's. Seeds run one after another inside the compiled epoch (`lax.map`):
the collect decision is per seed, which a vmap would turn into running both branches.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agents.neubay import Neubay, NeubayState
from mbrl.core import sequence_replay
from mbrl.core.sequence_replay import Tape
from mbrl.core.types import Transitions
from world_models.rollout import PolicyInput, RecurrentStart, RolloutConfig, rollout, uncertainty_threshold, warm_up

HISTOGRAM_BINS = 10


@struct.dataclass
class CollectStats:
    """The latest collect's summary (imagined lengths exclude the real prefix)."""

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
class NeubayTrainState:
    agent: NeubayState
    tape: Tape
    credit: jax.Array  # () int32: updates earned by collected data, not yet done
    collects: jax.Array  # () int32: collects so far
    last_collect: CollectStats
    key: jax.Array
    epoch: jax.Array


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
    from world_models.model import WorldModel

    if not isinstance(world_model, WorldModel):
        return world_model
    count = world_model.elites.shape[-1]
    if count == world_model.config.num_members:
        return world_model
    params = jax.tree.map(lambda p: p[world_model.elites], world_model.params)
    config = dataclasses.replace(world_model.config, num_members=count, num_elites=count)
    return world_model.replace(params=params, elites=jnp.arange(count, dtype=jnp.int32), config=config)


class NeubayTrainer:
    """The same surface as `mbrl.train.Trainer` (initial_state, run_epoch, evaluate, real_data) for NEUBAY."""

    uses_model = True

    def __init__(self, config, obs_dim: int, act_dim: int):
        self.config = config
        self.neubay = config.neubay
        self.obs_dim, self.act_dim = obs_dim, act_dim
        total = config.schedule.epochs * config.schedule.updates_per_epoch
        self.agent = Neubay(config.neubay, obs_dim, act_dim, total_updates=total)
        self.rollout_config = RolloutConfig(member_mode="per_trajectory", member_pool="elites", uncertainty="epistemic_std",
                                            deterministic=not config.neubay.model_noise)
        self.per_seed_model = config.imagination.per_seed_model
        self.init_states = jax.jit(jax.vmap(self.init_state))
        self._run = jax.jit(self._all_seeds, donate_argnums=0)
        self._collect = jax.jit(self.collect)
        self._eval_step = jax.jit(self._batched_policy)
        self._threshold_cache: tuple[Any, Any, jax.Array] | None = None

    # ------------------------------------------------------------------ data

    def real_data(self, dataset) -> Tape:
        """The dataset's episodes as a tape (episodes cut at max_episode_steps, as neubay's histories)."""
        return sequence_replay.from_episodes(dataset.transitions, dataset.episode_starts, self.neubay.max_episode_steps)

    def threshold(self, world_model, real: Tape) -> jax.Array:
        """The truncation threshold per model (computed once per model and dataset): quantile
        `unc_quantile` of epistemic_std over the dataset's (obs, action) pairs; +inf when negative."""
        cached = self._threshold_cache
        if cached is not None and cached[0] is world_model and cached[1] is real:
            return cached[2]
        quantile = self.neubay.unc_quantile
        if quantile < 0:
            value = jnp.full((len(self.config.seed_list),) if self.per_seed_model else (), jnp.inf, jnp.float32)
        else:
            lengths = np.asarray(real.length)[: int(real.size)]
            steps = np.arange(real.max_len + 1)[None, :] < lengths[:, None]
            obs = np.asarray(real.obs)[: int(real.size)][steps]
            actions = np.asarray(real.action)[: int(real.size)][steps]
            rows = self.neubay.threshold_rows
            if rows is not None and rows < len(obs):
                pick = np.random.default_rng(0).choice(len(obs), rows, replace=False)
                obs, actions = obs[pick], actions[pick]

            def one(model):
                return uncertainty_threshold(posterior_members(model), obs, actions, quantile, uncertainty="epistemic_std")

            if self.per_seed_model:
                count = jax.tree.leaves(world_model)[0].shape[0]
                value = jnp.stack([one(jax.tree.map(lambda x, i=i: x[i], world_model)) for i in range(count)])
            else:
                value = one(world_model)
        self._threshold_cache = (world_model, real, value)
        return value

    # ------------------------------------------------------------------ pure functions (one seed)

    def init_state(self, key: jax.Array) -> NeubayTrainState:
        agent_key, key = jax.random.split(key)
        cfg = self.neubay
        tape = sequence_replay.empty(cfg.tape_capacity, cfg.max_episode_steps, self.obs_dim, self.act_dim)
        zero = jnp.zeros((), jnp.int32)
        return NeubayTrainState(self.agent.init(agent_key), tape, zero, zero, CollectStats.zeros(), key, zero)

    def collect(self, agent_state: NeubayState, tape: Tape, real: Tape, world_model, threshold, key):
        """Imagine `parallel_size` trajectories from real prefixes and insert them into `tape`."""
        cfg = self.neubay
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
        actor = agent_state.actor_params
        start = warm_up(warm_key, self.agent, actor, self.agent.initial_carry(batch), prefix, in_prefix)

        remaining = jnp.where(offset < rows.length, horizon - offset, 0)
        if cfg.max_rollout_length is not None:
            remaining = jnp.minimum(remaining, cfg.max_rollout_length)
        members = jax.random.choice(member_key, world_model.elites, (batch,))
        chunk = cfg.rollout_chunk
        num_chunks = -(-horizon // chunk)

        def unfinished(c):
            index, _, _, left, done, *_ = c
            return (index < num_chunks) & jnp.any(~done & (left > 0))

        def chunk_step(c):
            index, obs, start, left, done, imagined, returns, terminated, cut, rows = c
            out = rollout(jax.random.fold_in(roll_key, index), world_model, self.agent, actor, obs, chunk,
                          self.rollout_config, start=start, members=members,
                          max_length=jnp.where(done, 0, left), threshold=threshold)
            tr = out.transitions
            pos = offset[None, :] + imagined[None, :] + jnp.arange(chunk)[:, None]  # (chunk, B)
            pos = jnp.where(out.valid, pos, horizon + 1)  # invalid steps scatter out of range
            lane = jnp.broadcast_to(lanes[None, :], pos.shape)
            rows = rows.replace(
                obs=rows.obs.at[lane, pos + 1].set(tr.next_obs, mode="drop"),
                action=rows.action.at[lane, pos].set(tr.action, mode="drop"),
                reward=rows.reward.at[lane, pos].set(out.raw_reward, mode="drop"),
                terminal=rows.terminal.at[lane, pos].set(tr.terminal, mode="drop"),
                real=rows.real.at[lane, pos].set(False, mode="drop"),
            )
            stats, final = out.stats, out.final
            left = left - stats.lengths
            done = done | stats.terminated | stats.cut_by_uncertainty | (left <= 0)
            start = RecurrentStart(final.carry, final.prev_action, final.prev_reward, final.first)
            return (index + 1, final.obs, start, left, done, imagined + stats.lengths, returns + stats.returns,
                    terminated | stats.terminated, cut | stats.cut_by_uncertainty, rows)

        false = jnp.zeros(batch, bool)
        zeros = jnp.zeros(batch, jnp.int32)
        init = (jnp.zeros((), jnp.int32), rows.obs[lanes, offset], start, remaining, remaining <= 0, zeros,
                jnp.zeros(batch, jnp.float32), false, false, rows)
        _, _, _, _, _, imagined, returns, terminated, cut, rows = jax.lax.while_loop(unfinished, chunk_step, init)
        rows = rows.replace(length=offset + imagined)
        tape = sequence_replay.insert(tape, rows)

        lengths = imagined.astype(jnp.float32)
        edges = jnp.linspace(0.0, horizon, HISTOGRAM_BINS + 1)
        bins = jnp.clip(jnp.searchsorted(edges, lengths, side="right") - 1, 0, HISTOGRAM_BINS - 1)
        stats = CollectStats(
            imagined_length_mean=jnp.mean(lengths),
            imagined_length_max=jnp.max(lengths),
            imagined_length_median=jnp.median(lengths),
            prefix_length_mean=jnp.mean(offset.astype(jnp.float32)),
            terminated=jnp.mean(terminated.astype(jnp.float32)),
            cut_by_uncertainty=jnp.mean(cut.astype(jnp.float32)),
            imagined_return=jnp.mean(returns),
            transitions=jnp.sum(offset + imagined).astype(jnp.float32),
            length_histogram=jnp.zeros(HISTOGRAM_BINS).at[bins].add(1.0) / batch,
        )
        return tape, stats

    def _sample(self, tape: Tape, key) -> sequence_replay.SequenceBatch:
        cfg = self.neubay
        return sequence_replay.sample(tape, key, cfg.num_sequences, cfg.sequence_length, cfg.warmup_length)

    def epoch(self, state: NeubayTrainState, real: Tape, world_model, threshold) -> tuple[NeubayTrainState, dict]:
        """`updates_per_epoch` updates, collecting whenever the earned updates are spent."""
        cfg = self.neubay
        budget = self.config.schedule.updates_per_epoch
        model = posterior_members(world_model)
        metric_shapes = jax.eval_shape(lambda a, k: self.agent.update(a, self._sample(state.tape, k), k)[1],
                                       state.agent, state.key)
        sums = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), metric_shapes)

        def do_collect(args):
            state, key, (collects, length_sum) = args
            tape, stats = self.collect(state.agent, state.tape, real, model, threshold, key)
            earned = jnp.maximum(jnp.ceil(stats.transitions * cfg.utd), 1.0).astype(jnp.int32)
            state = state.replace(tape=tape, credit=state.credit + earned, collects=state.collects + 1, last_collect=stats)
            return state, (collects + 1, length_sum + stats.imagined_length_mean)

        def one_update(_, carry):
            agent, tape, key, sums = carry
            key, sample_key, update_key = jax.random.split(key, 3)
            agent, metrics = self.agent.update(agent, self._sample(tape, sample_key), update_key)
            return agent, tape, key, jax.tree.map(lambda s, m: s + m.astype(jnp.float32), sums, metrics)

        def body(c):
            state, done, sums, collected = c
            key, collect_key, update_key = jax.random.split(state.key, 3)
            state, collected = jax.lax.cond(state.credit <= 0, do_collect, lambda a: (a[0], a[2]),
                                            (state.replace(key=key), collect_key, collected))
            count = jnp.minimum(state.credit, budget - done)
            agent, _, _, sums = jax.lax.fori_loop(0, count, one_update, (state.agent, state.tape, update_key, sums))
            return state.replace(agent=agent, credit=state.credit - count), done + count, sums, collected

        zero = jnp.zeros((), jnp.int32)
        collected = (zero, jnp.zeros((), jnp.float32))
        state, _, sums, (collects, length_sum) = jax.lax.while_loop(
            lambda c: c[1] < budget, body, (state, zero, sums, collected))
        metrics = {name: value / budget for name, value in sums.items()}
        last = state.last_collect
        for field in dataclasses.fields(CollectStats):
            if field.name != "length_histogram":
                metrics[field.name] = getattr(last, field.name)
        # Every collect of the epoch has parallel_size trajectories, so the mean of their means is the
        # mean over all of them; an epoch that collected nothing repeats the last collect's.
        metrics["imagined_length_mean_epoch"] = jnp.where(
            collects > 0, length_sum / jnp.maximum(collects, 1), last.imagined_length_mean)
        width = cfg.max_episode_steps // HISTOGRAM_BINS
        for i in range(HISTOGRAM_BINS):
            metrics[f"imagined_length_hist_{i * width:04d}_{(i + 1) * width:04d}"] = last.length_histogram[i]
        metrics.update(
            collects=collects.astype(jnp.float32),
            collects_total=state.collects.astype(jnp.float32),
            tape_rows=state.tape.size.astype(jnp.float32),
            tape_transitions=state.tape.transitions().astype(jnp.float32),
            uncertainty_threshold=jnp.asarray(threshold, jnp.float32),
        )
        return state.replace(epoch=state.epoch + 1), metrics

    def _all_seeds(self, states, real, world_model, threshold):
        if self.per_seed_model:
            return jax.lax.map(lambda a: self.epoch(a[0], real, a[1], a[2]), (states, world_model, threshold))
        return jax.lax.map(lambda s: self.epoch(s, real, world_model, threshold), states)

    # ------------------------------------------------------------------ host side

    def initial_state(self, seeds: list[int]) -> NeubayTrainState:
        return self.init_states(jnp.stack([jax.random.PRNGKey(s) for s in seeds]))

    def run_epoch(self, state, real: Tape, world_model):
        return self._run(state, real, world_model, self.threshold(world_model, real))

    def _batched_policy(self, actor_params, carry, inputs: PolicyInput):
        """Deterministic actions of S seeds' policies for (S, E, ...) inputs and carries."""
        key = jax.random.PRNGKey(0)  # unused by the deterministic policy
        step = lambda p, c, i: self.agent.policy_step(p, c, i, key, True)  # noqa: E731
        return jax.vmap(step)(actor_params, carry, inputs)

    def evaluate(self, state, task, seeds: list[int], ref_scores, episodes: int = 10, eval_seed: int = 0) -> dict:
        """Like `Trainer.evaluate`, with the recurrent state carried along each real episode."""
        from mbrl.evaluate import normalized_score

        returns, lengths = evaluate_recurrent(self, state.agent.actor_params, task, len(seeds), episodes,
                                              eval_seed + seeds[0] * episodes)
        out = {"return_mean": returns.mean(axis=1).tolist(), "return_std": returns.std(axis=1).tolist()}
        out["normalized_score"] = (
            None if ref_scores is None else [float(normalized_score(r, *ref_scores)) for r in returns.mean(axis=1)]
        )
        out["length_mean"] = lengths.mean(axis=1).tolist()
        return out


def evaluate_recurrent(trainer: NeubayTrainer, actor_params, task, num_seeds: int, episodes: int, seed: int):
    """Run S x E real episodes in lockstep (episode j resets with seed + j); returns and lengths (S, E)."""
    import gymnasium

    total = num_seeds * episodes
    envs = [gymnasium.make(task.env_id) for _ in range(total)]
    try:
        low, high = envs[0].action_space.low, envs[0].action_space.high
        obs = np.stack([np.asarray(env.reset(seed=seed + j)[0], np.float32) for j, env in enumerate(envs)])
        act_dim = trainer.act_dim
        prev_action = np.zeros((total, act_dim), np.float32)
        prev_reward = np.zeros(total, np.float32)
        first = np.ones(total, bool)
        carry = jax.tree.map(lambda x: x.reshape(num_seeds, episodes, *x.shape[1:]), trainer.agent.initial_carry(total))
        returns, lengths = np.zeros(total), np.zeros(total, np.int64)
        live = np.ones(total, bool)
        shape = lambda x: jnp.asarray(x).reshape(num_seeds, episodes, *x.shape[1:])  # noqa: E731
        while live.any():
            inputs = PolicyInput(shape(obs), shape(prev_action), shape(prev_reward), shape(first))
            actions, carry = trainer._eval_step(actor_params, carry, inputs)
            actions = np.asarray(actions).reshape(total, act_dim)
            for j in np.flatnonzero(live):
                next_obs, reward, terminated, truncated, _ = envs[j].step(np.clip(actions[j], low, high))
                returns[j] += float(reward)
                lengths[j] += 1
                obs[j], prev_action[j], prev_reward[j] = next_obs, actions[j], reward
                live[j] = not (terminated or truncated)
            first[:] = False
    finally:
        for env in envs:
            env.close()
    return returns.reshape(num_seeds, episodes), lengths.reshape(num_seeds, episodes)


def compile_key(config):
    """The parts of a config that NEUBAY's compiled programs depend on."""
    from mbrl.config import ScheduleConfig, TrainConfig

    return TrainConfig(
        algo="neubay",
        neubay=config.neubay,
        imagination=config.imagination,
        schedule=ScheduleConfig(epochs=config.schedule.epochs, updates_per_epoch=config.schedule.updates_per_epoch),
        seeds=config.seeds,
    )


@functools.lru_cache(maxsize=4)
def _cached(key, obs_dim: int, act_dim: int) -> NeubayTrainer:
    return NeubayTrainer(key, obs_dim, act_dim)


def neubay_trainer_for(config, obs_dim: int, act_dim: int) -> NeubayTrainer:
    return _cached(compile_key(config), obs_dim, act_dim)
