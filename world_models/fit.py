"""Fitting the dynamics ensemble: holdout split, compiled epochs, early stopping, elites.

The recipe is MBPO's as kept by OfflineRL-Kit (offlinerlkit/dynamics/ensemble_dynamics.py, `train`)
and mbrl-lib (mbrl/models/model_trainer.py): a holdout of min(20%, 1000) transitions, per-member
bootstrap resampling, Adam at 1e-3 with batch 256, early stopping once no member has improved its
holdout MSE by more than 1% for 5 epochs, each member's best weights kept, and elites the members
with the lowest holdout MSE.

One epoch is one compiled call: a `lax.scan` over minibatches in which all members train as one
batched computation, then the holdout evaluation and a per-member masked select of the best
weights. The host only sees one small array per epoch (for early stopping and the progress bar).
The split, normalizers, epoch loop, checkpoints and the model's record are the one fit's
(`mbrl.world_models.fitting.run_fit`); `EnsembleFit` is the ensemble's part of it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from mbrl.core.errors import ConfigError, DatasetError
from mbrl.core.types import OfflineDataset, Transitions
from mbrl.world_models.base import Normalizer
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble, ensemble_loss, init_params, observation_indices
from mbrl.world_models.fitting import (  # noqa: F401 (CHECKPOINT_DIR, FitInterrupted: re-exported to their importers)
    CHECKPOINT_DIR, FitConfigBase, FitData, FitInterrupted, FitResult, choose_eval_episodes, fit_normalizers,
    model_inputs, model_targets, run_fit,
)
from mbrl.world_models.model import WorldModel

HOLDOUT_CHUNK = 2048  # rows per step of the chunked holdout evaluation


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
# Host side: the split, the normalizers, the ensemble's part of the fit


def without_inputs(norm: Normalizer, dims: tuple[int, ...], obs_dim: int) -> Normalizer:
    """`norm` with observation dimensions `dims` scaled to 0 (an infinite std): the members cannot depend on them,
    and a saved model keeps the choice in its normaliser."""
    if not observation_indices("ensemble.invariant_obs_dims", dims, obs_dim):
        return norm
    index = jnp.asarray(dims)
    return Normalizer(mean=norm.mean.at[index].set(0.0), std=norm.std.at[index].set(jnp.inf))



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



@dataclasses.dataclass(frozen=True)
class RowSplit:
    """The ensemble's split: training rows, holdout rows (random transitions) and what records it."""

    train: Transitions
    holdout: Transitions
    info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EnsembleFit:
    """The ensemble's part of the one fit (`mbrl.world_models.fitting.run_fit`): a row split, bootstrap rows per
    member, one compiled epoch over minibatches, each member's best weights, elites by holdout MSE."""

    config: EnsembleConfig
    fit_config: FitConfig
    model_class = WorldModel

    def split(self, data: FitData, rng: np.random.Generator) -> RowSplit:
        """Random holdout rows and whole eval episodes of the data, or of its held-out file (then every row trains)."""
        transitions, heldout = data.transitions, data.heldout
        if heldout is not None:
            _, holdout_rows, eval_episodes = split_rows(len(heldout), np.asarray(heldout.episode_starts),
                                                        self.fit_config, rng, from_heldout_file=True)
            train, holdout = transitions, heldout.transitions.slice(holdout_rows)
        else:
            train_rows, holdout_rows, eval_episodes = split_rows(len(transitions), data.episode_starts,
                                                                 self.fit_config, rng)
            train, holdout = transitions.slice(train_rows), transitions.slice(holdout_rows)
        info = {"holdout_rows": tuple(int(r) for r in holdout_rows),
                "eval_episodes": tuple(int(e) for e in eval_episodes)}
        return RowSplit(train, holdout, info)

    def normalizers(self, train: Transitions) -> tuple[Normalizer, Normalizer]:
        input_norm, target_norm = fit_normalizers(train)
        return without_inputs(input_norm, self.config.invariant_obs_dims, train.obs_dim), target_norm

    def start(self, split: RowSplit, norms):
        config, fit_config = self.config, self.fit_config
        input_norm, target_norm = norms
        network = GaussianEnsemble(config, split.train.obs_dim + 1)
        key = jax.random.PRNGKey(fit_config.seed)
        key, init_key, rows_key = jax.random.split(key, 3)
        train_x = model_inputs(split.train)
        params = init_params(network, init_key, train_x.shape[1])
        n, members = len(split.train), config.num_members
        if fit_config.sampling == "bootstrap":
            rows = jax.random.randint(rows_key, (members, n), 0, n, dtype=jnp.int32)
        else:
            rows = jnp.tile(jnp.arange(n, dtype=jnp.int32), (members, 1))
        data = DeviceData(
            inputs=input_norm.normalize(jnp.asarray(train_x)),
            targets=target_norm.normalize(jnp.asarray(model_targets(split.train))),
            terminals=jnp.asarray(split.train.terminal, bool),
            holdout_inputs=input_norm.normalize(jnp.asarray(model_inputs(split.holdout))),
            holdout_targets=target_norm.normalize(jnp.asarray(model_targets(split.holdout))),
        )
        state = TrainState(params=params, opt_state=make_optimizer(fit_config.learning_rate).init(params),
                           best_params=jax.tree.map(jnp.copy, params),
                           best_mse=jnp.full((members,), jnp.inf, jnp.float32), rows=rows)
        epoch_fn = functools.partial(run_epoch, network=network, learning_rate=fit_config.learning_rate,
                                     batch_size=fit_config.batch_size, sampling=fit_config.sampling)

        def advance(state, epoch_key):
            state, train_loss, mse = epoch_fn(state, data, epoch_key)
            mse = np.asarray(mse, np.float64)
            if not np.isfinite(mse).any():
                raise DatasetError("the dynamics ensemble diverged (non-finite holdout loss); check the dataset's scale")
            return state, train_loss, mse, mse

        return state, key, advance

    def describe(self, mse, stopping) -> str:
        elite_mse = np.sort(mse)[: self.config.num_elites].mean()
        return f"holdout mse {elite_mse:.4g} (elites) · no gain for {stopping.since_improved}/{self.fit_config.patience}"

    def finish(self, state: TrainState):
        best_mse = np.asarray(state.best_mse, np.float64)
        elites = np.sort(np.argsort(best_mse, kind="stable")[: self.config.num_elites]).astype(np.int32)
        return state.best_params, elites, best_mse


def fit_world_model(data: OfflineDataset | Transitions, *, config: EnsembleConfig = EnsembleConfig(),
                    fit_config: FitConfig = FitConfig(), **options: Any) -> FitResult:
    """Fit the ensemble on `data` and wrap it in a `WorldModel` that records the split; `options`: those of
    `mbrl.world_models.fitting.run_fit` (termination_fn, reward_fn, source, task, progress, control)."""
    return run_fit(EnsembleFit(config, fit_config), data, **options)
