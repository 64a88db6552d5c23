"""What a trial scores: in simulation, or offline with no environment at all.

- `sim`: the normalized score in MuJoCo, the mean over the last E evaluations of training (as D4RL papers
  report it; the raw return where the dataset has no reference scores).
- `offline`: the policy's return in the fitted world model (`mbrl.ope.model_return`), from the start states of
  the dataset's episodes, run greedily for an episode's length with one elite fixed per imagined trajectory (as
  PETS samples its particles). Each elite gives a return; the estimate is their mean and its uncertainty their
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

import jax
import jax.numpy as jnp
import numpy as np

from mbrl.agents.base import capability
from mbrl.core.score import score_key
from mbrl.core.types import Transitions
# The offline and fqe objectives judge a policy from the data alone (`mbrl.ope`); the engine reads them here.

OBJECTIVES = ("sim", "offline", "fqe")


def sim_scores(records: list[dict], last: int) -> list[float] | None:
    """Per member: the mean over the last `last` evaluations (normalized score, else the return)."""
    evals = [r["eval"] for r in records if r.get("eval")]
    if not evals:
        return None
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


def heldout_td_errors(trainer, state, heldout: Transitions | None, rows: int = 4096, seed: int = 0) -> list[float] | None:
    """Per member: the critics' mean squared TD error on held-out real transitions (None for an algorithm without
    `CriticJudge.heldout_td_error`)."""
    td_error = capability(trainer.agent, "heldout_td_error")
    if heldout is None or td_error is None:
        return None
    index = np.random.default_rng(seed).choice(len(heldout), min(rows, len(heldout)), replace=False)
    batch = jax.tree.map(jnp.asarray, heldout.slice(np.sort(index)))
    key = jax.random.PRNGKey(seed)

    def one(agent_state, hypers):
        return td_error(agent_state, batch, key, hypers)

    return np.asarray(jax.jit(jax.vmap(one))(state.agent, state.hypers), np.float64).tolist()


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
