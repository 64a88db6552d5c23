"""The `mbrl` command.

Each subcommand is a function `run(args: SomeDataclass) -> int | None` in a module that is imported
only when that subcommand is used (JAX takes a second to import). tyro builds each subcommand's
parser from the dataclass annotation of its `args` parameter.

A `UserError` (bad file, bad option) prints one line on stderr and exits 2; anything else is a bug
and keeps its traceback (exit 1).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import sys
import typing

import tyro

from mbrl import __version__
from mbrl.core.errors import UserError

# (group, name) or (name,) -> "module:function". The group "" is a top-level command.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("data", "info"): ("mbrl.commands.data:info", "validate and summarise a dataset"),
    ("data", "list"): ("mbrl.commands.data:list_datasets", "list known and locally made datasets"),
    ("data", "make"): ("mbrl.commands.data_make:make", "make a D4RL-style dataset locally"),
    ("data", "import"): ("mbrl.commands.data_import:import_logs", "a robot's logs (ROS 2 bag, LeRobot, CSV) as data"),
    ("data", "profile"): ("mbrl.commands.data_profile:profile", "the data's facts that settings are chosen from"),
    ("model", "fit"): ("mbrl.commands.model:fit", "fit a dynamics ensemble on a dataset"),
    ("model", "eval"): ("mbrl.commands.model:evaluate", "report a fitted model's accuracy and calibration"),
    ("train",): ("mbrl.commands.train:train", "train an agent (default: RAVL, quick preset, hopper-medium)"),
    ("sweep",): ("mbrl.commands.sweep:sweep", "tune an algorithm's options by Bayesian optimisation (Optuna)"),
    ("eval",): ("mbrl.commands.evaluate:evaluate", "evaluate a trained policy in simulation"),
    ("ope",): ("mbrl.commands.ope:ope", "estimate a policy's value from the data alone (FQE, critic, model)"),
    ("export",): ("mbrl.commands.export:export", "write a deployable policy"),
    ("deploy",): ("mbrl.commands.deploy:deploy", "run an exported policy on a robot"),
    ("finetune",): ("mbrl.commands.finetune:finetune", "fine-tune a trained policy online on a robot (WSRL)"),
}


def _usage() -> str:
    lines = ["usage: mbrl COMMAND [ARGS]", "", "commands:"]
    for key, (_, help_) in COMMANDS.items():
        lines.append(f"  {' '.join(key):<12} {help_}")
    lines.append("")
    lines.append("Run `mbrl COMMAND --help` for the options of one command.")
    return "\n".join(lines)


def _fail(message: str) -> int:
    print(f"mbrl: error: {message}", file=sys.stderr)
    return 2


def _parse(tyro, args_type, rest: list[str], prog: str, help_: str):
    """tyro's parse of `rest`; a parse error (a wrong type, a missing value, an unknown option) is printed as one
    line and gives None. Help and everything else pass through as tyro prints them."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = tyro.cli(args_type, args=rest, prog=prog, description=help_)
        sys.stderr.write(captured.getvalue())  # tyro's warnings, if any, still reach the user
        return args
    except SystemExit as exc:
        if exc.code in (0, None):
            sys.stderr.write(captured.getvalue())
            raise
        _fail(_one_line(captured.getvalue()) or f"could not parse the options of '{prog}'; see {prog} --help")
        return None


def _one_line(box: str) -> str:
    """tyro's boxed error as one line: its title and message, without the help text it appends."""
    parts = []
    for raw in box.splitlines():
        line = raw.strip().strip("│╭╮╰╯─ ").strip()
        if line.startswith(("Argument helptext", "For full helptext", "Perhaps you meant")):
            break
        if line:
            parts.append(line)
    if not parts:
        return ""
    title, message = parts[0], " ".join(parts[1:])
    if not message or message.lower().startswith(title.lower()):
        return message or title
    return f"{title.lower()}: {message}"


def _resolve(argv: list[str]) -> tuple[tuple[str, ...], list[str]] | None:
    if len(argv) >= 2 and (argv[0], argv[1]) in COMMANDS:
        return (argv[0], argv[1]), argv[2:]
    if argv and (argv[0],) in COMMANDS:
        return (argv[0],), argv[1:]
    return None


def _load(target: str):
    module_name, func_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, func_name)
    except (ImportError, AttributeError) as exc:
        if module_name in str(exc) or isinstance(exc, AttributeError):
            return None
        raise


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        print(__version__)
        return 0
    resolved = _resolve(argv)
    if resolved is None:
        groups = sorted({k[0] for k in COMMANDS})
        if argv[0] in groups and len(argv) >= 2 and not argv[1].startswith("-"):
            names = sorted(k[1] for k in COMMANDS if len(k) == 2 and k[0] == argv[0])
            return _fail(f"unknown command 'mbrl {argv[0]} {argv[1]}'; expected one of: {', '.join(names)}")
        if argv[0] in groups:
            print(_usage())
            return 2
        return _fail(f"unknown command '{argv[0]}'; expected one of: {', '.join(groups)}")
    key, rest = resolved
    target, help_ = COMMANDS[key]
    func = _load(target)
    if func is None:
        return _fail(f"'mbrl {' '.join(key)}' is not available in this version")
    hints = typing.get_type_hints(func)
    params = list(inspect.signature(func).parameters)
    try:
        if params:
            args_type = hints[params[0]]
            args = _parse(tyro, args_type, rest, f"mbrl {' '.join(key)}", help_)
            if args is None:
                return 2
            code = func(args)
        else:
            code = func()
    except UserError as exc:
        return _fail(" ".join(str(exc).split()))
    except KeyboardInterrupt:
        print("mbrl: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
