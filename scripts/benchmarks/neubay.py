"""NEUBAY's imagination throughput: long rollouts of a large ensemble driven by a recurrent policy.

Workload (issue 8): a 100-member 4x200 LayerNorm ensemble (`mbrl.world_models.model.WorldModel`, NEUBAY's
fixed log-σ range), one member per trajectory, epistemic_std computed at every step (it needs all 100
members on every state), driven by NEUBAY's recurrent actor at the paper's size (LRU 256/128 x 2 layers,
heads 2x256, `mbrl.agents.neubay`), at hopper sizes (obs 11, act 3). 100 trajectories x 1,000 steps, from
fresh episode starts, with no termination and no threshold, so that every step is an imagined
transition. Weights are freshly initialised (throughput does not depend on their values).

`neubay_rollout` times `mbrl.world_models.rollout.rollout` alone (one compiled scan of 1,000 steps);
`collect_transitions_per_s` times the whole NEUBAY collect (`mbrl.imagination.SequenceImagination.collect`:
warm-up of the memory on real prefixes of random length, chunked rollouts that stop once nothing is
alive, insertion into the tape) per imagined transition. NEUBAY's own collector steps the ensemble in a
Python loop with a host round trip per step (twni2016/neubay experience/collector.py).
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from benchmarks.common import matmul_flops_per_s

from mbrl.agents.neubay import NeubayConfig
from mbrl.config import ScheduleConfig, TrainConfig
from mbrl.core import sequence_replay
from mbrl.core.types import Transitions
from mbrl.imagination import ExploringPolicy
from mbrl.trainer import Trainer, hypers_of
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble, init_params
from mbrl.world_models.model import Normalizer, WorldModel
from mbrl.world_models.rollout import RecurrentStart, rollout

OBS_DIM, ACT_DIM = 11, 3
HIDDEN = (200, 200, 200, 200)


def _workload(members: int, trajectories: int, horizon: int):
    config = EnsembleConfig(num_members=members, num_elites=members, hidden_dims=HIDDEN, layer_norm=True)
    in_dim = OBS_DIM + ACT_DIM
    model = WorldModel(
        params=init_params(GaussianEnsemble(config, OBS_DIM + 1), jax.random.PRNGKey(0), in_dim),
        input_norm=Normalizer(jnp.zeros(in_dim), jnp.ones(in_dim)),
        target_norm=Normalizer(jnp.zeros(OBS_DIM + 1), jnp.full(OBS_DIM + 1, 0.05)),
        elites=jnp.arange(members, dtype=jnp.int32),
        config=config,
        obs_dim=OBS_DIM,
        act_dim=ACT_DIM,
    )
    neubay = NeubayConfig(parallel_size=trajectories, max_episode_steps=horizon, tape_capacity=trajectories,
                          rollout_chunk=min(50, horizon))
    trainer = Trainer(TrainConfig(algo="neubay", neubay=neubay, schedule=ScheduleConfig(epochs=1)), OBS_DIM, ACT_DIM)
    agent_state = jax.jit(trainer.agent.init)(jax.random.PRNGKey(1), trainer.agent.hypers())
    return model, trainer, agent_state, config


def flops_per_transition(config, neubay) -> float:
    """Matmul FLOPs of one imagined step: every member's forward pass plus one step of the actor."""
    widths = [OBS_DIM + ACT_DIM, *config.hidden_dims, 2 * (OBS_DIM + 1)]
    model = config.num_members * sum(2 * a * b for a, b in zip(widths[:-1], widths[1:], strict=True))
    dm, dh = neubay.d_model, neubay.d_hidden
    layer = 8 * dm * dh + 8 * dh * dm + 2 * 2 * dm * dm  # complex B and C (4 real products each), GLU
    head_widths = [dm, *([neubay.head_hidden] * neubay.head_layers), 2 * ACT_DIM]
    head = sum(2 * a * b for a, b in zip(head_widths[:-1], head_widths[1:], strict=True))
    actor = 2 * (OBS_DIM + ACT_DIM + 1) * dm + neubay.memory_layers * layer + head
    return float(model + actor)


def _real_tape(trajectories: int, horizon: int):
    rng = np.random.default_rng(0)
    rows = trajectories * horizon
    obs = rng.normal(size=(rows, OBS_DIM)).astype(np.float32)
    data = Transitions.from_arrays(obs, rng.uniform(-1, 1, (rows, ACT_DIM)), rng.normal(size=rows), obs,
                                   np.zeros(rows), np.zeros(rows))
    return sequence_replay.from_episodes(data, np.arange(0, rows, horizon), horizon)


def neubay_rollout(quick: bool) -> dict:
    members, trajectories, horizon = (20, 100, 100) if quick else (100, 100, 1_000)
    model, trainer, agent_state, config = _workload(members, trajectories, horizon)
    agent, actor = trainer.agent, agent_state.actor_params
    start_obs = jax.random.normal(jax.random.PRNGKey(2), (trajectories, OBS_DIM))
    start = RecurrentStart.fresh(agent.initial_carry(trajectories), trajectories, ACT_DIM)
    members_used = jax.random.randint(jax.random.PRNGKey(3), (trajectories,), 0, members)

    def imagine(key):
        out = rollout(key, model, ExploringPolicy(agent), actor, start_obs, horizon, trainer.part.rollout_config, start=start,
                      members=members_used)
        return out.stats.lengths

    run = jax.jit(imagine).lower(jax.random.PRNGKey(4)).compile()
    begin, begin_cpu = time.perf_counter(), time.process_time()
    lengths = jax.block_until_ready(run(jax.random.PRNGKey(4)))
    seconds, cpu_seconds = time.perf_counter() - begin, time.process_time() - begin_cpu
    imagined = int(jnp.sum(lengths))

    # The whole collect: warm-up on real prefixes, chunked rollouts, tape insertion.
    real = _real_tape(trajectories, horizon)
    tape = sequence_replay.empty(trajectories, horizon, OBS_DIM, ACT_DIM)
    part, hypers = trainer.part, hypers_of(trainer.config)
    no_cut = jnp.full(1, jnp.inf, jnp.float32)  # the sorted dataset uncertainties: any quantile is +inf

    def collect_once(agent_state, tape, key):
        return part.collect(agent_state, tape, part.initial_counters(), real, model, no_cut, hypers, key)[:2]

    collect = jax.jit(collect_once).lower(agent_state, tape, jax.random.PRNGKey(5)).compile()
    begin = time.perf_counter()
    _, counters = jax.block_until_ready(collect(agent_state, tape, jax.random.PRNGKey(5)))
    stats = counters.last
    collect_seconds = time.perf_counter() - begin
    collect_imagined = float(stats.imagined_length_mean) * trajectories

    rate = imagined / seconds
    flops = flops_per_transition(config, trainer.config.neubay)
    roofline = matmul_flops_per_s()
    return {
        "value": round(rate, 1),
        "unit": "transitions/s",
        "members": members,
        "trajectories": trajectories,
        "horizon": horizon,
        "imagined_transitions": imagined,
        "flops_per_transition": flops,
        "roofline_fraction": round(rate * flops / roofline, 3),
        "matmul_gflops": round(roofline / 1e9, 2),
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "collect_transitions_per_s": round(collect_imagined / collect_seconds, 1),
        "collect_imagined_transitions": int(collect_imagined),
        "collect_seconds": round(collect_seconds, 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


FIGURES = {"neubay_rollout": neubay_rollout}
