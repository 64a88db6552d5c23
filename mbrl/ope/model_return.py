"""A policy judged by its greedy return in a fitted world model, from the dataset's episode start states: the sweep's
`offline` objective, a run's evaluation without a simulator, `--select.by model` and `mbrl ope`'s model estimate.
One elite is fixed per imagined trajectory (as PETS samples its particles), so each elite gives a return."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from mbrl.core.types import OfflineDataset
from mbrl.imagination import ExploringPolicy
from mbrl.world_models.rollout import RecurrentStart, RolloutConfig, rollout


@functools.partial(jax.jit, static_argnames=("policy", "horizon", "cfg"))
def _population_returns(key, world_model, policy, actor_params, start_obs, members, start, horizon, cfg):
    def one(params):
        return rollout(key, world_model, policy, params, start_obs, horizon, cfg, start=start, members=members).stats.returns

    return jax.vmap(one)(actor_params)


def model_returns(trainer, state, world_model, dataset: OfflineDataset, *, starts: int, horizon: int,
                  seed: int = 0) -> np.ndarray:
    """(members of the population, elites): each member's mean greedy return in the model per elite, from
    the same `starts` episode start states (drawn with replacement when the dataset has fewer)."""
    agent = trainer.agent
    return greedy_model_returns(world_model, ExploringPolicy(agent, True), agent.actor_params(state.agent),
                                agent.initial_carry, trainer.act_dim, dataset, starts=starts, horizon=horizon, seed=seed)


def greedy_model_returns(world_model, policy, actor_params, initial_carry, act_dim: int, dataset: OfflineDataset, *,
                         starts: int, horizon: int, seed: int = 0) -> np.ndarray:
    """(policies, elites): the mean return per elite of each of the policies `actor_params` (stacked on a leading
    axis) under `policy`, a `mbrl.world_models.rollout` PolicyFn acting greedily, from `starts` episode start states."""
    rng = np.random.default_rng(seed)
    first = dataset.transitions.obs[dataset.episode_starts]
    picked = first[rng.choice(len(first), starts, replace=len(first) < starts)]
    elites = np.asarray(world_model.elites, np.int32)
    start_obs = jnp.asarray(np.tile(picked, (len(elites), 1)), jnp.float32)  # elite-major
    members = jnp.asarray(np.repeat(elites, starts), jnp.int32)
    batch = start_obs.shape[0]
    start = RecurrentStart.fresh(initial_carry(batch), batch, act_dim)
    cfg = RolloutConfig(member_mode="per_trajectory", deterministic=True, outputs="stats")
    returns = _population_returns(jax.random.PRNGKey(seed), world_model, policy, actor_params, start_obs, members,
                                  start, horizon, cfg)
    return np.asarray(returns, np.float64).reshape(-1, len(elites), starts).mean(axis=2)
