"""The one registry of algorithms: a name -> its config sections, its hyperparameters-as-data, its class.

The presets of each algorithm are data in `mbrl.agents.presets`; `mbrl.config` refuses an option of a section
(or an imagination field) that the chosen algorithm does not read, so nothing is accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mbrl.agents.base import Hypers, as_hypers
from mbrl.agents.bc import BC, BC_HYPERS, BCConfig
from mbrl.agents.mopo import MOPO, MOPO_HYPERS, MOPOConfig
from mbrl.agents.mopo_ppo import MOPO_PPO_HYPERS, MOPOPPO, MOPOPPOConfig
from mbrl.agents.neubay import NEUBAY_HYPERS, Neubay, NeubayConfig
from mbrl.agents.ppo import PPO_HYPERS, PPOConfig
from mbrl.agents.ravl import RAVL
from mbrl.agents.sac_n import SAC_HYPERS, SACNConfig
from mbrl.core.errors import ConfigError
from mbrl.core.replay import real_count

# Sections every run has, whatever the algorithm.
COMMON_SECTIONS = ("schedule", "select", "logging")
# The config sections the algorithms define, in the order `mbrl.config.TrainConfig` holds them.
SECTIONS: dict[str, type] = {"sac": SACNConfig, "mopo": MOPOConfig, "bc": BCConfig, "neubay": NeubayConfig,
                             "ppo": PPOConfig, "mopo_ppo": MOPOPPOConfig}
DEFAULT = "ravl"  # what `mbrl train` runs with no --algo
ALL_IMAGINATION = ("horizon", "rollouts_per_epoch", "retain_epochs", "real_ratio", "per_seed_model")


@dataclasses.dataclass(frozen=True)
class AlgorithmEntry:
    name: str
    sections: tuple[str, ...]  # config sections it reads, besides COMMON_SECTIONS
    imagination_fields: tuple[str, ...]  # the fields of `imagination` it reads (empty: none)
    hyper_fields: dict[str, tuple[str, ...]]  # section -> fields carried as traced data
    # (TrainConfig, obs_dim, act_dim, ObsScale | None) -> an `mbrl.agents.base.Algorithm`
    make: Callable[[Any, int, int, Any], Any]
    # (section, field)s whose zero leaves a term out of the compiled program (EDAC's diversity, a BC anchor):
    # only "zero or not" is static, the value itself is data.
    zero_is_static: frozenset[tuple[str, str]] = frozenset()
    # TrainConfig -> the schedule fields, besides updates_per_epoch, that its compiled program reads.
    compiled_schedule: Callable[[Any], dict[str, Any]] = lambda config: {}

    @property
    def uses_model(self) -> bool:
        return self.model_kind is not None

    @property
    def model_sections(self) -> tuple[str, ...]:
        """The config sections that define its world model (its architecture and its fit)."""
        return {"rwm": ("rwm", "rwm_fit"), "mlp": ("ensemble", "fit"), None: ()}[self.model_kind]

    @property
    def model_kind(self) -> str | None:
        """The world model it fits by default: "mlp" (the ensemble), "rwm" (RWM-U), or None."""
        return "rwm" if "rwm" in self.sections else "mlp" if "ensemble" in self.sections else None

    def hyper_values(self, config) -> dict[str, dict[str, float]]:
        """The values of `config` (a TrainConfig) carried as traced data, as nested dicts of floats."""
        return {section: {name: getattr(getattr(config, section), name) for name in names}
                for section, names in self.hyper_fields.items()}

    def hypers_of(self, config) -> Hypers:
        """The traced values of `config` as float32 scalars."""
        return as_hypers(self.hyper_values(config))


def _ravl(config, obs_dim, act_dim, obs_scale):
    return RAVL(config.sac, obs_dim, act_dim, _real_rows(config), obs_scale)


def _mopo(config, obs_dim, act_dim, obs_scale):
    return MOPO(config.sac, config.mopo, obs_dim, act_dim, _real_rows(config), obs_scale)


def _bc(config, obs_dim, act_dim, obs_scale):
    return BC(config.bc, obs_dim, act_dim, obs_scale)


def _neubay(config, obs_dim, act_dim, obs_scale):
    total = config.schedule.epochs * config.schedule.updates_per_epoch
    return Neubay(config.neubay, obs_dim, act_dim, total_updates=total, obs_scale=obs_scale)


def _mopo_ppo(config, obs_dim, act_dim, obs_scale):
    if obs_scale is not None:
        raise ConfigError("normalize_obs: mopo-ppo standardises its observations with running statistics of its "
                          "rollouts (ppo.normalize_obs); leave normalize_obs off")
    return MOPOPPO(config.ppo, config.mopo_ppo, obs_dim, act_dim)


def _neubay_schedule(config) -> dict[str, Any]:
    # Without its own decay length, the learning rate's cosine runs over the run's total updates.
    return {"epochs": config.schedule.epochs} if config.neubay.lr_decay_steps is None else {}


_SAC_ZERO_IS_STATIC = frozenset({("sac", "eta"), ("sac", "actor_bc_coef")})


def _real_rows(config) -> int:
    """The leading real rows of every mixed batch (the BC anchor imitates these)."""
    return real_count(config.sac.batch_size, config.imagination.real_ratio)


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "ravl": AlgorithmEntry("ravl", ("sac", "imagination", "ensemble", "fit"), ALL_IMAGINATION, {"sac": SAC_HYPERS}, _ravl,
                           zero_is_static=_SAC_ZERO_IS_STATIC),
    "mopo": AlgorithmEntry("mopo", ("sac", "mopo", "imagination", "ensemble", "fit"), ALL_IMAGINATION,
                           {"sac": SAC_HYPERS, "mopo": MOPO_HYPERS}, _mopo, zero_is_static=_SAC_ZERO_IS_STATIC),
    "bc": AlgorithmEntry("bc", ("bc",), (), {"bc": BC_HYPERS}, _bc),
    "neubay": AlgorithmEntry("neubay", ("neubay", "imagination", "ensemble", "fit"), ("per_seed_model",),
                             {"neubay": NEUBAY_HYPERS}, _neubay, zero_is_static=frozenset({("neubay", "actor_bc_coef")}),
                             compiled_schedule=_neubay_schedule),
    "mopo-ppo": AlgorithmEntry("mopo-ppo", ("ppo", "mopo_ppo", "imagination", "rwm", "rwm_fit"),
                               ("horizon", "rollouts_per_epoch"), {"ppo": PPO_HYPERS, "mopo_ppo": MOPO_PPO_HYPERS},
                               _mopo_ppo),
}


def entry(name: str) -> AlgorithmEntry:
    if name not in ALGORITHMS:
        raise ConfigError(f"algo: unknown algorithm {name!r}; expected one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def make(config, obs_dim: int, act_dim: int, obs_scale=None):
    """The algorithm `config.algo` names, built for these dimensions; `obs_scale` (`mbrl.agents.networks.ObsScale`)
    standardises the observations inside its networks."""
    return entry(config.algo).make(config, obs_dim, act_dim, obs_scale)
