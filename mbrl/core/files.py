"""The project's folders on disk, and writing files so that a reader never sees half of one."""

from __future__ import annotations

import os
from pathlib import Path


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
