"""Throughput figures, one JSON object per line on stdout.

    python scripts/bench.py [--quick] [--only NAME[,NAME...]]

Each figure lives in `scripts/benchmarks/<topic>.py`, which defines `FIGURES: dict[str, callable]`.
A figure function takes `quick: bool` and returns a dict with at least `value` and `unit`; the
runner adds `"figure": NAME`. Workloads that are compared run in the same process, one after the
other, so that they see the same machine state. `--quick` shrinks workloads (for a smoke test).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def discover() -> dict:
    import benchmarks

    figures: dict = {}
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"benchmarks.{info.name}")
        figures.update(getattr(module, "FIGURES", {}))
    # The roofline first: later figures divide by it.
    return dict(sorted(figures.items(), key=lambda kv: kv[0] != "matmul_gflops"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small workloads, for a smoke test")
    parser.add_argument("--only", default="", help="comma-separated figure names")
    parser.add_argument("--list", action="store_true", help="list figure names and exit")
    args = parser.parse_args(argv)
    figures = discover()
    if args.list:
        print("\n".join(figures))
        return 0
    wanted = [n for n in args.only.split(",") if n] or list(figures)
    unknown = [n for n in wanted if n not in figures]
    if unknown:
        print(f"bench: error: unknown figure(s) {', '.join(unknown)}; known: {', '.join(figures)}", file=sys.stderr)
        return 2
    for name in wanted:
        start = time.perf_counter()
        result = figures[name](quick=args.quick)
        line = {"figure": name, **result, "bench_seconds": round(time.perf_counter() - start, 2)}
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
