"""The one fit loop every world-model kind runs (`mbrl.world_models.kind.ModelKind.fit`).

A kind's fit (`mbrl.world_models.fit.EnsembleFit`, `mbrl.world_models.recurrent_fit.RecurrentFit`) says how it splits
the data, what state its epochs carry and how one epoch runs; `run_fit` does the rest, the same for every kind:
the finiteness and shape checks of the data (and of its held-out file), the seeded split, the normalizers, the
epoch loop with early stopping, the progress bar, checkpoints and their resume (`fit_epochs`), and the fitted
model with the record of its split (`ModelInfo`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mbrl.core.early_stopping import EarlyStopping
from mbrl.core.errors import ConfigError, DatasetError
from mbrl.core.types import OfflineDataset, Transitions
from mbrl.world_models.base import ModelInfo, Normalizer


@dataclasses.dataclass(frozen=True)
class FitConfigBase:
    """What every world-model fit has (the MLP ensemble's `fit`, RWM-U's `rwm_fit`).

    holdout_ratio: the share of the data held out for early stopping (and, for the ensemble, the elites).
    eval_episodes: whole episodes kept out of fitting entirely, for `mbrl model eval`; at most 10% of them.
    batch_size / learning_rate: a minibatch (per member) and Adam's learning rate.
    max_epochs / max_seconds: hard limits on top of early stopping (None: no limit).
    patience / min_improvement: stop after `patience` epochs without a relative gain of `min_improvement` in the
        holdout error (for the ensemble, of any member).
    seed: of the split, the initial weights and the minibatches.
    """

    SECTION: ClassVar[str] = "fit"  # the config section, for the messages

    holdout_ratio: float = 0.2
    eval_episodes: int = 2
    batch_size: int = 256
    learning_rate: float = 1e-3
    max_epochs: int | None = None
    max_seconds: float | None = None
    patience: int = 5
    min_improvement: float = 0.01
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.holdout_ratio < 1.0:
            raise ConfigError(f"{self.SECTION}.holdout_ratio: expected a value in (0, 1), found {self.holdout_ratio}")
        self.check_positive_ints("batch_size", "patience")
        if not self.learning_rate > 0.0:
            raise ConfigError(f"{self.SECTION}.learning_rate: expected a value > 0, found {self.learning_rate}")
        if self.max_epochs is not None and self.max_epochs < 1:
            raise ConfigError(f"{self.SECTION}.max_epochs: expected a positive int or None, found {self.max_epochs}")
        if self.max_seconds is not None and self.max_seconds < 0:
            raise ConfigError(f"{self.SECTION}.max_seconds: expected a value >= 0 or None, found {self.max_seconds}")
        if self.eval_episodes < 0:
            raise ConfigError(f"{self.SECTION}.eval_episodes: expected an int >= 0, found {self.eval_episodes}")

    def check_positive_ints(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{self.SECTION}.{name}: expected a positive int, found {value!r}")

    def early_stopping(self) -> EarlyStopping:
        """The fit's stopping rule (`mbrl.core.early_stopping`), started now."""
        return EarlyStopping(self.patience, self.min_improvement, self.max_epochs, self.max_seconds)



# ---------------------------------------------------------------------------------------------
# The data: validation, normalizers, the episodes kept out


def check_finite(transitions: Transitions, source: str = "dataset") -> None:
    """Refuse NaN/Inf with a message naming the field and the first bad row."""
    for name in ("obs", "action", "reward", "next_obs"):
        values = np.asarray(getattr(transitions, name))
        finite = np.isfinite(values)
        if not finite.all():
            bad = finite.reshape(len(values), -1).all(axis=1)
            row = int(np.argmin(bad))
            kind = "NaN" if np.isnan(values[row]).any() else "Inf"
            raise DatasetError(
                f"{source}: field '{name}' has a {kind} at row {row}; the dynamics model needs finite numbers"
            )


def check_shapes(transitions: Transitions, source: str = "dataset") -> None:
    n = len(transitions)
    for name in ("obs", "action", "next_obs"):
        values = np.asarray(getattr(transitions, name))
        if values.ndim != 2 or values.shape[0] != n:
            raise DatasetError(f"{source}: field '{name}' has shape {values.shape}; expected ({n}, dim)")
    if transitions.next_obs.shape != transitions.obs.shape:
        raise DatasetError(
            f"{source}: 'next_obs' has shape {transitions.next_obs.shape}; expected {transitions.obs.shape} like 'obs'"
        )
    for name in ("reward", "terminal"):
        shape = np.asarray(getattr(transitions, name)).shape
        if shape != (n,):
            raise DatasetError(f"{source}: field '{name}' has shape {shape}; expected ({n},)")


# A target column that never changes (Simglucose's patient parameters) is predicted as its constant: scaled by this
# floor, the network's error in it vanishes. Scaled by 1, that error, large beside the column's spread across
# episodes, made open-loop predictions diverge (docs/findings.md).
CONSTANT_TARGET_STD = 1e-6


def make_normalizer(values: np.ndarray, constant_std: float = 1.0) -> Normalizer:
    """Standardise each column; a (near-)constant one is divided by `constant_std`: 1 for inputs (they pass through
    unscaled), `CONSTANT_TARGET_STD` for targets."""
    mean = values.mean(axis=0, dtype=np.float64)
    std = values.std(axis=0, dtype=np.float64)
    std = np.where(std < 1e-6, constant_std, std)
    return Normalizer(mean=jnp.asarray(mean, jnp.float32), std=jnp.asarray(std, jnp.float32))



def model_inputs(transitions: Transitions) -> np.ndarray:
    return np.concatenate([transitions.obs, transitions.action], axis=1).astype(np.float32)


def model_targets(transitions: Transitions) -> np.ndarray:
    delta = transitions.next_obs - transitions.obs
    return np.concatenate([delta, transitions.reward[:, None]], axis=1).astype(np.float32)


def choose_eval_episodes(num_episodes: int, wanted: int, rng: np.random.Generator,
                         from_heldout_file: bool = False) -> np.ndarray:
    """The episodes kept out of fitting entirely, the first draw of the fit's RNG: models of either kind fitted with
    the same seed keep out the same episodes, so their k-step errors compare. At most 10% of a training file's
    episodes; from a held-out (-val) file, which the fit never trains on, all but one (its holdout rows)."""
    count = min(wanted, num_episodes - 1 if from_heldout_file else num_episodes // 10)
    if not count:
        return np.zeros(0, np.int64)
    return np.sort(rng.choice(num_episodes, size=count, replace=False))



class EpochLines:
    """A fit's progress as one line an epoch on stderr, where rich would draw its bar only at the end (a log
    file, a pipe): a long fit in the background shows how far it is."""

    def __init__(self, console: Console):
        self.console, self.epoch, self.total = console, 0, None
        self.start = time.perf_counter()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, description, total=None, completed=0, **fields):
        self.epoch, self.total = completed, total
        return 0

    def update(self, task, advance=1, status=""):
        self.epoch += advance
        of = f"/{self.total}" if self.total is not None else ""
        minutes = (time.perf_counter() - self.start) / 60
        self.console.print(f"fit epoch {self.epoch}{of} ({minutes:.1f} min): {status}", highlight=False, soft_wrap=True)


def fit_progress(enabled: bool, total: int | None):
    console = Console(stderr=True)
    if enabled and not console.is_terminal:
        return EpochLines(console)
    columns = [TextColumn("[bold]fitting dynamics[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    columns.append(TextColumn("{task.fields[status]}"))
    return Progress(*columns, console=console, disable=not enabled, transient=False)


CHECKPOINT_DIR = "fit-checkpoint"  # a fit's checkpoints, inside the directory its model will replace


@dataclasses.dataclass
class FitControl:
    """What a caller (`mbrl model fit`) lends a fit so that it can be stopped and continued.

    checkpointer: saves `(epoch, state, record)` and restores the latest (`mbrl.checkpoint.Checkpointer`).
    every_seconds: wall time between checkpoints.
    resume: continue from the checkpointer's latest checkpoint instead of starting afresh.
    stop: an object whose `signum` turns non-None on SIGINT/SIGTERM (`mbrl.core.signals.StopSignal`): the fit saves a
        checkpoint after the running epoch and raises `FitInterrupted`.
    identity: what the fit is (its options, its data; JSON), kept in every checkpoint: a resume whose identity
        differs is refused rather than continuing another fit.
    """

    checkpointer: Any
    every_seconds: float = 300.0
    resume: bool = False
    stop: Any = None
    identity: dict | None = None


class FitInterrupted(Exception):
    """A fit stopped by a signal, after saving a checkpoint at `epoch`."""

    def __init__(self, signum: int, epoch: int):
        super().__init__(f"the fit was interrupted by signal {signum} after epoch {epoch}")
        self.signum, self.epoch = signum, epoch


def fit_epochs(advance, state, key, *, fit_config: FitConfigBase, describe, progress: bool,
               control: FitControl | None = None):
    """The epoch loop of every fit. `advance(state, key) -> (state, train_loss, mse, tracked)` runs one epoch
    (`mse`: the holdout error per member or head, recorded; `tracked`: what early stopping watches) and
    `describe(mse, stopping)` words it for the progress bar. Returns (state, history, stop_reason, seconds) once
    `fit_config`'s stopping rule says so; with `control`, checkpoints on the way and continues from one."""
    stopping = fit_config.early_stopping()
    history, seconds_before = [], 0.0
    if control is not None and control.resume:
        restored, record = control.checkpointer.restore({"state": state, "key": key})
        recorded = record.get("identity")
        if None not in (recorded, control.identity) and recorded != json.loads(json.dumps(control.identity)):
            raise ConfigError(f"{control.checkpointer.directory}: the checkpoint of another fit (other options or "
                              "data); remove it to start this one afresh")
        state, key = restored["state"], restored["key"]
        history, seconds_before = list(record["history"]), float(record["seconds"])
        stopping.restore(record["stopping"], seconds_before)
    start = last_save = time.perf_counter()
    with fit_progress(progress, fit_config.max_epochs) as bar:
        task = bar.add_task("fit", total=fit_config.max_epochs, completed=len(history), status="compiling")
        while True:
            key, epoch_key = jax.random.split(key)
            state, train_loss, mse, tracked = advance(state, epoch_key)
            reason = stopping.update(tracked)
            history.append({"epoch": len(history) + 1, "train_loss": float(train_loss), "holdout_mse": mse.tolist()})
            bar.update(task, advance=1, status=describe(mse, stopping))
            if reason is not None:
                return state, history, reason, seconds_before + time.perf_counter() - start
            if control is None:
                continue
            signum = None if control.stop is None else control.stop.signum
            now = time.perf_counter()
            if signum is not None or now - last_save >= control.every_seconds:
                record = {"epoch": len(history), "history": history, "stopping": stopping.to_record(),
                          "seconds": seconds_before + now - start, "identity": control.identity}
                control.checkpointer.save(len(history), {"state": state, "key": key}, record)
                last_save = time.perf_counter()
            if signum is not None:
                raise FitInterrupted(signum, len(history))




# ---------------------------------------------------------------------------------------------
# One fit, whatever the kind


@dataclasses.dataclass
class FitResult:
    model: Any  # the kind's model class (`mbrl.world_models.kind.ModelKind.model_class`)
    history: list[dict]  # one entry per epoch: train_loss, holdout_mse (per member or head)
    stop_reason: str


@dataclasses.dataclass(frozen=True)
class FitData:
    """The data of a fit, checked: its transitions (finite, consistent shapes), its episodes (None for bare
    transitions), its held-out data (a NeoRL-2 `-val` file, checked alike) and the names recorded with the model."""

    transitions: Transitions
    episode_starts: np.ndarray | None
    heldout: OfflineDataset | None
    source: str
    task: str | None

    @classmethod
    def of(cls, data: OfflineDataset | Transitions, source: str | None, task: str | None) -> FitData:
        heldout = episode_starts = None
        if isinstance(data, OfflineDataset):
            transitions, episode_starts, heldout = data.transitions, np.asarray(data.episode_starts), data.heldout
            source, task = source or data.info.source, task or data.info.task
        else:
            transitions = data
        source = source or "dataset"
        check_shapes(transitions, source)
        check_finite(transitions, source)
        if heldout is not None:
            check_shapes(heldout.transitions, cls.heldout_source(heldout, source))
            check_finite(heldout.transitions, cls.heldout_source(heldout, source))
        return cls(transitions, episode_starts, heldout, source, task)

    @staticmethod
    def heldout_source(heldout: OfflineDataset, source: str) -> str:
        return heldout.info.source or f"{source} (held out)"


class Fitter(Protocol):
    """What a kind tells `run_fit`: its configs and model class, and three steps.

    split(data, rng) -> a split with `train` (the transitions its normalizers are fitted on) and `info` (the
        `ModelInfo` fields that record it: holdout rows or episodes, eval episodes);
    start(split, norms) -> (state, key, advance): the epochs' first state, the key they split, and
        `advance(state, key) -> (state, train_loss, mse, tracked)` (`fit_epochs`);
    finish(state) -> (params, elites, best_mse): the kept weights.
    """

    config: Any
    fit_config: FitConfigBase
    model_class: ClassVar[type]

    def split(self, data: FitData, rng: np.random.Generator) -> Any: ...

    def normalizers(self, train: Transitions) -> tuple[Normalizer, Normalizer]: ...

    def start(self, split, norms: tuple[Normalizer, Normalizer]) -> tuple[Any, jax.Array, Any]: ...

    def describe(self, mse: np.ndarray, stopping: EarlyStopping) -> str: ...

    def finish(self, state) -> tuple[Any, np.ndarray, np.ndarray]: ...


def fit_normalizers(train: Transitions) -> tuple[Normalizer, Normalizer]:
    """The inputs' and targets' normalizers over `train` (a constant target column: `CONSTANT_TARGET_STD`)."""
    return make_normalizer(model_inputs(train)), make_normalizer(model_targets(train), CONSTANT_TARGET_STD)


@dataclasses.dataclass
class Trained:
    params: Any
    norms: tuple[Normalizer, Normalizer]
    elites: np.ndarray
    best_mse: np.ndarray
    history: list[dict]
    stop_reason: str
    seconds: float


def train_split(fitter: Fitter, split, *, progress: bool = False, control: FitControl | None = None) -> Trained:
    """Normalize on the split's training rows, run the epochs to their stop, and keep the best weights."""
    norms = fitter.normalizers(split.train)
    state, key, advance = fitter.start(split, norms)
    state, history, stop_reason, seconds = fit_epochs(advance, state, key, fit_config=fitter.fit_config,
                                                      describe=fitter.describe, progress=progress, control=control)
    params, elites, best_mse = fitter.finish(state)
    return Trained(params, norms, elites, best_mse, history, stop_reason, seconds)


def run_fit(fitter: Fitter, data: OfflineDataset | Transitions, *, termination_fn=None, reward_fn=None,
            source: str | None = None, task: str | None = None, progress: bool = True,
            control: FitControl | None = None) -> FitResult:
    """Check, split, fit and wrap the best weights in the kind's model, which records the split (`source` / `task`:
    what to record instead of the dataset's own; `termination_fn` / `reward_fn`: the task's, for imagined steps;
    `control`: checkpoints and signals, `fit_epochs`).

    A dataset with held-out data (`OfflineDataset.heldout`, a NeoRL-2 `-val` file) is fitted on all its own data;
    the holdout and the eval episodes come from the held-out data instead (their indices are its rows or episodes)."""
    data = FitData.of(data, source, task)
    fit_config = fitter.fit_config
    split = fitter.split(data, np.random.default_rng(fit_config.seed))
    trained = train_split(fitter, split, progress=progress, control=control)
    info = ModelInfo(source=data.source, task=data.task, num_transitions=len(data.transitions),
                     holdout_from="heldout" if data.heldout is not None else "",
                     holdout_mse=tuple(float(m) for m in trained.best_mse), epochs=len(trained.history),
                     fit_seconds=round(trained.seconds, 3), stop_reason=trained.stop_reason, seed=fit_config.seed,
                     **split.info)
    input_norm, target_norm = trained.norms
    model = fitter.model_class(
        params=trained.params, input_norm=input_norm, target_norm=target_norm, elites=jnp.asarray(trained.elites),
        config=fitter.config, obs_dim=data.transitions.obs_dim, act_dim=data.transitions.act_dim, info=info,
        termination_fn=termination_fn, reward_fn=reward_fn)
    return FitResult(model=model, history=trained.history, stop_reason=trained.stop_reason)
