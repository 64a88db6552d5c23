"""One rule for numbers: every float option of every section refuses NaN and ±inf, except +inf where its field is
declared `unlimited` (inf: no limit), whichever way the value comes: `mbrl.config.build`'s overrides, a config
file, the command line of `mbrl train` and of the commands without a preset (`from_options`).

The walk is derived from the registries (every algorithm's sections, every world-model kind's) and from the
commands' option classes, not from a hand list. No training: every refusal comes before a dataset is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path

import pytest

from mbrl import config as config_io
from mbrl.agents import registry
from mbrl.cli import main
from mbrl.commands.deploy import SafetyArgs, SimArgs
from mbrl.commands.finetune import FinetuneArgs
from mbrl.commands.ope import OpeArgs
from mbrl.commands.sweep import SweepArgs
from mbrl.core import checks
from mbrl.core.errors import ConfigError
from mbrl.envs.robots.connect import SimOptions
from mbrl.envs.robots.safety import SafetyConfig
from mbrl.finetune import FinetuneConfig
from mbrl.sweep.engine import SweepOptions
from mbrl.world_models import registry as model_registry

BAD = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _number_kind(hint) -> str | None:
    """'float' for a float field (or float | None), 'tuple' for a tuple of floats, else None."""
    if hint is float:
        return "float"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds = {_number_kind(option) for option in typing.get_args(hint)} - {None}
        return kinds.pop() if kinds else None
    if typing.get_origin(hint) is tuple and float in typing.get_args(hint):
        return "tuple"
    return None


def float_fields(cls, prefix: str = "") -> list[tuple[str, dataclasses.Field, str]]:
    """(dotted name, field, kind) of every float field of the dataclass `cls`, nested dataclasses walked."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        name = prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            out += float_fields(hints[f.name], name + ".")
        elif _number_kind(hints[f.name]):
            out.append((name, f, _number_kind(hints[f.name])))
    return out


def train_sections() -> dict[str, type]:
    """Every section of TrainConfig: the algorithms' (`mbrl.agents.registry`), the world models'
    (`mbrl.world_models.registry`) and the common ones; checked to hold both registries whole."""
    sections = {f.name: type(f.default) for f in dataclasses.fields(config_io.TrainConfig) if dataclasses.is_dataclass(f.default)}
    assert set(registry.SECTIONS) <= set(sections) and set(model_registry.SECTIONS) <= set(sections)
    return sections


def train_cases():
    cases = []
    for section, cls in train_sections().items():
        for name, field, kind in float_fields(cls, section + "."):
            reader = next(algo for algo in registry.ALGORITHMS if name not in config_io.unread_fields(algo))
            cases += [pytest.param(reader, name, field, kind, text, id=f"{name}={text}") for text in BAD]
    return cases


def nested(name: str, value) -> dict:
    section, _, field = name.partition(".")
    return {section: {field: value}}


def value_of(kind: str, number: float):
    return [number] if kind == "tuple" else number


TRAIN_CASES = train_cases()


def test_the_walk_finds_the_float_fields_of_every_algorithm_and_world_model():
    sections = {c.values[1].partition(".")[0] for c in TRAIN_CASES}
    assert {"mobile", "mopo", "fit", "ensemble", "imagination"} <= sections
    assert len(TRAIN_CASES) >= 3 * 40


@pytest.mark.parametrize("algo, name, field, kind, text", TRAIN_CASES)
def test_every_float_option_of_every_section_refuses_nan_and_inf(algo, name, field, kind, text):
    value = value_of(kind, BAD[text])
    if checks.allows_inf(field) and text == "inf":
        config_io.build(algo, "hopper-medium", "quick", nested(name, value))  # declared: inf means no limit
        assert "inf" in (config_io.field_help(type(getattr(config_io._DEFAULTS, name.partition('.')[0])), field.name) or "")
        return
    with pytest.raises(ConfigError) as info:
        config_io.build(algo, "hopper-medium", "quick", nested(name, value))
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(name) and "expected" in message and text in message, message


def _replaced(args, dotted: str, value):
    """`args` (an options instance) with the option at `dotted` (`safety.max_delta`) set to `value`."""
    head, _, rest = dotted.partition(".")
    inner = _replaced(getattr(args, head), rest, value) if rest else value
    return dataclasses.replace(args, **{head: inner})


# The commands without a preset: (their config class, an instance of their options, the values that are not options)
COMMANDS = {
    "finetune": (FinetuneConfig, FinetuneArgs(run=Path("run"), robot="mujoco:Hopper-v5"), {"run": "run"}),
    "sweep": (SweepOptions, SweepArgs(space=Path("space.toml")), {}),
    "ope": (OpeArgs, OpeArgs(policy=Path("run"), dataset="hopper-medium"), {}),
    "deploy --safety": (SafetyConfig, SafetyArgs(), {}),
    "deploy --sim": (SimOptions, SimArgs(), {"noise_seed": 0}),
}


def command_cases():
    cases = []
    for command, (cls, args, values) in COMMANDS.items():
        for name, field, kind in float_fields(cls):
            cases += [pytest.param(command, name, field, kind, text, id=f"{command}:{name}={text}") for text in BAD]
    return cases


@pytest.mark.parametrize("command, name, field, kind, text", command_cases())
def test_every_float_option_of_the_commands_without_a_preset_refuses_nan_and_inf(command, name, field, kind, text):
    cls, args, values = COMMANDS[command]
    if checks.allows_inf(field) and text == "inf":
        config_io.from_options(cls, _replaced(args, name, value_of(kind, BAD[text])), **values)
        return
    with pytest.raises(ConfigError) as info:  # a group that is its config class itself (ope's fqe) checks as tyro builds it
        config_io.from_options(cls, _replaced(args, name, value_of(kind, BAD[text])), **values)
    message, field_name = str(info.value), name.rpartition(".")[2]
    assert len(message.splitlines()) == 1 and text in message, message
    assert message.startswith(("--" + field_name.replace("_", "-"), "--" + name.replace("_", "-"), name)), message


def test_an_unlimited_field_takes_inf_and_refuses_nan_and_minus_inf():
    @dataclasses.dataclass(frozen=True)
    class Limits:
        """max_seconds: seconds at most (inf: no limit)."""

        max_seconds: float = checks.unlimited(60.0)
        rate: float = 1.0

    assert config_io.override(Limits(), {"max_seconds": math.inf}).max_seconds == math.inf
    for value in (math.nan, -math.inf):
        with pytest.raises(ConfigError, match=r"^max_seconds: expected a number or inf \(no limit\)"):
            config_io.override(Limits(), {"max_seconds": value})
    with pytest.raises(ConfigError, match=r"^rate: expected a finite number, found inf"):
        config_io.override(Limits(), {"rate": math.inf})


def test_a_config_file_with_a_non_finite_number_is_refused_naming_the_file_and_option(tmp_path):
    path = tmp_path / "config.json"
    data = config_io.to_dict(config_io.build("mobile"))
    data["mobile"]["penalty_coef"] = math.inf
    path.write_text(json.dumps(data))  # Python's json writes Infinity, and reads it back
    with pytest.raises(ConfigError, match=r"config\.json: mobile\.penalty_coef: expected a finite number, found inf"):
        config_io.load(path)


@pytest.mark.parametrize("argv, option", [
    (["train", "--algo", "mobile", "--mobile.penalty-coef", "inf"], "mobile.penalty_coef"),
    (["train", "--algo", "mopo", "--mopo.penalty-coef", "nan"], "mopo.penalty_coef"),
    (["train", "--algo", "ravl", "--fit.learning-rate=-inf"], "fit.learning_rate"),
    (["train", "--algo", "ravl", "--imagination.real-ratio", "nan"], "imagination.real_ratio"),
    (["model", "fit", "--dataset", "missing.hdf5", "--ensemble.logvar-bound-penalty", "inf"], "ensemble.logvar_bound_penalty"),
    (["finetune", "missing-run", "--robot", "mujoco:Hopper-v5", "--anchor", "inf"], "--anchor"),
    (["finetune", "missing-run", "--robot", "mujoco:Hopper-v5", "--max-delta", "nan"], "--max-delta"),
    (["sweep", "--space", "mopo", "--algo", "mopo", "--holdout", "nan"], "--holdout"),
    (["ope", "missing-run", "--dataset", "hopper-medium", "--fqe.learning-rate", "inf"], "--fqe.learning-rate"),
])
def test_the_cli_refuses_a_non_finite_number_in_one_line_with_exit_2(argv, option, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written; the refusal comes first
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"mbrl: error: {option}: expected a finite number"), err
    assert not any(tmp_path.iterdir())


def test_the_cli_refuses_a_non_finite_number_in_a_config_file(tmp_path, capsys):
    path = tmp_path / "config.json"
    data = config_io.to_dict(config_io.build("mobile"))
    data["mobile"]["penalty_coef"] = math.nan
    path.write_text(json.dumps(data))
    assert main(["train", "--config", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mobile.penalty_coef: expected a finite number, found nan" in err, err
    assert not (tmp_path / "run").exists()
