"""RAVL (Sims et al. 2024, "The Edge-of-Reach Problem in Offline Model-Based Reinforcement Learning").

Reach-Aware Value Learning: an EDAC critic ensemble (An et al. 2021) trained on short model rollouts
mixed with real data. The min over N=10 critics, kept diverse by the EDAC gradient term (η=1), is low
exactly at the edge-of-reach states that rollouts reach but never leave, so no reward penalty from the
world model is needed (λ=0). The agent is the SAC-N core (`agents.sac_n`); this module only fixes
its defaults and passes model rewards through unchanged.

Defaults: anyasims/edge-of-reach train_ravl_agent.py (N=10 critics of 3x256, η=1, lr 3e-4, batch 256,
γ 0.99, τ 5e-3; rollouts: see `agents.presets`).
"""

from __future__ import annotations

import jax

from agents.sac_n import SACN, SACNConfig, SACNState
from mbrl.types import Transitions

DEFAULT_SAC = SACNConfig(
    num_critics=10,
    hidden_sizes=(256, 256, 256),
    actor_lr=3e-4,
    critic_lr=3e-4,
    alpha_lr=3e-4,
    gamma=0.99,
    tau=5e-3,
    batch_size=256,
    eta=1.0,
)


class RAVL:
    """EDAC-style SAC-N on unpenalised model rollouts plus real data."""

    uses_model = True
    uncertainty = "aleatoric_max"  # only logged: RAVL does not penalise

    def __init__(self, sac: SACNConfig, obs_dim: int, act_dim: int):
        self.core = SACN(sac, obs_dim, act_dim)
        self.batch_size = sac.batch_size

    def init(self, key: jax.Array) -> SACNState:
        return self.core.init(key)

    def update(self, state: SACNState, batch: Transitions, key: jax.Array):
        return self.core.update(state, batch, key)

    def update_many(self, state: SACNState, batches: Transitions, key: jax.Array):
        return self.core.update_many(state, batches, key)

    @staticmethod
    def actor_params(state: SACNState):
        return state.actor_params

    def act(self, actor_params, obs, key, deterministic: bool = False):
        return self.core.act(actor_params, obs, key, deterministic)

    @staticmethod
    def model_reward(reward: jax.Array, uncertainty: jax.Array) -> jax.Array:
        del uncertainty
        return reward
