"""Fine-tuning side by side (docs/finetune.md): WSRL, WSRL keeping 50% offline data, and SAC from scratch (and, with
--variants, WSRL with its anchor decayed to 0, with none, or with one of 2.5 for a run trained without one), from one
offline run, several seeds each, through `mbrl finetune --robot mujoco:ENV`.

    python scripts/experiments/finetune_compare.py --run runs/mopo --out results/finetune [--seeds 0 1 2] [--steps 30000] [--jobs 2]

Each (variant, seed) is one `mbrl finetune` process, single-threaded, `--jobs` at a time; a finished run is kept and
an unfinished one resumed, so the script can be run again after an interruption. It then writes `summary.json`,
`table.md` (score at each evaluation, mean ± stderr over seeds; the lowest score after the warm-up against 80% of
the offline policy's) and `curve.png` into `--out`, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "WSRL": [],
    "WSRL + 50% offline data": ["--retain-offline-ratio", "0.5"],
    "SAC from scratch": ["--scratch"],
    "WSRL, anchor decayed to 0": ["--anchor-final", "0"],
    "WSRL, no anchor": ["--anchor", "0"],
    "WSRL, anchor 2.5": ["--anchor", "2.5"],  # for a run trained without one (CQL): the quick presets' weight
}
SLUG = {"WSRL": "wsrl", "WSRL + 50% offline data": "retain50", "SAC from scratch": "scratch",
        "WSRL, anchor decayed to 0": "decay0", "WSRL, no anchor": "no-anchor",
        "WSRL, anchor 2.5": "anchor2.5"}
DEFAULT_VARIANTS = ["WSRL", "WSRL + 50% offline data", "SAC from scratch"]


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _command(args, variant: str, seed: int, run_dir: Path) -> list[str]:
    mbrl = [sys.executable, "-m", "mbrl.cli", "finetune"]
    if (run_dir / "finetune.json").is_file():
        return mbrl + ["--resume", str(run_dir), "--no-progress"]
    return mbrl + [str(args.run), "--robot", args.robot, "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--utd", str(args.utd), "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes),
                   "--seed", str(seed), "--run-dir", str(run_dir), "--no-progress", *VARIANTS[variant]]


def run_all(args) -> None:
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    todo = []
    for variant in args.variants:
        for seed in args.seeds:
            run_dir = args.out / f"{SLUG[variant]}-seed{seed}"
            records = _records(run_dir)
            if not records or records[-1]["step"] < args.steps:
                todo.append((variant, seed, run_dir))
    running: list[tuple[subprocess.Popen, str, float]] = []
    while todo or running:
        while todo and len(running) < args.jobs:
            variant, seed, run_dir = todo.pop(0)
            log = open(args.out / f"{SLUG[variant]}-seed{seed}.log", "a")
            process = subprocess.Popen(_command(args, variant, seed, run_dir), stdout=log, stderr=subprocess.STDOUT, env=env)
            running.append((process, f"{variant} seed {seed}", time.time()))
            print(f"{time.strftime('%H:%M:%S')} started {variant} seed {seed}", flush=True)
        time.sleep(5)
        for item in list(running):
            process, name, started = item
            if process.poll() is not None:
                running.remove(item)
                print(f"{time.strftime('%H:%M:%S')} {name}: exit {process.returncode} after {(time.time() - started) / 60:.1f} min",
                      flush=True)


def _mean_stderr(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def summarize(args) -> dict:
    summary = {"run": str(args.run), "robot": args.robot, "steps": args.steps, "warmup": args.warmup, "utd": args.utd,
               "seeds": args.seeds, "variants": {}}
    for variant in args.variants:
        found = [(seed, _records(args.out / f"{SLUG[variant]}-seed{seed}")) for seed in args.seeds]
        seeds = [seed for seed, records in found if records]
        runs = [[r for r in records if r.get("eval")] for _, records in found if records]
        if not runs:
            continue
        steps = sorted(set.intersection(*[{r["step"] for r in records} for records in runs]))
        scores = {step: [next(r["score_mean"] for r in records if r["step"] == step) for records in runs] for step in steps}
        minutes = [records[-1]["seconds"] / 60 for records in runs]
        summary["variants"][variant] = {"seeds": seeds, "steps": steps, "scores": {str(s): v for s, v in scores.items()},
                                        "minutes": minutes}
    return summary


def table(summary: dict, every: int) -> str:
    """Mean ± stderr at every `every` steps (and the warm-up's end), then per variant its seeds' figures."""
    variants = summary["variants"]
    if not variants:
        return "no finished runs"
    steps = sorted({s for v in variants.values() for s in v["steps"] if s % every == 0 or s == summary["warmup"]})
    offline = None
    if "WSRL" in variants and "0" in variants["WSRL"]["scores"]:
        offline = _mean_stderr(variants["WSRL"]["scores"]["0"])[0]
    header = "| env steps | " + " | ".join(variants) + " |"
    lines = [header, "|---:|" + "---|" * len(variants)]
    for step in steps:
        cells = []
        for v in variants.values():
            values = v["scores"].get(str(step))
            cells.append("" if values is None else "{:.1f} ± {:.1f}".format(*_mean_stderr(values)))
        lines.append(f"| {step:,} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, v in variants.items():
        after = [s for s in v["steps"] if s > summary["warmup"]]
        per_seed_min = [min(v["scores"][str(s)][i] for s in after) for i in range(len(v["scores"][str(after[0])]))] if after else []
        final = v["scores"][str(v["steps"][-1])]
        note = f"- {name}: final {', '.join(f'{x:.1f}' for x in final)} (seeds {', '.join(map(str, v['seeds']))})"
        if per_seed_min:
            note += f"; lowest after the warm-up per seed {', '.join(f'{x:.1f}' for x in per_seed_min)}"
        if offline is not None:
            note += f" (80% of the offline policy's {offline:.1f} is {0.8 * offline:.1f})"
        note += f"; wall time per run {', '.join(f'{m:.1f}' for m in v['minutes'])} min"
        lines.append(note)
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    offline = None
    for name, v in summary["variants"].items():
        x = v["steps"]
        stats = [_mean_stderr(v["scores"][str(s)]) for s in x]
        mean = [m for m, _ in stats]
        err = [e for _, e in stats]
        ax.plot(x, mean, marker="o", ms=3, lw=1.5, label=f"{name} ({len(v['seeds'])} seeds)")
        ax.fill_between(x, [m - e for m, e in zip(mean, err)], [m + e for m, e in zip(mean, err)], alpha=0.2)
        if name == "WSRL":
            offline = mean[0]
    if offline is not None:
        ax.axhline(offline, color="grey", lw=1, ls="--", label="offline policy")
        ax.axhline(0.8 * offline, color="grey", lw=1, ls=":", label="80% of it")
    ax.axvline(summary["warmup"], color="black", lw=0.8, alpha=0.5)
    ax.set_xlabel("online env steps (warm-up left of the line)")
    ax.set_ylabel("normalized score")
    ax.set_title(f"fine-tuning on {summary['robot']}, UTD {summary['utd']}, mean ± stderr over seeds", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="the offline run directory (mbrl train)")
    parser.add_argument("--out", type=Path, default=Path("results/finetune"))
    parser.add_argument("--robot", default="mujoco:Hopper-v5")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--utd", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=2_500)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each single-threaded)")
    parser.add_argument("--table-every", type=int, default=2_500, help="steps between the table's rows")
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summarize_only:
        run_all(args)
    summary = summarize(args)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = table(summary, args.table_every)
    (args.out / "table.md").write_text(text + "\n")
    if summary["variants"]:
        plot(summary, args.out / "curve.png")
    print(text)


if __name__ == "__main__":
    main()
