"""RWM-U as a world-model kind (`--model rwm`): `mbrl.world_models.recurrent` (the network and the fitted model),
`mbrl.world_models.recurrent_fit` (its fit by autoregressive forecasting)."""

from __future__ import annotations

from mbrl.world_models.kind import ModelKind
from mbrl.world_models.metrics import episode_holdout_metrics
from mbrl.world_models.recurrent import FORMAT, RecurrentConfig, RecurrentWorldModel
from mbrl.world_models.recurrent_fit import RecurrentFitConfig, fit_recurrent_model


def describe(config: RecurrentConfig) -> str:
    return (f"RWM-U (GRU {config.gru_layers}x{config.gru_hidden}, {config.num_heads} heads of "
            f"{'x'.join(map(str, config.head_hidden))}, history {config.history}, forecast {config.forecast})")


KIND = ModelKind(
    name="rwm", about="RWM-U: a GRU with ensemble heads", sections={"rwm": RecurrentConfig, "rwm_fit": RecurrentFitConfig},
    fit=fit_recurrent_model, model_class=RecurrentWorldModel, format=FORMAT, describe=describe,
    holdout_metrics=episode_holdout_metrics, k_step_error=True,
    smoke={"rwm": {"num_heads": 2, "gru_layers": 1, "gru_hidden": 8, "head_hidden": (8,), "history": 3, "forecast": 3},
           "rwm_fit": {"batch_size": 16, "steps_per_epoch": 4, "max_epochs": 2}},
)
