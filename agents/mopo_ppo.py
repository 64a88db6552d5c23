"""MOPO-PPO (Li et al. 2025, RWM-U): PPO on long imagined rollouts in thousands of parallel environments, with
model rewards penalised by the world model's epistemic uncertainty, r̃ = r - λ·u (MOPO's penalty,
`mbrl.agents.mopo.penalized_reward`).

The agent is `mbrl.agents.ppo.PPO`; this module adds the penalty and the settings of the imagination it learns from.
Rollouts reach it as data (`mbrl.imagination.OnPolicyImagination`): each iteration draws
`imagination.rollouts_per_epoch` windows of real history, warms the recurrent world model up on them, imagines
`imagination.horizon` steps from each, and cuts a trajectory (bootstrapping its value there) before a step whose
uncertainty exceeds the threshold.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mbrl.agents.mopo import penalized_reward
from mbrl.agents.ppo import PPO, PPOConfig
from mbrl.core.errors import ConfigError

# The fields of `MOPOPPOConfig` that are data in the training state.
MOPO_PPO_HYPERS = ("penalty_coef", "threshold_quantile")
HEAD_MODES = ("per_trajectory", "per_step")


@dataclasses.dataclass(frozen=True)
class MOPOPPOConfig:
    """MOPO-PPO's own settings on top of PPO.

    penalty_coef: λ in r̃ = r - λ·u (RWM-U: 1.0).
    uncertainty: the measure u (a name of `mbrl.world_models.uncertainty.MEASURES`); RWM-U's is epistemic_sum,
        the heads' disagreement summed over dimensions.
    threshold_quantile: an imagined trajectory is cut before a step whose u exceeds this quantile of u over
        the dataset's own steps (1.0: their max; a negative value: never cut); the value there is bootstrapped.
    head_mode: per_trajectory (one head drawn per imagined trajectory, as in PETS) or per_step (a head drawn at
        every step).
    """

    penalty_coef: float = 1.0
    uncertainty: str = "epistemic_sum"
    threshold_quantile: float = 1.0
    head_mode: str = "per_trajectory"

    def __post_init__(self):
        if not self.penalty_coef >= 0.0:
            raise ConfigError(f"mopo_ppo.penalty_coef: expected a value >= 0, found {self.penalty_coef}")
        if not self.threshold_quantile <= 1.0:
            raise ConfigError(f"mopo_ppo.threshold_quantile: expected a value <= 1 (negative: never cut), found "
                              f"{self.threshold_quantile}")
        if self.head_mode not in HEAD_MODES:
            raise ConfigError(f"mopo_ppo.head_mode: expected one of {', '.join(HEAD_MODES)}, found {self.head_mode!r}")


class MOPOPPO(PPO):
    """PPO trained on λ·u-penalised imagined rewards."""

    def __init__(self, ppo: PPOConfig, mopo_ppo: MOPOPPOConfig, obs_dim: int, act_dim: int):
        super().__init__(ppo, obs_dim, act_dim)
        self.mopo_ppo = mopo_ppo
        self.uncertainty = mopo_ppo.uncertainty
        self.head_mode = mopo_ppo.head_mode

    def uncertainty_quantile(self, hypers) -> jax.Array:
        """The quantile of the dataset's uncertainties past which an imagined trajectory stops (traced)."""
        return hypers["mopo_ppo"]["threshold_quantile"]

    def model_reward(self, hypers, reward: jax.Array, uncertainty: jax.Array) -> jax.Array:
        return penalized_reward(reward, uncertainty.astype(jnp.float32), hypers["mopo_ppo"]["penalty_coef"])
