"""Agent update throughput on the workloads of OfflineRL-Kit's `learn`, and seeds vmapped.

- `sac2_update`: MOPO's SAC update (OfflineRL-Kit `MOPOPolicy.learn`): batch 256 mixed 5% real / 95%
  model rows, 2 critics and an actor of 2x256, auto-alpha.
- `edac10_update`: EDAC's update (`--algo edac`; OfflineRL-Kit `EDACPolicy.learn`): 10 critics of 3x256, η=1,
  batch 256 from the real data.
- `td3_bc_update`, `cql_update`, `iql_update`: the other model-free baselines' updates at their paper presets,
  batch 256 from the real data (OfflineRL-Kit's `TD3BCPolicy`, `CQLPolicy`, `IQLPolicy`).
- `combo_update`, `mobile_update`: the conservative model-based updates at their paper presets, batch 256 of real and
  model rows (OfflineRL-Kit's `COMBOPolicy`, `MOBILEPolicy`); MOBILE's samples 10 next states from each of the 5
  elites of a fresh 7-member ensemble of 4x200 at every update.
- `seeds5_vmapped`: whole training epochs (rollouts, then updates) of 5 seeds in one vmapped program
  against the same 5 seeds run one after the other.

Updates run as the training loop runs them (`mbrl.trainer.Trainer`): K updates per compiled call, their
batches sampled inside it from device buffers of realistic size. Sizes are halfcheetah's (obs 17,
act 6). FLOPs per update come from XLA's cost analysis of one compiled update (matmuls are all but
~1% of it); `roofline_fraction` divides the achieved FLOP/s by `matmul_gflops`. OfflineRL-Kit is
compared only side by side, in one run on one machine (docs/throughput.md).
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
from benchmarks.common import matmul_flops_per_s
from benchmarks.rollout import _workload

from mbrl import config as config_io
from mbrl.agents.base import capability
from mbrl.core import replay
from mbrl.core.types import Transitions
from mbrl.trainer import Trainer, hypers_of, time_epochs
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble, init_params
from mbrl.world_models.model import Normalizer, WorldModel

TARGETS = {"seeds5_vmapped": 3.0}
OBS_DIM, ACT_DIM = 17, 6


def _config(algo: str, overrides: dict):
    return config_io.build(algo, "halfcheetah-medium", "paper", overrides)


def _buffers(trainer, real_rows: int, model_rows: int):
    def random_rows(key, rows):
        k = jax.random.split(key, 4)
        return Transitions(
            obs=jax.random.normal(k[0], (rows, OBS_DIM)),
            action=jax.random.uniform(k[1], (rows, ACT_DIM), minval=-1, maxval=1),
            reward=jax.random.normal(k[2], (rows,)),
            next_obs=jax.random.normal(k[3], (rows, OBS_DIM)),
            terminal=jnp.zeros(rows, bool),
            timeout=jnp.zeros(rows, bool),
        )

    real = replay.from_transitions(random_rows(jax.random.PRNGKey(0), real_rows))
    if not trainer.uses_model:
        return real, None
    model = replay.insert(trainer.part.empty(),
                          random_rows(jax.random.PRNGKey(1), model_rows), jnp.ones(model_rows, bool))
    return real, model


def _world_model_reads(trainer) -> dict:
    """{"world_model": a fresh ensemble of the default size} for an algorithm whose updates read the model, else {}."""
    if not capability(trainer.agent, "reads_model"):
        return {}
    config = EnsembleConfig()
    params = init_params(GaussianEnsemble(config, OBS_DIM + 1), jax.random.PRNGKey(3), OBS_DIM + ACT_DIM)
    width = OBS_DIM + ACT_DIM
    return {"world_model": WorldModel(params=params, input_norm=Normalizer(jnp.zeros(width), jnp.ones(width)),
                                      target_norm=Normalizer(jnp.zeros(OBS_DIM + 1), jnp.ones(OBS_DIM + 1)),
                                      elites=jnp.arange(config.num_elites, dtype=jnp.int32), config=config,
                                      obs_dim=OBS_DIM, act_dim=ACT_DIM)}


def update_flops(trainer, own_update: bool = False) -> float:
    """FLOPs of one update, from XLA's cost analysis of the compiled single update: the SAC-N core's on its `sac`
    values, or (`own_update`: TD3+BC, IQL, CQL, COMBO, MOBILE) the learner's own on every section's (with a world model
    for one that reads it)."""
    rows = trainer.agent.batch_size
    batch = Transitions(
        obs=jnp.zeros((rows, OBS_DIM)), action=jnp.zeros((rows, ACT_DIM)), reward=jnp.zeros(rows),
        next_obs=jnp.zeros((rows, OBS_DIM)), terminal=jnp.zeros(rows, bool), timeout=jnp.zeros(rows, bool),
    )
    learner = getattr(trainer.agent, "core", trainer.agent)
    hypers = hypers_of(trainer.config)
    state = jax.jit(trainer.agent.init)(jax.random.PRNGKey(0), hypers)
    hypers = hypers if own_update else hypers["sac"]
    reads = _world_model_reads(trainer)
    compiled = jax.jit(learner.update).lower(state, batch, jax.random.PRNGKey(0), hypers, **reads).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


def _update_rate(algo: str, overrides: dict, quick: bool, repeats: int = 3, own_update: bool = False) -> dict:
    """Updates/s of the compiled K-update chunk (sampling included) on one seed."""
    updates = 50 if quick else 500
    overrides = {**overrides, "schedule": {"updates_per_epoch": updates}}
    trainer = Trainer(_config(algo, overrides), OBS_DIM, ACT_DIM)
    real, model = _buffers(trainer, 100_000 if quick else 1_000_000, 50_000 if quick else 250_000)
    hypers = hypers_of(trainer.config)
    reads = _world_model_reads(trainer)

    def chunk(agent_state, key):
        sample_key, update_key = jax.random.split(key)
        batches = trainer.part.sample(real, model, sample_key, updates)
        return trainer.agent.update_many(agent_state, batches, update_key, hypers, **reads)

    chunk = jax.jit(chunk, donate_argnums=0)
    state = jax.jit(trainer.agent.init)(jax.random.PRNGKey(0), hypers)
    state, metrics = chunk(state, jax.random.PRNGKey(1))  # compile
    jax.block_until_ready(metrics)
    best = float("inf")
    for i in range(repeats):
        start = time.perf_counter()
        state, metrics = chunk(state, jax.random.PRNGKey(2 + i))
        jax.block_until_ready(metrics)
        best = min(best, time.perf_counter() - start)
    return {"updates_per_s": updates / best, "updates": updates, "flops_per_update": update_flops(trainer, own_update)}


def _update_figure(name: str, algo: str, overrides: dict, quick: bool, own_update: bool = False) -> dict:
    result = _update_rate(algo, overrides, quick, own_update=own_update)
    rate = result["updates_per_s"]
    peak = matmul_flops_per_s()
    achieved = rate * result["flops_per_update"]
    return {
        "value": round(rate, 2),
        "unit": "updates/s",
        "roofline_fraction": round(achieved / peak, 3),
        "achieved_gflops": round(achieved / 1e9, 2),
        "matmul_gflops": round(peak / 1e9, 2),
        "gflops_per_update": round(result["flops_per_update"] / 1e9, 4),
        "updates_per_call": result["updates"],
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def sac2_update(quick: bool) -> dict:
    return _update_figure("sac2_update", "mopo", {"sac": {"num_critics": 2, "hidden_sizes": [256, 256]}}, quick)


def edac10_update(quick: bool) -> dict:
    overrides = {"sac": {"num_critics": 10, "hidden_sizes": [256, 256, 256], "eta": 1.0}}
    return _update_figure("edac10_update", "edac", overrides, quick)


def seeds5_vmapped(quick: bool) -> dict:
    """Epochs/s of 5 seeds in one vmapped program vs 5 single-seed programs run in turn (MOPO, quick preset)."""
    seeds = 5
    updates, rollouts = (100, 2_000) if quick else (500, 10_000)
    config = _config("mopo", {"imagination": {"rollouts_per_epoch": rollouts, "horizon": 5},
                              "schedule": {"updates_per_epoch": updates}})
    trainer = Trainer(config, OBS_DIM, ACT_DIM)
    model = _workload()[0]
    real, _ = _buffers(trainer, 100_000 if quick else 1_000_000, 1)
    epochs = 1 if quick else 2

    hypers = hypers_of(config)
    together = trainer.initial_state(list(range(seeds)), [hypers] * seeds)
    _, vmapped_seconds = time_epochs(trainer, together, real, model, epochs)
    sequential_seconds = 0.0
    for seed in range(seeds):
        _, seconds = time_epochs(trainer, trainer.initial_state([seed], [hypers]), real, model, epochs)
        sequential_seconds += seconds
    jax.clear_caches()
    speedup = sequential_seconds / vmapped_seconds
    return {
        "value": round(speedup, 3),
        "unit": "x throughput (5 seeds vmapped / 5 sequential)",
        "target": TARGETS["seeds5_vmapped"],
        "vmapped_updates_per_s": round(seeds * epochs * updates / vmapped_seconds, 1),
        "sequential_updates_per_s": round(seeds * epochs * updates / sequential_seconds, 1),
        "updates_per_epoch": updates,
        "rollouts_per_epoch": rollouts,
        "epochs_timed": epochs,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


# The other model-free baselines at their paper presets on halfcheetah-medium (batch 256, real data only), the
# workloads of OfflineRL-Kit's run_td3bc.py, run_cql.py and run_iql.py.
def td3_bc_update(quick: bool) -> dict:
    return _update_figure("td3_bc_update", "td3-bc", {}, quick, own_update=True)  # 2 critics and actor of 2x256


def cql_update(quick: bool) -> dict:
    return _update_figure("cql_update", "cql", {}, quick, own_update=True)  # 2 critics of 3x256, 10 sampled actions


def iql_update(quick: bool) -> dict:
    return _update_figure("iql_update", "iql", {}, quick, own_update=True)  # 2 critics, value and actor of 2x256


def combo_update(quick: bool) -> dict:
    return _update_figure("combo_update", "combo", {}, quick, own_update=True)  # CQL's penalty on 3x256 critics


def mobile_update(quick: bool) -> dict:
    return _update_figure("mobile_update", "mobile", {}, quick, own_update=True)  # 2 critics of 2x256, 10 x 5 samples


FIGURES = {"sac2_update": sac2_update, "edac10_update": edac10_update, "seeds5_vmapped": seeds5_vmapped,
           "td3_bc_update": td3_bc_update, "cql_update": cql_update, "iql_update": iql_update,
           "combo_update": combo_update, "mobile_update": mobile_update}
