"""What the registries of declared entries share (algorithms: `mbrl.agents.registry`; world-model kinds:
`mbrl.world_models.registry`): each lists modules that declare one entry under a known name."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from mbrl.core.errors import ConfigError


def collect(modules: Iterable[str], attribute: str, what: str) -> dict[str, Any]:
    """{entry.name: entry} of each module's `attribute`, in the modules' order; a name declared twice is refused."""
    out: dict[str, Any] = {}
    for module in modules:
        found = getattr(importlib.import_module(module), attribute)
        if found.name in out:
            raise ValueError(f"{module}: {what} {found.name!r} is already declared")
        out[found.name] = found
    return out


def merged_sections(entries: Iterable[Any]) -> dict[str, type]:
    """Every entry's config sections ({name: class}) in the entries' order; a name must mean one class."""
    out: dict[str, type] = {}
    for found in entries:
        for name, cls in found.sections.items():
            if out.setdefault(name, cls) is not cls:
                raise ValueError(f"{found.name}: section {name!r} is {cls.__name__} here and {out[name].__name__} elsewhere")
    return out


def lookup(table: dict[str, Any], name: str, option: str, what: str) -> Any:
    """`table[name]`, or a `ConfigError` naming the `option`, the unknown name and the known ones."""
    if name not in table:
        raise ConfigError(f"{option}: unknown {what} {name!r}; expected one of {', '.join(table)}")
    return table[name]
