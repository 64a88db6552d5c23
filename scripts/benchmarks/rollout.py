"""Imagined-rollout throughput: MOPO's workload at horizon 5, and long horizons (1,000 steps).

Workload (issue 5): a 7-member 4x200 SiLU Gaussian ensemble (`mbrl.world_models.model.WorldModel`, 5
elites, a member per sample) with MOPO's `aleatoric_max` penalty, driven by a 2x256 SAC actor with
tanh-Gaussian sampling (`mbrl.agents.sac_n.SACN`), at halfcheetah sizes (obs 17, act 6). Weights are
freshly initialised (throughput does not depend on their values). OfflineRL-Kit's `MOPOPolicy.rollout`
runs the same workload; compare with it only side by side, in one run on one machine (docs/throughput.md).

`rollout_h1000` runs in a child process so that its `peak_rss_mb` is its own, not the maximum over
the figures run before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from benchmarks.common import matmul_flops_per_s, peak_rss_mb, time_call

from mbrl.agents.sac_n import SACN, SACNConfig
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble, init_params
from mbrl.world_models.model import Normalizer, WorldModel
from mbrl.world_models.rollout import MarkovPolicy, RolloutConfig, rollout

OBS_DIM, ACT_DIM = 17, 6
# Slices of the batch per step: one slice's activations (7 x 2,500 x 200 floats, 14 MB) stay in a
# 32 MB L3 cache, which beat the whole batch at once on a 2-core CPU (docs/throughput.md).
BATCH_CHUNK = 2500


def _workload(seed: int = 0):
    config = EnsembleConfig()  # 7 members, 5 elites, 4x200 SiLU
    network = GaussianEnsemble(config, OBS_DIM + 1)
    model_key, actor_key = jax.random.split(jax.random.PRNGKey(seed))
    in_dim = OBS_DIM + ACT_DIM
    model = WorldModel(
        params=init_params(network, model_key, in_dim),
        input_norm=Normalizer(jnp.zeros(in_dim), jnp.ones(in_dim)),
        target_norm=Normalizer(jnp.zeros(OBS_DIM + 1), jnp.ones(OBS_DIM + 1)),
        elites=jnp.arange(config.num_elites, dtype=jnp.int32),
        config=config,
        obs_dim=OBS_DIM,
        act_dim=ACT_DIM,
    )
    sac = SACN(SACNConfig(), OBS_DIM, ACT_DIM)  # 2x256 tanh-Gaussian actor
    actor_params = sac.init(actor_key, sac.hypers()).actor_params
    return model, MarkovPolicy(sac.act), actor_params, config


def flops_per_transition(config, actor_hidden=(256, 256)) -> float:
    """Matmul FLOPs of one model transition: every member's forward pass plus the actor's."""
    widths = [OBS_DIM + ACT_DIM, *config.hidden_dims, 2 * (OBS_DIM + 1)]
    model = config.num_members * sum(2 * a * b for a, b in zip(widths[:-1], widths[1:], strict=True))
    actor_widths = [OBS_DIM, *actor_hidden, 2 * ACT_DIM]
    actor = sum(2 * a * b for a, b in zip(actor_widths[:-1], actor_widths[1:], strict=True))
    return float(model + actor)


def _measure(starts: int, horizon: int, batch_chunk: int | None, repeats: int = 3) -> dict:
    model, policy, actor_params, config = _workload()
    chunk = batch_chunk if batch_chunk and starts % batch_chunk == 0 and starts > batch_chunk else None
    cfg = RolloutConfig(uncertainty="aleatoric_max", batch_chunk=chunk)
    start_obs = jax.random.normal(jax.random.PRNGKey(1), (starts, OBS_DIM))

    # Model, actor and start states are arguments, not constants baked into the program.
    run = jax.jit(lambda key, m, p, obs: rollout(key, m, policy, p, obs, horizon, cfg))
    args = (model, actor_params, start_obs)
    if repeats > 1:
        seconds, call = time_call(run, jax.random.PRNGKey(2), *args, repeats=repeats - 1), run
    else:  # a long rollout: compile ahead, then time its only run
        seconds, call = float("inf"), run.lower(jax.random.PRNGKey(3), *args).compile()
    begin, begin_cpu = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(call(jax.random.PRNGKey(3), *args))
    seconds = min(seconds, time.perf_counter() - begin)
    # CPU time of the last run: with the machine shared, wall time overstates the cost.
    cpu_seconds = time.process_time() - begin_cpu
    transitions = starts * horizon
    return {
        "seconds": seconds,
        "transitions_per_s": transitions / seconds,
        "flops_per_transition": flops_per_transition(config),
        "valid_fraction": float(out.valid.mean()),
        "mean_length": float(out.stats.mean_length),
        "batch_chunk": chunk,
        "cpu_seconds": cpu_seconds,
        "load_avg_1m": os.getloadavg()[0],
    }


def rollout_h5(quick: bool) -> dict:
    starts = 5_000 if quick else 50_000
    result = _measure(starts, 5, BATCH_CHUNK, repeats=2 if quick else 3)
    rate = result["transitions_per_s"]
    roofline = matmul_flops_per_s()
    return {
        "value": round(rate, 1),
        "unit": "transitions/s",
        "starts": starts,
        "horizon": 5,
        "roofline_fraction": round(rate * result["flops_per_transition"] / roofline, 3),
        "workload_gflops": round(rate * result["flops_per_transition"] / 1e9, 2),
        "matmul_gflops": round(roofline / 1e9, 2),
        "flops_per_transition": result["flops_per_transition"],
        "batch_chunk": result["batch_chunk"],
        "seconds": round(result["seconds"], 3),
        "cpu_seconds": round(result["cpu_seconds"], 3),
        "load_avg_1m": round(result["load_avg_1m"], 2),
    }


def rollout_h1000(quick: bool) -> dict:
    starts, horizon = (1_000, 100) if quick else (10_000, 1_000)
    scripts_dir = str(Path(__file__).resolve().parents[1])
    code = (
        f"import sys; sys.path.insert(0, {scripts_dir!r}); "
        f"from benchmarks.rollout import _child; _child({starts}, {horizon})"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise RuntimeError(f"rollout_h1000 child failed:\n{child.stderr[-4000:]}")
    result = json.loads(child.stdout.strip().splitlines()[-1])
    return {
        "value": round(result["transitions_per_s"], 1),
        "unit": "transitions/s",
        "starts": starts,
        "horizon": horizon,
        "peak_rss_mb": round(result["peak_rss_mb"], 1),
        "output_mb": round(result["output_mb"], 1),
        "valid_fraction": round(result["valid_fraction"], 4),
        "batch_chunk": result["batch_chunk"],
        "seconds": round(result["seconds"], 3),
        "cpu_seconds": round(result["cpu_seconds"], 3),
        "load_avg_1m": round(result["load_avg_1m"], 2),
    }


def _child(starts: int, horizon: int) -> None:
    """Measure one long rollout (all transitions materialised) and print its JSON line."""
    result = _measure(starts, horizon, BATCH_CHUNK, repeats=1)
    per_transition = 4 * (2 * OBS_DIM + ACT_DIM + 3) + 3  # obs, action, next_obs, rewards, u + 3 flags
    result.update(peak_rss_mb=peak_rss_mb(), output_mb=starts * horizon * per_transition / 2**20)
    print(json.dumps(result))


FIGURES = {"rollout_h5": rollout_h5, "rollout_h1000": rollout_h1000}
