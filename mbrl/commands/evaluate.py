"""`mbrl eval DIR [--episodes N]`: evaluate a run's latest policies (every seed) in the real simulator."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tyro

from mbrl.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class EvalArgs:
    run_dir: tyro.conf.Positional[Path]
    """A run directory written by `mbrl train`."""
    episodes: int = 10
    """Episodes per seed."""
    seed: int | None = None
    """Episode i of training seed s resets the env with seed + s * episodes + i (default: the run's
    schedule.eval_seed, so that the same --episodes repeats the run's own evaluation)."""


def evaluate(args: EvalArgs) -> int:
    # lazy: at the top these add to `mbrl eval --help` (0.15 s) 1.3 s (tasks), 0.04 s (score: numpy), 0.35 s
    # (logging) and 2.1 s (train) (measured)
    from mbrl.envs.tasks import get_task
    from mbrl.core.score import score_key, score_label, scores_of
    from mbrl.logging import mean_stderr
    from mbrl.train import load_run

    if args.episodes < 1:
        raise ConfigError(f"--episodes: expected a positive int, found {args.episodes}")
    loaded = load_run(args.run_dir)
    config, facts, seeds = loaded.config, loaded.facts, loaded.seeds
    if facts.get("task") is None:
        raise ConfigError(f"{loaded.run_dir}: run.json names no simulator task; this run's dataset has none to evaluate in")
    ref_scores = tuple(facts["ref_scores"]) if facts.get("ref_scores") else None
    results = loaded.trainer.evaluate(loaded.state, get_task(facts["task"]), seeds, ref_scores, episodes=args.episodes,
                                      eval_seed=config.schedule.eval_seed if args.seed is None else args.seed)
    scores, label = scores_of(results), score_label(score_key(results))
    for seed, score, ret in zip(seeds, scores, results["return_mean"]):
        print(f"seed {seed}: {label} {score:.1f} (return {ret:.1f}, {args.episodes} episodes)")
    mean, stderr = mean_stderr(scores)
    print(f"{config.algo} on {config.dataset} after {loaded.record['updates']:,} updates: {label} {mean:.1f} ± {stderr:.1f} "
          f"(mean ± stderr over {len(seeds)} seed(s))")
    return 0
