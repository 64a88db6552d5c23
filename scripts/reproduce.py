"""The learning-quality table: BC, MOPO and RAVL on locally made D4RL-style datasets, several seeds.

    python scripts/reproduce.py                      # CPU budget (quick presets), 3 seeds, all 6 datasets
    python scripts/reproduce.py --full               # the papers' budgets (paper presets)
    python scripts/reproduce.py --datasets hopper-medium --seeds 5 --out results/hopper

Each (algorithm, dataset) is one `mbrl train` run with its seeds vmapped, in OUT/runs/ALGO-DATASET.
MOPO and RAVL on one dataset share one world model (OUT/models/DATASET, fitted once; put a model fitted
with `mbrl model fit` there to reuse it). `--algos bc,mopo,ravl,neubay` adds NEUBAY, which fits its own
large LayerNorm ensemble inside its run (its preset's `ensemble`). The script is
resumable: a finished run is read back, an interrupted one continues from its checkpoint (Ctrl-C
stops cleanly). It writes OUT/results.json, OUT/results.md (the Markdown table) and OUT/results.png.
Missing datasets are made first with `mbrl data make`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from mbrl import config as config_io, datasets as datasets_io
from mbrl.commands.train import enable_compile_cache, ensure_dataset
from mbrl.core.errors import UserError
from mbrl.core.score import scores_of
from mbrl.envs.tasks import find_task, get_task
from mbrl.logging import mean_stderr
from mbrl.train import load_run, run
from mbrl.world_models.fit import fit_world_model

ALGOS = ("bc", "mopo", "ravl", "neubay", "mopo-ppo")
DEFAULT_ALGOS = ("bc", "mopo", "ravl")
SHARED_MODEL_ALGOS = ("mopo", "ravl")  # one model per dataset, fitted here
# NEUBAY fits its own large LayerNorm ensemble in its run (its preset's `ensemble`), MOPO-PPO its RWM-U.
OWN_MODEL_ALGOS = ("neubay", "mopo-ppo")
DATASETS = tuple(f"{task}-{level}" for task in ("hopper", "halfcheetah", "walker2d") for level in ("medium", "medium-replay"))


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _summary(result) -> dict:
    final = result.final_eval or {}
    scores = final.get("normalized_score") or []
    mean, stderr = mean_stderr(scores) if scores else (None, None)
    return {
        "algo": result.config.algo,
        "dataset": result.config.dataset,
        "preset": result.config.preset,
        "seeds": result.config.seed_list,
        "updates": result.epochs_done * result.config.schedule.updates_per_epoch,
        "scores": scores,
        "score_mean": mean,
        "score_stderr": stderr,
        "dataset_score": result.dataset_score,
        "curve": [(r["updates"], r["score_mean"], r["score_stderr"]) for r in result.records if "score_mean" in r],
        "minutes": round(result.seconds / 60, 2),
        "complete": result.interrupted is None and result.epochs_done == result.config.schedule.epochs,
    }


def world_model_for(dataset_name: str, dataset, preset: str, out: Path, fit_seconds: float | None = None) -> Path:
    """Fit one world model per dataset (shared by MOPO and RAVL), or reuse the saved one."""
    path = out / "models" / config_io.dataset_key(dataset_name)  # a file path gives its stem
    if (path / "model.json").is_file():
        return path
    overrides = {} if fit_seconds is None else {"fit": {"max_seconds": fit_seconds, "max_epochs": None}}
    config = config_io.build("ravl", dataset_name, preset, overrides)
    task = find_task(dataset.info.task)
    print(f"[reproduce] fitting the world model of {dataset_name}", flush=True)
    result = fit_world_model(dataset, config=config.ensemble, fit_config=config.fit, progress=True,
                             **(task.model_fns() if task else {}))
    return result.model.save(path)


def final_evaluation(run_dir: Path, episodes: int) -> dict:
    """The finished run's policies scored on `episodes` episodes per seed (NeoRL-2 scores with 1,000), with the
    resets `mbrl eval` uses."""
    loaded = load_run(run_dir)
    task = loaded.facts.get("task")
    if task is None:
        return {}
    ref_scores = tuple(loaded.facts["ref_scores"]) if loaded.facts.get("ref_scores") else None
    results = loaded.trainer.evaluate(loaded.state, get_task(task), loaded.seeds, ref_scores, episodes=episodes,
                                      eval_seed=loaded.config.schedule.eval_seed)
    scores = scores_of(results)
    mean, stderr = mean_stderr(scores)
    return {"final_episodes": episodes, "final_scores": list(map(float, scores)), "final_mean": mean,
            "final_stderr": stderr}


def run_one(algo: str, dataset_name: str, dataset, args, out: Path) -> dict:
    run_dir = out / "runs" / f"{algo}-{config_io.dataset_key(dataset_name)}"
    result_file = run_dir / "result.json"
    if result_file.is_file():
        summary = json.loads(result_file.read_text())
        if summary.get("complete"):
            print(f"[reproduce] {algo} on {dataset_name}: done before ({summary['score_mean']:.1f})", flush=True)
            if args.final_episodes and summary.get("final_episodes") != args.final_episodes:
                summary.update(final_evaluation(run_dir, args.final_episodes))
                _write(result_file, json.dumps(summary, indent=1))
            return summary
    preset = "paper" if args.full else "quick"
    shared = algo in SHARED_MODEL_ALGOS
    world_model = world_model_for(dataset_name, dataset, preset, out, args.fit_seconds) if shared else None
    print(f"[reproduce] {algo} on {dataset_name}, {preset} preset, {args.seeds} seeds", flush=True)
    if (run_dir / "config.json").is_file():
        result = run(None, run_dir, resume=True, dataset=dataset)
    else:
        overrides = {"seeds": args.seeds, "seed": args.seed, "schedule": {}}
        if args.fit_seconds is not None and algo in OWN_MODEL_ALGOS:
            section = "rwm_fit" if algo == "mopo-ppo" else "fit"
            overrides[section] = {"max_seconds": args.fit_seconds, "max_epochs": None}
        for name in ("epochs", "updates_per_epoch", "eval_every"):
            if getattr(args, name) is not None:
                overrides["schedule"][name] = getattr(args, name)
        config = config_io.build(algo, dataset_name, preset, overrides)
        result = run(config, run_dir, world_model_dir=world_model, dataset=dataset)
    summary = _summary(result)
    if args.final_episodes and summary["complete"]:
        summary.update(final_evaluation(run_dir, args.final_episodes))
    _write(result_file, json.dumps(summary, indent=1))
    if result.interrupted is not None:
        raise KeyboardInterrupt
    return summary


def markdown(summaries: list[dict], args) -> str:
    datasets = [d for d in args.datasets if any(s["dataset"] == d for s in summaries)]
    algos = [a for a in args.algos if any(s["algo"] == a for s in summaries)]
    by_key = {(s["algo"], s["dataset"]): s for s in summaries}
    budget = "paper presets (`--full`)" if args.full else "quick presets (CPU budget)"
    episodes = f"{args.final_episodes} episodes per seed" if args.final_episodes else "the last evaluation's episodes"
    lines = [
        f"Normalized score at the end of training ({episodes}), mean ± stderr over {args.seeds} seeds; {budget}.",
        "",
        "| dataset | data | " + " | ".join(a.upper() for a in algos) + " |",
        "|---|---|" + "---|" * len(algos),
    ]
    for name in datasets:
        data_score = next((s["dataset_score"] for s in summaries if s["dataset"] == name and s["dataset_score"] is not None), None)
        cells = []
        for algo in algos:
            s = by_key.get((algo, name))
            if s is not None and args.final_episodes and s.get("final_episodes") == args.final_episodes:
                mean, stderr = s["final_mean"], s["final_stderr"]
            else:
                mean, stderr = (None, None) if s is None else (s["score_mean"], s["score_stderr"])
            if mean is None:
                cells.append("–")
            else:
                cells.append(f"{mean:.1f} ± {stderr:.1f}" + ("" if s["complete"] else " (partial)"))
        lines.append(f"| {name} | {'–' if data_score is None else f'{data_score:.1f}'} | " + " | ".join(cells) + " |")
    updates = {a: sorted({s["updates"] for s in summaries if s["algo"] == a}) for a in algos}
    minutes = sum(s["minutes"] for s in summaries)
    lines += ["", "Updates per run: " + ", ".join(f"{a.upper()} {'/'.join(f'{u:,}' for u in v)}" for a, v in updates.items()),
              f"Training wall time: {minutes:.0f} min in total (world-model fits and dataset making not included)."]
    return "\n".join(lines) + "\n"


def plot(summaries: list[dict], path: Path) -> None:
    matplotlib.use("Agg")

    datasets = sorted({s["dataset"] for s in summaries}, key=lambda d: DATASETS.index(d) if d in DATASETS else 99)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4 * len(datasets), 3.2), dpi=110, squeeze=False)
    for ax, name in zip(axes[0], datasets):
        for s in (s for s in summaries if s["dataset"] == name and s["curve"]):
            x, mean, stderr = (list(v) for v in zip(*s["curve"]))
            ax.plot(x, mean, marker="o", ms=3, label=s["algo"].upper())
            ax.fill_between(x, [m - e for m, e in zip(mean, stderr)], [m + e for m, e in zip(mean, stderr)], alpha=0.2)
        data = next((s["dataset_score"] for s in summaries if s["dataset"] == name and s["dataset_score"] is not None), None)
        if data is not None:
            ax.axhline(data, color="gray", ls="--", lw=1, label="data")
        ax.set_title(name)
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("normalized score")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="paper presets (hours per run on a CPU)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per run, vmapped (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--algos", default=",".join(DEFAULT_ALGOS),
                        help=f"comma-separated, from {', '.join(ALGOS)} (default: {', '.join(DEFAULT_ALGOS)})")
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated dataset names")
    parser.add_argument("--out", type=Path, default=Path("results/reproduce"))
    parser.add_argument("--epochs", type=int, default=None, help="override every preset's schedule.epochs")
    parser.add_argument("--updates-per-epoch", type=int, default=None, help="override schedule.updates_per_epoch")
    parser.add_argument("--eval-every", type=int, default=None, help="override schedule.eval_every")
    parser.add_argument("--final-episodes", type=int, default=None,
                        help="score each finished run again on this many episodes per seed for the table")
    parser.add_argument("--fit-seconds", type=float, default=None, help="time budget of each world-model fit")
    args = parser.parse_args(argv)
    args.algos = [a for a in args.algos.split(",") if a]
    args.datasets = [d for d in args.datasets.split(",") if d]
    unknown = [a for a in args.algos if a not in ALGOS]
    if unknown or args.seeds < 1:
        parser.error(f"unknown algorithm(s) {unknown}" if unknown else "--seeds must be >= 1")

    enable_compile_cache()
    out = args.out.absolute()
    out.mkdir(parents=True, exist_ok=True)
    summaries = []
    start = time.perf_counter()
    try:
        for name in args.datasets:
            ensure_dataset(name)
            dataset = datasets_io.load(name)
            for algo in args.algos:
                summaries.append(run_one(algo, name, dataset, args, out))
                _write(out / "results.json", json.dumps(summaries, indent=1))
    except KeyboardInterrupt:
        print("[reproduce] interrupted; run the same command again to continue", file=sys.stderr)
        return 130
    except UserError as exc:
        print(f"reproduce: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    table = markdown(summaries, args)
    _write(out / "results.md", table)
    plot(summaries, out / "results.png")
    print(table)
    print(f"[reproduce] {len(summaries)} runs in {(time.perf_counter() - start) / 60:.1f} min -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
