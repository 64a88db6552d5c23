"""The one registry of world-model kinds: it lists the modules that declare one.

Each module of `MODULES` holds a `KIND` (`mbrl.world_models.kind.ModelKind`): its config sections, fit, save format,
load, model class and what it can answer. Everything else (the `--model` choices of `mbrl model fit`, the model
sections of `mbrl.config.TrainConfig`, an algorithm's `model_kind`, which kind a saved directory holds) is derived
from these entries. Adding a kind: write its module, add its line here (docs/contributing.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from mbrl.core import entries
from mbrl.core.errors import UserError
from mbrl.world_models.kind import ModelKind
from mbrl.world_models.saved import read_model_meta

# One line per kind; the first is what `mbrl model fit` fits with no --model.
MODULES = (
    "mbrl.world_models.mlp",
    "mbrl.world_models.rwm",
)


def _collect(modules: tuple[str, ...]) -> dict[str, ModelKind]:
    out = entries.collect(modules, "KIND", "world-model kind")
    formats = [found.format for found in out.values()]
    if len(set(formats)) != len(formats):
        raise ValueError(f"world-model kinds {list(out)}: save formats {formats}; each kind needs its own")
    return out


KINDS: dict[str, ModelKind] = _collect(MODULES)
DEFAULT = next(iter(KINDS))


# The config sections the kinds define, in the order `mbrl.config.TrainConfig` holds them.
SECTIONS: dict[str, type] = entries.merged_sections(KINDS.values())


def kind(name: str) -> ModelKind:
    return entries.lookup(KINDS, name, "model", "world-model kind")


def saved_kind(path: str | os.PathLike) -> ModelKind:
    """The kind of the model saved in `path`, by the format its model.json names."""
    meta = read_model_meta(Path(path))
    for found in KINDS.values():
        if meta.get("format") == found.format:
            return found
    raise UserError(f"{Path(path) / 'model.json'}: field 'format' is {meta.get('format')!r}; expected "
                    + " or ".join(repr(k.format) for k in KINDS.values()))


def load_model(path: str | os.PathLike, termination_fn: Callable | None = None, reward_fn: Callable | None = None):
    """A saved world model of any kind, by the format its model.json names."""
    return saved_kind(path).load(path, termination_fn, reward_fn)
