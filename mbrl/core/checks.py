"""Checks of option values, each rule in one place with one message: it names the option, what was expected and
what was found, and raises a `ConfigError` (the CLI prints it as one line and exits 2).

An option is named by its section and field: `section` "schedule" and field "epochs" give `schedule.epochs`;
`section` "" gives the bare field (`seeds`); `section` "--" gives a command-line flag (`--update-every`), for the
config classes of commands with no sections (`mbrl finetune`, `mbrl sweep`).

The number rule: every float an option takes is finite (`finite`), whichever way it comes (a command line, a
config file, `mbrl.config.build`); `mbrl.config` applies it to every value it reads. A field whose documented
meaning of inf is "no limit" says so with `unlimited(default)`, the one declaration of that meaning, and its help
says that inf means no limit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from mbrl.core.errors import ConfigError

FLAG = "--"  # the `section` of options named as command-line flags

_UNLIMITED = "unlimited"  # the metadata key of `unlimited` fields


def option(section: str, name: str) -> str:
    """The option's name in messages: `section.name`, the bare `name`, or the flag `--name-with-dashes`."""
    if section == FLAG:
        return FLAG + name.replace("_", "-")
    return f"{section}.{name}" if section else name


def unlimited(default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field (a float, or a tuple of floats) that takes inf, meaning no limit. The one declaration of
    that meaning: every other float option refuses inf (`finite`). Say in the field's help that inf means no limit."""
    return dataclasses.field(default=default, metadata={_UNLIMITED: True})


def allows_inf(field: dataclasses.Field) -> bool:
    """Whether `field` was declared with `unlimited`: +inf is a value it takes (no limit)."""
    return bool(field.metadata.get(_UNLIMITED))


def finite(value: int | float, where: str, unlimited: bool = False) -> float:
    """`value` as a float; NaN and ±inf are refused, except +inf for an `unlimited` option (no limit)."""
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf if value > 0 else -math.inf
    if math.isfinite(number) or (unlimited and number == math.inf):
        return number
    expected = "a number or inf (no limit)" if unlimited else "a finite number"
    raise ConfigError(f"{where}: expected {expected}, found {number}")


def positive_ints(section: str, values: Any, *names: str) -> None:
    """Each field an int >= 1 (a bool is not one)."""
    _ints(section, values, names, 1, none_ok=False)


def non_negative_ints(section: str, values: Any, *names: str) -> None:
    """Each field an int >= 0 (a bool is not one)."""
    _ints(section, values, names, 0, none_ok=False)


def optional_positive_ints(section: str, values: Any, *names: str) -> None:
    """Each field None or an int >= 1."""
    _ints(section, values, names, 1, none_ok=True)


def _ints(section: str, values: Any, names: tuple[str, ...], minimum: int, none_ok: bool) -> None:
    for name in names:
        value = getattr(values, name)
        if none_ok and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            expected = "a positive int" if minimum == 1 else f"an int >= {minimum}"
            raise ConfigError(f"{option(section, name)}: expected {expected}{' or None' if none_ok else ''}, found {value!r}")


def positive(section: str, values: Any, *names: str) -> None:
    """Each field a number > 0."""
    _bounded(section, values, names, lambda v: v > 0, "a value > 0")


def non_negative(section: str, values: Any, *names: str) -> None:
    """Each field a number >= 0."""
    _bounded(section, values, names, lambda v: v >= 0, "a value >= 0")


def rates(section: str, values: Any, *names: str) -> None:
    """Each field in (0, 1]: a discount, a Polyak rate."""
    _bounded(section, values, names, lambda v: 0.0 < v <= 1.0, "a value in (0, 1]")


def _bounded(section: str, values: Any, names: tuple[str, ...], holds, expected: str) -> None:
    for name in names:
        value = getattr(values, name)
        if not holds(value):
            raise ConfigError(f"{option(section, name)}: expected {expected}, found {value}")


def widths(section: str, sizes: Sequence[int], name: str = "hidden_sizes") -> None:
    """Hidden layer widths: at least one, each >= 1."""
    if not sizes or any(int(w) < 1 for w in sizes):
        raise ConfigError(f"{option(section, name)}: expected positive widths, found {tuple(sizes)}")
