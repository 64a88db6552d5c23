"""MOPO (Yu et al. 2020, "MOPO: Model-based Offline Policy Optimization"): SAC-N on model rollouts
whose rewards are penalised by the world model's uncertainty, r̃ = r - λ·u.

The agent is the SAC-N core (`mbrl.agents.sac_n`) with N=2 critics by default; this module adds only the
reward penalty. Rollouts reach the agent as data: the training loop imagines them and hands the raw
model reward and the uncertainty u (MOPO's `aleatoric_max`: the max over members of ‖σ‖₂) to
`model_reward`, which writes r̃ into the model buffer.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mbrl.agents.sac_n import SACNAgent, SACNConfig
from mbrl.core.errors import ConfigError


# The fields of `MOPOConfig` that are data in the training state.
MOPO_HYPERS = ("penalty_coef",)


@dataclasses.dataclass(frozen=True)
class MOPOConfig:
    """MOPO's own settings on top of SAC-N. Per-dataset λ presets: `mbrl.agents.presets.MOPO_HORIZON_PENALTY`.

    penalty_coef: λ in r̃ = r - λ·u.
    uncertainty: the measure u (a name of `mbrl.world_models.uncertainty.MEASURES`); MOPO's is aleatoric_max.
    """

    penalty_coef: float = 1.0
    uncertainty: str = "aleatoric_max"

    def __post_init__(self):
        if not self.penalty_coef >= 0.0:
            raise ConfigError(f"mopo.penalty_coef: expected a value >= 0, found {self.penalty_coef}")


def penalized_reward(reward: jax.Array, uncertainty: jax.Array, penalty_coef) -> jax.Array:
    """MOPO's r̃ = r - λ·u, elementwise: the one place the penalty is written (λ may be traced)."""
    return reward - penalty_coef * uncertainty


class MOPO(SACNAgent):
    """SAC-N (default N=2) trained on λ·u-penalised model rewards mixed with real data."""

    def __init__(self, sac: SACNConfig, mopo: MOPOConfig, obs_dim: int, act_dim: int, bc_rows: int | None = None,
                 obs_scale=None):
        super().__init__(sac, obs_dim, act_dim, bc_rows, obs_scale)
        self.config = mopo
        self.uncertainty = mopo.uncertainty

    def model_reward(self, hypers, reward: jax.Array, uncertainty: jax.Array) -> jax.Array:
        return penalized_reward(reward, uncertainty.astype(jnp.float32), hypers["mopo"]["penalty_coef"])
