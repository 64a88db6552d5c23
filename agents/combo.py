"""COMBO (Yu et al. 2021, "COMBO: Conservative Offline Model-Based Policy Optimization").

CQL's critic penalty (`mbrl.agents.cql`) on a batch of real rows and model rollouts: the TD loss on every row, and
per critic

    penalty_i = w * (T * mean_{s ~ rho} logsumexp_a(Q_i(s, a) / T) - mean_{(s, a) ~ data} Q_i(s, a)),

the soft maximum over sampled actions (uniform, the policy's at s and at s', each less its log-density) taken on the
model rows (`rho_s` "model") or on every row ("mix"), the value pushed up on the real rows only. The rollouts are the
MOPO family's (`imagination` "transitions"), their rewards unpenalised.

Formulas and defaults: yihaosun1124/OfflineRL-Kit offlinerlkit/policy/model_based/combo.py (`COMBOPolicy.learn`) and
run_example/run_combo.py. Not implemented: `uniform_rollout` (rollouts with uniform actions, off in every preset),
`max_q_backup`, and run_combo.py's cosine decay of the actor's learning rate.
"""

from __future__ import annotations

import dataclasses

import jax

from mbrl.agents.base import IMAGINATION_FIELDS, AlgorithmEntry
from mbrl.agents.cql import CQL, CQLConfig, CQLCore
from mbrl.agents.networks import ObsScale
from mbrl.agents.presets import (FIT_QUICK, IMAGINATION_PAPER, IMAGINATION_QUICK, imagination_per_dataset,
                                 with_sac_per_dataset)
from mbrl.agents.sac_n import SACNAgent, SACNConfig, real_rows
from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions

RHO_S = ("model", "mix")


@dataclasses.dataclass(frozen=True)
class COMBOConfig:
    """COMBO's own setting (section `combo`); the penalty's are section `cql`, the SAC part's section `sac`.

    rho_s: the states whose sampled actions the penalty pushes down: "model" (the model rows of each batch) or
        "mix" (every row, real and model; OfflineRL-Kit's default).
    """

    rho_s: str = "mix"

    def __post_init__(self):
        if self.rho_s not in RHO_S:
            raise ConfigError(f"combo.rho_s: expected one of {', '.join(RHO_S)}, found {self.rho_s!r}")


class COMBOCore(CQLCore):
    """CQL's core on mixed batches: the leading `num_real` rows are real, the rest imagined."""

    def __init__(self, sac: SACNConfig, cql: CQLConfig, combo: COMBOConfig, num_real: int, obs_dim: int,
                 act_dim: int, obs_scale: ObsScale | None = None):
        super().__init__(sac, cql, obs_dim, act_dim, obs_scale)
        self.combo = combo
        self.num_real = num_real

    def penalty_rows(self, batch: Transitions) -> tuple[Transitions, Transitions]:
        real = jax.tree.map(lambda x: x[:self.num_real], batch)
        if self.combo.rho_s == "mix":
            return batch, real
        return jax.tree.map(lambda x: x[self.num_real:], batch), real


class COMBO(CQL):
    """`mbrl.agents.base.FlatLearner` on real rows and model rollouts with `COMBOCore`; its capabilities are CQL's
    (critic values, held-out TD error without the penalty, online fine-tuning as plain SAC)."""

    imagination = "transitions"

    def __init__(self, sac: SACNConfig, cql: CQLConfig, combo: COMBOConfig, num_real: int, obs_dim: int,
                 act_dim: int, obs_scale: ObsScale | None = None):
        SACNAgent.__init__(self, sac, obs_dim, act_dim, num_real, obs_scale)
        self.core = COMBOCore(sac, cql, combo, num_real, obs_dim, act_dim, obs_scale)


# -------------------------------------------------------------------------------------------------
# Presets

# OfflineRL-Kit run_example/run_combo.py: 2 critics of 3x256, actor lr 1e-4, critic lr 3e-4, temperature lr 1e-4,
# batch 256, gamma 0.99, tau 5e-3, the penalty at weight 5 and temperature 1 over 10 actions per sampler, no
# Lagrange multiplier, deterministic backup, rho_s "mix"; 50,000 rollouts of 5 steps per 1,000 updates, 5 epochs of
# them retained, half of each batch real; 1,000 epochs of 1,000 updates. Its `learn` steps the actor and the
# temperature before the critics.
SAC_PAPER = {"num_critics": 2, "hidden_sizes": (256, 256, 256), "actor_lr": 1e-4, "critic_lr": 3e-4, "alpha_lr": 1e-4,
             "batch_size": 256, "gamma": 0.99, "tau": 5e-3, "update_order": "alpha_actor_critic"}
CQL_PAPER = {"cql_weight": 5.0, "cql_temperature": 1.0, "num_samples": 10, "min_q_version": 3, "with_lagrange": False,
             "lagrange_threshold": 10.0, "cql_alpha_lr": 3e-4, "deterministic_backup": True, "policy_bc_steps": 0}
REAL_RATIO = 0.5

# Quick: 2x256 networks (CQL's quick reason: the critics are evaluated on 31 actions per state), the quick rollouts,
# 20 epochs of 500 updates.
PRESETS = {
    "paper": {
        "sac": SAC_PAPER, "cql": CQL_PAPER, "combo": {"rho_s": "mix"},
        "imagination": dict(IMAGINATION_PAPER, real_ratio=REAL_RATIO),
        "schedule": {"epochs": 1000, "updates_per_epoch": 1000, "eval_every": 10, "eval_episodes": 10},
    },
    "quick": {
        "sac": dict(SAC_PAPER, hidden_sizes=(256, 256)), "cql": CQL_PAPER, "combo": {"rho_s": "mix"},
        "imagination": dict(IMAGINATION_QUICK, real_ratio=REAL_RATIO),
        "schedule": {"epochs": 20, "updates_per_epoch": 500, "eval_every": 5, "eval_episodes": 5},
        "fit": dict(FIT_QUICK),
    },
}

# (rollout length h, weight w) per D4RL dataset: run_combo.py's "suggested hypers" (D4RL v2).
D4RL = {
    "halfcheetah-medium": (5, 0.5), "hopper-medium": (5, 5.0), "walker2d-medium": (1, 5.0),
    "halfcheetah-medium-replay": (5, 0.5), "hopper-medium-replay": (5, 0.5), "walker2d-medium-replay": (1, 0.5),
    "halfcheetah-medium-expert": (5, 5.0), "hopper-medium-expert": (5, 5.0), "walker2d-medium-expert": (1, 5.0),
}
# NeoRL-2 (polixir/NeoRL2 benchmark/results/<Task>-combo/log.csv): a grid of w {2.5, 3.5, 5} x h {1, 5} x rho_s
# {model, mix} x seeds {7, 42, 210} at 1,000 x 1,000 updates, the rest as run_combo.py; the optimum is the tag with the
# highest mean Reward_Mean_Env over the seeds (benchmark/report_result.py's rule). (h, w, rho_s) per task:
NEORL2 = {
    "dmsd": (1, 2.5, "mix"),
    "simglucose": (5, 2.5, "model"),
    "safetyhalfcheetah": (1, 5.0, "model"),
    "pipeline": (5, 5.0, "model"),
    "randomfrictionhopper": (1, 3.5, "mix"),
    "rocketrecovery": (1, 5.0, "model"),
    "fusion": (5, 5.0, "model"),
}


def per_dataset(dataset: str | None) -> dict:
    if dataset in NEORL2:
        horizon, weight, rho_s = NEORL2[dataset]
        return with_sac_per_dataset({"imagination": {"horizon": horizon, **imagination_per_dataset(dataset)},
                                     "cql": {"cql_weight": weight}, "combo": {"rho_s": rho_s}}, dataset)
    if dataset in D4RL:
        horizon, weight = D4RL[dataset]
        return {"imagination": {"horizon": horizon}, "cql": {"cql_weight": weight}}
    return {}


def combo_rules(config) -> dict:
    """The penalty needs real rows (its data term), model rows under rho_s "model", and one row set (version 3)."""
    num_real = real_rows(config)
    if config.cql.cql_weight > 0:
        if num_real == 0:
            raise ConfigError(f"imagination.real_ratio: COMBO's penalty raises Q on the real rows, and real_ratio "
                              f"{config.imagination.real_ratio} of batch {config.sac.batch_size} gives none")
        if config.combo.rho_s == "model" and num_real == config.sac.batch_size:
            raise ConfigError("combo.rho_s: 'model' takes the penalty's states from the model rows, and "
                              f"imagination.real_ratio {config.imagination.real_ratio} leaves none")
        if config.cql.min_q_version != 3:
            raise ConfigError(f"cql.min_q_version: COMBO's penalty is version 3 (each sample less its log-density), "
                              f"found {config.cql.min_q_version}")
    if config.cql.policy_bc_steps:
        raise ConfigError("cql.policy_bc_steps: COMBO has no behaviour-cloning warm start; expected 0")
    if config.sac.actor_bc_coef > 0:
        raise ConfigError("sac.actor_bc_coef: COMBO has no BC anchor; expected 0")
    return {}


def make(config, obs_dim, act_dim, obs_scale):
    return COMBO(config.sac, config.cql, config.combo, real_rows(config), obs_dim, act_dim, obs_scale)


# COMBO's search space (`mbrl sweep --algo combo --space combo`): NeoRL-2's grid (above: w {2.5, 3.5, 5} x h {1, 5} x
# rho_s {model, mix}).
SPACE = {"cql.cql_weight": {"choices": [2.5, 3.5, 5.0]}, "imagination.horizon": {"choices": [1, 5]},
         "combo.rho_s": {"choices": ["model", "mix"]}}

ALGORITHM = AlgorithmEntry(
    name="combo", sections={"sac": SACNConfig, "cql": CQLConfig, "combo": COMBOConfig}, make=make, presets=PRESETS,
    per_dataset=per_dataset, model_kind="mlp",
    imagination_fields=IMAGINATION_FIELDS,  # every field: short flat rollouts
    finalize=combo_rules,
    smoke={"sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": 16}, "cql": {"num_samples": 2}},
    space=SPACE,
)
