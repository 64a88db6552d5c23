"""The one normalized score (D4RL's convention) and the one lookup of the reference scores behind it."""

from __future__ import annotations

import numpy as np

from mbrl.core.errors import ConfigError


def normalized_score(episode_return, ref_min_score: float, ref_max_score: float):
    """100 * (return - ref_min) / (ref_max - ref_min): 0 is the random policy's return, 100 the expert's."""
    return 100.0 * (np.asarray(episode_return, np.float64) - ref_min_score) / (ref_max_score - ref_min_score)


SCORE_KEY, RETURN_KEY = "normalized_score", "return_mean"


def evaluation_record(returns, ref_scores=None, lengths=None, estimate: str | None = None) -> dict:
    """The one evaluation record of `metrics.jsonl` (training, fine-tuning, an estimate without a simulator): per
    member (a row of `returns`, (members, episodes)) its mean return and their spread, its normalized score where
    reference scores exist, and its mean episode length where `lengths` are given; `estimate` names the estimator
    where the returns are not the robot's or simulator's ("model")."""
    returns = np.asarray(returns, np.float64)
    means = returns.mean(axis=1)
    out = {"estimate": estimate} if estimate else {}
    out.update(return_mean=means.tolist(), return_std=returns.std(axis=1).tolist(),
               normalized_score=None if ref_scores is None else [float(normalized_score(r, *ref_scores)) for r in means])
    if lengths is not None:
        out["length_mean"] = np.asarray(lengths).mean(axis=1).tolist()
    return out


def score_key(*evaluations: dict) -> str:
    """The key an evaluation record is scored by: its normalized score where every one of `evaluations` has one
    (the task has reference scores), else its mean return. The one fallback every report and objective uses."""
    return SCORE_KEY if evaluations and all(e.get(SCORE_KEY) is not None for e in evaluations) else RETURN_KEY


def scores_of(evaluation: dict) -> list[float]:
    """Per member: an evaluation record's normalized scores, else its mean returns (`score_key`)."""
    return list(evaluation[score_key(evaluation)])


def score_label(key: str) -> str:
    return "normalized score" if key == SCORE_KEY else "return"


def reference_scores(ref_min_score: float | None, ref_max_score: float | None, task=None) -> tuple[float, float] | None:
    """The (min, max) pair a score is normalized by: the given one (a dataset's own, or the caller's),
    else the task's references (`task` is a TaskSpec or any object with `ref_min_score` / `ref_max_score`),
    else None."""
    if (ref_min_score is None) != (ref_max_score is None):
        raise ConfigError(
            f"reference scores: pass both ref_min_score and ref_max_score or neither, found {ref_min_score!r} / {ref_max_score!r}"
        )
    if ref_min_score is not None:
        if not ref_max_score > ref_min_score:
            raise ConfigError(
                f"reference scores: ref_max_score must exceed ref_min_score, found {ref_min_score!r} / {ref_max_score!r}"
            )
        return float(ref_min_score), float(ref_max_score)
    if task is not None and task.ref_min_score is not None and task.ref_max_score is not None:
        return float(task.ref_min_score), float(task.ref_max_score)
    return None
