"""Off-policy evaluation throughput.

- `fqe_fit`: FQE's gradient steps per second (`mbrl.ope.fqe`): 5 Q-heads of 2x256 with LayerNorm, each on its own
  batch of 256 per step, targets copied every 100 steps, as `mbrl ope` fits them by default; halfcheetah's sizes (obs 17,
  act 6) and 1M rows. FLOPs per step come from XLA's cost analysis of a one-step program; `roofline_fraction`
  divides the achieved FLOP/s by `matmul_gflops`. Compare it with `sac2_update` in the same run.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
from benchmarks.common import matmul_flops_per_s

from mbrl.ope.fqe import FQEConfig, fqe_programs

OBS_DIM, ACT_DIM = 17, 6


def _data(rows: int):
    k = jax.random.split(jax.random.PRNGKey(0), 5)
    return {"obs": jax.random.normal(k[0], (rows, OBS_DIM)), "action": jax.random.uniform(k[1], (rows, ACT_DIM), minval=-1),
            "reward": jax.random.normal(k[2], (rows,)), "done": jnp.zeros(rows),
            "next_obs": jax.random.normal(k[3], (rows, OBS_DIM)),
            "next_action": jax.random.uniform(k[4], (rows, ACT_DIM), minval=-1)}


def fqe_fit(quick: bool) -> dict:
    config = FQEConfig(chunk=50 if quick else 500)
    data = _data(100_000 if quick else 1_000_000)
    norm = (jnp.zeros(OBS_DIM), jnp.ones(OBS_DIM), jnp.zeros(()))  # obs mean, obs std, the value's offset
    programs = fqe_programs(config)
    carry = programs.init(jax.random.PRNGKey(0), data["obs"][:1], data["action"][:1])
    carry, loss = programs.chunk(carry, jax.random.PRNGKey(1), data, norm)  # compile
    jax.block_until_ready(loss)
    best = float("inf")
    for i in range(3):
        start = time.perf_counter()
        carry, loss = programs.chunk(carry, jax.random.PRNGKey(2 + i), data, norm)
        jax.block_until_ready(loss)
        best = min(best, time.perf_counter() - start)
    one = fqe_programs(dataclasses.replace(config, chunk=1))
    cost = one.chunk.lower(carry, jax.random.PRNGKey(0), data, norm).compile().cost_analysis()
    flops = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
    rate = config.chunk / best
    peak = matmul_flops_per_s()
    return {"value": round(rate, 2), "unit": "steps/s", "roofline_fraction": round(rate * flops / peak, 3),
            "achieved_gflops": round(rate * flops / 1e9, 2), "matmul_gflops": round(peak / 1e9, 2),
            "gflops_per_step": round(flops / 1e9, 4), "heads": config.heads, "steps_per_call": config.chunk,
            "load_avg_1m": round(os.getloadavg()[0], 2)}


FIGURES = {"fqe_fit": fqe_fit}
