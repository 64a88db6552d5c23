"""RAVL (Sims et al. 2024, "The Edge-of-Reach Problem in Offline Model-Based Reinforcement Learning").

Reach-Aware Value Learning: an EDAC critic ensemble (An et al. 2021) trained on short model rollouts
mixed with real data. The min over N=10 critics, kept diverse by the EDAC gradient term (η=1), is low
exactly at the edge-of-reach states that rollouts reach but never leave, so no reward penalty from the
world model is needed (λ=0). The agent is the SAC-N core (`mbrl.agents.sac_n`); this module only fixes
its defaults and passes model rewards through unchanged.

Defaults: anyasims/edge-of-reach train_ravl_agent.py (N=10 critics of 3x256, η=1, lr 3e-4, batch 256,
γ 0.99, τ 5e-3; rollouts: see `mbrl.agents.presets`).
"""

from __future__ import annotations

from mbrl.agents.sac_n import SACNAgent, SACNConfig

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


class RAVL(SACNAgent):
    """EDAC-style SAC-N on unpenalised model rollouts plus real data (the base's pass-through reward)."""
