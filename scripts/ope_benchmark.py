"""Off-policy evaluation against the truth, DOPE's protocol (Fu et al. 2021): a set of policies of known return on
one dataset, each judged from the data alone by every estimator of `mbrl ope`, then ranked against its true
discounted return from simulated episodes.

    python scripts/ope_benchmark.py --dataset neorl2:DMSD --runs RUN_DIR [RUN_DIR ...] --episodes 100 \\
        --untrained 2 --out results/ope/dmsd

Policies: every training seed of every run directory given (any Markov algorithm; named PARENT/RUN#SEED; with
`--every-checkpoint`, each kept checkpoint, PARENT/RUN@EPOCH#SEED), `--behaviour` the shipped behaviour actors of the
dataset's task (medium, expert and the medium-replay snapshots, each acting by its mode), plus deliberately bad
ones: `--untrained N` (the first run's agent at N fresh initialisations) and `--negated RUN_DIR ...` (runs trained on
the dataset with its rewards negated; their own critics and model learnt the negated reward, so they do not judge).
`--write-negated PATH` writes that dataset (D4RL-layout .hdf5) and exits:

    python scripts/ope_benchmark.py --dataset hopper-medium --write-negated NEG.hdf5
    mbrl model fit --dataset NEG.hdf5 --out WM_NEG && mbrl train --algo mopo --dataset NEG.hdf5 --world-model WM_NEG ...

`--world-model DIR` judges every Markov policy in that one model (else each run in its own, and the others not).
Truth: `--episodes` simulated episodes per policy from fixed reset seeds; the discounted return with FQE's γ (what
FQE and the critic estimate) and the undiscounted one over the task's episodes (what the model estimates; the
normalized score). Metrics per estimator, against the truth of its kind: Spearman's rank correlation, regret@1 (the
true value lost by picking the estimator's best, over the true range), and the mean absolute error over the true
range; each with a 95% bootstrap interval over policies. `fqe_lcb` ranks by the low end of FQE's interval. Writes
OUT/policies.jsonl (one line per policy) and OUT/metrics.json, and prints the metrics as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np
from make_sample import write

from mbrl import datasets
from mbrl.checkpoint import Checkpointer
from mbrl.core.score import normalized_score, reference_scores
from mbrl.core.tanh_gaussian import tanh_gaussian_mode
from mbrl.core.types import TASK_SPECS
from mbrl.envs import lockstep
from mbrl.envs.behaviour import load_actor, load_snapshots, read_record
from mbrl.envs.tasks import find_task
from mbrl.ope.estimates import critic_estimate, fqe_estimate, model_estimate
from mbrl.ope.fqe import FQEConfig
from mbrl.ope.judged import JudgedPolicy
from mbrl.ope.policy import load_policy, policy_of_run
from mbrl.sweep.objective import spearman
from mbrl.train import load_run
from mbrl.trainer import hypers_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def true_returns(policy, task, episodes: int, gamma: float, seed: int, steps: int | None) -> tuple[float, float]:
    """(mean discounted return over `steps`-step episodes, mean undiscounted return over the task's own episodes),
    `episodes` seeded episodes each. FQE bootstraps through the time limit, so its value is the infinite-horizon
    one: the discounted truth runs the env past its limit, to `steps` (γ^steps negligible)."""
    discounted = _returns(policy, task, episodes, seed, steps, gamma)
    undiscounted = _returns(policy, task, episodes, seed, None, 1.0)
    return discounted, undiscounted


def _returns(policy, task, episodes: int, seed: int, steps: int | None, gamma: float) -> float:
    envs = [task.make_env(**({} if steps is None else {"max_episode_steps": steps})) for _ in range(episodes)]
    try:
        slots = lockstep.run(envs, lockstep.markov(lambda obs: np.asarray(policy.act(obs))),
                             lambda slot, episode: seed + slot, episodes=1)
    finally:
        for env in envs:
            env.close()
    rewards = [ep.rewards.astype(np.float64) for (ep,) in slots]
    return float(np.mean([np.sum(r * gamma ** np.arange(len(r))) for r in rewards]))


def untrained_policies(run_dir: Path, count: int):
    """The run's agent at `count` fresh initialisations: the bad end of the policy set."""
    run = load_run(run_dir)
    agent, hypers = run.trainer.agent, hypers_of(run.config)
    out = []
    for i in range(count):
        params = agent.actor_params(agent.init(jax.random.PRNGKey(1000 + i), hypers))
        policy = policy_of_run(run, params, f"untrained-{i}", {"algo": run.config.algo, "run_dir": str(run_dir)})
        policy.run = None  # not the run's own weights: its critics and model do not judge it
        out.append((f"untrained-{i}", policy))
    return out


def negated_policies(run_dir: Path):
    """Every seed of a run trained on negated rewards, judged only by FQE and the one world model."""
    out = run_policies(run_dir, every_checkpoint=False)
    for _, policy in out:
        policy.run = None  # its critics and its model estimate the negated reward
    return [(f"negated/{name}", policy) for name, policy in out]


def behaviour_policies(task: str):
    """The shipped behaviour actors of `task` (envs/behaviour), each acting by its tanh-Gaussian's mode: medium,
    expert and the medium-replay run's snapshots, from random-like to medium."""
    spec = TASK_SPECS[task]

    def judged(actor, params, name):
        act = jax.jit(lambda obs: tanh_gaussian_mode(actor.apply(params, obs)[0]))
        return name, JudgedPolicy(act, spec.obs_dim, spec.act_dim, name)

    out = [judged(*load_actor(task, level), f"behaviour/{level}") for level in ("medium", "expert")]
    actor, snapshots = load_snapshots(task)
    steps = read_record(task, "medium_replay")["snapshot_steps"]
    out += [judged(actor, params, f"behaviour/snapshot@{step}") for params, step in zip(snapshots, steps)]
    return out


def write_negated(dataset, path: Path) -> None:
    t = dataset.transitions
    write(path, {"observations": t.obs, "actions": t.action, "rewards": -np.asarray(t.reward, np.float32),
                 "next_observations": t.next_obs, "terminals": t.terminal, "timeouts": t.timeout},
          {"task": dataset.info.task, "made_by": "scripts/ope_benchmark.py --write-negated (rewards negated)"})
    print(f"wrote {path}: {len(t)} transitions of {dataset.info.task}, rewards negated")


def run_policies(run_dir: Path, every_checkpoint: bool):
    """Every training seed of a run at its latest checkpoint, or at each kept checkpoint."""
    name = f"{run_dir.parent.name}/{run_dir.name}"
    if not every_checkpoint:
        run = load_run(run_dir)
        return [(f"{name}#{i}", load_policy(run_dir, i)) for i in range(len(run.seeds))]
    checkpointer = Checkpointer(run_dir / "checkpoints", max_to_keep=None)
    try:
        epochs = sorted(checkpointer.all_epochs())
    finally:
        checkpointer.close()
    out = []
    for epoch in epochs:
        run = load_run(run_dir, epoch=epoch)
        for i in range(len(run.seeds)):
            metadata = {"algo": run.config.algo, "train_seed": run.seeds[i], "run_dir": str(run_dir), "epoch": epoch}
            out.append((f"{name}@{epoch}#{i}", policy_of_run(run, run.actor_params(i), str(run_dir), metadata, i)))
    return out


def metrics(estimates: np.ndarray, truth: np.ndarray, rng: np.random.Generator, draws: int = 1000) -> dict:
    span = float(truth.max() - truth.min()) or 1.0

    def one(index):
        e, t = estimates[index], truth[index]
        return (spearman(e, t) if len(set(t.tolist())) > 1 else np.nan,
                (t.max() - t[np.argmax(e)]) / span, float(np.mean(np.abs(e - t))) / span)

    point = one(np.arange(len(truth)))
    boot = np.array([one(rng.integers(0, len(truth), len(truth))) for _ in range(draws)], np.float64)
    names = ("spearman", "regret_at_1", "abs_error_over_range")
    return {name: {"value": round(float(point[k]), 3),
                   "ci95": [round(float(np.nanpercentile(boot[:, k], 2.5)), 3),
                            round(float(np.nanpercentile(boot[:, k], 97.5)), 3)]}
            for k, name in enumerate(names)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--runs", nargs="+", type=Path, default=[])
    parser.add_argument("--write-negated", type=Path, default=None, help="write the dataset, rewards negated; exit")
    parser.add_argument("--every-checkpoint", action="store_true", help="each kept checkpoint of a run, not its latest")
    parser.add_argument("--behaviour", action="store_true", help="also the task's shipped behaviour actors")
    parser.add_argument("--world-model", type=Path, default=None, help="one model that judges every Markov policy")
    parser.add_argument("--starts", type=int, default=64, help="model estimate: imagined episodes per elite")
    parser.add_argument("--untrained", type=int, default=2)
    parser.add_argument("--negated", nargs="*", type=Path, default=[], help="runs trained on negated rewards")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--eval-seed", type=int, default=50_000)
    parser.add_argument("--holdout", type=float, default=0.1)
    parser.add_argument("--fqe-steps", type=int, default=20_000)
    parser.add_argument("--fqe-hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--truth-steps", type=int, default=1000, help="episode length of the discounted truth")
    parser.add_argument("--target-every", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.write_negated is None and (not args.runs or args.out is None):
        parser.error("--runs and --out: expected run directories and an output folder")

    dataset = datasets.load(args.dataset)
    if args.write_negated is not None:
        write_negated(dataset, args.write_negated)
        return 0
    task = find_task(dataset.info.task)
    if task is None or not task.has_env:
        print(f"{args.dataset}: no simulator task; the truth needs one", file=sys.stderr)
        return 2
    fqe = FQEConfig(steps=args.fqe_steps, hidden_sizes=tuple(args.fqe_hidden), gamma=args.gamma,
                    min_steps=min(5_000, args.fqe_steps // 2), target_every=args.target_every)
    initial = dataset.transitions.obs[dataset.episode_starts]
    ref = reference_scores(dataset.info.ref_min_score, dataset.info.ref_max_score, task)
    policies = []
    for run_dir in args.runs:
        policies += run_policies(run_dir, args.every_checkpoint)
    if args.behaviour:
        policies += behaviour_policies(task.name)
    policies += untrained_policies(args.runs[0], args.untrained)
    for run_dir in args.negated:
        policies += negated_policies(run_dir)

    args.out.mkdir(parents=True, exist_ok=True)
    done = {}
    log = args.out / "policies.jsonl"
    if log.exists():  # resumable: a policy judged before is read back
        done = {r["policy"]: r for r in map(json.loads, log.read_text().splitlines())}
    for name, policy in policies:
        if name in done:
            continue
        discounted, undiscounted = true_returns(policy, task, args.episodes, args.gamma, args.eval_seed, args.truth_steps)
        row = {"policy": name, "true_discounted": discounted, "true_return": undiscounted,
               "true_normalized": None if ref is None else float(normalized_score(undiscounted, *ref))}
        for method, estimate in (("fqe", fqe_estimate(policy, dataset, initial, args.holdout, fqe)),
                                 ("critic", critic_estimate(policy, initial)),
                                 ("model", model_estimate(policy, dataset, args.world_model, args.starts, None))):
            if estimate is not None:
                row[method] = {k: estimate[k] for k in ("value", "low", "high")}
        done[name] = row
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    rows = [done[name] for name, _ in policies]
    rng = np.random.default_rng(0)
    out = {"dataset": args.dataset, "policies": len(rows), "episodes": args.episodes, "gamma": args.gamma,
           "fqe_steps": args.fqe_steps, "target_every": args.target_every, "truth_steps": args.truth_steps,
           "methods": {}}
    # fqe_lcb: FQE's interval's low end, the pessimistic choice (off the data, the heads disagree and it falls).
    # Each against the truth of its kind: FQE and the critic estimate the discounted value, the model the return.
    for method, source, field, truth_of in (("fqe", "fqe", "value", "true_discounted"),
                                            ("fqe_lcb", "fqe", "low", "true_discounted"),
                                            ("critic", "critic", "value", "true_discounted"),
                                            ("model", "model", "value", "true_return")):
        have = [i for i, r in enumerate(rows) if source in r]
        if len(have) < 3:
            continue
        estimates = np.array([rows[i][source][field] for i in have])
        truth = np.array([rows[i][truth_of] for i in have])
        score = np.array([rows[i]["true_return"] for i in have])
        # Also against the undiscounted return, what a user ranks policies by: γ 0.99 sees about 100 steps of an
        # episode of up to 1,000, so the discounted truth may rank policies differently.
        out["methods"][method] = {"policies": len(have), "truth": truth_of, **metrics(estimates, truth, rng),
                                  "vs_return": {k: v for k, v in metrics(estimates, score, rng).items()
                                                if k != "abs_error_over_range"}}
        print(json.dumps({"method": method, **out["methods"][method]}))
    (args.out / "metrics.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
