"""MOBILE (Sun et al. 2023, "Model-Bellman Inconsistency Penalized Offline Policy Optimization").

MOPO's program (SAC-N on real rows and short model rollouts) with the penalty taken from the critics rather than the
model's variance: for every imagined (s, a) of a batch, `num_samples` next states are drawn from each elite member's
Gaussian, each is valued by the target critics at an action of the current policy (min over critics), and the
penalty is the spread over members of the per-member mean value,

    u(s, a) = std_m ( mean_j min_i Q'_i(s'_mj, a'_mj) ),   s'_mj ~ N(mu_m(s, a), sigma_m(s, a)),  a'_mj ~ pi(s'_mj),

(the unbiased std over the elites), recomputed at every update with the critics of that update; the TD target of a
model row is (r - lambda u) + gamma (1 - terminal) V'(s'), real rows unpenalised, and the target is clamped at 0.

Formulas and defaults: yihaosun1124/mobile (the authors' code: policies/mobile.py `compute_lcb`, `learn`;
dynamics/ensemble_dynamics.py `predict_next_obs`; configs/gym). Not implemented: the cosine decay of the actor's
learning rate (`lr_scheduler`) and `max_q_backup` (off in its configs).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mbrl.agents.base import IMAGINATION_FIELDS, AlgorithmEntry, scan_updates, traced
from mbrl.agents.networks import ObsScale
from mbrl.agents.presets import (FIT_QUICK, IMAGINATION_PAPER, IMAGINATION_QUICK, imagination_per_dataset,
                                 with_sac_per_dataset)
from mbrl.agents.sac_n import SACN, SACNAgent, SACNConfig, SACNState, real_rows, sac_rules
from mbrl.core import checks
from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions


@dataclasses.dataclass(frozen=True)
class MOBILEConfig:
    """MOBILE's own settings (section `mobile`; the SAC part is section `sac`).

    penalty_coef: lambda in r - lambda u.
    num_samples: next states drawn from each elite member per imagined row.
    nonnegative_target: clamp the TD target at 0, as the authors' code does (for tasks whose returns are >= 0).
    """

    penalty_coef: float = traced(1.0)
    num_samples: int = 10
    nonnegative_target: bool = True

    def __post_init__(self):
        checks.non_negative("mobile", self, "penalty_coef")
        checks.positive_ints("mobile", self, "num_samples")


def bellman_spread(values: jax.Array) -> jax.Array:
    """u from the next-state values (samples, members, rows): the unbiased std over members of the mean over samples."""
    return jnp.std(jnp.mean(values, axis=0), axis=0, ddof=1)


class MOBILECore(SACN):
    """The SAC-N core whose critic loss penalises the model rows (the batch's rows after the leading `num_real`) by
    the spread of their Bellman targets over the world model's elites. Its `update` takes the nested hypers (`sac`,
    `mobile`) and the world model."""

    def __init__(self, sac: SACNConfig, mobile: MOBILEConfig, num_real: int, obs_dim: int, act_dim: int,
                 obs_scale: ObsScale | None = None):
        super().__init__(sac, obs_dim, act_dim, num_real, obs_scale)
        self.mobile = mobile
        self.num_real = num_real

    def next_state_values(self, state: SACNState, world_model, obs, action, key) -> jax.Array:
        """min_i Q'_i(s', a') at `num_samples` next states of each elite member: (samples, elites, rows)."""
        noise_key, action_key = jax.random.split(key)
        means, stds = world_model.member_predictions(obs, action)  # (members, rows, obs_dim + 1): (Δobs, reward)
        mean = obs + means[world_model.elites, :, :self.obs_dim]
        std = stds[world_model.elites, :, :self.obs_dim]
        noise = jax.random.normal(noise_key, (self.mobile.num_samples, *mean.shape), mean.dtype)
        next_obs = (mean + noise * std).reshape(-1, self.obs_dim)
        next_action, _ = self.sample(state.actor_params, next_obs, action_key)
        q = jnp.min(self.critic.apply(state.target_critic_params, next_obs, next_action), axis=0)
        return q.reshape(self.mobile.num_samples, mean.shape[0], obs.shape[0])

    def critic_loss(self, critic_params, state: SACNState, batch: Transitions, key, hypers: dict):
        """The SAC-N critic loss on rewards less lambda u on the model rows."""
        penalty_key, key = jax.random.split(key)
        model_rows = jax.tree.map(lambda x: x[self.num_real:], batch)
        values = self.next_state_values(state, hypers["model"], model_rows.obs, model_rows.action, penalty_key)
        penalty = jax.lax.stop_gradient(bellman_spread(values))
        reward = batch.reward.at[self.num_real:].add(-hypers["mobile"]["penalty_coef"] * penalty)
        loss, metrics = super().critic_loss(critic_params, state, batch.replace(reward=reward), key, hypers)
        return loss, dict(metrics, mobile_penalty=jnp.mean(penalty))

    def td_target(self, state: SACNState, batch: Transitions, key, hypers: dict) -> jax.Array:
        target = super().td_target(state, batch, key, hypers)
        return jnp.maximum(target, 0.0) if self.mobile.nonnegative_target else target

    def update(self, state: SACNState, batch: Transitions, key: jax.Array, hypers: dict, world_model=None,
               anchor_params=None):
        inner = dict(hypers["sac"], mobile=hypers["mobile"], model=world_model)
        return SACN.update(self, state, batch, key, inner, anchor_params)

    def update_many(self, state: SACNState, batches: Transitions, key: jax.Array, hypers: dict, world_model=None,
                    anchor_params=None):
        return scan_updates(lambda s, b, k: self.update(s, b, k, hypers, world_model, anchor_params), state, batches,
                            key)


class MOBILE(SACNAgent):
    """`mbrl.agents.base.ModelReader` on real rows and model rollouts (unpenalised in the buffer: the penalty is the
    critics', computed at each update). Its capabilities are the SAC-N agent's."""

    reads_model = True

    def __init__(self, sac: SACNConfig, mobile: MOBILEConfig, num_real: int, obs_dim: int, act_dim: int,
                 obs_scale: ObsScale | None = None):
        super().__init__(sac, obs_dim, act_dim, num_real, obs_scale)
        self.core = MOBILECore(sac, mobile, num_real, obs_dim, act_dim, obs_scale)

    def update_many(self, state: SACNState, batches: Transitions, key: jax.Array, hypers: dict, world_model=None):
        if world_model is None:
            raise ConfigError("mobile: its updates sample next states from the world model, and none was given")
        return self.core.update_many(state, batches, key, hypers, world_model)

    def heldout_td_error(self, agent_state: SACNState, batch: Transitions, key, hypers):
        """On real rows, which MOBILE never penalises: SAC-N's TD error against MOBILE's (clamped) target."""
        _, metrics = SACN.critic_loss(self.core, agent_state.critic_params, agent_state, batch, key, hypers["sac"])
        return metrics["critic_loss"] / self.core.config.num_critics


# -------------------------------------------------------------------------------------------------
# Presets

# The authors' configs/gym/default.py: 2 critics of 2x256, actor lr 1e-4, critic lr 3e-4, temperature lr 1e-4 (the
# temperature clamped at 1 in `learn`), batch 256, gamma 0.99, tau 5e-3, soft backup; 50,000 rollouts of 1 step per
# 1,000 updates, 5 epochs of them retained, 5% real data; lambda 1.0 and 10 samples; 3,000 epochs of 1,000 updates.
# `learn` steps the critics, then the actor, then the temperature (`critic_actor_alpha`).
SAC = {"num_critics": 2, "hidden_sizes": (256, 256), "actor_lr": 1e-4, "critic_lr": 3e-4, "alpha_lr": 1e-4,
       "alpha_max": 1.0, "batch_size": 256, "gamma": 0.99, "tau": 5e-3, "update_order": "critic_actor_alpha"}
MOBILE_PAPER = {"penalty_coef": 1.0, "num_samples": 10, "nonnegative_target": True}

PRESETS = {
    "paper": {
        "sac": SAC, "mobile": MOBILE_PAPER,
        "imagination": dict(IMAGINATION_PAPER, horizon=1),
        "schedule": {"epochs": 3000, "updates_per_epoch": 1000, "eval_every": 10, "eval_episodes": 10},
    },
    "quick": {
        "sac": SAC, "mobile": MOBILE_PAPER,
        "imagination": dict(IMAGINATION_QUICK, horizon=1),
        "schedule": {"epochs": 40, "updates_per_epoch": 500, "eval_every": 10, "eval_episodes": 5},
        "fit": dict(FIT_QUICK),
    },
}

# (rollout length h, lambda) per dataset. D4RL: the authors' configs/gym/<task>.py where it overrides the default.
D4RL = {"walker2d-medium": (5, 0.5), "hopper-medium-expert": (5, 1.5), "halfcheetah-medium-replay": (5, 0.1)}
# NeoRL-2 (polixir/NeoRL2 benchmark/results/<Task>-mobile/log.csv): a grid of h {1, 5} x lambda {0.5, 1.5, 2.5, 3.5}
# x seeds {7, 42, 210} at 3,000 x 1,000 updates, 5% real data; the optimum is the tag with the highest mean
# Reward_Mean_Env over the seeds (benchmark/report_result.py's rule).
NEORL2 = {
    "dmsd": (1, 0.5),
    "simglucose": (1, 2.5),
    "safetyhalfcheetah": (5, 0.5),
    "pipeline": (1, 3.5),
    "randomfrictionhopper": (5, 1.5),
    "rocketrecovery": (5, 3.5),
    "fusion": (5, 1.5),
}


def per_dataset(dataset: str | None) -> dict:
    found = {**D4RL, **NEORL2}.get(dataset or "")
    if found is None:
        return {}
    horizon, penalty = found
    return with_sac_per_dataset({"imagination": {"horizon": horizon, **imagination_per_dataset(dataset)},
                                 "mobile": {"penalty_coef": penalty}}, dataset)


def mobile_rules(config) -> dict:
    """SAC-N's rules, at least one model row per batch (the penalty is computed on them) and two elites (a spread)."""
    if config.ensemble.num_elites < 2:
        raise ConfigError(f"ensemble.num_elites: MOBILE's penalty is a spread over the elites; expected at least 2, "
                          f"found {config.ensemble.num_elites}")
    if real_rows(config) == config.sac.batch_size:
        raise ConfigError(f"imagination.real_ratio: MOBILE learns from model rows, and real_ratio "
                          f"{config.imagination.real_ratio} leaves none in a batch of {config.sac.batch_size}")
    return sac_rules(config)


def make(config, obs_dim, act_dim, obs_scale):
    return MOBILE(config.sac, config.mobile, real_rows(config), obs_dim, act_dim, obs_scale)


# MOBILE's search space (`mbrl sweep --algo mobile --space mobile`): NeoRL-2's grid (above: h {1, 5} x lambda
# {0.5, 1.5, 2.5, 3.5}).
SPACE = {"imagination.horizon": {"choices": [1, 5]}, "mobile.penalty_coef": {"choices": [0.5, 1.5, 2.5, 3.5]}}

ALGORITHM = AlgorithmEntry(
    name="mobile", sections={"sac": SACNConfig, "mobile": MOBILEConfig}, make=make, presets=PRESETS,
    per_dataset=per_dataset, model_kind="mlp",
    imagination_fields=IMAGINATION_FIELDS,  # every field: short flat rollouts
    finalize=mobile_rules,
    smoke={"sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": 16}, "mobile": {"num_samples": 2}},
    space=SPACE,
)
