"""`mbrl ope POLICY --dataset SOURCE`: estimate a policy's value from the data alone (off-policy evaluation)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import tyro

from mbrl.core.errors import ConfigError
from mbrl.ope.fqe import FQEConfig

METHODS = ("fqe", "critic", "model")


@dataclasses.dataclass(frozen=True)
class OpeArgs:
    policy: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="POLICY")]
    """A run directory written by `mbrl train` or an export written by `mbrl export`."""
    dataset: str
    """The dataset SOURCE that judges the policy (`mbrl data list`)."""
    task: str | None = None
    """The dataset's task, where the dataset does not name it."""
    method: Literal["fqe", "critic", "model", "all"] = "all"
    """fqe: Fitted Q Evaluation; critic: the run's own critics at the initial states (SAC-N runs); model: the
    greedy return in the run's world model (the sweep's offline objective); all: each that applies."""
    holdout: float = 0.1
    """The fraction of episodes FQE holds out for its early stopping, where the dataset has no -val file."""
    seed_index: int = 0
    """Which of a run's training seeds to judge."""
    world_model: Path | None = None
    """For the model method: a fitted world model (default: the run's own)."""
    starts: int = 256
    """For the model method: imagined episodes per elite, from the dataset's initial states."""
    horizon: int | None = None
    """For the model method: steps per imagined episode (default: the dataset's longest episode)."""
    json: bool = False
    """Print the estimates as one JSON object."""
    fqe: FQEConfig = FQEConfig()


def ope(args: OpeArgs) -> int:
    from mbrl import datasets
    from mbrl.ope.policy import load_policy
    from mbrl.sweep.objective import split_holdout

    if not 0.0 < args.holdout < 1.0:
        raise ConfigError(f"--holdout: expected a fraction in (0, 1), found {args.holdout}")
    policy = load_policy(args.policy, args.seed_index)
    dataset = datasets.load(args.dataset, task=args.task)
    if (policy.obs_dim, policy.act_dim) != (dataset.info.obs_dim, dataset.info.act_dim):
        raise ConfigError(f"{args.policy}: the policy takes {policy.obs_dim} observations and gives {policy.act_dim} "
                          f"actions; {dataset.info.source} has {dataset.info.obs_dim} and {dataset.info.act_dim}")
    initial = dataset.transitions.obs[dataset.episode_starts]
    methods = METHODS if args.method == "all" else (args.method,)
    estimates = []
    for method in methods:
        estimate = {"fqe": _fqe, "critic": _critic, "model": _model}[method](args, policy, dataset, initial, split_holdout)
        if estimate is None and args.method != "all":
            raise ConfigError(f"--method {method}: {_UNAVAILABLE[method]}")
        if estimate is not None:
            estimates.append(estimate)
    report = {"policy": str(args.policy), "dataset": dataset.info.source or args.dataset,
              "initial_states": int(len(initial)), "estimates": estimates}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['policy']} on {report['dataset']} ({report['initial_states']} initial states):")
    for e in estimates:
        normalized = f", normalized {e['normalized']:.1f}" if e.get("normalized") is not None else ""
        print(f"  {e['method']:<7} {e['kind']} {e['value']:.4g} [{e['low']:.4g}, {e['high']:.4g}]{normalized}  ({e['detail']})")
    return 0


_UNAVAILABLE = {
    "critic": "the policy has no critics of its own here (a run of the SAC-N family: --algo mopo or ravl)",
    "model": "no world model: the policy is not a run with one; give --world-model DIR with a run directory",
}


def _fqe(args, policy, dataset, initial, split_holdout) -> dict:
    from mbrl.ope.fqe import fit_fqe

    train, held = split_holdout(dataset, args.holdout, seed=args.fqe.seed)
    if held is None or len(held) == 0:
        raise ConfigError(f"--holdout {args.holdout}: holds out no episode of {dataset.num_episodes}; FQE checks its fit "
                          "on held-out episodes (a larger fraction, or a dataset with more episodes or a -val file)")
    result = fit_fqe(policy.act, train.transitions, held, initial, args.fqe)
    low, high = result.interval
    return {"method": "fqe", "kind": "discounted value", "value": result.value, "low": low, "high": high,
            "gamma": args.fqe.gamma, "heads": [float(v) for v in result.head_values], "steps": result.steps,
            "stop_reason": result.stop_reason, "heldout_td": result.heldout_td[-1],
            "detail": f"γ {args.fqe.gamma}, {args.fqe.heads} heads, {result.steps:,} steps, {result.stop_reason}, "
                      f"held-out TD {result.heldout_td[-1]:.3g}"}


def _critic(args, policy, dataset, initial, split_holdout) -> dict | None:
    import jax
    import jax.numpy as jnp

    from agents.sac_n import SACNAgent

    run = policy.run
    if run is None or not isinstance(run.trainer.agent, SACNAgent):
        return None
    core = run.trainer.agent.core
    member = jax.tree.map(lambda x: x[policy.member], run.state.agent)
    obs = jnp.asarray(initial, jnp.float32)
    q = core.critic.apply(member.critic_params, obs, policy.act(obs))  # (critics, states)
    per_critic = np.asarray(jnp.mean(q, axis=1), np.float64)
    value = float(np.mean(np.min(np.asarray(q), axis=0)))
    return {"method": "critic", "kind": "discounted value", "value": value, "low": float(per_critic.min()),
            "high": float(per_critic.max()), "gamma": core.config.gamma,
            "detail": f"γ {core.config.gamma}, min over {len(per_critic)} critics; biased: trained on its own targets"}


def _model(args, policy, dataset, initial, split_holdout) -> dict | None:
    from envs.tasks import TASKS
    from mbrl.core.score import normalized_score
    from mbrl.sweep.objective import model_returns
    from mbrl.train import _reference_scores
    from world_models.model import ModelInfo
    from world_models.recurrent import load_model

    run = policy.run
    if run is None:
        return None
    paths = [Path(args.world_model)] if args.world_model is not None else [
        run.run_dir / p for p in (run.facts or {}).get("world_models", [])]
    if not paths:
        return None
    path = paths[policy.member] if len(paths) > 1 else paths[0]
    if not (path / "model.json").is_file():
        raise ConfigError(f"--world-model {path}: no model.json; expected a directory written by `mbrl model fit`")
    task = TASKS.get(dataset.info.task) if dataset.info.task else None
    model = load_model(path, **(task.model_fns() if task is not None else {})).replace(info=ModelInfo())
    if hasattr(model, "warm_up"):
        raise ConfigError(f"--world-model {path}: a recurrent world model (RWM-U); the model estimate imagines from "
                          "single states, give an MLP ensemble")
    horizon = args.horizon or int(dataset.episode_lengths().max())
    returns = model_returns(run.trainer, run.state, model, dataset, starts=args.starts, horizon=horizon)[policy.member]
    ref = _reference_scores(dataset, task)
    value = float(np.mean(returns))
    return {"method": "model", "kind": "return", "value": value, "low": float(np.min(returns)),
            "high": float(np.max(returns)), "horizon": horizon,
            "normalized": None if ref is None else float(normalized_score(value, *ref)),
            "detail": f"undiscounted over {horizon} steps, {len(returns)} elites x {args.starts} starts"}
