"""What a trial scores: in simulation, or offline with no environment at all.

- `sim`: the normalized score in MuJoCo, the mean over the last E evaluations of training (as D4RL papers
  report it; the raw return where the dataset has no reference scores).
- `offline`: the policy's return in the fitted world model, from the start states of the dataset's
  episodes, run greedily for an episode's length with one elite fixed per imagined trajectory (as PETS
  samples its particles). Each elite gives a return; the estimate is their mean and its uncertainty their
  spread, and the objective is the pessimistic mean - std, normalized like the sim score where the
  reference scores are known. A robot-only dataset (no simulator behind it) can use it.

- `fqe`: Fitted Q Evaluation (`mbrl.ope.fqe`) of each member's deterministic policy on the training data, checked
  on the held-out episodes: the low end of the interval of its discounted value at the dataset's initial states
  (pessimistic, as the offline objective: off the data the heads disagree). Also needs no simulator.

Beside the offline estimate come the critic's diagnostics of Kumar et al. 2021 ("A Workflow for Offline
Model-Free Robotic Reinforcement Learning"): the trend of the mean Q over the second half of training
(Q that keeps climbing signals overestimation) and the TD error on whole episodes held out from training.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from mbrl.core.types import OfflineDataset, Transitions

OBJECTIVES = ("sim", "offline", "fqe")


def split_holdout(dataset: OfflineDataset, fraction: float, seed: int = 0) -> tuple[OfflineDataset, Transitions | None]:
    """The dataset without a random `fraction` of its episodes, and those episodes' transitions; a dataset with
    held-out data of its own (a NeoRL-2 `-val` file) keeps every episode and is checked on that data instead."""
    if dataset.heldout is not None:
        return dataset, dataset.heldout.transitions
    count = int(round(fraction * dataset.num_episodes))
    if count == 0 or dataset.num_episodes < 2:
        return dataset, None
    count = min(count, dataset.num_episodes - 1)
    held = np.zeros(dataset.num_episodes, bool)
    held[np.random.default_rng(seed).choice(dataset.num_episodes, count, replace=False)] = True
    lengths = dataset.episode_lengths()
    row_held = np.repeat(held, lengths)
    kept_lengths = lengths[~held]
    starts = np.concatenate([[0], np.cumsum(kept_lengths)[:-1]]).astype(dataset.episode_starts.dtype)
    train = dataclasses.replace(dataset, transitions=dataset.transitions.slice(np.flatnonzero(~row_held)),
                                episode_starts=starts)
    return train, dataset.transitions.slice(np.flatnonzero(row_held))


def sim_scores(records: list[dict], last: int) -> list[float] | None:
    """Per member: the mean over the last `last` evaluations (normalized score, else the return)."""
    evals = [r["eval"] for r in records if r.get("eval")]
    if not evals:
        return None
    from mbrl.core.score import score_key

    key = score_key(*evals[-last:])
    values = np.asarray([e[key] for e in evals[-last:]], np.float64)
    return values.mean(axis=0).tolist()


def q_trends(records: list[dict], updates_per_unit: int = 1000) -> list[float] | None:
    """Per member: the least-squares slope of the epoch's mean Q per 1,000 updates over the second half
    of training (None when the algorithm has no critic)."""
    rows = [r for r in records if "q_mean" in r["train"]]
    if len(rows) < 2:
        return None
    rows = rows[len(rows) // 2:] if len(rows) >= 4 else rows
    x = np.asarray([r["updates"] for r in rows], np.float64) / updates_per_unit
    q = np.asarray([r["train"]["q_mean"] for r in rows], np.float64)  # (epochs, members)
    x = x - x.mean()
    return ((x[:, None] * (q - q.mean(axis=0))).sum(axis=0) / (x**2).sum()).tolist()


@functools.partial(jax.jit, static_argnames=("policy", "horizon", "cfg"))
def _population_returns(key, world_model, policy, actor_params, start_obs, members, start, horizon, cfg):
    from mbrl.world_models.rollout import rollout

    def one(params):
        return rollout(key, world_model, policy, params, start_obs, horizon, cfg, start=start, members=members).stats.returns

    return jax.vmap(one)(actor_params)


def model_returns(trainer, state, world_model, dataset: OfflineDataset, *, starts: int, horizon: int,
                  seed: int = 0) -> np.ndarray:
    """(members of the population, elites): each member's mean greedy return in the model per elite, from
    the same `starts` episode start states (drawn with replacement when the dataset has fewer)."""
    from mbrl.imagination import ExploringPolicy

    agent = trainer.agent
    return greedy_model_returns(world_model, ExploringPolicy(agent, True), agent.actor_params(state.agent),
                                agent.initial_carry, trainer.act_dim, dataset, starts=starts, horizon=horizon, seed=seed)


def greedy_model_returns(world_model, policy, actor_params, initial_carry, act_dim: int, dataset: OfflineDataset, *,
                         starts: int, horizon: int, seed: int = 0) -> np.ndarray:
    """(policies, elites): the mean return per elite of each of the policies `actor_params` (stacked on a leading
    axis) under `policy`, a `mbrl.world_models.rollout` PolicyFn acting greedily, from `starts` episode start states."""
    from mbrl.world_models.rollout import RecurrentStart, RolloutConfig

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


def heldout_td_errors(trainer, state, heldout: Transitions | None, rows: int = 4096, seed: int = 0) -> list[float] | None:
    """Per member: the critics' mean squared TD error on held-out real transitions (SAC-N critics only)."""
    from mbrl.agents.sac_n import SACNAgent

    if heldout is None or not isinstance(trainer.agent, SACNAgent):
        return None
    index = np.random.default_rng(seed).choice(len(heldout), min(rows, len(heldout)), replace=False)
    batch = jax.tree.map(jnp.asarray, heldout.slice(np.sort(index)))
    core = trainer.agent.core
    key = jax.random.PRNGKey(seed)

    def one(agent_state, hypers):
        _, metrics = core.critic_loss(agent_state.critic_params, agent_state, batch, key, hypers["sac"])
        return metrics["critic_loss"] / core.config.num_critics  # the TD part, without EDAC's diversity term

    return np.asarray(jax.jit(jax.vmap(one))(state.agent, state.hypers), np.float64).tolist()


def fqe_values(trainer, state, train: OfflineDataset, heldout: Transitions | None, config) -> list[tuple[float, float]]:
    """Per member of the population: FQE's discounted value (`mbrl.ope.fqe`, settings `config`) of its greedy policy
    and the low end of its interval, fitted on `train` and checked on `heldout`, at `train`'s initial states. A
    recurrent policy acts on each logged episode's history (`mbrl.ope.judged.JudgedPolicy`)."""
    from mbrl.core.errors import ConfigError
    from mbrl.ope.judged import agent_policy, fqe_of

    if heldout is None or len(heldout) == 0:
        raise ConfigError("--objective fqe: no held-out episodes to check FQE's fit on; give --holdout (or a -val file)")
    agent = trainer.agent
    initial = train.transitions.obs[train.episode_starts]
    members = jax.tree.leaves(state.agent)[0].shape[0]
    values = []
    for i in range(members):
        params = jax.tree.map(lambda x, i=i: x[i], agent.actor_params(state.agent))
        result = fqe_of(agent_policy(agent, params, f"member {i}"), train.transitions, heldout, initial, config)
        values.append((result.value, result.interval[0]))
    return values


def spearman(x, y) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None with fewer than 3 pairs or no spread."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.size < 3:
        return None

    def ranks(v):
        order = np.argsort(v, kind="stable")
        r = np.empty(v.size)
        r[order] = np.arange(v.size, dtype=np.float64)
        for value in np.unique(v):  # ties share their mean rank
            tie = v == value
            r[tie] = r[tie].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])
