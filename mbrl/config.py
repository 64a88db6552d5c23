"""The configuration of a training run: frozen dataclasses, one per component, composed in `TrainConfig`.

A run's config is built in layers: the preset of the algorithm (data its module declares), then a config
file (`--config FILE`, the `config.json` of an earlier run), then the options given on the command line.
The options of `mbrl train` are generated from these dataclasses (`TrainArgs`): every field of every
component becomes an option such as `--sac.num-critics 5` or `--schedule.epochs 10`, whose absence
means "keep the preset's value". `mbrl model fit` gets its `--ensemble.*` and `--fit.*` options from the
same mechanism (`options_class`). `mbrl finetune`, `mbrl sweep` and `mbrl deploy`, which have no preset, take
theirs from their own config classes with the classes' defaults (`option_fields`).

Each algorithm reads only some sections (its `mbrl.agents.base.AlgorithmEntry`), and `config.json` holds only those: an
option of a section it does not read (given on the command line, to `build`, or with a non-default value
in a config file) is refused rather than ignored. Validation of one section's values lives in that
section's `__post_init__`; `TrainConfig.__post_init__` holds only the checks that span sections.

The command-line mirrors are generated here rather than left to tyro: "absent" must mean "the preset's
value" while the preset depends on `--algo` from the same command line, the refusals need to know which
options were given, and config files need the same type checks (`_coerce`) as the options.

One rule for numbers, in `_coerce`, which every value passes (presets, config files, `build`'s overrides, every
command's options): a float is finite; +inf only where the field is declared `mbrl.core.checks.unlimited` (inf: no
limit, said in its help). A NaN or ±inf elsewhere is a one-line `ConfigError` naming the option (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

from mbrl.agents import registry
from mbrl.core import checks
from mbrl.core.errors import ConfigError
from mbrl.core.files import read_json, write_text_atomic
from mbrl.world_models import registry as model_registry
from mbrl.world_models.ensemble import observation_indices
from mbrl.world_models.kind import ModelKind

CONFIG_VERSION = 1
AUTO = "auto"  # the preset the rules of `mbrl.rules` fill in from the data's profile


@dataclasses.dataclass(frozen=True)
class ImaginationConfig:
    """Model rollouts that feed a model-based agent (unused by BC).

    horizon: steps per imagined rollout (MOPO's h, RAVL's k).
    rollouts_per_epoch: start states drawn from the dataset each epoch (one compiled rollout).
    retain_epochs: the model buffer holds this many epochs of rollouts (a ring).
    real_ratio: the fraction of each batch drawn from the real data.
    per_seed_model: with --seeds N, fit one world model per seed (seed + i) instead of sharing one.
    model_noise: each imagined step samples its member's Gaussian (MOPO, MBPO); False steps with the member's mean,
        for a system without process noise whose model's variance only reflects what it cannot predict.
    """

    horizon: int = 5
    rollouts_per_epoch: int = 50_000
    retain_epochs: int = 5
    real_ratio: float = 0.05
    per_seed_model: bool = False
    model_noise: bool = True

    def __post_init__(self):
        checks.positive_ints("imagination", self, "horizon", "rollouts_per_epoch", "retain_epochs")
        if not 0.0 <= self.real_ratio <= 1.0:
            raise ConfigError(f"imagination.real_ratio: expected a value in [0, 1], found {self.real_ratio}")


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """How long to train and how often to look.

    epochs: epochs of (rollouts, then `updates_per_epoch` updates in one compiled scan).
    eval_every / checkpoint_every: in epochs; the last epoch always evaluates and checkpoints.
        checkpoint_every 0 checkpoints with every evaluation.
    eval_episodes: real-env episodes per seed at each evaluation.
    eval_seed: episode i of training seed s resets the env with eval_seed + s * eval_episodes + i.
    """

    epochs: int = 100
    updates_per_epoch: int = 1000
    eval_every: int = 10
    eval_episodes: int = 10
    checkpoint_every: int = 0
    eval_seed: int = 10_000

    def __post_init__(self):
        checks.positive_ints("schedule", self, "epochs", "updates_per_epoch", "eval_every", "eval_episodes")
        checks.non_negative_ints("schedule", self, "checkpoint_every")

    @property
    def checkpoint_period(self) -> int:
        return self.checkpoint_every or self.eval_every


@dataclasses.dataclass(frozen=True)
class SelectConfig:
    """Which checkpoint `mbrl export` takes.

    by: last (the latest checkpoint) | fqe | model: per training seed, the checkpoint whose estimate from the data
        alone is best, by its pessimistic end: every checkpoint is kept and judged after training. fqe: the low end
        of FQE's interval (a recurrent policy acts on each logged episode's history); model: the greedy return in
        the run's MLP world model, the elites' mean less their spread (the sweep's offline objective).
    fqe_steps: FQE's most gradient steps per checkpoint and training seed.
    holdout: the fraction of episodes FQE's fit is checked on (a NeoRL-2 -val file instead, where there is one).
    starts: model: imagined episodes per elite, from the dataset's episode starts.
    """

    by: str = "last"
    fqe_steps: int = 20_000
    holdout: float = 0.1
    starts: int = 64

    def __post_init__(self):
        if self.by not in ("last", "fqe", "model"):
            raise ConfigError(f"select.by: expected last, fqe or model, found {self.by!r}")
        checks.positive_ints("select", self, "fqe_steps", "starts")
        if not 0.0 < self.holdout < 1.0:
            raise ConfigError(f"select.holdout: expected a fraction in (0, 1), found {self.holdout}")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Where metrics go besides `metrics.jsonl`: the terminal (progress bar) and optional trackers.

    tensorboard / wandb need the `tracking` extra (pip install 'offline-mbrl[tracking]').
    """

    progress: bool = True
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "offline-mbrl"


TOP_LEVEL = ("algo", "dataset", "task", "preset", "seed", "seeds", "normalize_obs", "ignore_obs_dims")  # fields of TrainConfig every algorithm reads


class _TrainConfigRules:
    """Everything that defines a run. `config.json` in a run directory is this, as JSON.

    algo: {algorithms}.
    dataset: a dataset SOURCE (`mbrl data list`): a made dataset name such as hopper-medium, a
        .hdf5/.npz path, minari:ID or neorl2:TASK.
    task: the task the dataset comes from (`mbrl data list`), where the dataset does not name it; its reward
        and termination rules drive imagination, its simulator evaluates.
    preset: quick (sized for 2 CPU cores) | paper (the published settings) | auto (quick's sizes, no task's own
        entry; the rules of `mbrl.rules` set what the data's profile calls for, `mbrl data profile` shows them).
    seed / seeds: train seeds seed, seed+1, ..., seed+seeds-1 in one compiled program.
    normalize_obs: standardise observations inside the policy and critics by the train data's mean and std
        (stored with the run, part of the export): for observations of wide or unequal ranges. mopo-ppo has its
        own (ppo.normalize_obs).
    ignore_obs_dims: observation dimensions the policy and critics never see (held at 0 inside the networks, stored
        with the run, part of the export), such as a robot's absolute position, on which a good policy need not
        depend and which the data's episodes tie to the time step.

    The sections `algo` does not read (`mbrl.agents.registry`) hold their defaults: a value there would be
    ignored, so it is refused.
    """

    # The fields are generated below (`TrainConfig`): the algorithms' sections come from `mbrl.agents.registry`.

    def __post_init__(self):
        entry = registry.entry(self.algo)
        if self.preset not in (*registry.PRESETS, AUTO):
            raise ConfigError(f"preset: unknown preset {self.preset!r}; expected one of "
                              f"{', '.join((*registry.PRESETS, AUTO))}")
        checks.positive_ints("", self, "seeds")
        checks.non_negative_ints("", self, "seed")
        object.__setattr__(self, "ignore_obs_dims", observation_indices("ignore_obs_dims", self.ignore_obs_dims))
        changed = [name for name in unread_fields(self.algo) if _field_value(self, name) != _field_value(_DEFAULTS, name)]
        if changed:
            raise ConfigError(refusal(self.algo, changed))
        # The algorithm's own rules across sections, and the values that follow from others.
        for section, value in entry.finalize(self).items():
            object.__setattr__(self, section, value)

    @property
    def uses_model(self) -> bool:
        return registry.entry(self.algo).uses_model

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))


def _field(name: str, kind, default):
    return (name, kind, dataclasses.field(default=default))


def _check_model_kinds() -> None:
    """Every algorithm's `model_kind` names a world-model kind of `mbrl.world_models.registry` (agents/ declares it by
    name: it never imports world_models)."""
    for entry in registry.ALGORITHMS.values():
        if entry.model_kind is not None and entry.model_kind not in model_registry.KINDS:
            raise ValueError(f"{entry.name}: model_kind {entry.model_kind!r}; expected one of "
                             f"{[*model_registry.KINDS, None]}")


_check_model_kinds()


# Everything that defines a run: the top-level fields, the algorithms' own sections (`mbrl.agents.registry.SECTIONS`,
# so that a new algorithm's section needs no line here), then the model, imagination and schedule sections.
TrainConfig = dataclasses.make_dataclass(
    "TrainConfig",
    [
        _field("algo", str, registry.DEFAULT), _field("dataset", str, "hopper-medium"), _field("task", str | None, None),
        _field("preset", str, "quick"), _field("seed", int, 0), _field("seeds", int, 1), _field("normalize_obs", bool, False),
        _field("ignore_obs_dims", tuple[int, ...], ()),
        *(_field(name, section, section()) for name, section in registry.SECTIONS.items()),
        _field("imagination", ImaginationConfig, ImaginationConfig()),
        *(_field(name, section, section()) for name, section in model_registry.SECTIONS.items()),
        _field("schedule", ScheduleConfig, ScheduleConfig()),
        _field("select", SelectConfig, SelectConfig()), _field("logging", LoggingConfig, LoggingConfig()),
    ],
    bases=(_TrainConfigRules,), frozen=True,
)
TrainConfig.__module__ = __name__
TrainConfig.__doc__ = _TrainConfigRules.__doc__.replace("{algorithms}", " | ".join(registry.ALGORITHMS))


# The field defaults of TrainConfig's sections (what an algorithm's unread sections must hold).
_DEFAULTS = types.SimpleNamespace(**{f.name: f.default for f in dataclasses.fields(TrainConfig)})


# -------------------------------------------------------------------------------------------------
# What each algorithm reads


def _section_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(TrainConfig) if dataclasses.is_dataclass(f.default))


def _is_read(algo: str, section: str, name: str | None = None) -> bool:
    entry = registry.entry(algo)
    if section in TOP_LEVEL or section not in _section_names():
        return True  # unknown names are refused by `override` with their own message
    if section not in (*sections_read(algo), *registry.COMMON_SECTIONS):
        return False
    return section != "imagination" or name is None or name in entry.imagination_fields


def unread_fields(algo: str) -> list[str]:
    """Every `section.field` of TrainConfig that `algo` does not read."""
    return [f"{section}.{f.name}" for section in _section_names() for f in dataclasses.fields(getattr(_DEFAULTS, section))
            if not _is_read(algo, section, f.name)]


def unread(algo: str, nested: dict[str, Any]) -> list[str]:
    """The dotted names in the nested `nested` (options, a config file) that `algo` does not read."""
    out = []
    for section, value in nested.items():
        if not isinstance(value, dict):
            out += [] if _is_read(algo, section) else [section]
            continue
        out += [f"{section}.{name}" for name in value if not _is_read(algo, section, name)]
    return out


def _field_value(config, name: str):
    section, _, field = name.partition(".")
    return getattr(getattr(config, section), field)


def _option(name: str, cli: bool) -> str:
    return "--" + name.replace("_", "-") if cli else name


def model_kind(algo: str) -> ModelKind | None:
    """The world-model kind `algo` fits (its `model_kind`, resolved in `mbrl.world_models.registry`), or None."""
    name = registry.entry(algo).model_kind
    return None if name is None else model_registry.kind(name)


def sections_read(algo: str) -> tuple[str, ...]:
    """The sections `algo` reads besides those every run has: its own, imagination, its world model's."""
    kind = model_kind(algo)
    return (*registry.entry(algo).reads, *(kind.sections if kind is not None else ()))


def model_sections(algo: str) -> tuple[str, ...]:
    """The sections that define `algo`'s world model (its architecture and its fit); () for none."""
    kind = model_kind(algo)
    return tuple(kind.sections) if kind is not None else ()


def reads(algo: str) -> list[str]:
    """What `algo` reads: whole sections (`sac`) and single fields (`imagination.per_seed_model`)."""
    entry = registry.entry(algo)
    out = []
    for section in (*sections_read(algo), *registry.COMMON_SECTIONS):
        if section == "imagination" and set(entry.imagination_fields) != set(registry.ALL_IMAGINATION):
            out += [f"imagination.{name}" for name in entry.imagination_fields]
        else:
            out.append(section)
    return out


def refusal(algo: str, names: Sequence[str], cli: bool = False) -> str:
    """The one-line refusal of options `names` that `algo` does not read (`cli`: as command-line options)."""
    read = ", ".join(_option(name, cli) + ("" if "." in name else ".*") for name in reads(algo))
    return f"{', '.join(_option(n, cli) for n in names)}: not read by algorithm {algo}, which reads {read}"


def _drop_unread_defaults(algo: str, data: dict[str, Any]) -> dict[str, Any]:
    """`data` without the unread fields that hold their default value (config.json files written before
    runs kept only their own sections); unread fields with other values stay, for TrainConfig to refuse."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for name in unread(algo, data):
        section, _, field = name.partition(".")
        if not field:
            continue
        default = getattr(_DEFAULTS, section)
        try:
            same = getattr(override(default, {field: out[section][field]}, section), field) == getattr(default, field)
        except ConfigError:
            same = False
        if same:
            del out[section][field]
    return {k: v for k, v in out.items() if not (isinstance(v, dict) and not v and data[k])}  # emptied: gone


# -------------------------------------------------------------------------------------------------
# Building a config from layers of nested dicts


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value, hint, where: str, unlimited: bool = False):
    """Check a JSON/CLI value against a field's annotation; lists become tuples for sequences.

    Every value an option takes passes here (`override`: presets, config files, `build`'s overrides and the options
    of `mbrl train`, `sweep` and `model fit`; `from_options`: the options of the commands without a preset), so the
    number rule is here: a float is finite (`mbrl.core.checks.finite`), or +inf where its field is declared
    `unlimited` (no limit)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where, unlimited)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: unexpected value {value!r}")
    if origin in (tuple, Sequence, list, typing.Sequence) or hint in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, found {value!r}")
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        inner = args[0] if args else Any
        return tuple(_coerce(v, inner, f"{where}[{i}]", unlimited) for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, found {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, found {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, found {value!r}")
        return checks.finite(value, where, unlimited)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, found {value!r}")
        return value
    return value


def override(obj, overrides: dict[str, Any], where: str = ""):
    """A copy of the frozen dataclass `obj` with the nested `overrides` applied and type-checked."""
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping of fields, found {overrides!r}")
    hints = _hints(type(obj))
    fields = {f.name: f for f in dataclasses.fields(obj)}
    changes = {}
    for key, value in overrides.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            raise ConfigError(f"{path}: unknown field; expected one of {', '.join(fields)}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            changes[key] = override(current, value, path)
        else:
            changes[key] = _coerce(value, hints[key], path, checks.allows_inf(fields[key]))
    try:
        return dataclasses.replace(obj, **changes)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from None


def merge_overrides(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = value
    return out


def dataset_key(source: str) -> str:
    """The name presets are keyed by: `hopper-medium` for a made dataset or a file `hopper-medium-v2.hdf5`;
    the task's name (`dmsd`) for NeoRL-2's files, which have one dataset per task (`neorl2:DMSD`,
    `DMSD-high-100000-train.npz`)."""
    from mbrl.core.types import CHANGE_SUFFIX, find_spec

    if source.lower().endswith(CHANGE_SUFFIX):  # the same dataset with each observation's change: the same presets
        return dataset_key(source[: -len(CHANGE_SUFFIX)])
    if source.startswith("neorl2:"):
        return source.removeprefix("neorl2:").partition("-")[0].lower()
    head = Path(source).name.partition("-")[0]
    spec = find_spec(head) if source.endswith(".npz") else None
    if spec is not None and spec.suite == "neorl2":
        return spec.name.lower()
    is_minari = source.startswith("minari:")
    name = source.removeprefix("minari:").replace("/", "-") if is_minari else Path(source).name
    for suffix in (".hdf5", ".h5", ".npz"):
        name = name.removesuffix(suffix)
    parts = name.replace("_", "-").split("-")
    if len(parts) > 1 and parts[-1].startswith("v") and parts[-1][1:].isdigit():
        parts = parts[:-1]
    if is_minari and len(parts) >= 3:  # a namespace: mbrl/<task>/<level>-v0, mujoco/<task>/<level>-v0
        parts = parts[1:]
    return "-".join(parts).lower()


def build(algo: str = registry.DEFAULT, dataset: str = "hopper-medium", preset: str = "quick", overrides: dict | None = None) -> TrainConfig:
    """The preset of `algo` for `dataset`, with nested `overrides` on top.

    An override that `algo` does not read (a section or imagination field of another algorithm) is refused."""
    base = TrainConfig(algo=algo, dataset=dataset, preset=preset)  # checks the names before the preset lookup
    names = unread(algo, overrides or {})
    if names:
        raise ConfigError(refusal(algo, names))
    entry = registry.entry(algo)
    head = {"algo": algo, "dataset": dataset, "preset": preset}
    if preset == AUTO:
        layers = merge_overrides(entry.preset("quick"), head)
        layers = merge_overrides(layers, auto_overrides(override(TrainConfig(), merge_overrides(layers, overrides or {}))))
        layers["preset"] = AUTO
    else:
        layers = merge_overrides(entry.preset(preset, dataset_key(dataset)), head)
    # From the plain defaults, so that nothing `base` derived from its own sections (mopo-ppo's updates per epoch)
    # stands in for a value given here.
    return override(TrainConfig(), merge_overrides(layers, overrides or {}))


def updates_of(config: TrainConfig) -> int:
    """The run's update budget: its epochs times the updates of each."""
    return config.schedule.epochs * config.schedule.updates_per_epoch


def quick_base(algo: str, dataset: str) -> TrainConfig:
    """`algo`'s quick preset without any dataset's own entry: what `--preset auto` starts from."""
    return override(TrainConfig(), merge_overrides(registry.entry(algo).preset("quick"), {"algo": algo, "dataset": dataset}))


def auto_overrides(config: TrainConfig) -> dict[str, Any]:
    """What the rules of `mbrl.rules` set on `config` (quick's sizes and the given options) from its dataset's profile."""
    # Imported here: the dataset and its profile are read only for `--preset auto`.
    from mbrl import rules
    from mbrl.datasets.profile import cached_profile

    entry, kind = registry.entry(config.algo), model_kind(config.algo)
    model_section = kind.architecture_section if kind is not None else None
    model_fields = tuple(f.name for f in dataclasses.fields(getattr(config, model_section))) if model_section else ()
    placed = rules.choices_for(cached_profile(config.dataset, config.task), updates_of(config),
                               {name: getattr(config, name) for name in entry.sections})
    return rules.as_overrides(placed, entry.scales_observations, model_section, model_fields)


def to_dict(config: TrainConfig) -> dict[str, Any]:
    """`config` as JSON-ready nested dicts, with only the sections (and imagination fields) its algorithm reads."""

    def convert(value):
        if dataclasses.is_dataclass(value):
            return {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (tuple, list)):
            return [convert(v) for v in value]
        return value

    out = convert(config)
    for name in unread_fields(config.algo):
        section, _, field = name.partition(".")
        out[section].pop(field, None)
    return {"version": CONFIG_VERSION, **{k: v for k, v in out.items() if v != {}}}


def from_dict(data: dict[str, Any], where: str = "config") -> TrainConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, found {type(data).__name__}")
    data = dict(data)
    version = data.pop("version", CONFIG_VERSION)
    if version != CONFIG_VERSION:
        raise ConfigError(f"{where}: field 'version' is {version!r}; expected {CONFIG_VERSION}")
    try:
        base = TrainConfig(algo=data.get("algo", registry.DEFAULT), preset=data.get("preset", "quick"))
        return override(base, _drop_unread_defaults(base.algo, data))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def save(config: TrainConfig, path: Path) -> None:
    """Write `config.json` atomically."""
    write_text_atomic(path, json.dumps(to_dict(config), indent=2) + "\n")


def load(path: Path) -> TrainConfig:
    return from_dict(read_json(path, "no such config file", ConfigError), str(path))


# -------------------------------------------------------------------------------------------------
# Command lines: mirrors of config dataclasses whose every field is optional (None: keep the layer below)


def _field_help(cls, name: str) -> str | None:
    """The `name: text` entry of the class docstring (our convention), or of a base class's."""
    for klass in cls.__mro__:  # a field a base class holds is documented there
        found = _doc_entry(klass.__doc__ if klass is cls or dataclasses.is_dataclass(klass) else None, name)
        if found is not None:
            return found
    return None


def _doc_entry(doc: str | None, name: str) -> str | None:
    lines = (doc or "").splitlines()
    for i, line in enumerate(lines):
        head, colon, text = line.strip().partition(":")
        names = [n.strip() for n in head.split("/")]
        if not colon or name not in names or not all(n.isidentifier() for n in names):
            continue
        indent = len(line) - len(line.lstrip())
        parts = [text.strip()]
        for more in lines[i + 1 :]:
            if not more.strip() or len(more) - len(more.lstrip()) <= indent:
                break
            parts.append(more.strip())
        return " ".join(parts)
    return None


def _metavar(hint) -> str:
    origin = typing.get_origin(hint)
    if origin is tuple:
        inner = _metavar(typing.get_args(hint)[0])
        return f"{inner} [{inner} ...]"
    return {int: "INT", float: "FLOAT", str: "STR", bool: "{True,False}"}.get(hint, "VALUE")


def _cli_type(hint):
    origin = typing.get_origin(hint)
    if origin in (Sequence, typing.Sequence, list) or hint in (tuple, list):
        args = typing.get_args(hint)
        return tuple[args[0] if args else int, ...]
    if origin in (typing.Union, types.UnionType):
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        if len(options) == 1:
            return _cli_type(options[0])
    return hint


Hint = Callable[[str, str, Any], str]  # (section, field, default) -> the help's "(default: ...)"


def the_default(section: str, name: str, default) -> str:
    shown = " ".join(str(v) for v in default) if isinstance(default, (tuple, list)) else default
    return f"(default: {shown})"


def from_the_preset(section: str, name: str, default) -> str:
    return "(default: from the preset)" if section else the_default(section, name, default)  # top level: no preset


def mirror_fields(cls, prefix: str, hint: Hint, section: str = "") -> list:
    """The fields of `cls` as `T | None = None` options; a nested dataclass becomes a nested mirror."""
    import tyro

    hints = _hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            nested = _mirror(type(default), prefix + f.name.capitalize(), hint, f.name)
            fields.append((f.name, nested, dataclasses.field(default_factory=nested, metadata={"option": True})))
            continue
        cli_type = _cli_type(hints[f.name])
        arg = tyro.conf.arg(help=(_field_help(cls, f.name) or "").strip() or None, metavar=_metavar(cli_type),
                            help_behavior_hint=hint(section, f.name, default))
        fields.append((f.name, Annotated[cli_type | None, arg], dataclasses.field(default=None, metadata={"option": True})))
    return fields


def _mirror(cls, prefix: str, hint: Hint, section: str = ""):
    mirror = dataclasses.make_dataclass(f"{prefix}{cls.__name__}Options", mirror_fields(cls, prefix, hint, section), frozen=True)
    mirror.__module__ = __name__
    return mirror


def section_options(sections: dict[str, type], hint: Hint = the_default) -> list:
    """Option fields `--SECTION.FIELD` for the config dataclasses `sections` (name -> class)."""
    out = []
    for name, cls in sections.items():
        nested = _mirror(cls, name.capitalize(), hint, name)
        out.append((name, nested, dataclasses.field(default_factory=nested, metadata={"option": True})))
    return out


def options_class(name: str, doc: str, extra: list, options: list):
    """A frozen dataclass for tyro: the command's own fields `extra` (name, type[, field]), then `options`."""
    cls = dataclasses.make_dataclass(name, [*extra, *options], frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = doc
    return cls


# Commands with no preset under their options (finetune, deploy, sweep): an option's default is its field's.


def field_help(cls, name: str) -> str | None:
    """The help of field `name` of `cls`: its `name: text` entry in the class docstring."""
    return _field_help(cls, name)


def _option_type(hint):
    """`hint` as tyro parses it, None kept (`--max-delta None`): a sequence becomes a tuple."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.Union[tuple(_option_type(option) for option in typing.get_args(hint))]
    return _cli_type(hint)


def option_fields(cls, skip: Sequence[str] = (), flat: Sequence[str] = (), defaults=None) -> list:
    """The fields of `cls` as options with its own types and defaults (`defaults`: an instance whose values are the
    defaults instead) and help from its docstring; a bool is a --flag/--no-flag pair. A nested dataclass becomes a
    group, `--safety.max-delta`, or, named in `flat`, `--max-delta`. `from_options` builds `cls` back."""
    import tyro

    hints = _hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if defaults is not None:
            default = getattr(defaults, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING
        arg = tyro.conf.arg(help=_field_help(cls, f.name))
        if dataclasses.is_dataclass(hints[f.name]):
            group = options_of(hints[f.name], defaults=default)
            kind = tyro.conf.OmitArgPrefixes[group] if f.name in flat else group
            fields.append((f.name, Annotated[kind, arg], dataclasses.field(default_factory=group)))
        elif default is dataclasses.MISSING:
            fields.append((f.name, Annotated[_option_type(hints[f.name]), arg]))
        else:
            fields.append((f.name, Annotated[_option_type(hints[f.name]), arg], dataclasses.field(default=default)))
    return fields


def options_of(cls, skip: Sequence[str] = (), flat: Sequence[str] = (), defaults=None):
    """A frozen dataclass of `option_fields(cls, ...)`: a group of options, such as a field of a command's args."""
    summary = " ".join((cls.__doc__ or "").split("\n\n")[0].split())  # the help's heading of the group
    return options_class(f"{cls.__name__}Options", summary, [], option_fields(cls, skip, flat, defaults))


def from_options(cls, args, **values):
    """`cls` from the options that `option_fields` made of it (groups built back into their dataclasses), with
    `values` for the fields that are not options; a field that is neither keeps its default. Each option's value
    is checked as a config file's is (`_coerce`: the number rule), named by its flag (`--max-delta`)."""
    return _from_options(cls, args, "--", values)


def _from_options(cls, args, prefix: str, values: dict[str, Any]):
    import tyro

    flat = typing.get_args(tyro.conf.OmitArgPrefixes[int])[1]  # the marker of a group whose options have no prefix
    hints, annotations = _hints(cls), typing.get_type_hints(type(args), include_extras=True)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif hasattr(args, f.name):
            value, flag = getattr(args, f.name), prefix + f.name.replace("_", "-")
            if dataclasses.is_dataclass(hints[f.name]):
                inner = prefix if flat in typing.get_args(annotations.get(f.name))[1:] else flag + "."
                kwargs[f.name] = _from_options(hints[f.name], value, inner, {})
            else:
                kwargs[f.name] = _coerce(value, hints[f.name], flag, checks.allows_inf(f))
    return cls(**kwargs)


def changed_options(args, defaults, skip: Sequence[str] = ()) -> list[str]:
    """The fields of `args` that differ from `defaults` (both of one options class), as flags: `--steps`, and the
    options of a group one by one (`--max-delta`: the groups of these commands are flat)."""
    out = []
    for f in dataclasses.fields(args):
        value, default = getattr(args, f.name), getattr(defaults, f.name)
        if f.name in skip or value == default:
            continue
        out += changed_options(value, default) if dataclasses.is_dataclass(value) else ["--" + f.name.replace("_", "-")]
    return out


def given_options(args) -> dict[str, Any]:
    """The options that were given, as nested dicts (the command's own fields and options left at None dropped)."""

    def collect(obj):
        out = {}
        for f in dataclasses.fields(obj):
            if not f.metadata.get("option"):
                continue
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                nested = collect(value)
                if nested:
                    out[f.name] = nested
            elif value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    return collect(args)


def refuse_unread_options(algo: str, given: dict[str, Any]) -> None:
    names = unread(algo, given)
    if names:
        raise ConfigError(refusal(algo, names, cli=True))


def _path_arg(help_: str, metavar: str, hint: str = ""):
    import tyro

    return Annotated[Path | None, tyro.conf.arg(help=help_, metavar=metavar, help_behavior_hint=hint)]


TrainArgs = options_class(
    "TrainArgs",
    "Train an agent. With no options: RAVL, quick preset, hopper-medium (made first if missing).",
    [
        ("run_dir", _path_arg("where the run is written", "DIR", "(default: runs/ALGO-DATASET-TIME)"), dataclasses.field(default=None)),
        ("resume", _path_arg("continue the run in this directory from its last checkpoint", "DIR"), dataclasses.field(default=None)),
        ("config", _path_arg("a config.json to start from (options given here override it)", "FILE"), dataclasses.field(default=None)),
        ("world_model", _path_arg("reuse this fitted world model (from `mbrl model fit` or a run's world_model/)", "DIR",
                                  "(default: fit one)"), dataclasses.field(default=None)),
    ],
    mirror_fields(TrainConfig, "", from_the_preset),
)


def resolve(args) -> TrainConfig:
    """The run's config from `TrainArgs`: preset (or --config file) with the given options on top.

    Options of sections the algorithm does not read are refused."""
    given = given_options(args)
    if args.config is not None:
        base = to_dict(load(args.config))
        base.pop("version", None)
        refuse_unread_options(given.get("algo", base["algo"]), given)
        return from_dict(merge_overrides(base, given), str(args.config))
    algo = given.pop("algo", registry.DEFAULT)
    dataset = given.pop("dataset", "hopper-medium")
    preset = given.pop("preset", "quick")
    refuse_unread_options(algo, given)
    return build(algo, dataset, preset, given)
