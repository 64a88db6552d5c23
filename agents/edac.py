"""EDAC (An et al. 2021, "Uncertainty-Based Offline Reinforcement Learning with Diversified Q-Ensemble").

SAC-N on the dataset's transitions only: N critics whose min is the TD target and the actor's objective, kept
diverse by the ensemble-diversity term of weight η (the action-gradients of the critics, pairwise cosines off
the diagonal). No world model and nothing imagined. The agent is the SAC-N core (`mbrl.agents.sac_n`) as
RAVL's, so it reads the shared `sac` section; η = 0 gives SAC-N.

Presets: `PRESETS` and `per_dataset` below, each value with its source.
"""

from __future__ import annotations

from typing import Any

from mbrl.agents.base import AlgorithmEntry
from mbrl.agents.presets import with_sac_per_dataset
from mbrl.agents.sac_n import SACNAgent, SACNConfig


class EDAC(SACNAgent):
    """SAC-N with EDAC's diversity term, on real batches only (the BC term, if set, imitates every row)."""

    imagination = "none"


# The official code, snu-mllab/EDAC run_scripts/sac.py and lifelong_rl/trainers/q_learning/sac.py: actor and
# critics of 3 layers of 256, lr 3e-4 for actor, critics and temperature (the temperature takes `policy_lr`),
# log α = 0 at start, batch 256, γ 0.99, τ 5e-3, 3,000 epochs of 1,000 updates; N 10 and η are set per dataset.
SAC_PAPER = {"hidden_sizes": (256, 256, 256), "actor_lr": 3e-4, "critic_lr": 3e-4, "alpha_lr": 3e-4, "init_alpha": 1.0,
             "batch_size": 256, "gamma": 0.99, "tau": 5e-3, "num_critics": 10, "eta": 1.0}
# Its mechanics: hidden biases 0.1 and the critics' last layer U(±3e-3) (lifelong_rl/models/networks.py
# ParallelizedEnsembleFlattenMLP; the critics' first kernel here is bounded as edge-of-reach's, by its output width,
# where that code uses the input width), log(1 - tanh² + 1e-6) (lifelong_rl/torch/distributions.py TanhNormal). It takes
# all three losses at the same parameters; the nearest order here is CORL's edac.py (the temperature, the actor,
# then the critics), which RAVL's paper preset runs too.
REFERENCE = {"update_order": "alpha_actor_critic", "init": "edac", "logp_epsilon": 1e-6}

PRESETS = {
    "paper": {
        "sac": dict(SAC_PAPER, **REFERENCE),
        # CORL algorithms/offline/edac.py TrainConfig: evaluated every 5 epochs on 10 episodes.
        "schedule": {"epochs": 3000, "updates_per_epoch": 1000, "eval_every": 5, "eval_episodes": 10},
    },
    # Quick, sized for 2 CPU cores: 20 epochs of 1,000 updates (20k of the paper's 3M), actor and critics of 2x64
    # instead of 3x256 (the diversity term differentiates every critic twice, and hopper's N is 50); N and η per
    # dataset as in the paper, the networks' init and update order left at the defaults.
    "quick": {
        "sac": dict(SAC_PAPER, hidden_sizes=(64, 64)),
        "schedule": {"epochs": 20, "updates_per_epoch": 1000, "eval_every": 5, "eval_episodes": 5},
    },
}

# D4RL (N, η): the EDAC paper's settings as yihaosun1124/OfflineRL-Kit run_example/run_edac.py ("suggested
# hypers") and tinkoff-ai/CORL configs/offline/edac/<task>/<level>_v2.yaml give them.
D4RL: dict[str, tuple[int, float]] = {
    "halfcheetah-medium": (10, 1.0),
    "halfcheetah-medium-replay": (10, 1.0),
    "halfcheetah-medium-expert": (10, 5.0),
    "hopper-medium": (50, 1.0),
    "hopper-medium-replay": (50, 1.0),
    "hopper-medium-expert": (50, 1.0),
    "walker2d-medium": (10, 1.0),
    "walker2d-medium-replay": (10, 1.0),
    "walker2d-medium-expert": (10, 5.0),
}

# NeoRL-2 (keyed by task): the best (N, η) of the benchmark's grid N ∈ {10, 50} × η ∈ {1, 5}, by the mean over
# its 3 seeds of Reward_Mean_Env in polixir/NeoRL2 benchmark/results/<Task>-edac/log.csv. Those runs (same
# file, hparams/*) used actor and temperature lr 1e-4, critic lr 3e-4: polixir/OfflineRL's EDAC defaults.
NEORL2: dict[str, tuple[int, float]] = {
    "dmsd": (10, 1.0),
    "pipeline": (10, 5.0),
    "randomfrictionhopper": (10, 1.0),
    "rocketrecovery": (50, 1.0),
    "safetyhalfcheetah": (50, 1.0),
    "simglucose": (10, 1.0),
}
NEORL2_LR = {"actor_lr": 1e-4, "alpha_lr": 1e-4, "critic_lr": 3e-4}


def per_dataset(dataset: str | None) -> dict[str, Any]:
    """N critics and η for `dataset` (a D4RL name such as `hopper-medium`, or a NeoRL-2 task such as `dmsd`);
    empty when unknown (the preset's N 10, η 1: the official code's default N and the common η)."""
    if dataset in NEORL2:
        num_critics, eta = NEORL2[dataset]
        return with_sac_per_dataset({"sac": {"num_critics": num_critics, "eta": eta, **NEORL2_LR}}, dataset)
    if dataset in D4RL:
        num_critics, eta = D4RL[dataset]
        return {"sac": {"num_critics": num_critics, "eta": eta}}
    return {}


def make(config, obs_dim, act_dim, obs_scale):
    return EDAC(config.sac, obs_dim, act_dim, None, obs_scale)  # bc_rows None: every row of a batch is real


# EDAC's search space (`mbrl sweep --algo edac --space edac`): NeoRL-2's grid (polixir/NeoRL2
# benchmark/results/<Task>-edac/log.csv: N {10, 50} x eta {1, 5}).
SPACE = {"sac.num_critics": {"choices": [10, 50]}, "sac.eta": {"choices": [1.0, 5.0]}}

ALGORITHM = AlgorithmEntry(
    name="edac", sections={"sac": SACNConfig}, make=make, presets=PRESETS, per_dataset=per_dataset,
    smoke={"sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": 16}},
    space=SPACE,
)
