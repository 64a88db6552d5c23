"""The project's folders on disk, writing files so that a reader never sees half of one, and reading a JSON or
TOML document with a one-line error that names the file."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mbrl.core.errors import UserError


def data_dir() -> Path:
    """The folder holding made datasets (and `neorl2/`, `tasks/`): `$MBRL_DATA_DIR`, else `~/.mbrl/datasets`."""
    return Path(os.environ.get("MBRL_DATA_DIR") or Path.home() / ".mbrl" / "datasets").expanduser()


def cache_dir() -> Path | None:
    """Where compiled programs (and what is measured about them) are kept between runs: `$MBRL_CACHE_DIR`, default
    ~/.cache/mbrl/jax; None where it is `off`."""
    where = os.environ.get("MBRL_CACHE_DIR", str(Path.home() / ".cache" / "mbrl" / "jax"))
    return None if where.lower() in ("off", "0", "none", "") else Path(where)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to a temp file beside `path`, then rename it over `path` (the temp name carries the pid:
    sweep workers may write the same file at once)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def read_json(path: str | os.PathLike, missing: str, error: type[Exception] = UserError) -> Any:
    """The JSON document in the file `path`. `error` (a `UserError` by default) says in one line that names the
    file that it is missing (`missing`: what the reader expected there) or not valid JSON."""
    return _read(path, json.loads, "JSON", missing, error)


def read_toml(path: str | os.PathLike, missing: str, error: type[Exception] = UserError) -> dict[str, Any]:
    """The TOML document in the file `path`, with `read_json`'s errors."""
    return _read(path, tomllib.loads, "TOML", missing, error)


def _read(path: str | os.PathLike, parse: Callable[[str], Any], kind: str, missing: str, error: type[Exception]) -> Any:
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: {missing}")
    try:
        return parse(path.read_text())
    except ValueError as exc:  # JSONDecodeError, TOMLDecodeError, UnicodeDecodeError
        raise error(f"{path}: not a valid {kind} file ({exc})") from None
