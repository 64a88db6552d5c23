"""NeoRL-2's tasks (Gao et al. 2025, polixir/NeoRL2) as Gymnasium envs with jax reward and termination rules.

Each module holds one task's (or two tasks') env, reward and termination, written from NeoRL-2's definitions.
`mbrl.envs.tasks` registers them from `ENTRIES`, with their Gymnasium ids `NeoRL2/<Task>-v0` (TASK_SPECS). Fusion
and SalesPromotion are left out: NeoRL-2 simulates them with learned networks, not a model of the system.

Policies are scored in each env's default mode, `train`: NeoRL-2 registers its envs with it
(neorl2/__init__.py) and its benchmark evaluates them as registered (benchmark/launch_task.py).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str  # the task's name in mbrl.core.types.TASK_SPECS
    module: str  # mbrl.envs.neorl2.<module>
    env_class: str
    prefix: str = ""  # of the module's names: {prefix}reward, {prefix}terminated, {PREFIX}OBS_NAMES, ...
    env_kwargs: tuple[tuple[str, object], ...] = ()

    def attr(self, name: str) -> str:
        """The module attribute `name` (reward, OBS_NAMES, ...) under this entry's prefix."""
        return (self.prefix.upper() if name.isupper() else self.prefix.lower()) + name


ENTRIES: tuple[Entry, ...] = (
    Entry("DMSD", "dmsd", "DMSDEnv", env_kwargs=(("mode", "train"),)),
    Entry("Pipeline", "pipeline", "PipelineEnv"),
    Entry("Simglucose", "simglucose", "SimglucoseEnv", env_kwargs=(("mode", "train"),)),
    Entry("RocketRecovery", "rocket_recovery", "RocketRecoveryEnv", env_kwargs=(("mode", "train"),)),
    Entry("RandomFrictionHopper", "mujoco_tasks", "RandomFrictionHopperEnv", prefix="hopper_",
          env_kwargs=(("mode", "train"),)),
    Entry("SafetyHalfCheetah", "mujoco_tasks", "SafetyHalfCheetahEnv", prefix="cheetah_",
          env_kwargs=(("mode", "train"),)),
)
