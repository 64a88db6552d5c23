"""The estimators of `mbrl ope`, each a dict of its value, interval and details (None where it does not apply):
FQE, the run's own critics, and the greedy return in its world model (the sweep's offline objective)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mbrl.agents.base import capability
from mbrl.core.errors import ConfigError
from mbrl.ope.fqe import FQEConfig
from mbrl.ope.holdout import split_holdout
from mbrl.ope.model_return import greedy_model_returns, model_returns

UNAVAILABLE = {
    "critic": "the policy has no critics of its own here (a run of an algorithm with critics: --algo mopo or ravl)",
    "model": "no MLP world model: the policy is not a run with one (or its own is RWM-U); give --world-model DIR",
}


def fqe_estimate(policy, dataset, initial: np.ndarray, holdout: float, config: FQEConfig) -> dict:
    """FQE's value of `policy`, fitted on `dataset` less a `holdout` fraction of its episodes (or beside its -val
    file), at the `initial` states."""
    from mbrl.ope.judged import fqe_of

    train, held = split_holdout(dataset, holdout, seed=config.seed)
    if held is None or len(held) == 0:
        raise ConfigError(f"--holdout {holdout}: holds out no episode of {dataset.num_episodes}; FQE checks its fit "
                          "on held-out episodes (a larger fraction, or a dataset with more episodes or a -val file)")
    result = fqe_of(policy, train.transitions, held, initial, config)
    low, high = result.interval
    return {"method": "fqe", "kind": "discounted value", "value": result.value, "low": low, "high": high,
            "gamma": config.gamma, "heads": [float(v) for v in result.head_values], "steps": result.steps,
            "stop_reason": result.stop_reason, "heldout_td": result.heldout_td[-1],
            "detail": f"γ {config.gamma}, {config.heads} heads, {result.steps:,} steps, {result.stop_reason}, "
                      f"held-out TD {result.heldout_td[-1]:.3g}"}


def critic_estimate(policy, initial: np.ndarray) -> dict | None:
    """The run's own critics at the `initial` states (an algorithm with `CriticJudge`'s methods; None otherwise)."""
    run = policy.run
    agent = None if run is None else run.trainer.agent
    if agent is None or capability(agent, "critic_values") is None:
        return None
    member = jax.tree.map(lambda x: x[policy.member], run.state.agent)
    obs = jnp.asarray(initial, jnp.float32)
    q = agent.critic_values(member, obs, policy.act(obs))  # (critics, states)
    per_critic = np.asarray(jnp.mean(q, axis=1), np.float64)
    value = float(np.mean(np.min(np.asarray(q), axis=0)))
    gamma = agent.critic_gamma()
    return {"method": "critic", "kind": "discounted value", "value": value, "low": float(per_critic.min()),
            "high": float(per_critic.max()), "gamma": gamma,
            "detail": f"γ {gamma}, min over {len(per_critic)} critics; biased: trained on its own targets"}


@dataclasses.dataclass(frozen=True)
class _MarkovPolicy:
    """A deterministic Markov policy `act(obs batch) -> actions` as a `mbrl.world_models.rollout` PolicyFn."""

    act: Callable

    def __call__(self, actor_params, carry, inputs, key):
        return self.act(inputs.obs), carry


def model_estimate(policy, dataset, world_model: Path | None, starts: int, horizon: int | None) -> dict | None:
    """The greedy return of `policy` in a world model: `world_model`, else its run's own (None without either).
    A run's agent acts as in training; any other Markov policy (an export) acts through its deployed function."""
    from mbrl.envs.tasks import find_task
    from mbrl.core.score import normalized_score
    from mbrl.train import dataset_reference_scores
    from mbrl.world_models import registry as model_registry
    from mbrl.world_models.base import ModelInfo

    run = policy.run
    if run is None and (world_model is None or policy.recurrent):
        return None
    paths = [Path(world_model)] if world_model is not None else [
        run.run_dir / p for p in (run.facts or {}).get("world_models", [])]
    if not paths:
        return None
    path = paths[policy.member] if len(paths) > 1 else paths[0]
    if not (path / "model.json").is_file():
        raise ConfigError(f"--world-model {path}: no model.json; expected a directory written by `mbrl model fit`")
    task = find_task(dataset.info.task)
    kind = model_registry.saved_kind(path)
    model = kind.load(path, **(task.model_fns() if task is not None else {})).replace(info=ModelInfo())
    if kind.is_recurrent and world_model is None:  # the run's own RWM-U (MOPO-PPO): this estimate does not apply
        return None
    if kind.is_recurrent:
        raise ConfigError(f"--world-model {path}: a recurrent world model (RWM-U); the model estimate imagines from "
                          "single states, give an MLP ensemble")
    horizon = horizon or int(dataset.episode_lengths().max())
    if run is not None:
        returns = model_returns(run.trainer, run.state, model, dataset, starts=starts, horizon=horizon)[policy.member]
    else:
        returns = greedy_model_returns(model, _MarkovPolicy(policy.act), np.zeros(1, np.float32), lambda batch: (),
                                       policy.act_dim, dataset, starts=starts, horizon=horizon)[0]
    ref = dataset_reference_scores(dataset, task)
    value = float(np.mean(returns))
    return {"method": "model", "kind": "return", "value": value, "low": float(np.min(returns)),
            "high": float(np.max(returns)), "horizon": horizon,
            "normalized": None if ref is None else float(normalized_score(value, *ref)),
            "detail": f"undiscounted over {horizon} steps, {len(returns)} elites x {starts} starts"}
