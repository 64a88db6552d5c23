"""Fitting the dynamics ensemble: holdout split, compiled epochs, early stopping, elites.

The recipe is MBPO's as kept by OfflineRL-Kit (offlinerlkit/dynamics/ensemble_dynamics.py, `train`)
and mbrl-lib (mbrl/models/model_trainer.py): a holdout of min(20%, 1000) transitions, per-member
bootstrap resampling, Adam at 1e-3 with batch 256, early stopping once no member has improved its
holdout MSE by more than 1% for 5 epochs, each member's best weights kept, and elites the members
with the lowest holdout MSE.

One epoch is one compiled call: a `lax.scan` over minibatches in which all members train as one
batched computation, then the holdout evaluation and a per-member masked select of the best
weights. The host only sees one small array per epoch (for early stopping and the progress bar).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mbrl.core.early_stopping import EarlyStopping
from mbrl.core.errors import ConfigError, DatasetError
from mbrl.core.types import OfflineDataset, Transitions
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble, ensemble_loss, init_params, observation_indices
from mbrl.world_models.model import ModelInfo, Normalizer, WorldModel

HOLDOUT_CHUNK = 2048  # rows per step of the chunked holdout evaluation


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


@dataclasses.dataclass(frozen=True)
class FitConfig(FitConfigBase):
    """How the ensemble is fitted (the shared fields: `FitConfigBase`).

    holdout_ratio / max_holdout: random transitions kept out for early stopping and elite choice,
        min(ratio * N, max_holdout) rows (MBPO / OfflineRL-Kit: 0.2 and 1000).
    sampling: "bootstrap" (each member trains on its own resample with replacement, reshuffled every
        epoch, as OfflineRL-Kit) or "permutation" (each member sees all data in its own order).
    """

    max_holdout: int = 1000
    sampling: str = "bootstrap"

    def __post_init__(self):
        super().__post_init__()
        self.check_positive_ints("max_holdout")
        if self.sampling not in ("bootstrap", "permutation"):
            raise ConfigError(f"fit.sampling: expected 'bootstrap' or 'permutation', found {self.sampling!r}")


@struct.dataclass
class TrainState:
    params: Any
    opt_state: Any
    best_params: Any
    best_mse: jax.Array  # (M,) holdout MSE of best_params, standardised target units
    rows: jax.Array  # (M, N) int32: each member's training rows (a bootstrap resample or arange)


@struct.dataclass
class DeviceData:
    inputs: jax.Array  # (N, in) standardised
    targets: jax.Array  # (N, out) standardised
    terminals: jax.Array  # (N,) bool
    holdout_inputs: jax.Array
    holdout_targets: jax.Array


@dataclasses.dataclass
class FitResult:
    model: WorldModel
    history: list[dict]  # one entry per epoch: train_loss, holdout_mse (per member)
    stop_reason: str


# ---------------------------------------------------------------------------------------------
# Compiled pieces


def member_holdout_mse(network: GaussianEnsemble, params, inputs, targets) -> jax.Array:
    """Per-member MSE over rows and dims, standardised units, (M,). Chunked so any holdout size fits."""
    n = inputs.shape[0]
    chunk = min(n, HOLDOUT_CHUNK)
    num_chunks = -(-n // chunk)
    pad = num_chunks * chunk - n
    x = jnp.pad(inputs, ((0, pad), (0, 0))).reshape(num_chunks, chunk, -1)
    y = jnp.pad(targets, ((0, pad), (0, 0))).reshape(num_chunks, chunk, -1)
    valid = (jnp.arange(num_chunks * chunk) < n).reshape(num_chunks, chunk)

    def body(total, xs):
        xc, yc, vc = xs
        mean, _, _ = network.apply(params, xc)
        sq = jnp.mean(jnp.square(mean - yc[None]), axis=-1)  # (M, chunk)
        return total + jnp.sum(jnp.where(vc[None], sq, 0.0), axis=1), None

    total, _ = jax.lax.scan(body, jnp.zeros(network.config.num_members), (x, y, valid))
    return total / n


def select_members(improved: jax.Array, new, old):
    """Per member: `new` where improved else `old` (leaves with a leading member axis)."""

    def pick(a, b):
        mask = improved.reshape((-1,) + (1,) * (a.ndim - 1))
        return jnp.where(mask, a, b)

    return jax.tree.map(pick, new, old)


def make_optimizer(learning_rate: float) -> optax.GradientTransformation:
    # Plain Adam: weight decay is an L2 term inside the loss, per layer (OfflineRL-Kit).
    return optax.adam(learning_rate)


def train_steps(network, optimizer, params, opt_state, inputs, targets, terminals, batch_rows):
    """lax.scan of gradient steps; batch_rows (steps, M, B) picks each member's rows per step."""

    def step(carry, rows):
        params, opt_state = carry
        x, y, t = inputs[rows], targets[rows], terminals[rows]
        (loss, _), grads = jax.value_and_grad(
            lambda p: ensemble_loss(network, p, x, y, t), has_aux=True
        )(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), batch_rows)
    return params, opt_state, losses


@functools.partial(
    jax.jit, static_argnames=("network", "learning_rate", "batch_size", "sampling"), donate_argnames=("state",)
)
def run_epoch(state: TrainState, data: DeviceData, key, *, network, learning_rate, batch_size, sampling):
    """One epoch over the training rows, then holdout MSE and the per-member best-weights update."""
    members, n = state.rows.shape
    keys = jax.random.split(key, members)
    # One sort of random keys per member: a fresh order of that member's rows every epoch.
    shuffle = jnp.argsort(jax.vmap(lambda k: jax.random.uniform(k, (n,)))(keys), axis=1)
    order = jnp.take_along_axis(state.rows, shuffle, axis=1)
    num_batches = -(-n // batch_size)
    # Wrap around so every batch is full and shapes stay static.
    wrap = jnp.arange(num_batches * batch_size) % n
    batch_rows = order[:, wrap].reshape(members, num_batches, batch_size).transpose(1, 0, 2)
    optimizer = make_optimizer(learning_rate)
    params, opt_state, losses = train_steps(
        network, optimizer, state.params, state.opt_state, data.inputs, data.targets, data.terminals, batch_rows
    )
    mse = member_holdout_mse(network, params, data.holdout_inputs, data.holdout_targets)
    improved = mse < state.best_mse
    state = TrainState(
        params=params,
        opt_state=opt_state,
        best_params=select_members(improved, params, state.best_params),
        best_mse=jnp.where(improved, mse, state.best_mse),
        rows=state.rows,
    )
    return state, jnp.mean(losses), mse


# ---------------------------------------------------------------------------------------------
# Host side: validation, split, the epoch loop


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


def without_inputs(norm: Normalizer, dims: tuple[int, ...], obs_dim: int) -> Normalizer:
    """`norm` with observation dimensions `dims` scaled to 0 (an infinite std): the members cannot depend on them,
    and a saved model keeps the choice in its normaliser."""
    if not observation_indices("ensemble.invariant_obs_dims", dims, obs_dim):
        return norm
    index = jnp.asarray(dims)
    return Normalizer(mean=norm.mean.at[index].set(0.0), std=norm.std.at[index].set(jnp.inf))


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


def split_rows(n: int, episode_starts: np.ndarray | None, config: FitConfig, rng: np.random.Generator,
               from_heldout_file: bool = False):
    """(train_rows, holdout_rows, eval_episodes): eval episodes whole, the holdout random transitions."""
    eval_episodes = np.zeros(0, np.int64)
    available = np.ones(n, bool)
    if episode_starts is not None and len(episode_starts):
        eval_episodes = choose_eval_episodes(len(episode_starts), config.eval_episodes, rng, from_heldout_file)
        bounds = np.append(episode_starts, n)
        for e in eval_episodes:
            available[bounds[e] : bounds[e + 1]] = False
    rows = np.flatnonzero(available)
    holdout_size = min(int(len(rows) * config.holdout_ratio), config.max_holdout)
    holdout_size = max(holdout_size, 1)
    if len(rows) - holdout_size < 1:
        raise DatasetError(f"dataset has {n} usable transitions; need at least 2 to fit a model with a holdout")
    perm = rng.permutation(rows)
    return np.sort(perm[holdout_size:]), np.sort(perm[:holdout_size]), eval_episodes


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


def fit_ensemble(
    train: Transitions,
    holdout: Transitions,
    *,
    obs_dim: int,
    config: EnsembleConfig = EnsembleConfig(),
    fit_config: FitConfig = FitConfig(),
    progress: bool = False,
    control: FitControl | None = None,
):
    """Fit on `train`, early-stop and choose elites on `holdout` (`control`: checkpoints, `fit_epochs`).

    Returns (params, input_normalizer, target_normalizer, elites, best_mse, history, stop_reason, seconds).
    """
    train_x, train_y = model_inputs(train), model_targets(train)
    input_norm, target_norm = make_normalizer(train_x), make_normalizer(train_y, CONSTANT_TARGET_STD)
    input_norm = without_inputs(input_norm, config.invariant_obs_dims, obs_dim)
    network = GaussianEnsemble(config, obs_dim + 1)
    key = jax.random.PRNGKey(fit_config.seed)
    key, init_key, rows_key = jax.random.split(key, 3)
    params = init_params(network, init_key, train_x.shape[1])
    n, members = len(train), config.num_members
    if fit_config.sampling == "bootstrap":
        rows = jax.random.randint(rows_key, (members, n), 0, n, dtype=jnp.int32)
    else:
        rows = jnp.tile(jnp.arange(n, dtype=jnp.int32), (members, 1))
    data = DeviceData(
        inputs=input_norm.normalize(jnp.asarray(train_x)),
        targets=target_norm.normalize(jnp.asarray(train_y)),
        terminals=jnp.asarray(train.terminal, bool),
        holdout_inputs=input_norm.normalize(jnp.asarray(model_inputs(holdout))),
        holdout_targets=target_norm.normalize(jnp.asarray(model_targets(holdout))),
    )
    state = TrainState(
        params=params,
        opt_state=make_optimizer(fit_config.learning_rate).init(params),
        best_params=jax.tree.map(jnp.copy, params),
        best_mse=jnp.full((members,), jnp.inf, jnp.float32),
        rows=rows,
    )
    epoch_fn = functools.partial(
        run_epoch,
        network=network,
        learning_rate=fit_config.learning_rate,
        batch_size=fit_config.batch_size,
        sampling=fit_config.sampling,
    )

    def advance(state, epoch_key):
        state, train_loss, mse = epoch_fn(state, data, epoch_key)
        mse = np.asarray(mse, np.float64)
        if not np.isfinite(mse).any():
            raise DatasetError("the dynamics ensemble diverged (non-finite holdout loss); check the dataset's scale")
        return state, train_loss, mse, mse

    def describe(mse, stopping):
        elite_mse = np.sort(mse)[: config.num_elites].mean()
        return f"holdout mse {elite_mse:.4g} (elites) · no gain for {stopping.since_improved}/{fit_config.patience}"

    state, history, stop_reason, seconds = fit_epochs(advance, state, key, fit_config=fit_config, describe=describe,
                                                      progress=progress, control=control)
    best_mse = np.asarray(state.best_mse, np.float64)
    elites = np.sort(np.argsort(best_mse, kind="stable")[: config.num_elites]).astype(np.int32)
    return state.best_params, input_norm, target_norm, elites, best_mse, history, stop_reason, seconds


def fit_world_model(
    data: OfflineDataset | Transitions,
    *,
    config: EnsembleConfig = EnsembleConfig(),
    fit_config: FitConfig = FitConfig(),
    termination_fn=None,
    reward_fn=None,
    source: str | None = None,
    task: str | None = None,
    progress: bool = True,
    control: FitControl | None = None,
) -> FitResult:
    """Validate, split, fit and wrap the result in a `WorldModel` that records the split (`control`: checkpoints
    and signals, `fit_epochs`).

    A dataset with held-out data (`OfflineDataset.heldout`, a NeoRL-2 `-val` file) is fitted on every row;
    the holdout and the eval episodes come from the held-out data instead."""
    heldout = None
    if isinstance(data, OfflineDataset):
        transitions, episode_starts = data.transitions, np.asarray(data.episode_starts)
        source = source or data.info.source
        task = task or data.info.task
        heldout = data.heldout
    else:
        transitions, episode_starts = data, None
    source = source or "dataset"
    check_shapes(transitions, source)
    check_finite(transitions, source)
    rng = np.random.default_rng(fit_config.seed)
    if heldout is not None:
        check_shapes(heldout.transitions, heldout.info.source)
        _, holdout_rows, eval_episodes = split_rows(len(heldout), np.asarray(heldout.episode_starts), fit_config, rng,
                                                     from_heldout_file=True)
        train, holdout = transitions, heldout.transitions.slice(holdout_rows)
    else:
        train_rows, holdout_rows, eval_episodes = split_rows(len(transitions), episode_starts, fit_config, rng)
        train, holdout = transitions.slice(train_rows), transitions.slice(holdout_rows)
    params, input_norm, target_norm, elites, best_mse, history, stop_reason, seconds = fit_ensemble(
        train,
        holdout,
        obs_dim=transitions.obs_dim,
        config=config,
        fit_config=fit_config,
        progress=progress,
        control=control,
    )
    info = ModelInfo(
        source=source,
        task=task,
        num_transitions=len(transitions),
        holdout_rows=tuple(int(r) for r in holdout_rows),
        eval_episodes=tuple(int(e) for e in eval_episodes),
        holdout_from="heldout" if heldout is not None else "",
        holdout_mse=tuple(float(m) for m in best_mse),
        epochs=len(history),
        fit_seconds=round(seconds, 3),
        stop_reason=stop_reason,
        seed=fit_config.seed,
    )
    model = WorldModel(
        params=params,
        input_norm=input_norm,
        target_norm=target_norm,
        elites=jnp.asarray(elites),
        config=config,
        obs_dim=transitions.obs_dim,
        act_dim=transitions.act_dim,
        info=info,
        termination_fn=termination_fn,
        reward_fn=reward_fn,
    )
    return FitResult(model=model, history=history, stop_reason=stop_reason)

