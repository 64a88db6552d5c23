"""A population of configurations in one compiled program, with no run directory: the Python API behind sweeps.

    from mbrl.population import member_config, train_population
    result = train_population(config, [{"mopo": {"penalty_coef": 1.0}}, {"mopo": {"penalty_coef": 5.0}}], seeds=[0, 0])
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from mbrl.agents import registry
from mbrl.config import TrainConfig
from mbrl.core.errors import ConfigError
from mbrl.core.signals import StopSignal
from mbrl.train import dataset_reference_scores, fit_model, world_models_for
from mbrl.trainer import (EpochReport, TrainState, compile_key, hypers_of, shard_population, train_epochs,
                          trainer_of_data)


@dataclasses.dataclass
class PopulationResult:
    configs: list[TrainConfig]  # member i's config (the base with its overrides)
    seeds: list[int]
    records: list[dict]  # per epoch: {"epoch", "updates", "train": {name: [per member]}, "eval": per-member lists}
    state: TrainState  # the final population state
    layout: str = "vmap"  # how its members ran in the program (`Trainer.choose_layout`)


def member_config(config: TrainConfig, overrides: dict) -> TrainConfig:
    """`config` with the nested `overrides` of traced hyperparameters, e.g. {"mopo": {"penalty_coef": 2.0}};
    a field that changes the compiled program (shapes, which terms exist) is refused."""
    entry = registry.entry(config.algo)
    changes = {}
    for section, fields in overrides.items():
        allowed = entry.hyper_fields.get(section)
        if allowed is None or not isinstance(fields, dict):
            raise ConfigError(f"population: {section!r} holds no hyperparameters of {config.algo}; expected one of "
                              f"{', '.join(entry.hyper_fields)}")
        for name in fields:
            if name not in allowed:
                raise ConfigError(f"population: {section}.{name} is not a hyperparameter that {config.algo} carries as "
                                  f"data; expected one of {', '.join(allowed)}")
        changes[section] = dataclasses.replace(getattr(config, section), **{k: float(v) for k, v in fields.items()})
    member = dataclasses.replace(config, **changes)
    if compile_key(member) != compile_key(config):
        raise ConfigError(f"population: {overrides} turns a term of the program on or off (a weight of 0 leaves its "
                          "term out); members with a different program need a population of their own")
    return member


def train_population(
    config: TrainConfig,
    hypers: Sequence[dict],
    seeds: Sequence[int],
    *,
    dataset=None,
    world_model=None,
    evaluate: bool = True,
    on_epoch: Callable[[EpochReport], None] | None = None,
    shard: bool = True,
    stop: StopSignal | None = None,
) -> PopulationResult:
    """Train len(seeds) members in one compiled program: member i has seed `seeds[i]` and `config` with the
    overrides `hypers[i]` (nested dicts of the traced hyperparameters, `member_config`).

    `dataset`: an `OfflineDataset` (else `mbrl.datasets.load(config.dataset)`); `world_model`: a fitted
    world model (the MLP ensemble or RWM-U), a directory holding one, or None to fit one of the algorithm's kind
    with `config`'s settings (`fit_model`; shared by all members). `shard`: split the members over the local devices
    (`shard_population`); False keeps them on one. `stop`: the caller's `StopSignal` (a sweep's, which
    outlives one population); by default one of its own. Stopped early, `records` ends before the
    schedule's last epoch. Nothing is written to disk.
    """
    from mbrl.envs.tasks import find_task
    from mbrl import datasets

    if len(hypers) != len(seeds) or not seeds:
        raise ConfigError(f"population: expected one set of hyperparameters per seed, found {len(hypers)} and {len(seeds)}")
    configs = [member_config(config, h) for h in hypers]
    dataset = dataset if dataset is not None else datasets.load(config.dataset, task=config.task)
    task = find_task(dataset.info.task)
    trainer = trainer_of_data(config, dataset)
    real = trainer.real_data(dataset)
    model = None
    if trainer.uses_model:
        if trainer.per_member_model:
            raise ConfigError("population: imagination.per_seed_model needs one model per member; pass one shared model")
        from mbrl.world_models.model import ModelInfo

        if isinstance(world_model, (str, Path)):
            model = world_models_for(config, dataset, task, [Path(world_model).absolute()], progress=False)
        else:
            model = (world_model if world_model is not None else fit_model(config, dataset, task)).replace(info=ModelInfo())
    state = trainer.initial_state(list(seeds), [hypers_of(c) for c in configs])
    if shard:
        state, real, model = shard_population(state, real, model)
    ref_scores = dataset_reference_scores(dataset, task)
    records = []
    evaluate_fn = None
    if evaluate and task is not None and task.has_env:
        evaluate_fn = functools.partial(trainer.evaluate, task=task, seeds=list(seeds), ref_scores=ref_scores,
                                        episodes=config.schedule.eval_episodes, eval_seed=config.schedule.eval_seed)

    def report(r: EpochReport):
        records.append({"epoch": r.epoch, "updates": r.updates, "train": r.train, "eval": r.eval})
        if on_epoch is not None:
            on_epoch(r)

    layout, _ = trainer.choose_layout(state, real, model)
    with contextlib.nullcontext(stop) if stop is not None else StopSignal() as stop:
        if stop.signum is None:
            state, _ = train_epochs(trainer, config.schedule, state, real, model, start_epoch=0, evaluate=evaluate_fn,
                                    checkpoint=lambda s, e: None, on_epoch=report, stop=stop, layout=layout)
    return PopulationResult(configs, list(seeds), records, state, layout)
