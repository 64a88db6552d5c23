"""RAVL (Sims et al. 2024, "The Edge-of-Reach Problem in Offline Model-Based Reinforcement Learning").

Reach-Aware Value Learning: an EDAC critic ensemble (An et al. 2021) trained on short model rollouts
mixed with real data. The min over N=10 critics, kept diverse by the EDAC gradient term (η=1), is low
exactly at the edge-of-reach states that rollouts reach but never leave, so no reward penalty from the
world model is needed (λ=0). The agent is the SAC-N core (`mbrl.agents.sac_n`); this module only fixes
its defaults and passes model rewards through unchanged.

Defaults and presets: anyasims/edge-of-reach train_ravl_agent.py (`PRESETS` below).
"""

from __future__ import annotations

from mbrl.agents.base import IMAGINATION_FIELDS, AlgorithmEntry, merge_sections
from mbrl.agents.presets import (ANCHOR_REAL_RATIO, FIT_QUICK, IMAGINATION_PAPER, IMAGINATION_QUICK, LOW_TARGET_ALPHA_LR,
                                 TARGET_ENTROPY, imagination_per_dataset, with_sac_per_dataset, without_anchor)
from mbrl.agents.sac_n import SACNAgent, SACNConfig, real_rows, sac_rules


class RAVL(SACNAgent):
    """EDAC-style SAC-N on unpenalised model rollouts plus real data (the base's pass-through reward)."""


# RAVL (Sims et al. 2024) defaults: anyasims/edge-of-reach train_ravl_agent.py TrainConfig: num_critics 10, 3
# hidden layers of 256 (VectorizedCritic), eta 1.0, lr 3e-4 (actor, critic, alpha), batch 256, gamma 0.99, tau
# 5e-3, auto alpha, steps_k 5, 3,000 epochs of 1,000 updates. That repo has no per-dataset configs: its README
# and CLI defaults use these values for every dataset. The same agent in the paper and quick presets.
SAC = {"num_critics": 10, "hidden_sizes": (256, 256, 256), "eta": 1.0, "actor_lr": 3e-4, "critic_lr": 3e-4,
       "alpha_lr": 3e-4, "batch_size": 256, "gamma": 0.99, "tau": 5e-3}

# Paper: edge-of-reach's own SAC mechanics (agent_training/agent.py): temperature, actor, then critic in each
# update (Agent.update); EDAC's initialisation (Actor, VectorizedCritic); log(1 - tanh^2 + 1e-6) (Actor.forward).
# On one world model the init is what brings the policy's entropy to the reference's; with Flax's init it fell
# about 2,000 updates ahead, and the order or the epsilon alone changed nothing measurable (docs/peer_check.md).
# The quick preset keeps the defaults its scores were measured with.
REFERENCE = {"update_order": "alpha_actor_critic", "init": "edac", "logp_epsilon": 1e-6}

# Quick: 5x fewer updates per epoch (the paper's 50 rollouts per update) and the anchor of
# `mbrl.agents.presets`, lighter than MOPO's: the min over 10 EDAC critics already keeps the policy near the data,
# and at MOPO's weight it settled towards the data's level as training went on (docs/findings.md). The weight was
# chosen on hopper-medium (the scores with and without it: docs/results.md).
ANCHOR_QUICK = {"actor_bc_coef": 1.0}

PRESETS = {
    "paper": {
        "sac": dict(SAC, **REFERENCE),
        "imagination": dict(IMAGINATION_PAPER),
        "schedule": {"epochs": 3000, "updates_per_epoch": 1000, "eval_every": 10, "eval_episodes": 10},
    },
    "quick": {
        "sac": dict(SAC, **ANCHOR_QUICK),
        "imagination": dict(IMAGINATION_QUICK, real_ratio=ANCHOR_REAL_RATIO),
        "schedule": {"epochs": 40, "updates_per_epoch": 200, "eval_every": 10, "eval_episodes": 5},
        "fit": dict(FIT_QUICK),
    },
}


# Where a measurement on the task found the anchored quick preset below the pure algorithm: the pure one (5% real
# data, no BC term); the value says where the measurement is. DMSD, seed 0, one world model, mean imagined steps,
# 8,000 updates: anchored 64.8, pure 83.8.
WITHOUT_ANCHOR = {"dmsd": "docs/neorl2.md, RAVL on DMSD"}


def per_dataset(dataset: str | None) -> dict:
    """The imagination every flat-rollout algorithm takes on `dataset` (`mbrl.agents.presets`); without the anchor
    where `WITHOUT_ANCHOR` says so; a temperature fast enough for its 8,000 updates where `TARGET_ENTROPY` is low."""
    out = {"imagination": imagination_per_dataset(dataset)}
    out = with_sac_per_dataset(without_anchor(out) if dataset in WITHOUT_ANCHOR else out, dataset)
    if dataset in TARGET_ENTROPY:
        out = merge_sections(out, {"sac": {"alpha_lr": LOW_TARGET_ALPHA_LR}})
    return {name: values for name, values in out.items() if values}


def make(config, obs_dim, act_dim, obs_scale):
    return RAVL(config.sac, obs_dim, act_dim, real_rows(config), obs_scale)


# RAVL's search space (`mbrl sweep --algo ravl --space ravl`): its own knobs (the number of critics N, EDAC's
# diversity weight eta, the rollout length k and the real ratio, around edge-of-reach's defaults N 10, eta 1, k 5,
# real ratio 0.05), plus the quick preset's BC weight. The bounds are ours. N is a choice because it changes the
# critics' shapes (trials with different N run apart).
SPACE = {
    "sac.num_critics": {"choices": [5, 10, 20]},
    "sac.eta": {"low": 0.1, "high": 100.0, "log": True},
    "imagination.horizon": {"choices": [1, 5, 10]},
    "imagination.real_ratio": {"choices": [0.05, 0.5]},
    "sac.actor_bc_coef": {"low": 0.1, "high": 10.0, "log": True},
}

ALGORITHM = AlgorithmEntry(
    name="ravl", sections={"sac": SACNConfig}, make=make, presets=PRESETS, per_dataset=per_dataset, model_kind="mlp",
    imagination_fields=IMAGINATION_FIELDS,  # every field: short flat rollouts
    finalize=sac_rules, smoke={"sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": 16}},
    space=SPACE,
)
