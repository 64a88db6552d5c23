"""Helpers shared by the benchmark figures."""

from __future__ import annotations

import functools
import resource
import time

import jax
import jax.numpy as jnp


def time_call(fn, *args, repeats: int = 5, warmup: int = 1) -> float:
    """Best wall time in seconds of `fn(*args)` after warm-up (compiles excluded)."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def matmul_flops_per_s(n: int = 2048) -> float:
    """fp32 GEMM throughput of this machine: the roofline that other figures divide by."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    seconds = time_call(matmul, a, b, repeats=10)
    return 2.0 * n**3 / seconds


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
