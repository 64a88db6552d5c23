"""A training run: `run(config, run_dir)` trains into a run directory (config.json, run.json, world_model*/,
checkpoints/, metrics.jsonl, learning_curve.png) and `load_run(run_dir)` reads one back, as `mbrl eval`, `mbrl export`
and `--resume` do. `prepare_run` sets a run up (everything decided before its first update, a `RunSpec`); `run`
trains it. The compiled program is `mbrl.trainer`; a population of configurations without a run directory (sweeps)
is `mbrl.population`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from mbrl import config as config_io
from mbrl import datasets, rules
from mbrl.agents import registry
from mbrl.agents.base import AlgorithmEntry, capability
from mbrl.agents.networks import ObsScale
from mbrl.checkpoint import Checkpointer
from mbrl.config import TrainConfig
from mbrl.core.errors import ConfigError, DatasetError
from mbrl.core.files import write_text_atomic
from mbrl.core.score import evaluation_record, normalized_score, reference_scores, scores_of
from mbrl.core.signals import StopSignal
from mbrl.core.types import OfflineDataset
from mbrl.datasets.profile import profile_data
from mbrl.envs.tasks import Task, find_task
from mbrl.logging import (METRICS_FILE, Progress, RunLogger, mean_stderr, plot_learning_curve, read_metrics,
                          truncate_metrics)
from mbrl.ope.model_return import model_returns
from mbrl.selection import check_selection, select_checkpoint, write_selection
from mbrl.trainer import (EpochReport, Trainer, TrainState, hypers_of, observation_scale, shard_population,
                          stack_models, train_epochs, trainer_for)
from mbrl.world_models import registry as model_registry
from mbrl.world_models.base import ModelInfo
from mbrl.world_models.fitting import CHECKPOINT_DIR, FitControl


@dataclasses.dataclass
class RunResult:
    run_dir: Path
    config: TrainConfig
    epochs_done: int
    records: list[dict]  # metrics.jsonl, all epochs of the run (also those before a resume)
    final_eval: dict | None  # the last evaluation's per-seed results
    dataset_score: float | None  # the dataset's own mean normalized score (episode returns)
    interrupted: int | None  # the signal that stopped the run early, if any
    seconds: float


OFFLINE_STARTS = 64  # dataset start states per elite of the model-based estimate in a run's evaluation


def offline_evaluation(trainer: Trainer, state: TrainState, *, world_model, dataset, ref_scores, seed: int = 0) -> dict:
    """The evaluation record of a run with no simulator: per member, the mean greedy return in the world model over
    its elites (from the dataset's start states, an episode's length) and its spread over elites, normalized where
    reference scores exist; `estimate` says it is one."""
    horizon = int(dataset.episode_lengths().max())
    returns = model_returns(trainer, state, world_model, dataset, starts=OFFLINE_STARTS, horizon=horizon, seed=seed)
    return evaluation_record(returns, ref_scores, estimate="model")


def dataset_reference_scores(dataset, task) -> tuple[float, float] | None:
    return reference_scores(dataset.info.ref_min_score, dataset.info.ref_max_score, task)


def _dataset_score(dataset, ref_scores) -> float | None:
    """The dataset's own mean normalized score (its episodes' returns), where reference scores exist."""
    if ref_scores is None or not dataset.num_episodes:
        return None
    return float(normalized_score(dataset.episode_returns().mean(), *ref_scores))


def _model_paths(config: TrainConfig, run_dir: Path, world_model_dir: Path | None) -> list[Path]:
    if world_model_dir is not None:
        if config.imagination.per_seed_model:
            raise ConfigError("--world-model gives one model; it cannot be combined with imagination.per_seed_model")
        return [Path(world_model_dir).absolute()]
    if config.imagination.per_seed_model:
        return [run_dir / f"world_model_seed{s}" for s in config.seed_list]
    return [run_dir / "world_model"]


def fit_model(config: TrainConfig, dataset, task, seed_offset: int = 0, progress: bool = False, *,
              entry: AlgorithmEntry | None = None, control: FitControl | None = None):
    """A world model of the kind the algorithm fits (`mbrl.agents.registry.AlgorithmEntry.model_kind`, an entry of
    `mbrl.world_models.registry`), with `config`'s sections of that kind (fit seed + `seed_offset`). `entry`:
    `config.algo`'s registry entry where the caller holds it; `control`: checkpoints."""
    entry = registry.entry(config.algo) if entry is None else entry
    task_fns = task.model_fns() if task is not None else {}
    kind = model_registry.kind(entry.model_kind)
    architecture, fit_config = kind.configs(config)
    fit_config = dataclasses.replace(fit_config, seed=fit_config.seed + seed_offset)
    return kind.fit(dataset, config=architecture, fit_config=fit_config, progress=progress, control=control,
                    **task_fns).model


def world_models_for(config: TrainConfig, dataset, task, paths: list[Path], progress: bool, *,
                     entry: AlgorithmEntry | None = None, stop: StopSignal | None = None):
    """Load each model that exists, fit (and save) the others; one pytree, seed-stacked when per seed. `entry`:
    `config.algo`'s registry entry where the caller holds it. `stop`: a signal stops a fit after its running epoch,
    with a checkpoint (`mbrl.world_models.fit.FitInterrupted`)."""
    entry = registry.entry(config.algo) if entry is None else entry
    task_fns = task.model_fns() if task is not None else {}
    kind = model_registry.kind(entry.model_kind)
    models = []
    for index, path in enumerate(paths):
        if (path / "model.json").is_file():
            saved = model_registry.saved_kind(path)
            model = saved.load(path, **task_fns)
            if saved.is_recurrent and not kind.is_recurrent:
                raise ConfigError(f"world model {path}: a recurrent world model (RWM-U) reads a history before it "
                                  f"predicts, and {config.algo} imagines from single states; give it an MLP "
                                  "ensemble (`mbrl model fit`), or use --algo mopo-ppo")
            models.append(model)
            continue
        seed_offset = config.seed_list[index] if config.imagination.per_seed_model else 0
        # A long fit (the paper presets fit to early stopping) checkpoints on the way: a run killed during it
        # continues the fit on `mbrl train --resume`. The saved model then replaces the checkpoints.
        checkpointer = Checkpointer(path / CHECKPOINT_DIR, max_to_keep=1)
        try:
            identity = {name: dataclasses.asdict(getattr(config, name)) for name in kind.sections}
            identity.update(dataset=dataset.info.name, rows=len(dataset), seed_offset=seed_offset)
            control = FitControl(checkpointer, resume=checkpointer.latest_epoch() is not None, stop=stop,
                                 identity=identity)
            model = fit_model(config, dataset, task, seed_offset, progress, entry=entry, control=control)
        finally:
            checkpointer.close()
        kind.save(model, path)
        models.append(model)
    for model in models:
        if model.obs_dim != dataset.info.obs_dim or model.act_dim != dataset.info.act_dim:
            raise ConfigError(
                f"world model {paths[0]}: obs/act dims {model.obs_dim}/{model.act_dim} do not match the dataset's "
                f"{dataset.info.obs_dim}/{dataset.info.act_dim}"
            )
    # Static metadata (where it was fitted) would make each model a new jit cache entry: drop it here.
    models = [m.replace(info=ModelInfo()) for m in models]
    return models[0] if len(models) == 1 and not config.imagination.per_seed_model else stack_models(models)


RUN_FILE = "run.json"  # facts a run needs besides its config: world-model paths, task, reference scores
PROFILE_FILE = "profile.json"  # the data's profile and what the rules would choose (`mbrl data profile`)


def _write_json(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def read_run_facts(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(Path(path).absolute().relative_to(run_dir.absolute()))
    except ValueError:
        return str(Path(path).absolute())


@dataclasses.dataclass
class RunSpec:
    """A run as `prepare_run` sets it up: everything decided before its first update. Its checkpointer and logger
    are open; `run` trains it and closes them."""

    config: TrainConfig
    run_dir: Path
    entry: AlgorithmEntry  # config.algo's registry entry, resolved once
    seeds: list[int]
    progress: bool  # show a progress bar (and the world models' fits)
    dataset: OfflineDataset
    task: Task | None
    ref_scores: tuple[float, float] | None
    dataset_score: float | None  # the dataset's own mean normalized score (episode returns)
    obs_scale: ObsScale | None
    model_paths: list[Path]  # the world models' directories (used only where the algorithm has a model)
    trainer: Trainer
    real: object  # the dataset as the trainer samples it, sharded
    world_model: object | None  # the model pytree (seed-stacked where per seed), sharded
    checkpointer: Checkpointer
    state: TrainState  # the state training starts from (the last checkpoint's when resumed), sharded
    start_epoch: int
    layout: str  # how the members' updates are laid out (`Trainer.choose_layout`)
    evaluate: Callable[[TrainState], dict] | None
    logger: RunLogger
    title: str  # of the progress bar and the learning curve

    def save_checkpoint(self, state: TrainState, epoch: int) -> None:
        record = {
            "epoch": epoch,
            "updates": epoch * self.config.schedule.updates_per_epoch,
            "seeds": self.seeds,
            "world_models": [_relative(p, self.run_dir) for p in self.model_paths] if self.trainer.uses_model else [],
        }
        # Host copies: orbax keeps a sharded array's device layout and refuses to restore it onto another
        # device count (`mbrl eval` on a smaller machine); the save copies to the host anyway.
        self.checkpointer.save(epoch, jax.device_get(state), record)


def prepare_run(
    config: TrainConfig | None,
    run_dir: str | Path,
    *,
    resume: bool = False,
    world_model_dir: str | Path | None = None,
    dataset=None,
    progress: bool | None = None,
    stop: StopSignal | None = None,
) -> RunSpec:
    """Set up the run `run` trains (the same arguments): writes config.json and run.json, loads or fits (and saves)
    the world models, cuts metrics.jsonl back to the start epoch and opens the checkpointer and the logger.
    `stop`: a signal during a world model's fit raises `FitInterrupted` once its checkpoint is saved."""
    run_dir = Path(run_dir).absolute()
    config, loaded, model_paths = _config_and_model_paths(config, run_dir, resume, world_model_dir)
    facts = loaded.facts if loaded is not None else None
    entry = registry.entry(config.algo)
    check_selection(config)
    progress = config.logging.progress if progress is None else progress

    # The dataset and its task first: a bad file or declaration leaves no run directory behind.
    dataset = dataset if dataset is not None else datasets.load(config.dataset, task=config.task)
    task = find_task(dataset.info.task)
    # A resumed run keeps the scale it started with (the dataset file may have changed since); a new one's is checked
    # against the dataset (ignore_obs_dims) before anything is written.
    obs_scale = ObsScale.from_json(facts.get("obs_scale")) if facts else observation_scale(config, dataset)
    if not resume:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_io.save(config, run_dir / "config.json")
    ref_scores = dataset_reference_scores(dataset, task)
    dataset_score = _dataset_score(dataset, ref_scores)
    _write_json(run_dir / RUN_FILE, _run_facts(run_dir, entry, model_paths, dataset, task, ref_scores, dataset_score,
                                               obs_scale))
    if not resume:
        _write_json(run_dir / PROFILE_FILE, _profile(dataset, config))

    trainer = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim, obs_scale)
    data_notice = capability(trainer.agent, "data_notice")  # `mbrl.agents.base.DataNoticer`
    notice = data_notice(dataset.transitions.action) if data_notice is not None and not resume else None
    if notice:
        print(f"mbrl train: {notice}", file=sys.stderr)
    real = trainer.real_data(dataset)
    world_model = (world_models_for(config, dataset, task, model_paths, progress, entry=entry, stop=stop)
                   if trainer.uses_model else None)
    # Choosing a checkpoint after training needs them all.
    checkpointer = Checkpointer(run_dir / "checkpoints", max_to_keep=None if config.select.by != "last" else 2)
    state, start_epoch = _start_state(trainer, config, loaded, run_dir)
    # A restored state comes back unsharded: (re)shard it here, as a fresh one.
    state, real, world_model = shard_population(state, real, world_model, per_member_model=trainer.per_member_model)
    layout = _member_layout(trainer, state, real, world_model, facts, run_dir)
    evaluate = _evaluator(config, trainer, task, dataset, world_model, ref_scores)

    logger = RunLogger(run_dir, tensorboard=config.logging.tensorboard, wandb=config.logging.wandb,
                       wandb_project=config.logging.wandb_project, config=config_io.to_dict(config))
    return RunSpec(
        config=config, run_dir=run_dir, entry=entry, seeds=config.seed_list, progress=progress, dataset=dataset,
        task=task, ref_scores=ref_scores, dataset_score=dataset_score, obs_scale=obs_scale, model_paths=model_paths,
        trainer=trainer, real=real, world_model=world_model, checkpointer=checkpointer, state=state,
        start_epoch=start_epoch, layout=layout, evaluate=evaluate, logger=logger,
        title=f"{config.algo.upper()} · {config_io.dataset_key(config.dataset)}",
    )


def _profile(dataset, config: TrainConfig) -> dict:
    """The data's profile (`mbrl data profile`) and what the rules choose from it for this run's algorithm and update
    budget (what `--preset auto` sets; under another preset, for comparison)."""
    try:
        found = profile_data(dataset)
    except DatasetError as exc:
        return {"skipped": str(exc)}
    # From quick's values at this run's budget: what `--preset auto` sets (or would set) for this algorithm.
    base = config_io.quick_base(config.algo, config.dataset)
    placed = rules.choices_for(found, config_io.updates_of(config),
                               {name: getattr(base, name) for name in registry.entry(config.algo).sections})
    if config.preset == config_io.AUTO:
        for section, choice in placed:
            where = f"{section}." if section else ""
            print(f"mbrl train: preset auto: {where}{choice.field} {choice.value} ({choice.fact})", file=sys.stderr)
    return {**found.to_json(), "choices": rules.placed_table(placed)}


def _config_and_model_paths(config: TrainConfig | None, run_dir: Path, resume: bool,
                            world_model_dir: str | Path | None) -> tuple[TrainConfig, LoadedRun | None, list[Path]]:
    """The run's config, the run read back when resumed, and its world models' paths (a resumed run's own)."""
    if resume:
        loaded = load_run(run_dir, require_checkpoint=False)
        facts = loaded.facts
        if facts:
            paths = [run_dir / p for p in facts["world_models"]]
        else:
            paths = _model_paths(loaded.config, run_dir, world_model_dir)
        return loaded.config, loaded, paths
    if (run_dir / "config.json").exists():
        raise ConfigError(f"{run_dir}: already holds a run; continue it with --resume {run_dir} or choose another --run-dir")
    return config, None, _model_paths(config, run_dir, world_model_dir)


def _run_facts(run_dir: Path, entry: AlgorithmEntry, model_paths: list[Path], dataset, task, ref_scores,
               dataset_score: float | None, obs_scale: ObsScale | None) -> dict:
    """run.json as a run starts (the members' layout follows once it is chosen)."""
    return {
        "world_models": [_relative(p, run_dir) for p in model_paths] if entry.uses_model else [],
        # A declared robot by its file, so later commands (export, finetune, evaluate) can register it again.
        "task": None if task is None else (task.declaration or task.name),
        "ref_scores": list(ref_scores) if ref_scores is not None else None,
        "obs_dim": dataset.info.obs_dim,
        "act_dim": dataset.info.act_dim,
        "dataset_score": dataset_score,
        "obs_scale": None if obs_scale is None else obs_scale.to_json(),
    }


def _state_shape(trainer: Trainer, config: TrainConfig):
    """The shapes of a fresh population state: what a checkpoint is restored into."""
    seeds = config.seed_list
    return jax.eval_shape(trainer.initial_state, seeds, [hypers_of(config)] * len(seeds))


def _start_state(trainer: Trainer, config: TrainConfig, loaded: LoadedRun | None,
                 run_dir: Path) -> tuple[TrainState, int]:
    """The state training starts from and its epoch: a resumed run's last checkpoint, else a fresh population.
    metrics.jsonl keeps only the records up to that epoch."""
    if loaded is not None and loaded.state is not None:
        state, start_epoch = loaded.state, int(loaded.record["epoch"])
    else:
        seeds = config.seed_list
        state, start_epoch = trainer.initial_state(seeds, [hypers_of(config)] * len(seeds)), 0
    truncate_metrics(run_dir / METRICS_FILE, start_epoch)
    return state, start_epoch


def _member_layout(trainer: Trainer, state: TrainState, real, world_model, facts: dict | None, run_dir: Path) -> str:
    """How the members' updates are laid out, added to run.json."""
    # A resumed run keeps its members' layout: the two give different roundings.
    if facts:  # a run from before the choice existed was vmapped
        layout, measured = facts.get("member_layout", "vmap"), facts.get("member_layout_rule")
    else:
        layout, measured = trainer.choose_layout(state, real, world_model)
    _write_json(run_dir / RUN_FILE, {**read_run_facts(run_dir), "member_layout": layout, "member_layout_rule": measured})
    return layout


def _evaluator(config: TrainConfig, trainer: Trainer, task: Task | None, dataset, world_model,
               ref_scores) -> Callable[[TrainState], dict] | None:
    """An evaluation of the population: in the task's simulator, else in a world model the members share, else none."""
    if task is not None and task.has_env:
        return functools.partial(trainer.evaluate, task=task, seeds=config.seed_list, ref_scores=ref_scores,
                                 episodes=config.schedule.eval_episodes, eval_seed=config.schedule.eval_seed)
    if world_model is not None and not trainer.per_member_model:
        # No simulator: each evaluation records the model-based estimate (the sweep's offline objective).
        return functools.partial(offline_evaluation, trainer, world_model=world_model, dataset=dataset,
                                 ref_scores=ref_scores, seed=config.seed)
    return None


def _epoch_reporter(spec: RunSpec, bar: Progress,
                    on_epoch: Callable[[EpochReport], None] | None) -> Callable[[EpochReport], None]:
    """What the host does after each epoch: its record to metrics.jsonl (and the trackers), the bar, `on_epoch`."""
    last_status = ""

    def report(r: EpochReport):
        nonlocal last_status
        record = {"epoch": r.epoch, "updates": r.updates, "seeds": spec.seeds, "train": r.train}
        if r.eval is not None:
            record["eval"] = r.eval
            mean, stderr = mean_stderr(scores_of(r.eval))
            record["score_mean"], record["score_stderr"] = mean, stderr
            last_status = f"score {mean:.1f} ± {stderr:.1f}"
        spec.logger.log(record)
        bar.update(r.epoch, last_status)
        if on_epoch is not None:
            on_epoch(r)

    return report


def _select(spec: RunSpec) -> None:
    """Judge every checkpoint as `config.select` says and write the choice (selected.json)."""
    selection = select_checkpoint(spec.trainer, spec.checkpointer, _state_shape(spec.trainer, spec.config),
                                  spec.dataset, spec.world_model, spec.config, progress=spec.progress)
    write_selection(spec.run_dir, selection)


def run(config: TrainConfig | None, run_dir: str | Path, *, on_epoch: Callable[[EpochReport], None] | None = None,
        **setup) -> RunResult:
    """Train as `config` says into `run_dir`, or (`resume=True`) continue the run there from its last checkpoint.

    `setup`: `prepare_run`'s options, `resume`, `world_model_dir`, `dataset` (an already loaded `OfflineDataset`,
    else `mbrl.datasets.load(config.dataset)`) and `progress`.
    `on_epoch`: called on the host after each epoch's record is written (tests, scripts).
    A SIGINT or SIGTERM stops the run after its running epoch, with a checkpoint (`RunResult.interrupted`); during
    its world model's fit, after the fit's running epoch, raising `mbrl.world_models.fit.FitInterrupted`.
    """
    start_time = time.perf_counter()
    with StopSignal() as stop:
        spec = prepare_run(config, run_dir, stop=stop, **setup)
        config, schedule = spec.config, spec.config.schedule
        with Progress(schedule.epochs, spec.start_epoch, spec.title, enabled=spec.progress) as bar:
            report = _epoch_reporter(spec, bar, on_epoch)
            try:
                _, epochs_done = train_epochs(spec.trainer, schedule, spec.state, spec.real, spec.world_model,
                                              start_epoch=spec.start_epoch, evaluate=spec.evaluate,
                                              checkpoint=spec.save_checkpoint, on_epoch=report, stop=stop,
                                              layout=spec.layout)
                interrupted = stop.signum
                if config.select.by != "last" and not interrupted and epochs_done == schedule.epochs:
                    _select(spec)
            finally:
                spec.logger.close()
                spec.checkpointer.close()

    records = read_metrics(spec.run_dir / METRICS_FILE)
    plot_learning_curve(records, spec.run_dir / "learning_curve.png", spec.title)
    evals = [r["eval"] for r in records if r.get("eval")]
    return RunResult(
        run_dir=spec.run_dir,
        config=config,
        epochs_done=epochs_done,
        records=records,
        final_eval=evals[-1] if evals else None,
        dataset_score=spec.dataset_score,
        interrupted=interrupted,
        seconds=time.perf_counter() - start_time,
    )


@dataclasses.dataclass
class LoadedRun:
    """A run directory as `mbrl eval`, `mbrl export` and `--resume` read it."""

    run_dir: Path
    config: TrainConfig
    facts: dict | None  # run.json (None: the run never started training)
    trainer: Trainer | None  # None without run.json (the dimensions are unknown)
    seeds: list[int]
    state: TrainState | None  # the latest checkpoint's population state (None: no checkpoint yet)
    record: dict | None  # the latest checkpoint's record (epoch, updates, seeds)

    def actor_params(self, member: int = 0):
        """Member `member`'s policy parameters (host arrays)."""
        if not 0 <= member < len(self.seeds):
            raise ConfigError(f"--seed-index: the run trained {len(self.seeds)} seed(s) {self.seeds}, found index {member}")
        return jax.tree.map(lambda x: np.asarray(x[member]), self.trainer.agent.actor_params(self.state.agent))


def load_run(run_dir: str | Path, *, require_checkpoint: bool = True, epoch: int | None = None) -> LoadedRun:
    """The config, facts, trainer and latest checkpoint (or the one of `epoch`) of a run directory written by
    `mbrl train`."""
    run_dir = Path(run_dir).absolute()
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no config.json); expected a directory written by `mbrl train`")
    config = config_io.load(run_dir / "config.json")
    facts = read_run_facts(run_dir)
    seeds = config.seed_list
    if facts is None:
        if require_checkpoint:
            raise ConfigError(f"{run_dir / RUN_FILE}: missing; the run did not start training")
        return LoadedRun(run_dir, config, None, None, seeds, None, None)
    trainer = trainer_for(config, int(facts["obs_dim"]), int(facts["act_dim"]), ObsScale.from_json(facts.get("obs_scale")))
    checkpointer = Checkpointer(run_dir / "checkpoints")
    try:
        if checkpointer.latest_epoch() is None:
            if require_checkpoint:
                raise ConfigError(f"{run_dir / 'checkpoints'}: no checkpoint; train the run for at least one checkpoint first")
            return LoadedRun(run_dir, config, facts, trainer, seeds, None, None)
        state, record = checkpointer.restore(_state_shape(trainer, config), epoch)
    finally:
        checkpointer.close()
    return LoadedRun(run_dir, config, facts, trainer, seeds, state, record)
