"""The machine's roofline."""

from __future__ import annotations

import jax
from benchmarks.common import matmul_flops_per_s


def matmul_gflops(quick: bool) -> dict:
    n = 1024 if quick else 2048
    flops = matmul_flops_per_s(n)
    return {"value": round(flops / 1e9, 2), "unit": "GFLOP/s", "n": n, "dtype": "float32", "backend": jax.default_backend()}


FIGURES = {"matmul_gflops": matmul_gflops}
