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
    import jax

    from envs.tasks import get_task
    from mbrl import config as config_io
    from mbrl.checkpoint import Checkpointer
    from mbrl.logging import mean_stderr
    from mbrl.train import read_run_facts, trainer_for

    run_dir = Path(args.run_dir).absolute()
    if args.episodes < 1:
        raise ConfigError(f"--episodes: expected a positive int, found {args.episodes}")
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no config.json); expected a directory from `mbrl train`")
    config = config_io.load(run_dir / "config.json")
    facts = read_run_facts(run_dir)
    if facts is None or facts.get("task") is None:
        raise ConfigError(f"{run_dir}: run.json names no simulator task; this run's dataset has none to evaluate in")
    task = get_task(facts["task"])
    ref_scores = tuple(facts["ref_scores"]) if facts.get("ref_scores") else None
    trainer = trainer_for(config, int(facts["obs_dim"]), int(facts["act_dim"]))
    seeds = config.seed_list
    checkpointer = Checkpointer(run_dir / "checkpoints")
    try:
        state, record = checkpointer.restore(jax.eval_shape(trainer.initial_state, seeds))
    finally:
        checkpointer.close()
    results = trainer.evaluate(state, task, seeds, ref_scores, episodes=args.episodes,
                               eval_seed=config.schedule.eval_seed if args.seed is None else args.seed)
    scores = results["normalized_score"] or results["return_mean"]
    label = "normalized score" if results["normalized_score"] is not None else "return"
    for seed, score, ret in zip(seeds, scores, results["return_mean"]):
        print(f"seed {seed}: {label} {score:.1f} (return {ret:.1f}, {args.episodes} episodes)")
    mean, stderr = mean_stderr(scores)
    print(f"{config.algo} on {config.dataset} after {record['updates']:,} updates: {label} {mean:.1f} ± {stderr:.1f} "
          f"(mean ± stderr over {len(seeds)} seed(s))")
    return 0
