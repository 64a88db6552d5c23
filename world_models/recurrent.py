"""RWM-U: a recurrent world model with an ensemble of heads (Li et al. 2025, "Uncertainty-Aware Robotic World
Model Makes Offline Model-Based Reinforcement Learning Work on Real Robots").

The structure is rsl_rl_rwm's system dynamics model (leggedrobotics/rsl_rl_rwm,
rsl_rl/modules/system_dynamics.py `SystemDynamicsEnsemble` with architecture type "rnn"): one GRU shared by
all heads reads the history of (observation, action) pairs, and E MLP heads read its output. The sizes are
the paper's (2 GRU layers of 256, 5 heads with one hidden layer of 128, a history of 32 and a forecast of 8
steps); that repository takes them from an Isaac Lab config it does not ship.

Each head predicts a diagonal Gaussian over (Δobs, reward) in standardised units, with learned soft bounds
on its log-variance as the MLP ensemble has (`mbrl.world_models.ensemble`), and a termination logit where the
task has no termination function. The epistemic uncertainty is the heads' disagreement
(`mbrl.world_models.uncertainty.epistemic_sum`). Differences from rsl_rl_rwm: the reward is a head output (Isaac
Lab computes it from the state); the heads are fitted by Gaussian NLL (rsl_rl_rwm's default is the squared
error of a sample); see `mbrl.world_models.recurrent_fit`.

`RecurrentWorldModel` implements `mbrl.world_models.base.DynamicsModel` with a carry, the GRU's hidden state
(B, layers, hidden), so `mbrl.world_models.rollout` runs it as it runs the MLP ensemble; `warm_up` reads a real
history into that carry. The GRU is written out (fused gate matmuls, torch's gate layout) rather than taken
from flax, so that the history is read layer by layer with each layer's input projection as one matmul.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from mbrl.core.errors import ConfigError
from mbrl.world_models.base import ModelInfo, Normalizer, StepOutput, TaskFunctions
from mbrl.world_models.ensemble import soft_clamp
from mbrl.world_models.model import sample_step
from mbrl.world_models.saved import SavedModel
from mbrl.world_models.uncertainty import get_measure

FORMAT = "mbrl-recurrent-world-model"


@dataclasses.dataclass(frozen=True)
class RecurrentConfig:
    """Architecture of RWM-U.

    num_heads: E heads on the shared GRU; their disagreement is the epistemic uncertainty.
    gru_layers / gru_hidden: the shared GRU's depth and width.
    head_hidden: hidden layer widths of every head (ReLU).
    history: real (observation, action) pairs the GRU reads before it forecasts (fit windows, imagination
        warm-up).
    forecast: steps the fit predicts autoregressively after the history, feeding on its own predictions.
    learned_termination: add a termination logit to each head (for tasks with no known function).
    logvar_init_max / logvar_init_min / logvar_bound_penalty: the learned log-variance bounds, as the MLP
        ensemble's.
    """

    num_heads: int = 5
    gru_layers: int = 2
    gru_hidden: int = 256
    head_hidden: tuple[int, ...] = (128,)
    history: int = 32
    forecast: int = 8
    learned_termination: bool = False
    logvar_init_max: float = 0.5
    logvar_init_min: float = -10.0
    logvar_bound_penalty: float = 0.01

    def __post_init__(self):
        for name in ("num_heads", "gru_layers", "gru_hidden", "history", "forecast"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"rwm.{name}: expected a positive int, found {value!r}")
        if not self.head_hidden or any(int(w) < 1 for w in self.head_hidden):
            raise ConfigError(f"rwm.head_hidden: expected positive widths, found {tuple(self.head_hidden)}")
        if not self.logvar_init_min < self.logvar_init_max:
            raise ConfigError(f"rwm.logvar_init_min: expected a value below logvar_init_max "
                              f"{self.logvar_init_max}, found {self.logvar_init_min}")


# ---------------------------------------------------------------------------------------------
# The network as pure functions of a parameter dict


def init_params(key: jax.Array, config: RecurrentConfig, in_dim: int, out_dim: int) -> dict:
    """GRU layers with torch's U(±1/√hidden) init; heads with a leading head axis, fan-in scaled normal."""
    hidden, heads = config.gru_hidden, config.num_heads
    keys = iter(jax.random.split(key, 2 * config.gru_layers + len(config.head_hidden) + 1))
    bound = 1.0 / np.sqrt(hidden)

    def uniform(shape):
        return jax.random.uniform(next(keys), shape, jnp.float32, -bound, bound)

    gru = []
    for layer in range(config.gru_layers):
        width = in_dim if layer == 0 else hidden
        gru.append({"wi": uniform((width, 3 * hidden)), "wh": uniform((hidden, 3 * hidden)),
                    "bi": jnp.zeros(3 * hidden), "bh": jnp.zeros(3 * hidden)})
    dense, width = [], hidden + in_dim  # the heads read the GRU's output and the step's own input
    outputs = 2 * out_dim + int(config.learned_termination)
    for size in (*config.head_hidden, outputs):
        scale = 1.0 / (2.0 * np.sqrt(width))  # the MLP ensemble's init (mbrl.core.nn.truncated_normal_fan_in)
        kernel = scale * jax.random.truncated_normal(next(keys), -2.0, 2.0, (heads, width, size), jnp.float32)
        dense.append({"kernel": kernel, "bias": jnp.zeros((heads, size))})
        width = size
    return {
        "gru": gru,
        "heads": dense,
        "max_logvar": jnp.full((heads, out_dim), config.logvar_init_max, jnp.float32),
        "min_logvar": jnp.full((heads, out_dim), config.logvar_init_min, jnp.float32),
    }


def _gru_cell(layer: dict, h: jax.Array, x_proj: jax.Array) -> jax.Array:
    """torch.nn.GRU's update, with the input projection x·Wi + bi already computed."""
    hidden = h.shape[-1]
    h_proj = h @ layer["wh"] + layer["bh"]
    r = jax.nn.sigmoid(x_proj[..., :hidden] + h_proj[..., :hidden])
    z = jax.nn.sigmoid(x_proj[..., hidden : 2 * hidden] + h_proj[..., hidden : 2 * hidden])
    n = jnp.tanh(x_proj[..., 2 * hidden :] + r * h_proj[..., 2 * hidden :])
    return (1.0 - z) * n + z * h


def gru_read(params: dict, carry: jax.Array, x_seq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Read a sequence (T, B, in) from `carry` (B, layers, hidden), layer by layer: each layer's input
    projection is one matmul over all T steps. Returns the new carry and the top layer's outputs (T, B, hidden)."""
    new_carry, inputs = [], x_seq
    for index, layer in enumerate(params["gru"]):
        projected = inputs @ layer["wi"] + layer["bi"]

        def body(h, xp, layer=layer):
            h = _gru_cell(layer, h, xp)
            return h, h

        h, inputs = jax.lax.scan(body, carry[..., index, :], projected)
        new_carry.append(h)
    return jnp.stack(new_carry, axis=-2), inputs


def gru_step(params: dict, carry: jax.Array, x: jax.Array) -> jax.Array:
    """One input (..., in) through every layer of `carry` (..., layers, hidden); the new carry. Its last layer
    (`carry[..., -1, :]`) is the output the heads read."""
    out = []
    for index, layer in enumerate(params["gru"]):
        x = _gru_cell(layer, carry[..., index, :], x @ layer["wi"] + layer["bi"])
        out.append(x)
    return jnp.stack(out, axis=-2)


def heads_apply(params: dict, config: RecurrentConfig, h: jax.Array, x: jax.Array, out_dim: int):
    """Every head on GRU outputs `h` beside the step's standardised input `x`: (B, ·) shared by all heads, or
    (E, B, ·) one per head. The skip connection (not in rsl_rl_rwm, whose heads read the GRU alone) lets a head
    read what the step's input says directly, as an MLP ensemble member does, so the GRU carries what the
    input lacks (a hidden velocity): the reward and the termination are functions of the current state.
    Returns standardised means and log-variances (E, B, out_dim) and termination logits (E, B) or None."""
    x = jnp.concatenate([h, jnp.broadcast_to(x, (*h.shape[:-1], x.shape[-1]))], axis=-1)
    layers = params["heads"]
    for index, layer in enumerate(layers):
        spec = "bi,eio->ebo" if x.ndim == 2 else "ebi,eio->ebo"
        x = jnp.einsum(spec, x, layer["kernel"]) + layer["bias"][:, None, :]
        if index < len(layers) - 1:
            x = jax.nn.relu(x)
    mean, raw = x[..., :out_dim], x[..., out_dim : 2 * out_dim]
    logvar = soft_clamp(raw, params["min_logvar"][:, None, :], params["max_logvar"][:, None, :])
    term_logit = x[..., 2 * out_dim] if config.learned_termination else None
    return mean, logvar, term_logit


# ---------------------------------------------------------------------------------------------
# The model


@struct.dataclass
class RecurrentWorldModel(TaskFunctions, SavedModel):
    """RWM-U, fitted (`mbrl.world_models.recurrent_fit`), saved and loaded as `SavedModel` in format `FORMAT`."""

    params: Any
    input_norm: Normalizer  # over concat(obs, action)
    target_norm: Normalizer  # over concat(Δobs, reward)
    elites: jax.Array  # (num_elites,) int32: every head (the GRU is shared, so heads are not selected)
    config: RecurrentConfig = struct.field(pytree_node=False)
    obs_dim: int = struct.field(pytree_node=False)
    act_dim: int = struct.field(pytree_node=False)
    info: ModelInfo = struct.field(pytree_node=False, default=ModelInfo())
    termination_fn: Callable | None = struct.field(pytree_node=False, default=None)
    reward_fn: Callable | None = struct.field(pytree_node=False, default=None)  # as WorldModel's

    is_recurrent = True  # a class constant, not a field

    @property
    def num_members(self) -> int:
        return self.config.num_heads

    @property
    def history(self) -> int:
        return self.config.history

    def initial_carry(self, batch: int) -> jax.Array:
        return jnp.zeros((batch, self.config.gru_layers, self.config.gru_hidden), jnp.float32)

    def _inputs(self, obs, action):
        return self.input_norm.normalize(jnp.concatenate([obs, action], axis=-1))

    def warm_up(self, obs: jax.Array, action: jax.Array, carry: jax.Array | None = None) -> jax.Array:
        """The carry after reading real pairs obs (B, L, obs_dim), action (B, L, act_dim) in order; imagination
        then starts from the observation that followed the last pair."""
        batch = obs.shape[0]
        carry = self.initial_carry(batch) if carry is None else carry
        x = jnp.swapaxes(self._inputs(obs, action), 0, 1)
        return gru_read(self.params, carry, x)[0]

    def predict(self, h: jax.Array, x: jax.Array):
        """Every head's Gaussian over (Δobs, reward) in raw units from GRU outputs h (B, hidden) and the step's
        standardised input x: means, stds (E, B, obs_dim + 1) and termination logits (E, B) or None."""
        mean, logvar, term_logit = heads_apply(self.params, self.config, h, x, self.obs_dim + 1)
        means = self.target_norm.denormalize(mean)
        stds = jnp.exp(0.5 * logvar) * self.target_norm.std
        return means, stds, term_logit

    def member_predictions(self, obs: jax.Array, action: jax.Array, carry: jax.Array):
        """Every head's prediction after reading (obs, action) on top of `carry`: means, stds and the new carry."""
        x = self._inputs(obs, action)
        carry = gru_step(self.params, carry, x)
        means, stds, _ = self.predict(carry[..., -1, :], x)
        return means, stds, carry

    def step(
        self,
        key: jax.Array,
        obs: jax.Array,
        action: jax.Array,
        member: jax.Array | None = None,
        *,
        carry: jax.Array | None = None,
        deterministic: bool = False,
        uncertainty: str = "epistemic_sum",
    ) -> StepOutput:
        """Read (obs, action), then predict the next step (see `mbrl.world_models.base.DynamicsModel.step`): one GRU
        step shared by all heads, then every head (the uncertainty needs them all) and each sample's head."""
        measure = get_measure(uncertainty)
        if carry is None or isinstance(carry, tuple):  # no memory yet (a rollout that has not warmed the model up)
            carry = self.initial_carry(obs.shape[0])
        x = self._inputs(obs, action)
        carry = gru_step(self.params, carry, x)
        means, stds, term_logit = self.predict(carry[..., -1, :], x)
        return sample_step(key, obs, action, means, stds, term_logit, member, self.elites, self.termination_fn,
                           deterministic, measure, carry, reward_fn=self.reward_fn)

    FORMAT = FORMAT  # class constants (not fields): `SavedModel`'s
    CONFIG = RecurrentConfig

    @classmethod
    def restored_params(cls, params, config: RecurrentConfig):
        """orbax restores lists as dicts keyed "0", "1", ...: the GRU's layers and the heads' as lists again."""
        for name, count in (("gru", config.gru_layers), ("heads", len(config.head_hidden) + 1)):
            layers = params[name]
            params[name] = [layers[str(i)] if isinstance(layers, dict) else layers[i] for i in range(count)]
        return params
