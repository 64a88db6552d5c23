"""`WorldModel`: a fitted dynamics ensemble as a pytree that rollouts can `jit`, `scan` and `vmap`.

It holds the ensemble's parameters, the input and target normalizers, the elite indices and
metadata (where it was fitted, which rows and episodes were held out), and implements the
`mbrl.world_models.base.DynamicsModel` protocol. The termination function is a static field, passed in
by the caller (`world_models` never imports `envs`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from mbrl.core.errors import UserError
from mbrl.world_models.base import MarkovModel, StepOutput
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble
from mbrl.world_models.uncertainty import get_measure

FORMAT = "mbrl-world-model"
FORMAT_VERSION = 1


@struct.dataclass
class Normalizer:
    mean: jax.Array
    std: jax.Array

    def normalize(self, x):
        return (x - self.mean) / self.std

    def denormalize(self, y):
        return y * self.std + self.mean


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """Where the model came from; hashable, so it can be a static pytree field."""

    source: str = ""
    task: str | None = None
    num_transitions: int = 0
    holdout_rows: tuple[int, ...] = ()  # dataset rows used as the holdout
    eval_episodes: tuple[int, ...] = ()  # dataset episodes kept out of fitting entirely
    # "heldout": holdout rows and eval episodes index the dataset's held-out data (a NeoRL-2 -val file), and
    # every training row was fitted; "" : they index the dataset itself.
    holdout_from: str = ""
    holdout_episodes: tuple[int, ...] = ()  # whole episodes used as the holdout (the recurrent model)
    holdout_mse: tuple[float, ...] = ()  # per member, standardised target units
    epochs: int = 0
    fit_seconds: float = 0.0
    stop_reason: str = ""
    seed: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ModelInfo:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("holdout_rows", "eval_episodes", "holdout_episodes", "holdout_mse"):
            values[name] = tuple(values.get(name, ()))
        return cls(**values)


@struct.dataclass
class WorldModel(MarkovModel):
    params: Any
    input_norm: Normalizer  # over concat(obs, action)
    target_norm: Normalizer  # over concat(Δobs, reward)
    elites: jax.Array  # (num_elites,) int32
    config: EnsembleConfig = struct.field(pytree_node=False)
    obs_dim: int = struct.field(pytree_node=False)
    act_dim: int = struct.field(pytree_node=False)
    info: ModelInfo = struct.field(pytree_node=False, default=ModelInfo())
    # jnp fn (obs, action, next_obs) -> (B,) bool; None uses the learned head, or never terminates.
    termination_fn: Callable | None = struct.field(pytree_node=False, default=None)
    # jnp fn (obs, action, next_obs) -> (B,) reward, the task's own rule; None uses the learned reward.
    reward_fn: Callable | None = struct.field(pytree_node=False, default=None)

    @property
    def num_members(self) -> int:
        return self.config.num_members

    @property
    def network(self) -> GaussianEnsemble:
        return GaussianEnsemble(self.config, self.obs_dim + 1)

    def _forward(self, obs: jax.Array, action: jax.Array):
        """All members, raw units: means, stds (M, B, obs_dim + 1) over (Δobs, reward), termination logits."""
        x = self.input_norm.normalize(jnp.concatenate([obs, action], axis=-1))
        mean, logvar, term_logit = self.network.apply(self.params, x)
        means = self.target_norm.denormalize(mean)
        stds = jnp.exp(0.5 * logvar) * self.target_norm.std
        return means, stds, term_logit

    def member_predictions(self, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Every member's Gaussian over (Δobs, reward) in raw units: means and stds, (M, B, obs_dim + 1)."""
        means, stds, _ = self._forward(obs, action)
        return means, stds

    def step(
        self,
        key: jax.Array,
        obs: jax.Array,
        action: jax.Array,
        member: jax.Array | None = None,
        *,
        carry: Any = (),
        deterministic: bool = False,
        uncertainty: str = "aleatoric_max",
    ) -> StepOutput:
        """Predict one step for a batch (see `mbrl.world_models.base.DynamicsModel.step`); the carry is empty.

        All members run in one batched pass (the uncertainty needs them all); each sample then
        takes its member's prediction. The uncertainty uses every member, as MOPO does.
        """
        measure = get_measure(uncertainty)  # an unknown name fails before any computation
        means, stds, term_logit = self._forward(obs, action)
        return sample_step(key, obs, action, means, stds, term_logit, member, self.elites, self.termination_fn,
                           deterministic, measure, reward_fn=self.reward_fn)

    def with_termination_fn(self, termination_fn: Callable | None) -> WorldModel:
        return self.replace(termination_fn=termination_fn)

    def with_reward_fn(self, reward_fn: Callable | None) -> WorldModel:
        return self.replace(reward_fn=reward_fn)

    # -----------------------------------------------------------------------------------------
    # Persistence (`save_model_dir`)

    def save(self, path: str | os.PathLike) -> Path:
        return save_model_dir(self, path, FORMAT, FORMAT_VERSION)

    @classmethod
    def load(cls, path: str | os.PathLike, termination_fn: Callable | None = None,
             reward_fn: Callable | None = None) -> WorldModel:
        path = Path(path).absolute()
        meta = read_model_meta(path, FORMAT, FORMAT_VERSION)
        try:
            config_dict = dict(meta["config"])
            config_dict["hidden_dims"] = tuple(config_dict["hidden_dims"])
            if config_dict.get("weight_decays") is not None:
                config_dict["weight_decays"] = tuple(config_dict["weight_decays"])
            config = EnsembleConfig(**config_dict)
            obs_dim, act_dim = int(meta["obs_dim"]), int(meta["act_dim"])
            info = ModelInfo.from_json(meta.get("info", {}))
        except (KeyError, TypeError) as exc:
            raise UserError(f"{path / 'model.json'}: missing or malformed field {exc}") from None
        return cls(**restore_model_arrays(path), config=config, obs_dim=obs_dim, act_dim=act_dim, info=info,
                   termination_fn=termination_fn, reward_fn=reward_fn)


# ---------------------------------------------------------------------------------------------
# A saved model's directory (either kind): orbax for the arrays, model.json for the rest, written in a
# temporary directory that is renamed into place.


def save_model_dir(model, path: str | os.PathLike, format_name: str, version: int) -> Path:
    """Write `model` (params, normalizers, elites, config, dims, info) to the directory `path`, atomically."""
    # lazy: importing orbax at the top adds 0.15 s to `mbrl train --help` (mbrl.config imports this module) (measured)
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        arrays = {
            "params": jax.tree.map(np.asarray, model.params),
            "input_norm": {"mean": np.asarray(model.input_norm.mean), "std": np.asarray(model.input_norm.std)},
            "target_norm": {"mean": np.asarray(model.target_norm.mean), "std": np.asarray(model.target_norm.std)},
            "elites": np.asarray(model.elites),
        }
        with ocp.PyTreeCheckpointer() as checkpointer:
            checkpointer.save(tmp / "arrays", arrays)
        meta = {"format": format_name, "version": version, "obs_dim": model.obs_dim, "act_dim": model.act_dim,
                "config": dataclasses.asdict(model.config), "info": model.info.to_json()}
        (tmp / "model.json").write_text(json.dumps(meta, indent=1))
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_model_meta(path: Path, format_name: str | None = None, version: int | None = None) -> dict:
    """A saved model's model.json; with `format_name`, refused unless it is that format at most `version`."""
    meta_file = Path(path) / "model.json"
    if not meta_file.is_file():
        raise UserError(f"{path}: not a saved world model (no model.json); expected a directory from `mbrl model fit`")
    try:
        meta = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{meta_file}: unreadable JSON ({exc})") from None
    if format_name is not None:
        if meta.get("format") != format_name:
            raise UserError(f"{meta_file}: field 'format' is {meta.get('format')!r}; expected {format_name!r}")
        if meta.get("version", 0) > version:
            raise UserError(f"{meta_file}: format version {meta['version']} is newer than this code ({version})")
    return meta


def restore_model_arrays(path: Path) -> dict:
    """The arrays of a saved model as the fields `params`, `input_norm`, `target_norm`, `elites`."""
    import orbax.checkpoint as ocp  # lazy: as in save_model_dir

    arrays_dir = Path(path) / "arrays"
    if not arrays_dir.is_dir():
        raise UserError(f"{path}: missing 'arrays' (the orbax checkpoint of the parameters)")
    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            arrays = checkpointer.restore(arrays_dir)
    except Exception as exc:  # orbax raises many kinds for a damaged checkpoint
        raise UserError(f"{arrays_dir}: cannot restore the parameters ({type(exc).__name__}: {exc})") from None
    to_jnp = lambda tree: jax.tree.map(jnp.asarray, tree)  # noqa: E731
    return {"params": to_jnp(arrays["params"]), "input_norm": Normalizer(**to_jnp(arrays["input_norm"])),
            "target_norm": Normalizer(**to_jnp(arrays["target_norm"])),
            "elites": jnp.asarray(arrays["elites"], jnp.int32)}


def sample_step(key, obs, action, means, stds, term_logit, member, elites, termination_fn, deterministic, measure,
                carry=(), reward_fn=None) -> StepOutput:
    """One step from every member's Gaussian over (Δobs, reward) in raw units, (M, B, obs_dim + 1): each
    sample takes its member's prediction (None: a random elite per sample), mean or sampled; the reward from
    the task's `reward_fn` of the predicted next obs, else the prediction; the terminal from
    `termination_fn`, else the learned logits (M, B), else never; the uncertainty from all members."""
    obs_dim = obs.shape[-1]
    batch = obs.shape[0]
    member_key, noise_key = jax.random.split(key)
    if member is None:
        member = elites[jax.random.randint(member_key, (batch,), 0, elites.shape[0])]
    member = jnp.asarray(member, jnp.int32)
    samples = jnp.arange(batch)
    mean, std = means[member, samples], stds[member, samples]
    prediction = mean if deterministic else mean + std * jax.random.normal(noise_key, mean.shape, mean.dtype)
    next_obs = obs + prediction[:, :obs_dim]
    reward = prediction[:, obs_dim]
    if reward_fn is not None:
        reward = jnp.asarray(reward_fn(obs, action, next_obs), reward.dtype).reshape(batch)
    if termination_fn is not None:
        terminal = jnp.asarray(termination_fn(obs, action, next_obs), bool).reshape(batch)
    elif term_logit is not None:
        terminal = term_logit[member, samples] > 0.0
    else:
        terminal = jnp.zeros(batch, bool)
    return StepOutput(next_obs=next_obs, reward=reward, terminal=terminal, uncertainty=measure(means, stds), carry=carry)


def replace_dir(src: Path, dst: Path) -> None:
    """Move `src` to `dst`, replacing an existing `dst` with no moment where `dst` is half-written."""
    if not dst.exists():
        os.replace(src, dst)
        return
    old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
    os.replace(dst, old)
    try:
        os.replace(src, dst)
    except OSError:
        os.replace(old, dst)
        raise
    shutil.rmtree(old, ignore_errors=True)


def save(model: WorldModel, path: str | os.PathLike) -> Path:
    return model.save(path)


def load(path: str | os.PathLike, termination_fn: Callable | None = None, reward_fn: Callable | None = None) -> WorldModel:
    return WorldModel.load(path, termination_fn, reward_fn)
