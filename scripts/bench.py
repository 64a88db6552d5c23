"""Throughput figures, one JSON object per line on stdout.

    python scripts/bench.py [--quick] [--only NAME[,NAME...]]

Each figure lives in `scripts/benchmarks/<topic>.py`, which defines `FIGURES: dict[str, callable]`.
A figure function takes `quick: bool` and returns a dict with at least `value` and `unit`; the
runner adds `"figure": NAME`. Workloads that are compared run in the same process, one after the
other, so that they see the same machine state. `--quick` shrinks workloads (for a smoke test).
Every line also states `other_cpus` and `steal_cpus`: the CPUs that other processes and the hypervisor
took while the figure ran (a warning goes to stderr when others took more than 0.2).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchmarks  # noqa: E402  (scripts/benchmarks, on the path just above)


def discover() -> dict:
    figures: dict = {}
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"benchmarks.{info.name}")
        figures.update(getattr(module, "FIGURES", {}))
    # The roofline first: later figures divide by it.
    return dict(sorted(figures.items(), key=lambda kv: kv[0] != "matmul_gflops"))


# A figure is only as good as the machine was idle: a busy neighbour process or hypervisor steal
# lowers it without a trace, so each line states both, in CPUs over the figure's wall time.
BUSY_WARNING_CPUS = 0.2


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, steal) clock ticks of all CPUs so far, from Linux's /proc/stat; None elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq, steal


class CpuWatch:
    """How many CPUs other processes (`other_cpus`) and the hypervisor (`steal_cpus`) took meanwhile.

    A figure's own subprocesses are not others: their time counts once they have been waited for.
    """

    def __init__(self) -> None:
        self._ticks, self._self, self._wall = _cpu_ticks(), os.times(), time.perf_counter()

    def stop(self) -> dict:
        ticks, own, wall = _cpu_ticks(), os.times(), time.perf_counter() - self._wall
        if ticks is None or self._ticks is None or wall <= 0:
            return {}
        hz = os.sysconf("SC_CLK_TCK")
        busy = (ticks[0] - self._ticks[0]) / hz
        own_seconds = sum(getattr(own, f) - getattr(self._self, f)
                          for f in ("user", "system", "children_user", "children_system"))
        return {
            "other_cpus": round(max(busy - own_seconds, 0.0) / wall, 2),
            "steal_cpus": round((ticks[1] - self._ticks[1]) / hz / wall, 2),
        }


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
        start, watch = time.perf_counter(), CpuWatch()
        result = figures[name](quick=args.quick)
        line = {"figure": name, **result, "bench_seconds": round(time.perf_counter() - start, 2), **watch.stop()}
        print(json.dumps(line), flush=True)
        if line.get("other_cpus", 0.0) > BUSY_WARNING_CPUS:
            print(f"bench: warning: other processes used {line['other_cpus']} CPUs during {name}; "
                  "its figure is lower than on an idle machine", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
