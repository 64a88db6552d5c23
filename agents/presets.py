"""Presets as data: per-algorithm, per-dataset hyperparameters in a `paper` and a `quick` version.

A preset is a nested dict of overrides, keyed like the sections of `mbrl.config.TrainConfig`
(`sac`, `bc`, `mopo`, `imagination`, `schedule`, `ensemble`, `fit`). `mbrl.config` applies them in
order: the algorithm's base preset, then its per-dataset entry. No code path depends on a name here.

`paper`: the published settings. `quick`: sized so that `mbrl train` (dataset make, model fit,
training, evaluation) fits a budget of about 20 minutes on 2 CPU cores: fewer updates, smaller rollout
batches, a fit time budget. MOPO's and RAVL's quick presets also anchor the actor to the data
(`_ANCHOR_QUICK`, `_ANCHOR_QUICK_RAVL`; NEUBAY's in `mbrl.agents.neubay_presets`), because their critics are
far from converged after the 8k to 20k updates a CPU affords; `--sac.actor-bc-coef 0
--imagination.real-ratio 0.05` gives the pure algorithms at the quick budget. What the presets score
and how long they take: docs/results.md.
"""

from __future__ import annotations

import copy
from typing import Any

from mbrl.agents import neubay_presets

PRESETS: tuple[str, ...] = ("quick", "paper")

# MOPO's published per-dataset (rollout length h, penalty λ): tianheyu927/mopo,
# examples/config/d4rl/<task>_<level>.py (`rollout_length`, `penalty_coeff`); MOPO's "mixed" is D4RL's
# medium-replay.
MOPO_HORIZON_PENALTY: dict[str, tuple[int, float]] = {
    "hopper-medium": (5, 5.0),
    "hopper-medium-replay": (5, 1.0),
    "hopper-medium-expert": (5, 1.0),
    "walker2d-medium": (5, 5.0),
    "walker2d-medium-replay": (1, 1.0),
    "walker2d-medium-expert": (1, 2.0),
    "halfcheetah-medium": (1, 1.0),
    "halfcheetah-medium-replay": (5, 1.0),
    "halfcheetah-medium-expert": (5, 1.0),
}
# OfflineRL-Kit run_example/run_mopo.py defaults, for datasets MOPO did not publish.
MOPO_DEFAULT_HORIZON_PENALTY = (5, 0.5)

# The settings every model-based agent shares in the papers: 7 members / 5 elites (MOPO base.py
# `num_networks`, `num_elites`), 50,000 rollouts per 1,000 updates, 5 epochs of model data retained,
# 5% real data in each batch (MOPO base.py `rollout_batch_size`, `model_retain_epochs`, `real_ratio`;
# RAVL anyasims/edge-of-reach train_ravl_agent.py `rollouts_per_epoch`, `buffer_retain_epochs`,
# `dataset_ratio`).
_IMAGINATION_PAPER = {"rollouts_per_epoch": 50_000, "retain_epochs": 5, "real_ratio": 0.05, "horizon": 5}

# The quick versions: a model fit capped at a time budget, 5x fewer rollouts per epoch, evaluation on the
# real env every few epochs. RAVL quick also has 5x fewer updates per epoch (the paper's 50 rollouts per
# update); MOPO quick has 2x fewer (20 rollouts per update, 2,500 updates of model data retained).
_IMAGINATION_QUICK = {"rollouts_per_epoch": 10_000, "retain_epochs": 5, "real_ratio": 0.05, "horizon": 5}
_FIT_QUICK = {"max_seconds": 150.0, "max_epochs": 60}

# The quick presets' anchor: a TD3+BC-style BC term on the actor's deterministic action (a weight of
# the batch's mean |Q|; see `mbrl.agents.sac_n.SACNConfig.actor_bc_coef`) over the real half of each batch, as
# in Unifloral's model-based ReBRAC (Jackson et al. 2025, "A Clean Slate for Offline RL"). The weights
# were chosen on hopper-medium (the scores with and without the anchor: docs/results.md). RAVL's min over
# 10 EDAC critics already keeps it near the data, so it takes the lighter weight: at MOPO's weight it
# settled towards the data's level as training went on (docs/findings.md).
_ANCHOR_QUICK = {"actor_bc_coef": 2.5}
_ANCHOR_QUICK_RAVL = {"actor_bc_coef": 1.0}
_ANCHOR_REAL_RATIO = 0.5

# RAVL's agent (anyasims/edge-of-reach train_ravl_agent.py TrainConfig, see BASE) and MOPO's SAC
# (OfflineRL-Kit run_example/run_mopo.py): the same in the paper and quick presets.
_RAVL_SAC = {"num_critics": 10, "hidden_sizes": (256, 256, 256), "eta": 1.0, "actor_lr": 3e-4, "critic_lr": 3e-4,
             "alpha_lr": 3e-4, "batch_size": 256, "gamma": 0.99, "tau": 5e-3}
_MOPO_SAC = {"num_critics": 2, "hidden_sizes": (256, 256), "eta": 0.0, "actor_lr": 1e-4, "critic_lr": 3e-4,
             "alpha_lr": 1e-4, "batch_size": 256, "gamma": 0.99, "tau": 5e-3}

# RAVL paper: edge-of-reach's own SAC mechanics (agent_training/agent.py): temperature, actor, then critic
# in each update (Agent.update); EDAC's initialisation (Actor, VectorizedCritic); log(1 - tanh^2 + 1e-6)
# (Actor.forward). On one world model the init is what brings the policy's entropy to the reference's; with
# Flax's init it fell about 2,000 updates ahead, and the order or the epsilon alone changed nothing measurable
# (docs/peer_check.md). The quick preset keeps the defaults its scores were measured with.
_RAVL_REFERENCE = {"update_order": "alpha_actor_critic", "init": "edac", "logp_epsilon": 1e-6}

BASE: dict[tuple[str, str], dict[str, Any]] = {
    # RAVL (Sims et al. 2024) defaults: anyasims/edge-of-reach train_ravl_agent.py TrainConfig:
    # num_critics 10, 3 hidden layers of 256 (VectorizedCritic), eta 1.0, lr 3e-4 (actor, critic, alpha),
    # batch 256, gamma 0.99, tau 5e-3, auto alpha, steps_k 5, 3,000 epochs of 1,000 updates. That repo
    # has no per-dataset configs: its README and CLI defaults use these values for every dataset.
    ("ravl", "paper"): {
        "sac": dict(_RAVL_SAC, **_RAVL_REFERENCE),
        "imagination": dict(_IMAGINATION_PAPER),
        "schedule": {"epochs": 3000, "updates_per_epoch": 1000, "eval_every": 10, "eval_episodes": 10},
    },
    ("ravl", "quick"): {
        "sac": dict(_RAVL_SAC, **_ANCHOR_QUICK_RAVL),
        "imagination": dict(_IMAGINATION_QUICK, real_ratio=_ANCHOR_REAL_RATIO),
        "schedule": {"epochs": 40, "updates_per_epoch": 200, "eval_every": 10, "eval_episodes": 5},
        "fit": dict(_FIT_QUICK),
    },
    # MOPO (Yu et al. 2020) on OfflineRL-Kit's SAC settings (run_example/run_mopo.py): 2 critics of
    # 2x256, actor lr 1e-4, critic lr 3e-4, alpha lr 1e-4, batch 256, gamma 0.99, tau 5e-3, 3,000 epochs
    # of 1,000 updates; the penalty is MOPO's max-over-members ||sigma|| (`aleatoric_max`).
    ("mopo", "paper"): {
        "sac": dict(_MOPO_SAC),
        "mopo": {"uncertainty": "aleatoric_max"},
        "imagination": dict(_IMAGINATION_PAPER),
        "schedule": {"epochs": 3000, "updates_per_epoch": 1000, "eval_every": 10, "eval_episodes": 10},
    },
    ("mopo", "quick"): {
        "sac": dict(_MOPO_SAC, **_ANCHOR_QUICK),
        "mopo": {"uncertainty": "aleatoric_max"},
        "imagination": dict(_IMAGINATION_QUICK, real_ratio=_ANCHOR_REAL_RATIO),
        "schedule": {"epochs": 40, "updates_per_epoch": 500, "eval_every": 10, "eval_episodes": 5},
        "fit": dict(_FIT_QUICK),
    },
    # BC: OfflineRL-Kit run_example/run_bc.py: a deterministic 2x256 actor, lr 3e-4, batch 256,
    # 200 epochs of 1,000 steps, on the real data only.
    ("bc", "paper"): {
        "bc": {"hidden_sizes": (256, 256), "learning_rate": 3e-4, "batch_size": 256},
        "schedule": {"epochs": 200, "updates_per_epoch": 1000, "eval_every": 10, "eval_episodes": 10},
    },
    ("bc", "quick"): {
        "bc": {"hidden_sizes": (256, 256), "learning_rate": 3e-4, "batch_size": 256},
        "schedule": {"epochs": 20, "updates_per_epoch": 1000, "eval_every": 5, "eval_episodes": 5},
    },
    # MOPO-PPO (Li et al. 2025, RWM-U): 4,096 imagined environments x 100 steps per iteration, lambda 1.0, PPO
    # with rsl_rl's defaults (`mbrl.agents.ppo.PPOConfig`), RWM-U with the paper's sizes (`mbrl.world_models.recurrent`);
    # an iteration is one epoch of ppo.learning_epochs x ppo.minibatches = 20 updates (`schedule.updates_per_epoch`
    # follows from the ppo section). 1,500 iterations are
    # rsl_rl's example `max_iterations` (leggedrobotics/rsl_rl_rwm config/example_config.yaml).
    ("mopo-ppo", "paper"): {
        "imagination": {"horizon": 100, "rollouts_per_epoch": 4096},
        "mopo_ppo": {"penalty_coef": 1.0},
        "schedule": {"epochs": 1500, "eval_every": 50, "eval_episodes": 10},
    },
    # Quick: 5x fewer imagined environments, a smaller policy and model, a fit time budget.
    ("mopo-ppo", "quick"): {
        "imagination": {"horizon": 100, "rollouts_per_epoch": 512},
        "mopo_ppo": {"penalty_coef": 1.0},
        "ppo": {"hidden_sizes": (128, 128)},
        "rwm": {"gru_hidden": 128, "history": 16},
        "rwm_fit": {"batch_size": 256, "max_seconds": 240.0, "max_epochs": 60},
        "schedule": {"epochs": 200, "eval_every": 25, "eval_episodes": 5},
    },
}


BASE.update(neubay_presets.BASE)  # NEUBAY's presets live in agents/neubay_presets.py


def mopo_per_dataset(dataset: str | None) -> dict[str, Any]:
    """MOPO's published (horizon, penalty) for `dataset`, else OfflineRL-Kit's defaults."""
    horizon, penalty = MOPO_HORIZON_PENALTY.get(dataset or "", MOPO_DEFAULT_HORIZON_PENALTY)
    return {"imagination": {"horizon": horizon}, "mopo": {"penalty_coef": penalty}}


# The algorithms with per-dataset settings, and the rule that gives them (data: no code path reads a name).
PER_DATASET: dict[str, Any] = {"mopo": mopo_per_dataset, "neubay": neubay_presets.per_dataset}


def per_dataset(algo: str, dataset: str | None) -> dict[str, Any]:
    """The per-dataset overrides of `algo` for a dataset name such as `hopper-medium` (may be empty)."""
    rule = PER_DATASET.get(algo)
    return {} if rule is None else rule(dataset)


def preset(algo: str, name: str, dataset: str | None = None) -> dict[str, Any]:
    """The nested overrides of preset `name` for `algo` on `dataset` (a fresh copy)."""
    out = copy.deepcopy(BASE[(algo, name)])
    for section, values in per_dataset(algo, dataset).items():
        out.setdefault(section, {}).update(values)
    return out
