"""Fitted Q Evaluation (Le, Voloshin and Yue 2019, "Batch Policy Learning under Constraints"): the discounted value of
a fixed policy, learnt from the dataset alone by iterated Bellman regression.

The policy never changes, so its action at every next state is computed once, before fitting; fitting is then a
regression of Q(s, a) on r + γ (1 - terminal) Q̄(s', π(s')), Q̄ a copy refreshed every `target_every` steps (one
iteration of FQE; a time limit bootstraps, so the value is the infinite-horizon discounted one). K
Q-functions are fitted side by side in one vmapped program, each from its own initialisation and its own minibatches;
their spread at the initial states is the interval. Compiled chunks of steps alternate with a check of the TD error
on held-out transitions, which keeps the best weights and stops the fit when it no longer falls.

The value is the mean over the dataset's initial states of Q(s0, π(s0)), in the data's reward units.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mbrl.agents.networks import Critic, ObsScale
from mbrl.core.early_stopping import EarlyStopping
from mbrl.core.errors import ConfigError, DatasetError
from mbrl.core.types import Transitions

POLICY_CHUNK = 4096  # rows per call of the policy when its next actions are precomputed


@dataclasses.dataclass(frozen=True)
class FQEConfig:
    """FQE's settings."""

    heads: int = 5
    """Q-functions fitted side by side; the spread of their values is the interval."""
    hidden_sizes: Sequence[int] = (256, 256)
    """Each Q-function's hidden layers."""
    layer_norm: bool = True
    """LayerNorm in the hidden layers (it keeps the values bounded off the data)."""
    gamma: float = 0.99
    """The discount of the estimated value."""
    learning_rate: float = 3e-4
    """Adam's step size at the start; it decays along a cosine to a tenth of it at `steps`."""
    batch_size: int = 256
    """Transitions per head per step."""
    target_every: int = 100
    """Steps between copies of the Q-functions into their targets: each copy is one FQE iteration, so a fit of
    `steps` takes steps / target_every iterations, and the value's residual shrinks by γ per iteration."""
    steps: int = 20_000
    """The most gradient steps."""
    chunk: int = 500
    """Steps per compiled call, between checks of the held-out TD error; at most `steps` (a fit runs whole chunks)."""
    min_steps: int = 5_000
    """Steps before a check may keep weights or stop the fit (the values move from their starting level first: an
    early TD error says little)."""
    patience: int = 5
    """Checks without a 1% lower held-out TD error (relative to the targets' size) before the fit stops."""
    seed: int = 0
    """Initialisation, minibatches and the held-out episodes."""

    def __post_init__(self):
        for name in ("heads", "batch_size", "steps", "chunk", "patience", "target_every"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"fqe.{name}: expected a positive int, found {getattr(self, name)}")
        if not 0.0 < self.gamma < 1.0:
            raise ConfigError(f"fqe.gamma: expected a value in (0, 1), found {self.gamma}")
        if not self.learning_rate > 0:
            raise ConfigError(f"fqe.learning_rate: expected a positive value, found {self.learning_rate}")
        if self.min_steps < 0:
            raise ConfigError(f"fqe.min_steps: expected an int >= 0, found {self.min_steps}")
        object.__setattr__(self, "hidden_sizes", tuple(int(w) for w in self.hidden_sizes))  # hashable: a compile key
        # A fit shorter than one chunk (a quick `--select.fqe-steps`) runs its own steps, not a whole default chunk.
        object.__setattr__(self, "chunk", min(int(self.chunk), int(self.steps)))


@dataclasses.dataclass(frozen=True)
class FQEResult:
    head_values: np.ndarray  # (heads,): each head's mean of Q(s0, π(s0)) over the initial states
    steps: int  # gradient steps taken
    best_step: int  # the step whose weights were kept
    heldout_td: list[float]  # the held-out TD error at each check (reward units squared)
    stop_reason: str  # "early_stopping" | "max_steps"

    @property
    def value(self) -> float:
        return float(np.mean(self.head_values))

    @property
    def interval(self) -> tuple[float, float]:
        """The heads' range widened by their standard deviation: the estimate's spread over initialisations and data."""
        spread = float(np.std(self.head_values, ddof=1)) if len(self.head_values) > 1 else 0.0
        return float(np.min(self.head_values)) - spread, float(np.max(self.head_values)) + spread


def policy_actions(policy: Callable, obs: np.ndarray) -> np.ndarray:
    """`policy` (batched obs -> actions, jittable) on every row of `obs`, in chunks of fixed shape (one compile)."""
    fn = jax.jit(policy)
    n = len(obs)
    padded = np.concatenate([obs, np.zeros(((-n) % POLICY_CHUNK, obs.shape[1]), obs.dtype)])
    out = [np.asarray(fn(jnp.asarray(padded[i:i + POLICY_CHUNK]))) for i in range(0, len(padded), POLICY_CHUNK)]
    actions = np.concatenate(out)[:n].astype(np.float32)
    if not np.all(np.isfinite(actions)):
        raise DatasetError("the policy gives non-finite actions on the dataset's observations")
    return actions


def arrays(t: Transitions, next_action: np.ndarray, reward_scale: float) -> dict:
    """The device arrays of a fit: the transitions with the policy's next actions, rewards times `reward_scale`."""
    return {"obs": jnp.asarray(t.obs, jnp.float32), "action": jnp.asarray(t.action, jnp.float32),
            "reward": jnp.asarray(t.reward * reward_scale, jnp.float32),
            "done": jnp.asarray(t.terminal, jnp.float32),
            "next_obs": jnp.asarray(t.next_obs, jnp.float32), "next_action": jnp.asarray(next_action, jnp.float32)}


class FQEPrograms(NamedTuple):
    """The compiled pieces of a fit. `chunk(carry, key, data, norm)`: `config.chunk` steps; `heldout_td(params,
    target, norm, held)`; `init(key, obs, action)` -> carry (params, target params, Adam state, steps); `values(params,
    norm, obs, action)` -> (heads,). `data`/`held` as `arrays` gives them, `norm` = (obs mean, obs std, the values'
    starting level)."""

    chunk: Callable
    heldout_td: Callable
    init: Callable
    values: Callable


@functools.lru_cache(maxsize=4)
def fqe_programs(config: FQEConfig) -> FQEPrograms:
    """The compiled pieces for one config, shared by every policy and dataset evaluated with it (the policy's
    actions and the observations' scale are data)."""
    critic = Critic(tuple(config.hidden_sizes), config.layer_norm)
    # Cosine decay to a tenth: large steps while the values grow, small ones for a precise final fit.
    tx = optax.adam(optax.cosine_decay_schedule(config.learning_rate, config.steps, alpha=0.1))

    def q(params, norm, obs, action):  # K heads' params on (K, B, ...) inputs, or on shared (B, ...) ones
        axes = 0 if obs.ndim == 3 else None
        return norm[2] + jax.vmap(critic.apply, in_axes=(0, axes, axes))(params, (obs - norm[0]) / norm[1], action)

    def targets(target, norm, batch):
        next_q = q(target, norm, batch["next_obs"], batch["next_action"])
        return jax.lax.stop_gradient(batch["reward"] + config.gamma * (1.0 - batch["done"]) * next_q)

    def td_errors(params, target, norm, batch):
        return q(params, norm, batch["obs"], batch["action"]) - targets(target, norm, batch)

    @functools.partial(jax.jit, donate_argnums=0)
    def chunk(carry, key, data, norm):
        rows_total = data["obs"].shape[0]

        def step(carry, key):
            params, target, opt_state, count = carry
            rows = jax.random.randint(key, (config.heads, config.batch_size), 0, rows_total)
            batch = jax.tree.map(lambda x: x[rows], data)
            loss, grads = jax.value_and_grad(lambda p: jnp.mean(td_errors(p, target, norm, batch) ** 2))(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            count = count + 1
            refresh = count % config.target_every == 0
            target = jax.tree.map(lambda t, p: jnp.where(refresh, p, t), target, params)
            return (params, target, opt_state, count), loss

        carry, losses = jax.lax.scan(step, carry, jax.random.split(key, config.chunk))
        return carry, jnp.mean(losses)

    @jax.jit
    def heldout_td(params, target, norm, held):
        """(mean squared TD error, mean squared target): their ratio is the error relative to the values' size."""
        return jnp.mean(td_errors(params, target, norm, held) ** 2), jnp.mean(targets(target, norm, held) ** 2)

    @jax.jit
    def init(key, obs, action):
        params = jax.vmap(critic.init, in_axes=(0, None, None))(jax.random.split(key, config.heads), obs, action)
        return params, jax.tree.map(jnp.copy, params), tx.init(params), jnp.zeros((), jnp.int32)

    @jax.jit
    def values(params, norm, obs, action):
        return jnp.mean(q(params, norm, obs, action), axis=1)

    return FQEPrograms(chunk, heldout_td, init, values)


def check_sizes(train: Transitions, heldout: Transitions, initial_obs) -> None:
    """Refuse data FQE cannot fit or check on, before the policy is asked for any action."""
    if len(heldout) == 0:
        raise DatasetError("FQE: the held-out data is empty; hold out some episodes (--holdout) or give a -val file")
    if len(train) == 0 or len(initial_obs) == 0:
        raise DatasetError("FQE: the dataset has no transitions or no initial states")


def fit_fqe_on_actions(train: Transitions, train_next_action: np.ndarray, heldout: Transitions,
                       heldout_next_action: np.ndarray, initial_obs: np.ndarray, initial_action: np.ndarray,
                       config: FQEConfig = FQEConfig()) -> FQEResult:
    """FQE given the policy's actions at every next state of `train` and `heldout` and at `initial_obs`: how a
    recurrent policy, whose action depends on its history, is judged (`mbrl.ope.judged.fqe_of`, which has checked the
    sizes with `check_sizes` before asking the policy for those actions)."""
    scale = ObsScale.of(train.obs)
    # Rewards times (1 - γ) over their mean magnitude: every dataset's Q targets are then of order 1, which Adam's
    # steps (about the learning rate per parameter) reach in a few thousand steps rather than 1 / (1 - γ) times more.
    reward_scale = (1.0 - config.gamma) / max(float(np.mean(np.abs(train.reward))), 1e-8)
    # The values start at the data's mean reward over (1 - γ), not at 0: each FQE iteration shrinks the distance to
    # the truth by γ, and a fit of a few hundred iterations keeps a part of it (γ^200 = 0.13), which from 0 is a bias
    # low by that share of the whole value.
    start = float(np.mean(train.reward)) * reward_scale / (1.0 - config.gamma)
    norm = (jnp.asarray(scale.mean, jnp.float32), jnp.asarray(scale.std, jnp.float32), jnp.asarray(start, jnp.float32))
    for name, actions in (("next", train_next_action), ("held-out next", heldout_next_action),
                          ("initial", initial_action)):
        if not np.all(np.isfinite(actions)):
            raise DatasetError(f"the policy gives non-finite actions at the dataset's {name} observations")
    data = arrays(train, train_next_action, reward_scale)
    held = arrays(heldout, heldout_next_action, reward_scale)
    start_obs = jnp.asarray(initial_obs, jnp.float32)
    start_action = jnp.asarray(initial_action, jnp.float32)
    chunk, heldout_td, init, values = fqe_programs(config)

    key = jax.random.PRNGKey(config.seed)
    key, init_key = jax.random.split(key)
    carry = init(init_key, start_obs[:1], start_action[:1])
    stopping = EarlyStopping(config.patience, min_improvement=0.01)
    best_params, best_step, history, steps, stop_reason = None, 0, [], 0, "max_steps"
    while steps < config.steps:
        key, chunk_key = jax.random.split(key)
        carry, _ = chunk(carry, chunk_key, data, norm)
        steps += config.chunk
        squared_error, squared_target = map(float, heldout_td(carry[0], carry[1], norm, held))
        if not np.isfinite(squared_error):
            raise DatasetError("FQE diverged (non-finite held-out TD error); check the dataset's rewards")
        history.append(squared_error / reward_scale**2)
        # Relative to the targets' size: the absolute error grows with the values as they grow from 0, which would
        # favour early, too small ones.
        error = squared_error / max(squared_target, 1e-12)
        if steps < config.min_steps:  # the values are still leaving their start: no weights are kept yet
            continue
        reason = stopping.update(error)
        if stopping.since_improved == 0:  # a significant improvement: these weights are the best so far
            best_params, best_step = jax.tree.map(jnp.copy, carry[0]), steps
        if reason is not None:
            stop_reason = reason
            break
    if best_params is None:  # the fit ended before min_steps: its last weights
        best_params, best_step = carry[0], steps
    head_values = np.asarray(values(best_params, norm, start_obs, start_action), np.float64) / reward_scale
    return FQEResult(head_values, steps, best_step, history, stop_reason)
