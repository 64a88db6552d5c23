"""A world-model kind declares itself: its module's `KIND`, listed in `mbrl.world_models.registry.MODULES`.

`mbrl model fit --model NAME`, `mbrl train` (an algorithm's `model_kind`), `mbrl model eval`, `mbrl ope` and checkpoint
selection read the entry and never the kind's name: its config sections, its fit (and the resume of an interrupted
one), its save format and load, its model class and imagined step, and what it can answer.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelKind:
    """What the training program, the config and the commands know of a world-model kind.

    name: its `--model` name, and an algorithm's `model_kind` (`mbrl.agents.base.AlgorithmEntry`).
    about: a few words for the `--model` help.
    sections: its config sections, {architecture: class, fit: class} in that order (TrainConfig's sections; the
        `--SECTION.*` options of `mbrl model fit` and `mbrl train`); a section may be shared by kinds with the same
        class.
    fit: (data, *, config, fit_config, termination_fn, reward_fn, source, task, progress, control) ->
        `mbrl.world_models.fitting.FitResult`, one signature for every kind (`mbrl.world_models.fitting.run_fit`);
        with `control.resume`, it continues from the latest checkpoint (`resume`).
    model_class: the fitted model, a `mbrl.world_models.base.DynamicsModel` pytree mixing in
        `mbrl.world_models.saved.SavedModel`; its `step` is one imagined step, its `is_recurrent` whether it reads a
        history (`warm_up`) before it predicts.
    format: the `format` its saved directories name in model.json (unique among the kinds).
    describe: its architecture section -> the words `mbrl model fit` prints for it.
    holdout_metrics: (model, dataset) -> (per-member metrics, rows) on the holdout its fit recorded, the measures of
        `mbrl.world_models.metrics.holdout_metrics` (mse, calibration); None: it cannot answer.
    k_step_error: it answers the open-loop k-step error (`mbrl.world_models.metrics.open_loop_errors`).
    smoke: the tiny sizes of its sections that still exercise every part (`tests/test_model_kinds.py`).
    """

    name: str
    about: str
    sections: Mapping[str, type]
    fit: Callable[..., Any]
    model_class: type
    format: str
    describe: Callable[[Any], str]
    holdout_metrics: Callable[[Any, Any], tuple[dict, int]] | None = None
    k_step_error: bool = True
    smoke: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if len(self.sections) != 2:
            raise ValueError(f"world-model kind {self.name}: sections {list(self.sections)}; expected two, its "
                             "architecture's and its fit's")

    @property
    def architecture_section(self) -> str:
        return next(iter(self.sections))

    @property
    def fit_section(self) -> str:
        return list(self.sections)[1]

    @property
    def is_recurrent(self) -> bool:
        """It reads a history before it predicts (an algorithm that imagines from single states refuses it)."""
        return bool(self.model_class.is_recurrent)

    @property
    def step(self) -> Callable:
        """One imagined step, `model.step(key, obs, action, member, *, carry, deterministic, uncertainty)`."""
        return self.model_class.step

    def configs(self, config) -> tuple[Any, Any]:
        """Its architecture and fit sections of `config` (a `mbrl.config.TrainConfig`)."""
        return getattr(config, self.architecture_section), getattr(config, self.fit_section)

    def resume(self, data, *, control, **options):
        """Continue the fit whose checkpoints `control` holds (`fit` with `control.resume`)."""
        return self.fit(data, control=dataclasses.replace(control, resume=True), **options)

    def save(self, model, path: str | os.PathLike) -> Path:
        return model.save(path, self.format)

    def load(self, path: str | os.PathLike, termination_fn: Callable | None = None, reward_fn: Callable | None = None):
        return self.model_class.load(path, termination_fn, reward_fn, format_name=self.format)
