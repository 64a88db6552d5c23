"""Fitting RWM-U by autoregressive forecasting (`mbrl.world_models.recurrent`).

A training example is a window of W = history + forecast - 1 consecutive steps of one episode. The shared GRU
reads the first `history` real (observation, action) pairs once, and every head predicts the next step from
its output. Then, for `forecast - 1` more steps, each head feeds on a sample of its own prediction with the
real action, through its own copy of the GRU state; the loss (Gaussian NLL in standardised units) covers every
forecast step. This is rsl_rl_rwm's `SystemDynamicsEnsemble.compute_state_loss` (leggedrobotics/rsl_rl_rwm,
rsl_rl/modules/system_dynamics.py), with two differences:
- the history is read once for all heads: rsl_rl_rwm gives each head its own bootstrap resample of the
  minibatch and so reads the history once per head; here each head weighs the same windows by its own
  multinomial bootstrap counts (the same resample as a weighting), and only the forecast runs per head;
- Gaussian NLL with learned log-variance bounds instead of the squared error of a sample, so the heads' σ
  are calibrated (as the MLP ensemble's).

Adam at 1e-3 with global-norm clipping at 1.0 and minibatches of 1,024 windows are rsl_rl_rwm's
(rsl_rl/algorithms/mbpo_ppo.py `update_system_dynamics`). Early stopping uses whole held-out episodes: after
each epoch of `steps_per_epoch` compiled steps, the heads' forecast MSE (feeding on their means) on the
holdout windows; the best weights are kept and fitting stops after `patience` epochs without a `min_improvement`
relative gain, as the MLP ensemble's fit does.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from mbrl.core.errors import ConfigError, DatasetError
from mbrl.core.types import OfflineDataset, Transitions
from mbrl.world_models.fitting import (
    FitConfigBase, FitData, FitResult, choose_eval_episodes, fit_normalizers, model_targets, run_fit,
)
from mbrl.world_models.recurrent import (
    RecurrentConfig, RecurrentWorldModel, gru_read, gru_step, heads_apply, init_params,
)

HOLDOUT_CHUNK = 1024  # windows per step of the holdout evaluation


@dataclasses.dataclass(frozen=True)
class RecurrentFitConfig(FitConfigBase):
    """How RWM-U is fitted (the shared fields: `mbrl.world_models.fit.FitConfigBase`; its holdout is whole episodes).

    batch_size: windows per gradient step (rsl_rl_rwm: 1,024).
    max_grad_norm: the global gradient-norm clip.
    steps_per_epoch: gradient steps between holdout evaluations (one compiled call).
    holdout_windows: the most holdout windows evaluated (evenly thinned).
    """

    SECTION: ClassVar[str] = "rwm_fit"

    batch_size: int = 1024
    max_grad_norm: float = 1.0
    steps_per_epoch: int = 100
    holdout_windows: int = 2048

    def __post_init__(self):
        super().__post_init__()
        self.check_positive_ints("steps_per_epoch", "holdout_windows")
        if not self.max_grad_norm > 0.0:
            raise ConfigError(f"rwm_fit.max_grad_norm: expected a value > 0, found {self.max_grad_norm}")


@struct.dataclass
class WindowData:
    """The dataset on the device, in episode order, and the first row of every window."""

    obs: jax.Array  # (N, obs_dim) raw
    action: jax.Array  # (N, act_dim) raw
    targets: jax.Array  # (N, obs_dim + 1) standardised (Δobs, reward)
    terminal: jax.Array  # (N,) bool
    train_starts: jax.Array  # (Nw,) int32
    holdout_starts: jax.Array  # (Nh,) int32


def window_starts(episode_starts: np.ndarray, num_rows: int, episodes, width: int) -> np.ndarray:
    """The first rows of every window of `width` steps that lies inside one of `episodes`."""
    bounds = np.append(np.asarray(episode_starts), num_rows)
    parts = [np.arange(bounds[e], bounds[e + 1] - width + 1) for e in episodes]
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)


def _gather(data: WindowData, starts: jax.Array, width: int):
    rows = starts[:, None] + jnp.arange(width)[None, :]  # (B, W)
    return data.obs[rows], data.action[rows], data.targets[rows], data.terminal[rows]


def forecast(params, config: RecurrentConfig, norms, obs, action, key, deterministic: bool):
    """The heads' forecasts over a batch of windows (B, W, ...): standardised means, log-variances (F, E, B, out)
    and termination logits (F, E, B) or None. `key` draws the samples fed back (ignored when deterministic)."""
    input_norm, target_norm = norms
    history, steps = config.history, config.forecast
    obs_dim = obs.shape[-1]
    out_dim = obs_dim + 1
    batch = obs.shape[0]
    x = input_norm.normalize(jnp.concatenate([obs[:, :history], action[:, :history]], axis=-1))
    carry0 = jnp.zeros((batch, config.gru_layers, config.gru_hidden), jnp.float32)
    carry, outputs = gru_read(params, carry0, jnp.swapaxes(x, 0, 1))
    first = heads_apply(params, config, outputs[-1], x[:, -1], out_dim)
    heads = config.num_heads
    carry = jnp.broadcast_to(carry[None], (heads, *carry.shape))  # (E, B, layers, hidden): a copy per head
    prev = jnp.broadcast_to(obs[:, history - 1][None], (heads, batch, obs_dim))

    def body(state, inputs):
        carry, prev, (mean, logvar) = state
        action_k, step_key = inputs
        sample = mean if deterministic else mean + jnp.exp(0.5 * logvar) * jax.random.normal(step_key, mean.shape)
        guess = prev + target_norm.denormalize(sample)[..., :obs_dim]
        x = input_norm.normalize(jnp.concatenate([guess, jnp.broadcast_to(action_k, (heads, *action_k.shape))], -1))
        carry = gru_step(params, carry, x)
        mean, logvar, term = heads_apply(params, config, carry[..., -1, :], x, out_dim)
        return (carry, guess, (mean, logvar)), (mean, logvar, term)

    later_actions = jnp.swapaxes(action[:, history : history + steps - 1], 0, 1)  # (F-1, B, act_dim)
    keys = jax.random.split(key, steps - 1)
    _, (means, logvars, terms) = jax.lax.scan(body, (carry, prev, first[:2]), (later_actions, keys))
    means = jnp.concatenate([first[0][None], means])
    logvars = jnp.concatenate([first[1][None], logvars])
    terms = None if first[2] is None else jnp.concatenate([first[2][None], terms])
    return means, logvars, terms


def forecast_loss(params, config: RecurrentConfig, norms, batch, counts, key):
    """Mean over forecast steps of each head's bootstrap-weighted Gaussian NLL, summed over heads, plus the
    log-variance bound penalty and the termination BCE (with a learned head)."""
    obs, action, targets, terminal = batch
    history, steps = config.history, config.forecast
    means, logvars, terms = forecast(params, config, norms, obs, action, key, deterministic=False)
    y = jnp.swapaxes(targets[:, history - 1 : history - 1 + steps], 0, 1)[:, None]  # (F, 1, B, out)
    nll = jnp.mean(jnp.square(means - y) * jnp.exp(-logvars) + logvars, axis=-1)  # (F, E, B)
    weights = counts / counts.shape[-1]  # (E, B), each head's resample as weights
    loss = jnp.sum(jnp.mean(jnp.sum(nll * weights[None], axis=-1), axis=0))
    spread = jnp.sum(params["max_logvar"]) - jnp.sum(params["min_logvar"])
    loss = loss + config.logvar_bound_penalty * spread / config.num_heads
    if terms is not None:
        labels = jnp.swapaxes(terminal[:, history - 1 : history - 1 + steps], 0, 1)[:, None].astype(jnp.float32)
        bce = jnp.mean(jax.nn.softplus(terms) - labels * terms, axis=0)  # (E, B)
        loss = loss + jnp.sum(jnp.sum(bce * weights, axis=-1))
    return loss


def holdout_mse(params, config: RecurrentConfig, norms, data: WindowData) -> jax.Array:
    """Per head (E,): the forecast MSE of the means (fed back), standardised units, over the holdout windows."""
    width = config.history + config.forecast - 1
    starts = data.holdout_starts
    n = starts.shape[0]
    chunk = min(n, HOLDOUT_CHUNK)
    count = -(-n // chunk)
    padded = jnp.pad(starts, (0, count * chunk - n), mode="edge").reshape(count, chunk)
    valid = (jnp.arange(count * chunk) < n).reshape(count, chunk)

    def body(total, xs):
        part, mask = xs
        obs, action, targets, _ = _gather(data, part, width)
        means, _, _ = forecast(params, config, norms, obs, action, jax.random.PRNGKey(0), deterministic=True)
        y = jnp.swapaxes(targets[:, config.history - 1 :], 0, 1)[:, None]
        sq = jnp.mean(jnp.square(means - y), axis=(0, 3))  # (E, chunk)
        return total + jnp.sum(jnp.where(mask[None], sq, 0.0), axis=1), None

    total, _ = jax.lax.scan(body, jnp.zeros(config.num_heads), (padded, valid))
    return total / n


@functools.partial(jax.jit, static_argnames=("config", "fit_config"), donate_argnames=("params", "opt_state"))
def run_epoch(params, opt_state, data: WindowData, norms, key, *, config: RecurrentConfig,
              fit_config: RecurrentFitConfig):
    """`steps_per_epoch` gradient steps on random windows, then the holdout MSE per head."""
    width = config.history + config.forecast - 1
    optimizer = make_optimizer(fit_config)
    batch, heads = fit_config.batch_size, config.num_heads

    def step(carry, step_key):
        params, opt_state = carry
        pick_key, boot_key, noise_key = jax.random.split(step_key, 3)
        starts = data.train_starts[jax.random.randint(pick_key, (batch,), 0, data.train_starts.shape[0])]
        resample = jax.random.randint(boot_key, (heads, batch), 0, batch)
        counts = jax.vmap(lambda r: jnp.zeros(batch, jnp.float32).at[r].add(1.0))(resample)
        loss, grads = jax.value_and_grad(forecast_loss)(params, config, norms, _gather(data, starts, width), counts,
                                                       noise_key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    keys = jax.random.split(key, fit_config.steps_per_epoch)
    (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), keys)
    return params, opt_state, jnp.mean(losses), holdout_mse(params, config, norms, data)


def make_optimizer(fit_config: RecurrentFitConfig) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(fit_config.max_grad_norm), optax.adam(fit_config.learning_rate))


def split_episodes(num_episodes: int, fit_config: RecurrentFitConfig, rng: np.random.Generator):
    """(train, holdout, eval) episode indices: eval at most 10% of them, the holdout a fraction of the rest."""
    eval_episodes = choose_eval_episodes(num_episodes, fit_config.eval_episodes, rng)
    rest = rng.permutation(np.setdiff1d(np.arange(num_episodes), eval_episodes))
    holdout_count = max(1, int(round(len(rest) * fit_config.holdout_ratio)))
    if len(rest) - holdout_count < 1:
        raise DatasetError(f"dataset has {num_episodes} episode(s); fitting RWM-U needs at least 2 (one to train on, "
                           "one held out)")
    return np.sort(rest[holdout_count:]), np.sort(rest[:holdout_count]), eval_episodes


@dataclasses.dataclass(frozen=True)
class WindowSplit:
    """RWM-U's split: whole episodes. `train`: the rows of the training episodes (for the normalizers); `rows`: every
    row windows are cut from (the data's, then its held-out file's); the windows' first rows; what records it."""

    train: Transitions
    rows: Transitions
    train_starts: np.ndarray
    holdout_starts: np.ndarray
    source: str
    info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RecurrentFit:
    """RWM-U's part of the one fit (`mbrl.world_models.fitting.run_fit`): an episode split, windows of history +
    forecast steps, `steps_per_epoch` compiled steps an epoch, the best weights of all heads together."""

    config: RecurrentConfig
    fit_config: RecurrentFitConfig
    model_class = RecurrentWorldModel
    normalizers = staticmethod(fit_normalizers)

    def split(self, data: FitData, rng: np.random.Generator) -> WindowSplit:
        """Train, holdout and eval episodes of the data, or (held-out data) holdout and eval episodes of its held-out
        file and every episode of the data to train on; the windows inside them (holdout ones evenly thinned)."""
        config, source, transitions = self.config, data.source, data.transitions
        if data.episode_starts is None or len(data.episode_starts) == 0:
            raise DatasetError(f"{source}: no episode boundaries; RWM-U reads histories, so it needs episodes")
        episode_starts, n, width = data.episode_starts, len(transitions), config.history + config.forecast - 1
        if data.heldout is not None:
            held_starts = np.asarray(data.heldout.episode_starts)
            if len(held_starts) < 2:
                raise DatasetError(f"{FitData.heldout_source(data.heldout, source)}: {len(held_starts)} episode(s); "
                                   "the held-out data must hold at least 2")
            # The split of the held-out episodes, as a dataset's own would be split; its training part is unused.
            _, holdout_eps, eval_eps = split_episodes(len(held_starts), self.fit_config, rng)
            train_eps, holdout_in = np.arange(len(episode_starts)), holdout_eps + len(episode_starts)
            # One array of rows: the train file's, then the held-out file's (windows never cross an episode).
            all_starts = np.concatenate([episode_starts, held_starts + n])
            rows = jax.tree.map(lambda a, b: np.concatenate([a, b]), transitions, data.heldout.transitions)
        else:
            train_eps, holdout_eps, eval_eps = split_episodes(len(episode_starts), self.fit_config, rng)
            holdout_in, all_starts, rows = holdout_eps, episode_starts, transitions
        train_starts = window_starts(all_starts, len(rows), train_eps, width)
        holdout_starts = window_starts(all_starts, len(rows), holdout_in, width)
        if len(train_starts) == 0 or len(holdout_starts) == 0:
            raise DatasetError(
                f"{source}: no {'training' if len(train_starts) == 0 else 'holdout'} episode has {width} steps "
                f"(rwm.history {config.history} + rwm.forecast {config.forecast} - 1); shorten the history or forecast")
        if len(holdout_starts) > self.fit_config.holdout_windows:
            keep = np.linspace(0, len(holdout_starts) - 1, self.fit_config.holdout_windows).round().astype(int)
            holdout_starts = holdout_starts[keep]
        bounds = np.append(episode_starts, n)
        train_rows = np.concatenate([np.arange(bounds[e], bounds[e + 1]) for e in train_eps])
        info = {"eval_episodes": tuple(int(e) for e in eval_eps), "holdout_episodes": tuple(int(e) for e in holdout_eps)}
        return WindowSplit(transitions.slice(train_rows), rows, train_starts, holdout_starts, source, info)

    def start(self, split: WindowSplit, norms):
        config, fit_config, rows = self.config, self.fit_config, split.rows
        device = WindowData(
            obs=jnp.asarray(rows.obs), action=jnp.asarray(rows.action),
            targets=norms[1].normalize(jnp.asarray(model_targets(rows))), terminal=jnp.asarray(rows.terminal, bool),
            train_starts=jnp.asarray(split.train_starts), holdout_starts=jnp.asarray(split.holdout_starts))
        key = jax.random.PRNGKey(fit_config.seed)
        key, init_key = jax.random.split(key)
        params = init_params(init_key, config, rows.obs_dim + rows.act_dim, rows.obs_dim + 1)
        state = {"params": params, "opt_state": make_optimizer(fit_config).init(params),
                 "best_params": jax.tree.map(jnp.copy, params),
                 "best_mse": jnp.full((config.num_heads,), jnp.inf, jnp.float32)}

        def advance(state, epoch_key):
            params, opt_state, train_loss, mse = run_epoch(state["params"], state["opt_state"], device, norms,
                                                           epoch_key, config=config, fit_config=fit_config)
            mse = np.asarray(mse, np.float64)
            mean_mse = float(mse.mean())
            if not np.isfinite(mean_mse):
                raise DatasetError(f"{split.source}: RWM-U diverged (non-finite holdout forecast error); check the "
                                   "dataset's scale")
            best = {"best_params": state["best_params"], "best_mse": state["best_mse"]}
            if mean_mse < float(np.mean(np.asarray(state["best_mse"], np.float64))):
                best = {"best_params": jax.tree.map(jnp.copy, params), "best_mse": jnp.asarray(mse, jnp.float32)}
            return {"params": params, "opt_state": opt_state, **best}, train_loss, mse, mean_mse

        return state, key, advance

    def describe(self, mse, stopping) -> str:
        return (f"holdout forecast mse {mse.mean():.4g} · no gain for {stopping.since_improved}/"
                f"{self.fit_config.patience}")

    def finish(self, state: dict):
        best_mse = np.asarray(state["best_mse"], np.float64)
        return state["best_params"], np.arange(self.config.num_heads, dtype=np.int32), best_mse


def fit_recurrent_model(data: OfflineDataset, *, config: RecurrentConfig = RecurrentConfig(),
                        fit_config: RecurrentFitConfig = RecurrentFitConfig(), **options: Any) -> FitResult:
    """Fit RWM-U on `data` (with episodes) and wrap it in a `RecurrentWorldModel` that records the split; `options`:
    those of `mbrl.world_models.fitting.run_fit` (termination_fn, reward_fn, source, task, progress, control)."""
    return run_fit(RecurrentFit(config, fit_config), data, **options)
