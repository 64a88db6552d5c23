"""The export folder's format, shared by the exporter (`mbrl.export`) and the runner (`mbrl.envs.robots.runner`).

A folder holds policy.onnx, policy.jax and policy.json; `read_description` reads and checks the last.
It needs only the standard library, so any robot-side tool can read an export's description.

Version 2 added `state` for recurrent policies (inputs, carry leaves, reset rule); a version 1 folder
(Markov policies only) reads the same.
"""

from __future__ import annotations

import math
from pathlib import Path

from mbrl.core.errors import UserError
from mbrl.core.files import read_json

FORMAT = "offline-mbrl-policy"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
ONNX_FILE, JAX_FILE, JSON_FILE = "policy.onnx", "policy.jax", "policy.json"
RECURRENT_INPUTS = ("prev_action", "prev_reward", "first")  # fed by the runner, in this order after obs
CARRY_DTYPES = ("float32", "float64", "int32", "int64", "bool")
RESET_RULE = "at an episode start: every carry leaf = its initial value, prev_action = 0, prev_reward = 0, first = true"


def state_inputs(act_dim: int) -> list[dict]:
    """policy.json `state.inputs`: what a recurrent policy takes each tick besides obs and its carry."""
    return [
        {"name": "prev_action", "shape": [act_dim], "dtype": "float32",
         "feed": "output policy_action of the previous tick (the policy's own action in [-1, 1]); zeros at an episode start"},
        {"name": "prev_reward", "shape": [], "dtype": "float32",
         "feed": "the reward of the previous step, which arrives with this tick's observation; 0 at an episode start"},
        {"name": "first", "shape": [], "dtype": "bool", "feed": "true at an episode's first tick, else false"},
    ]


class ExportError(UserError):
    """An export cannot be written or read as given (a missing file, an inconsistent description)."""


def read_description(export_dir: str | Path) -> dict:
    """policy.json of an export folder, checked for the fields a runner needs."""
    export_dir = Path(export_dir)
    path = export_dir / JSON_FILE
    if not export_dir.is_dir():
        raise ExportError(f"{export_dir}: no such export directory; expected a folder written by `mbrl export`")
    data = read_json(path, f"missing; expected {JSON_FILE} in a folder written by `mbrl export`", ExportError)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ExportError(f"{path}: field 'format' is {data.get('format') if isinstance(data, dict) else None!r}; expected {FORMAT!r}")
    if data.get("format_version") not in READABLE_VERSIONS:
        raise ExportError(f"{path}: field 'format_version' is {data.get('format_version')!r}; expected one of "
                          f"{list(READABLE_VERSIONS)} (re-export the run with this version of `mbrl export`)")
    for section, keys in (("observation", ("dim", "names")), ("action", ("dim", "names", "low", "high"))):
        for key in keys:
            if not isinstance(data.get(section), dict) or key not in data[section]:
                raise ExportError(f"{path}: field '{section}.{key}' is missing")
    act_dim = data["action"]["dim"]
    for key in ("low", "high", "names"):
        found = data["action"][key]
        if not isinstance(found, list) or len(found) != act_dim:
            raise ExportError(f"{path}: field 'action.{key}' has {len(found) if isinstance(found, list) else found!r} "
                              f"entries, expected action.dim = {act_dim}")
    if data.get("state") is not None:
        _check_state(path, data["state"], act_dim)
    return data


def _shape_of(value) -> list[int] | None:
    """The shape of a nested list of numbers (None when ragged)."""
    if not isinstance(value, list):
        return [] if isinstance(value, (int, float, bool)) else None
    inner = [_shape_of(v) for v in value]
    if any(s is None or s != inner[0] for s in inner):
        return None
    return [len(value), *(inner[0] if inner else [])]


def _finite(value) -> bool:
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return isinstance(value, bool) or math.isfinite(value)


def _check_state(path: Path, state, act_dim: int) -> None:
    """The `state` section of a recurrent policy: its inputs and carry leaves, each fully described."""
    if not isinstance(state, dict):
        raise ExportError(f"{path}: field 'state' is {state!r}; expected an object (or null for a Markov policy)")
    if "dim" in state and "carry" not in state:
        raise ExportError(f"{path}: field 'state.carry' is missing (a recurrent export of format 1); re-export the run")
    for key in ("inputs", "carry"):
        if not isinstance(state.get(key), list):
            raise ExportError(f"{path}: field 'state.{key}' is {'missing' if key not in state else repr(state[key])}; expected a list")
    names = [i.get("name") if isinstance(i, dict) else None for i in state["inputs"]]
    if names != list(RECURRENT_INPUTS):
        raise ExportError(f"{path}: field 'state.inputs' names {names}; expected {list(RECURRENT_INPUTS)}")
    for i, (entry, expected) in enumerate(zip(state["inputs"], state_inputs(act_dim))):
        shape, dtype = expected["shape"], expected["dtype"]
        if entry.get("shape") != shape or entry.get("dtype") != dtype:
            raise ExportError(f"{path}: field 'state.inputs[{i}]' ({entry['name']}) has shape {entry.get('shape')!r} and "
                              f"dtype {entry.get('dtype')!r}; expected {shape} and {dtype!r}")
    if not state["carry"]:
        raise ExportError(f"{path}: field 'state.carry' is empty; a recurrent policy carries at least one array")
    for i, leaf in enumerate(state["carry"]):
        where = f"{path}: field 'state.carry[{i}]"
        if not isinstance(leaf, dict):
            raise ExportError(f"{where}' is {leaf!r}; expected an object")
        for key in ("input", "output", "shape", "dtype", "initial"):
            if key not in leaf:
                raise ExportError(f"{where}.{key}' is missing")
        for key in ("input", "output"):
            if not isinstance(leaf[key], str) or not leaf[key]:
                raise ExportError(f"{where}.{key}' is {leaf[key]!r}; expected the name of a graph {key}")
        shape = leaf["shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ExportError(f"{where}.shape' is {shape!r}; expected a list of dims")
        if leaf["dtype"] not in CARRY_DTYPES:
            raise ExportError(f"{where}.dtype' is {leaf['dtype']!r}; expected one of {list(CARRY_DTYPES)}")
        found = _shape_of(leaf["initial"])
        if found != shape:
            raise ExportError(f"{where}.initial' has shape {found if found is not None else 'ragged'}; expected shape {shape}")
        if not _finite(leaf["initial"]):
            raise ExportError(f"{where}.initial' holds a NaN or infinity")
