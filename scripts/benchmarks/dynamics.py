"""Dynamics-ensemble training throughput.

`dynamics_train`: gradient steps per second of the real fitting code (`mbrl.world_models.fit.run_epoch`:
per-member shuffles, minibatch gathers, Gaussian NLL + per-layer weight decay + log-variance bound
penalty, Adam, then the holdout pass and best-weights select) for OfflineRL-Kit's MOPO workload:
7 members x [23 -> 4x200 -> 36] (halfcheetah: 17 obs + 6 action in, 2 x (17 + 1) out), batch 256
per member, fp32. One call is one compiled epoch of `steps` gradient steps.

The step is matmul-bound: `matmul_gflop_per_step` of fp32 GEMMs (forward, and backward at twice that),
so at a fp32 GEMM rate R the ceiling is R / that many steps/s; `roofline_fraction` is how close a run
gets. Members lead the activations (M, B, H) and the steps run in one compiled scan, the faster layout
and loop; what was measured, and the comparison with OfflineRL-Kit (only side by side, in one run on
one machine), are in docs/throughput.md.
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
from benchmarks.common import matmul_flops_per_s

from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble, init_params
from mbrl.world_models.fit import DeviceData, TrainState, make_optimizer, run_epoch

OBS_DIM, ACT_DIM, BATCH = 17, 6, 256


def matmul_flops_per_step(num_members: int, dims: list[int], batch: int) -> float:
    """Forward 2·B·in·out per layer; backward twice that, minus the unneeded input gradient of layer 1."""
    forward = sum(2.0 * batch * i * o for i, o in zip(dims[:-1], dims[1:]))
    first_input_grad = 2.0 * batch * dims[0] * dims[1]
    return num_members * (3.0 * forward - first_input_grad)


def dynamics_train(quick: bool) -> dict:
    steps = 20 if quick else 200
    repeats = 2 if quick else 5
    config = EnsembleConfig()  # 7 members, 4x200 SiLU, learned log-variance bounds, MOPO weight decay
    out_dim = OBS_DIM + 1
    network = GaussianEnsemble(config, out_dim)
    n, holdout = steps * BATCH, 1000  # one epoch = `steps` full batches
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    in_dim = OBS_DIM + ACT_DIM
    data = DeviceData(
        inputs=jax.random.normal(keys[0], (n, in_dim)),
        targets=jax.random.normal(keys[1], (n, out_dim)),
        terminals=jnp.zeros(n, bool),
        holdout_inputs=jax.random.normal(keys[2], (holdout, in_dim)),
        holdout_targets=jax.random.normal(keys[3], (holdout, out_dim)),
    )
    params = init_params(network, keys[4], in_dim)
    state = TrainState(
        params=params,
        opt_state=make_optimizer(1e-3).init(params),
        best_params=jax.tree.map(jnp.copy, params),
        best_mse=jnp.full((config.num_members,), jnp.inf, jnp.float32),
        rows=jax.random.randint(keys[5], (config.num_members, n), 0, n, dtype=jnp.int32),
    )
    epoch = functools.partial(run_epoch, network=network, learning_rate=1e-3, batch_size=BATCH, sampling="bootstrap")
    key = jax.random.PRNGKey(1)
    start = time.perf_counter()
    state, loss, _ = epoch(state, data, key)  # compile + warm-up
    jax.block_until_ready(loss)
    compile_seconds = time.perf_counter() - start
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        key, sub = jax.random.split(key)
        start, start_cpu = time.perf_counter(), time.process_time()
        state, loss, _ = epoch(state, data, sub)  # the state is donated and replaced each call
        jax.block_until_ready(loss)
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
    value = steps / best
    dims = [in_dim, *config.hidden_dims, 2 * out_dim]
    flops_per_step = matmul_flops_per_step(config.num_members, dims, BATCH)
    roofline = matmul_flops_per_s()
    achieved = value * flops_per_step
    return {
        "value": round(value, 2),
        "unit": "steps/s",
        "members": config.num_members,
        "layers": dims,
        "batch_per_member": BATCH,
        "steps_per_call": steps,
        "dtype": "float32",
        "roofline_fraction": round(achieved / roofline, 3),
        "achieved_gflops": round(achieved / 1e9, 1),
        "matmul_gflop_per_step": round(flops_per_step / 1e9, 3),
        # Steps per second of this process's CPU time: less sensitive to other jobs on a shared machine.
        "steps_per_cpu_second": round(steps / best_cpu, 2),
        "compile_seconds": round(compile_seconds, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "backend": jax.default_backend(),
    }


FIGURES = {"dynamics_train": dynamics_train}
