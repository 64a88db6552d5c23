"""A saved world model's directory, the same for every kind: orbax for the arrays (params, normalizers, elites),
model.json for the rest (format, version, dims, the architecture's config, `ModelInfo`), written in a temporary
directory that is renamed into place.

A model class mixes in `SavedModel` and declares `FORMAT`, `FORMAT_VERSION` and `CONFIG` (its architecture's
config class); its kind's entry (`mbrl.world_models.kind.ModelKind`) names the format its directories carry, and
`mbrl.world_models.registry.load_model` picks the kind by that name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import types
import typing
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from mbrl.core.errors import UserError
from mbrl.core.files import read_json
from mbrl.world_models.base import ModelInfo, Normalizer


class SavedModel:
    """Save and load for a model pytree with the fields params, input_norm, target_norm, elites, config, obs_dim,
    act_dim, info, termination_fn and reward_fn."""

    FORMAT: ClassVar[str]
    FORMAT_VERSION: ClassVar[int] = 1
    CONFIG: ClassVar[type]  # the architecture's frozen config dataclass, saved as model.json's "config"

    def save(self, path: str | os.PathLike, format_name: str | None = None) -> Path:
        """Write the model to the directory `path` (`format_name`: its kind's, default the class's `FORMAT`)."""
        return save_model_dir(self, path, format_name or self.FORMAT, self.FORMAT_VERSION)

    @classmethod
    def load(cls, path: str | os.PathLike, termination_fn: Callable | None = None, reward_fn: Callable | None = None,
             format_name: str | None = None):
        """The model saved in `path`, refused unless its model.json names `format_name` (default `FORMAT`)."""
        path = Path(path).absolute()
        meta = read_model_meta(path, format_name or cls.FORMAT, cls.FORMAT_VERSION)
        try:
            config = config_from_json(cls.CONFIG, meta["config"])
            obs_dim, act_dim = int(meta["obs_dim"]), int(meta["act_dim"])
            info = ModelInfo.from_json(meta.get("info", {}))
        except (KeyError, TypeError) as exc:
            raise UserError(f"{path / 'model.json'}: missing or malformed field {exc}") from None
        arrays = restore_model_arrays(path)
        arrays["params"] = cls.restored_params(arrays["params"], config)
        return cls(**arrays, config=config, obs_dim=obs_dim, act_dim=act_dim, info=info, termination_fn=termination_fn,
                   reward_fn=reward_fn)

    @classmethod
    def restored_params(cls, params, config):
        """The parameters as the model reads them, from orbax's restored tree (which turns lists into dicts)."""
        return params


def config_from_json(cls: type, values: dict):
    """A frozen config dataclass from its JSON dict: the lists JSON gives back as the tuples its fields hold."""
    hints = typing.get_type_hints(cls)
    values = dict(values)
    for name, value in values.items():
        if isinstance(value, list) and _is_tuple(hints.get(name)):
            values[name] = tuple(value)
    return cls(**values)


def _is_tuple(hint) -> bool:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_is_tuple(arg) for arg in typing.get_args(hint))
    return hint is tuple or typing.get_origin(hint) is tuple


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
    meta = read_json(meta_file, "missing")
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


