"""NEUBAY presets as data, declared by `mbrl.agents.neubay` (nested overrides per section, as every preset).

`paper`: twni2016/neubay configs/d4rl_loco/base.yaml with the per-dataset values of
configs/d4rl_loco/task/<task>_<level>.yaml. The world model (`ensemble` there): 128 members trained, the
100 with the lowest holdout error used (`collect.ensemble_size`), 4 hidden layers of 200 with LayerNorm
(`has_ln`, which also fixes the soft log-σ range to [-5, 0.25]), holdout min(20%, 1000), patience 5 at
1% improvement, batch 256, lr 1e-3 (offline_world/cont_ensemble.py); one ensemble per seed
(`model_seed = seed`). Agent: 2M updates (`train.grad_steps`), evaluated 100 times (`eval.times`) on 20
real episodes (`eval.real_episodes`).

`quick`: sized for 2 CPU cores. A 20-member ensemble using its 16 best, fitted under a time budget and
shared by the seeds; a narrower memory (128/64); batches of 4 windows of 64 steps after 64 steps of
history (256 transitions, RAVL's batch; with |λ| ≤ 0.9, 64 steps rebuild the LRU state to < 1e-3);
50 trajectories per collect; UTD 0.01 instead of 0.05 so that the 8,000 updates (RAVL's quick budget)
see tens of collects rather than a handful; a tape of 2,000 trajectories (everything collected is kept,
as with the paper's 40M); the threshold quantile over 100,000 dataset rows; and, not in NEUBAY, the
actor anchored to the data's actions on the real prefixes (`neubay.actor_bc_coef` 2.5, TD3+BC's ratio,
as the quick presets of MOPO and RAVL): at the quick budget the unanchored policy falls within tens of
steps, imagined or real, and the anchor keeps it up (the scores with and without it: docs/results.md;
its imagined lengths: docs/findings.md). Per-dataset values as in `paper`; `--neubay.actor-bc-coef 0`
gives the pure agent, DMSD's preset (there the anchor held the agent at the data's level: docs/neorl2.md).
"""

from __future__ import annotations

from typing import Any

from mbrl.agents.presets import DETERMINISTIC_IMAGINATION, LOW_TARGET_ALPHA_LR, TARGET_ENTROPY

# configs/d4rl_loco/task/*.yaml: (encoder lr for actor and critic, real_weight, fixed alpha).
# `model.target_alpha_ratio: null` (alpha fixed at 0.2) on the hopper datasets.
PER_DATASET: dict[str, tuple[float, float, bool]] = {
    "hopper-medium": (1e-6, 0.8, True),
    "hopper-medium-replay": (3e-7, 0.5, True),
    "hopper-medium-expert": (3e-6, 0.5, True),
    "hopper-random": (1e-5, 0.5, True),
    "walker2d-medium": (3e-6, 0.5, False),
    "walker2d-medium-replay": (1e-6, 0.5, False),
    "walker2d-medium-expert": (1e-6, 0.8, False),
    "walker2d-random": (3e-5, 0.5, False),
    "halfcheetah-medium": (3e-5, 0.8, False),
    "halfcheetah-medium-replay": (1e-5, 0.05, False),
    "halfcheetah-medium-expert": (3e-5, 0.8, False),
    "halfcheetah-random": (3e-5, 0.8, False),
}

# NeoRL-2's tasks (keyed by task: one dataset each): NEUBAY imagines up to the task's episode limit (NeoRL2
# README); DMSD's episodes of 100 steps hold windows of 32 steps of history and 64 trained steps.
PER_TASK: dict[str, dict[str, Any]] = {
    "dmsd": {"max_episode_steps": 100, "warmup_length": 32, "sequence_length": 64},
    "pipeline": {"max_episode_steps": 1000},
    "rocketrecovery": {"max_episode_steps": 500},
    "randomfrictionhopper": {"max_episode_steps": 1000},
    "safetyhalfcheetah": {"max_episode_steps": 1000},
    "simglucose": {"max_episode_steps": 480},
}

_ENSEMBLE_PAPER = {"num_members": 128, "num_elites": 100, "layer_norm": True, "hidden_dims": (200, 200, 200, 200)}
_ENSEMBLE_QUICK = {"num_members": 20, "num_elites": 16, "layer_norm": True, "hidden_dims": (200, 200, 200, 200)}

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {
        "neubay": {"parallel_scan": True},  # otherwise NeubayConfig's defaults are the paper's
        "ensemble": dict(_ENSEMBLE_PAPER),
        "fit": {"holdout_ratio": 0.2, "max_holdout": 1000, "patience": 5, "min_improvement": 0.01,
                "batch_size": 256, "learning_rate": 1e-3},
        "imagination": {"per_seed_model": True},
        "schedule": {"epochs": 2000, "updates_per_epoch": 1000, "eval_every": 20, "eval_episodes": 20},
    },
    "quick": {
        "neubay": {
            "d_model": 128,
            "d_hidden": 64,
            "num_sequences": 4,
            "sequence_length": 64,
            "warmup_length": 64,
            "parallel_size": 50,
            "utd": 0.01,
            "tape_capacity": 2000,
            "threshold_rows": 100_000,
            "actor_bc_coef": 2.5,
        },
        "ensemble": dict(_ENSEMBLE_QUICK),
        "fit": {"max_seconds": 300.0, "max_epochs": 60},
        "schedule": {"epochs": 40, "updates_per_epoch": 200, "eval_every": 10, "eval_episodes": 5},  # RAVL quick's budget
    },
}


# Where a measurement on the task found the anchored quick preset held at the data's level and the pure agent above
# it (both with the members' mean steps, the same seed and budget): the pure one; the value says where.
WITHOUT_ANCHOR = {"dmsd": "docs/neorl2.md, RAVL and NEUBAY on DMSD"}


def per_dataset(dataset: str | None) -> dict[str, Any]:
    """The per-dataset overrides for a dataset name such as `hopper-medium` (empty when unknown): the paper's values,
    imagined steps at the members' mean where the task has no process noise (`DETERMINISTIC_IMAGINATION`), no anchor
    where `WITHOUT_ANCHOR` says so, the SAC-based agents' target entropy where `TARGET_ENTROPY` lowers it (with a
    temperature fast enough to reach it)."""
    if dataset in PER_TASK:
        values = dict(PER_TASK[dataset])
        if dataset in DETERMINISTIC_IMAGINATION:
            values["model_noise"] = False
        if dataset in WITHOUT_ANCHOR:
            values["actor_bc_coef"] = 0.0
        if dataset in TARGET_ENTROPY:
            values["target_entropy"] = TARGET_ENTROPY[dataset]
            values["alpha_lr"] = LOW_TARGET_ALPHA_LR
        return {"neubay": values}
    if dataset not in PER_DATASET:
        return {}
    encoder_lr, real_weight, fixed_alpha = PER_DATASET[dataset]
    values: dict[str, Any] = {"critic_encoder_lr": encoder_lr, "actor_encoder_lr": encoder_lr, "real_weight": real_weight}
    if fixed_alpha:
        values["target_entropy_ratio"] = None
    return {"neubay": values}
