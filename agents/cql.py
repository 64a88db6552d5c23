"""CQL (Kumar et al. 2020, "Conservative Q-Learning for Offline Reinforcement Learning"), on the real data only.

The SAC-N core (`mbrl.agents.sac_n.SACN`) with one more term in each critic's loss: the critic's soft maximum over
sampled actions less its value at the data's action,

    penalty_i = w * (T * mean_s logsumexp_a(Q_i(s, a) / T) - mean_s Q_i(s, a_data)),

the actions being `num_samples` uniform ones, `num_samples` from the policy at s and `num_samples` from the policy
at s' (all evaluated at s). `min_q_version` 3 (CQL(H)) divides each sample by its density (log 0.5^|A| for the
uniform ones, the policy's log-probability for the others); 2 (CQL(rho)) takes the raw values, with Q at the data's
action among them. With `with_lagrange` the weight is w * alpha', alpha' learned by gradient ascent on
-alpha' (w * gap - tau), so that the weighted gap settles at `lagrange_threshold` tau.

Formulas: yihaosun1124/OfflineRL-Kit offlinerlkit/policy/model_free/cql.py (`CQLPolicy.learn`, version 3) and
polixir/OfflineRL offlinerl/algo/modelfree/cql.py (`AlgoTrainer._train`, versions 2 and 3, the BC warm start),
both after the authors' aviralkumar2907/CQL d4rl/rlkit/torch/sac/cql.py. Not implemented: their max-Q backup
(`max_q_backup`, off in every preset they publish).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from mbrl.agents.base import AlgorithmEntry, scan_updates, static_when_zero, traced
from mbrl.agents.networks import ObsScale
from mbrl.agents.presets import with_sac_per_dataset
from mbrl.agents.sac import OnlineSAC
from mbrl.agents.sac_n import SACN, SACNAgent, SACNConfig, SACNState
from mbrl.core import checks
from mbrl.core.errors import ConfigError
from mbrl.core.tanh_gaussian import sample_tanh_gaussian, tanh_gaussian_log_prob
from mbrl.core.types import Transitions

MIN_Q_VERSIONS = (2, 3)
CQL_ALPHA_MAX = 1e6  # the references' clamp of alpha'


@dataclasses.dataclass(frozen=True)
class CQLConfig:
    """CQL's conservative penalty (section `cql`; the SAC part is section `sac`). Defaults: OfflineRL-Kit
    run_example/run_cql.py (its suggested D4RL Gym values).

    cql_weight: the penalty's weight w (0: plain SAC-N, the penalty left out of the program).
    cql_temperature: the log-sum-exp's temperature T.
    num_samples: actions per state from each of the three samplers (uniform, policy at s, policy at s').
    min_q_version: 3: CQL(H), each sample divided by its density; 2: CQL(rho), raw values, the data's action included.
    with_lagrange: learn a multiplier alpha' of the penalty so that w * gap stays at lagrange_threshold.
    lagrange_threshold: the target tau of w * gap under with_lagrange.
    cql_alpha_lr: Adam learning rate of log alpha'.
    deterministic_backup: the TD target without the entropy term (OfflineRL-Kit's and the authors' default).
    policy_bc_steps: the first updates train the actor by behaviour cloning (alpha * log pi(a~pi) - log pi(a_data)),
        as the authors' policy_eval_start (0: none).
    """

    cql_weight: float = static_when_zero(5.0)
    cql_temperature: float = traced(1.0)
    num_samples: int = 10
    min_q_version: int = 3
    with_lagrange: bool = False
    lagrange_threshold: float = traced(10.0)
    cql_alpha_lr: float = traced(3e-4)
    deterministic_backup: bool = True
    policy_bc_steps: int = 0

    def __post_init__(self):
        checks.non_negative("cql", self, "cql_weight")
        checks.positive("cql", self, "cql_temperature", "cql_alpha_lr")
        checks.positive_ints("cql", self, "num_samples")
        if self.min_q_version not in MIN_Q_VERSIONS:
            raise ConfigError(f"cql.min_q_version: expected one of {MIN_Q_VERSIONS}, found {self.min_q_version!r}")
        if self.with_lagrange and self.cql_weight == 0:
            raise ConfigError("cql.with_lagrange: the multiplier scales the penalty, and cql.cql_weight 0 leaves it out")
        if isinstance(self.policy_bc_steps, bool) or not isinstance(self.policy_bc_steps, int) or self.policy_bc_steps < 0:
            raise ConfigError(f"cql.policy_bc_steps: expected an int >= 0, found {self.policy_bc_steps!r}")


@struct.dataclass
class CQLState(SACNState):
    """The SAC-N state and the Lagrange multiplier (log alpha', constant without `with_lagrange`)."""

    cql_log_alpha: jax.Array
    cql_alpha_opt_state: Any

    @classmethod
    def of(cls, sac: SACNState, cql_log_alpha, cql_alpha_opt_state) -> CQLState:
        return cls(**{f.name: getattr(sac, f.name) for f in dataclasses.fields(SACNState)},
                   cql_log_alpha=cql_log_alpha, cql_alpha_opt_state=cql_alpha_opt_state)

    def sac_state(self) -> SACNState:
        return SACNState(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SACNState)})


@struct.dataclass
class ActionSamples:
    """Per state (B rows), `num_samples` actions of each sampler and the policy's log-probabilities of its own."""

    uniform: jax.Array  # (B, N, A) in [-1, 1]
    policy: jax.Array  # (B, N, A), the policy at s
    policy_logp: jax.Array  # (B, N)
    next_policy: jax.Array  # (B, N, A), the policy at s'
    next_policy_logp: jax.Array  # (B, N)


def conservative_gap(q_at, q_data: jax.Array, samples: ActionSamples, temperature, min_q_version: int) -> jax.Array:
    """Per critic, T * mean_s logsumexp(values / T) - mean_s Q(s, a_data): (C,).

    `q_at(actions (B, M, A)) -> (C, B, M)`: every critic's Q at the batch's states; `q_data`: (C, B).
    Version 3 subtracts each sample's log-density (OfflineRL-Kit `calc_random_values`, `calc_pi_values`); version 2
    takes the raw values and Q at the data's action (polixir/OfflineRL cql.py: `cat_q1` before the version-3 branch).
    """
    n = samples.uniform.shape[1]
    q = q_at(jnp.concatenate([samples.uniform, samples.policy, samples.next_policy], axis=1))
    q_uniform, q_policy, q_next = q[..., :n], q[..., n:2 * n], q[..., 2 * n:]
    if min_q_version == 3:
        log_uniform = samples.uniform.shape[-1] * jnp.log(0.5)  # the density of U(-1, 1)^A
        values = [q_uniform - log_uniform, q_policy - samples.policy_logp[None], q_next - samples.next_policy_logp[None]]
    else:
        values = [q_uniform, q_data[..., None], q_policy, q_next]
    soft_max = temperature * jax.nn.logsumexp(jnp.concatenate(values, axis=-1) / temperature, axis=-1)
    return jnp.mean(soft_max, axis=-1) - jnp.mean(q_data, axis=-1)


def lagrange_loss(cql_log_alpha, weighted_gap, threshold):
    """The multiplier's loss, -alpha' (w * gap - tau) with gap the critics' mean: gradient descent on it raises alpha'
    while the weighted gap exceeds tau (OfflineRL-Kit `cql_alpha_loss`: the mean over its two critics)."""
    return -jnp.clip(jnp.exp(cql_log_alpha), 0.0, CQL_ALPHA_MAX) * (weighted_gap - threshold)


class CQLCore(SACN):
    """The SAC-N core with CQL's penalty in the critic loss, the optional BC warm start in the actor loss and the
    Lagrange multiplier's step after each update. Its `update` takes the nested hypers (`sac` and `cql`); the core's
    own losses see the `sac` values with `cql` (its traced values, alpha', the warm-start flag) beside them."""

    def __init__(self, sac: SACNConfig, cql: CQLConfig, obs_dim: int, act_dim: int, obs_scale: ObsScale | None = None):
        super().__init__(sac, obs_dim, act_dim, None, obs_scale)  # real data only: the BC term sees every row
        self.cql = cql
        self.use_cql = cql.cql_weight > 0

    def init(self, key: jax.Array, hypers: dict) -> CQLState:
        """`hypers`: the `sac` section's values, as `SACN.init`."""
        log_alpha = jnp.zeros((), jnp.float32)  # alpha' = 1, as the references
        return CQLState.of(super().init(key, hypers), log_alpha, self.tx.init(log_alpha))

    # ----------------------------------------------------------------- losses

    def td_loss(self, critic_params, state: SACNState, batch: Transitions, key, hypers: dict):
        """The core's critic loss (TD, and EDAC's term if any); under `deterministic_backup` its target has no
        entropy term: the core's soft target at temperature exp(-inf) = 0."""
        if self.cql.deterministic_backup:
            state = state.replace(log_alpha=jnp.full_like(state.log_alpha, -jnp.inf))
        return SACN.critic_loss(self, critic_params, state, batch, key, hypers)

    def sample_actions(self, actor_params, batch: Transitions, key) -> ActionSamples:
        """The penalty's actions: uniform, and the policy's at s and at s' (OfflineRL-Kit `learn`: `random_actions`,
        `calc_pi_values(tmp_obss, ...)`, `calc_pi_values(tmp_next_obss, ...)`)."""
        uniform_key, policy_key, next_key = jax.random.split(key, 3)
        shape = (batch.obs.shape[0], self.cql.num_samples, self.act_dim)

        def policy(obs, key):
            mean, log_std = self.actor.apply(actor_params, obs)
            return sample_tanh_gaussian(jnp.broadcast_to(mean[:, None], shape), jnp.broadcast_to(log_std[:, None], shape),
                                        key, self.config.logp_epsilon)

        action, logp = policy(batch.obs, policy_key)
        next_action, next_logp = policy(batch.next_obs, next_key)
        uniform = jax.random.uniform(uniform_key, shape, minval=-1.0, maxval=1.0)
        return ActionSamples(uniform, action, jax.lax.stop_gradient(logp), next_action, jax.lax.stop_gradient(next_logp))

    def q_at(self, critic_params, obs, actions):
        """Every critic's Q at (s, a) for M actions per state: obs (B, D), actions (B, M, A) -> (C, B, M)."""
        rows, m = actions.shape[:2]
        repeated = jnp.broadcast_to(obs[:, None], (rows, m, obs.shape[-1])).reshape(rows * m, -1)
        return self.critic.apply(critic_params, repeated, actions.reshape(rows * m, -1)).reshape(-1, rows, m)

    def penalty_rows(self, batch: Transitions) -> tuple[Transitions, Transitions]:
        """The rows whose sampled actions the penalty pushes down, and the rows whose actions it pushes up: both the
        whole batch in CQL (COMBO splits them between model and real rows)."""
        return batch, batch

    def critic_loss(self, critic_params, state: SACNState, batch: Transitions, key, hypers: dict):
        """The TD loss plus the penalty of every critic, summed (each critic's own loss in the references)."""
        td_key, sample_key = jax.random.split(key)
        loss, metrics = self.td_loss(critic_params, state, batch, td_key, hypers)
        if not self.use_cql:
            return loss, metrics
        cql = hypers["cql"]
        pushed, data = self.penalty_rows(batch)
        samples = self.sample_actions(state.actor_params, pushed, sample_key)
        q_data = self.critic.apply(critic_params, data.obs, data.action)
        gap = conservative_gap(lambda a: self.q_at(critic_params, pushed.obs, a), q_data, samples,
                               cql["cql_temperature"], self.cql.min_q_version)
        if self.cql.with_lagrange:
            penalty = cql["cql_alpha"] * jnp.sum(cql["cql_weight"] * gap - cql["lagrange_threshold"])
        else:
            penalty = cql["cql_weight"] * jnp.sum(gap)
        return loss + penalty, dict(metrics, cql_gap=jnp.mean(gap), cql_penalty=penalty)

    def actor_loss(self, actor_params, critic_params, log_alpha, batch: Transitions, key, hypers: dict,
                   anchor_params=None):
        """SAC's actor loss, or during the first `policy_bc_steps` updates behaviour cloning with the entropy term
        (polixir/OfflineRL cql.py `policy_bc_steps`; the authors' `policy_eval_start`)."""
        loss, (logp, extra) = super().actor_loss(actor_params, critic_params, log_alpha, batch, key, hypers,
                                                 anchor_params)
        if self.cql.policy_bc_steps > 0:
            mean, log_std = self.actor.apply(actor_params, batch.obs)
            bc = jnp.mean(self.alpha(log_alpha) * logp - tanh_gaussian_log_prob(mean, log_std, batch.action))
            loss = jnp.where(hypers["cql"]["bc_phase"], bc, loss)
        return loss, (logp, extra)

    # ----------------------------------------------------------------- update

    def update(self, state: CQLState, batch: Transitions, key: jax.Array, hypers: dict,
               anchor_params=None) -> tuple[CQLState, dict]:
        """One SAC-N update with the penalty (alpha' as it stands), then alpha''s step on the gap the critics' loss
        measured (before their step, as the references)."""
        cql = hypers["cql"]
        alpha = jnp.clip(jnp.exp(state.cql_log_alpha), 0.0, CQL_ALPHA_MAX)
        inner = dict(hypers["sac"], cql=dict(cql, cql_alpha=alpha, bc_phase=state.step < self.cql.policy_bc_steps))
        new_state, metrics = SACN.update(self, state, batch, key, inner, anchor_params)
        log_alpha, alpha_opt_state = state.cql_log_alpha, state.cql_alpha_opt_state
        if self.use_cql and self.cql.with_lagrange:
            grad = jax.grad(lagrange_loss)(log_alpha, cql["cql_weight"] * metrics["cql_gap"], cql["lagrange_threshold"])
            log_alpha, alpha_opt_state = self._step(log_alpha, grad, alpha_opt_state, cql["cql_alpha_lr"])
            metrics = dict(metrics, cql_alpha=alpha)
        return CQLState.of(new_state, log_alpha, alpha_opt_state), metrics

    def update_many(self, state: CQLState, batches: Transitions, key: jax.Array, hypers: dict,
                    anchor_params=None) -> tuple[CQLState, dict]:
        return scan_updates(lambda s, b, k: self.update(s, b, k, hypers, anchor_params), state, batches, key)


class OnlineCQL(OnlineSAC):
    """Online SAC (`mbrl.finetune`'s WSRL phase) on a CQL run's state: the state keeps the offline layout
    (`CQLState`), its multiplier carried unchanged; the updates are plain SAC's."""

    def _init(self, key: jax.Array):
        state = super()._init(key)
        log_alpha = jnp.zeros((), jnp.float32)
        return state.replace(agent=CQLState.of(state.agent, log_alpha, self.core.tx.init(log_alpha)))

    def _insert_and_update(self, state, rows, fixed, hypers, anchor_params=None):
        offline = state.agent
        state, metrics = super()._insert_and_update(state.replace(agent=offline.sac_state()), rows, fixed, hypers,
                                                    anchor_params)
        return state.replace(agent=CQLState.of(state.agent, offline.cql_log_alpha, offline.cql_alpha_opt_state)), metrics


class CQL(SACNAgent):
    """`mbrl.agents.base.FlatLearner` on the real data (imagination "none"): the SAC-N agent with `CQLCore`. Its
    capabilities are the SAC-N agent's: critic values, held-out TD error (without the penalty), online fine-tuning."""

    imagination = "none"

    def __init__(self, sac: SACNConfig, cql: CQLConfig, obs_dim: int, act_dim: int, obs_scale: ObsScale | None = None):
        super().__init__(sac, obs_dim, act_dim, None, obs_scale)
        self.core = CQLCore(sac, cql, obs_dim, act_dim, obs_scale)

    def update_many(self, state: CQLState, batches: Transitions, key: jax.Array, hypers: dict):
        return self.core.update_many(state, batches, key, hypers)

    def heldout_td_error(self, agent_state: CQLState, batch: Transitions, key, hypers):
        _, metrics = self.core.td_loss(agent_state.critic_params, agent_state, batch, key, hypers["sac"])
        return metrics["critic_loss"] / self.core.config.num_critics  # the TD part: no penalty, no EDAC term

    def online_learner(self, settings, obs_scale):
        learner = super().online_learner(settings, obs_scale)
        return OnlineCQL(learner.config, self.obs_dim, self.act_dim, obs_scale)


# -------------------------------------------------------------------------------------------------
# Presets

# The paper's D4RL Gym settings: the authors' aviralkumar2907/CQL d4rl/examples/cql_mujoco_new.py (3x256 networks,
# qf_lr 3e-4, batch 256, gamma 0.99, soft_target_tau 5e-3, num_random 10, temp 1.0, auto entropy, policy_eval_start
# 40000, deterministic backup) with its README's MuJoCo command (policy_lr 1e-4, min_q_version 3, min_q_weight 5.0,
# lagrange_thresh -1: no Lagrange); the temperature's lr is policy_lr there (`alpha_optimizer`). OfflineRL-Kit
# run_example/run_cql.py has the same values (cql-weight 5.0 "for all D4RL-Gym tasks", alpha-lr 1e-4,
# cql-alpha-lr 3e-4) without the BC warm start. Schedule: OfflineRL-Kit's and NeoRL-2's 1,000 epochs of 1,000 updates
# (the authors' variant: 3,000 epochs), evaluated every 10 epochs rather than every epoch.
# update_order: OfflineRL-Kit's `learn` steps the actor and the temperature before the critics, whose penalty and
# target then sample the updated actor.
SAC_PAPER = {"num_critics": 2, "hidden_sizes": (256, 256, 256), "actor_lr": 1e-4, "critic_lr": 3e-4, "alpha_lr": 1e-4,
             "batch_size": 256, "gamma": 0.99, "tau": 5e-3, "update_order": "alpha_actor_critic"}
CQL_PAPER = {"cql_weight": 5.0, "cql_temperature": 1.0, "num_samples": 10, "min_q_version": 3, "with_lagrange": False,
             "lagrange_threshold": 10.0, "cql_alpha_lr": 3e-4, "deterministic_backup": True, "policy_bc_steps": 40_000}

# Quick: the same agent on 2x256 networks (an update evaluates the critics on 31 actions per state, and a third hidden
# layer of 256 nearly doubles the multiply-adds of each evaluation), 10,000 updates, the BC warm start the paper's
# share of the updates (4%).
QUICK_UPDATES = 20 * 500
SAC_QUICK = dict(SAC_PAPER, hidden_sizes=(256, 256))
CQL_QUICK = dict(CQL_PAPER, policy_bc_steps=QUICK_UPDATES * 40_000 // 1_000_000)

PRESETS = {
    "paper": {"sac": SAC_PAPER, "cql": CQL_PAPER,
              "schedule": {"epochs": 1000, "updates_per_epoch": 1000, "eval_every": 10, "eval_episodes": 10}},
    "quick": {"sac": SAC_QUICK, "cql": CQL_QUICK,
              "schedule": {"epochs": 20, "updates_per_epoch": 500, "eval_every": 5, "eval_episodes": 5}},
}

# NeoRL-2 (polixir/NeoRL2 benchmark/results/<Task>-cql/log.csv): a grid over polixir/OfflineRL's lagrange_thresh
# (-1: off; >= 0 turns the Lagrange version on, `algo_init`), min_q_version and min_q_weight, 3 seeds each (7, 42,
# 210); the optimum is the tag with the highest mean Reward_Mean_Env over the seeds (benchmark/report_result.py's
# rule). (with_lagrange, lagrange_threshold, min_q_version, cql_weight) per task:
NEORL2_GRID = {
    "dmsd": (True, 10.0, 3, 5.0),
    "safetyhalfcheetah": (True, 2.0, 2, 10.0),
    "simglucose": (True, 2.0, 2, 10.0),
    "pipeline": (True, 10.0, 2, 10.0),
    "randomfrictionhopper": (True, 5.0, 2, 10.0),
    "rocketrecovery": (True, 2.0, 3, 10.0),
    "fusion": (True, 5.0, 2, 10.0),
}
# The rest of those runs (the logs' hparams, polixir/OfflineRL offlinerl/config/algo/cql_config.py): networks of 3
# hidden layers of 256 (`Net(layer_num=2)`: an input block and 2 more), actor_lr 1e-4 (the temperature's too),
# critic_lr 3e-4 (the multiplier's too), num_random 10, temp 1.0, type_q_backup "min" (the target keeps the entropy term),
# policy_bc_steps 40000 of 1,000 epochs x 1,000 updates. Only what differs from the presets is set here; the network
# sizes and the warm start stay the preset's.
NEORL2_COMMON = {"deterministic_backup": False}


def per_dataset(dataset: str | None) -> dict:
    if dataset not in NEORL2_GRID:
        return {}
    with_lagrange, threshold, version, weight = NEORL2_GRID[dataset]
    return with_sac_per_dataset({"cql": dict(NEORL2_COMMON, with_lagrange=with_lagrange, lagrange_threshold=threshold,
                                             min_q_version=version, cql_weight=weight)}, dataset)


def make(config, obs_dim, act_dim, obs_scale):
    return CQL(config.sac, config.cql, obs_dim, act_dim, obs_scale)


# CQL's search space (`mbrl sweep --algo cql --space cql`): NeoRL-2's grid (polixir/NeoRL2
# benchmark/results/<Task>-cql/log.csv: lagrange_thresh {-1: off, 2, 5, 10} x min_q_version {2, 3} x min_q_weight
# {5, 10}), the threshold split into the multiplier's switch and its value.
SPACE = {
    "cql.with_lagrange": {"choices": [False, True]},
    "cql.lagrange_threshold": {"choices": [2.0, 5.0, 10.0]},
    "cql.min_q_version": {"choices": [2, 3]},
    "cql.cql_weight": {"choices": [5.0, 10.0]},
}

ALGORITHM = AlgorithmEntry(
    name="cql", sections={"sac": SACNConfig, "cql": CQLConfig}, make=make, presets=PRESETS, per_dataset=per_dataset,
    smoke={"sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": 16},
           "cql": {"num_samples": 2, "with_lagrange": True, "policy_bc_steps": 20}},
    space=SPACE,
)
