"""The probabilistic MLP ensemble as a world-model kind (`--model mlp`): `mbrl.world_models.ensemble` (the network),
`mbrl.world_models.model.WorldModel` (the fitted model), `mbrl.world_models.fit` (its fit)."""

from __future__ import annotations

from mbrl.world_models.ensemble import EnsembleConfig
from mbrl.world_models.fit import FitConfig, fit_world_model
from mbrl.world_models.kind import ModelKind
from mbrl.world_models.metrics import row_holdout_metrics
from mbrl.world_models.model import FORMAT, WorldModel


def describe(config: EnsembleConfig) -> str:
    return f"{config.num_members} members ({config.num_elites} elites, hidden {'x'.join(map(str, config.hidden_dims))})"


KIND = ModelKind(
    name="mlp", about="the probabilistic MLP ensemble", sections={"ensemble": EnsembleConfig, "fit": FitConfig},
    fit=fit_world_model, model_class=WorldModel, format=FORMAT, describe=describe,
    holdout_metrics=row_holdout_metrics, k_step_error=True,
    smoke={"ensemble": {"num_members": 3, "num_elites": 2, "hidden_dims": (16,)}, "fit": {"max_epochs": 2}},
)
