"""The export folder's format, shared by the exporter (`mbrl.export`) and the runner (`envs.robots.runner`).

A folder holds policy.onnx, policy.jax and policy.json; `read_description` reads and checks the last.
It needs only the standard library, so any robot-side tool can read an export's description.
"""

from __future__ import annotations

import json
from pathlib import Path

from mbrl.core.errors import UserError

FORMAT = "offline-mbrl-policy"
FORMAT_VERSION = 1
ONNX_FILE, JAX_FILE, JSON_FILE = "policy.onnx", "policy.jax", "policy.json"


class ExportError(UserError):
    """An export cannot be written or read as given (a missing file, an inconsistent description)."""


def read_description(export_dir: str | Path) -> dict:
    """policy.json of an export folder, checked for the fields a runner needs."""
    export_dir = Path(export_dir)
    path = export_dir / JSON_FILE
    if not export_dir.is_dir():
        raise ExportError(f"{export_dir}: no such export directory; expected a folder written by `mbrl export`")
    if not path.is_file():
        raise ExportError(f"{path}: missing; expected {JSON_FILE} in a folder written by `mbrl export`")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExportError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ExportError(f"{path}: field 'format' is {data.get('format') if isinstance(data, dict) else None!r}; expected {FORMAT!r}")
    if data.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{path}: field 'format_version' is {data.get('format_version')!r}; expected {FORMAT_VERSION}")
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
    return data
