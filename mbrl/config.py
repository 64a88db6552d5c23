"""The configuration of a training run: frozen dataclasses, one per component, composed in `TrainConfig`.

A run's config is built in layers: the preset of the algorithm (`agents.presets`, data), then a config
file (`--config FILE`, the `config.json` of an earlier run), then the options given on the command line.
The options of `mbrl train` are generated from these dataclasses (`TrainArgs`): every field of every
component becomes an option such as `--sac.num-critics 5` or `--schedule.epochs 10`, whose absence
means "keep the preset's value".
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from agents import presets
from agents.bc import BCConfig
from agents.mopo import MOPOConfig
from agents.neubay import NeubayConfig
from agents.sac_n import SACNConfig
from mbrl.core.errors import ConfigError
from mbrl.core.replay import real_count
from world_models.ensemble import EnsembleConfig
from world_models.fit import FitConfig

CONFIG_VERSION = 1


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: expected a positive int, found {value!r}")


def _check_sac(sac: SACNConfig) -> None:
    _positive("sac.num_critics", sac.num_critics)
    _positive("sac.batch_size", sac.batch_size)
    if not sac.hidden_sizes or any(int(w) < 1 for w in sac.hidden_sizes):
        raise ConfigError(f"sac.hidden_sizes: expected positive widths, found {tuple(sac.hidden_sizes)}")
    for name in ("actor_lr", "critic_lr", "alpha_lr", "init_alpha"):
        if not getattr(sac, name) > 0:
            raise ConfigError(f"sac.{name}: expected a value > 0, found {getattr(sac, name)}")
    if not 0.0 < sac.gamma <= 1.0:
        raise ConfigError(f"sac.gamma: expected a value in (0, 1], found {sac.gamma}")
    if not 0.0 < sac.tau <= 1.0:
        raise ConfigError(f"sac.tau: expected a value in (0, 1], found {sac.tau}")
    if not sac.actor_bc_coef >= 0:
        raise ConfigError(f"sac.actor_bc_coef: expected a value >= 0, found {sac.actor_bc_coef}")
    if sac.eta < 0:
        raise ConfigError(f"sac.eta: expected a value >= 0, found {sac.eta}")
    if sac.eta > 0 and sac.num_critics < 2:
        raise ConfigError(f"sac.eta: the EDAC term (eta={sac.eta}) needs sac.num_critics >= 2, found {sac.num_critics}")


@dataclasses.dataclass(frozen=True)
class ImaginationConfig:
    """Model rollouts that feed a model-based agent (unused by BC).

    horizon: steps per imagined rollout (MOPO's h, RAVL's k).
    rollouts_per_epoch: start states drawn from the dataset each epoch (one compiled rollout).
    retain_epochs: the model buffer holds this many epochs of rollouts (a ring).
    real_ratio: the fraction of each batch drawn from the real data.
    per_seed_model: with --seeds N, fit one world model per seed (seed + i) instead of sharing one.
    """

    horizon: int = 5
    rollouts_per_epoch: int = 50_000
    retain_epochs: int = 5
    real_ratio: float = 0.05
    per_seed_model: bool = False

    def __post_init__(self):
        _positive("imagination.horizon", self.horizon)
        _positive("imagination.rollouts_per_epoch", self.rollouts_per_epoch)
        _positive("imagination.retain_epochs", self.retain_epochs)
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
        _positive("schedule.epochs", self.epochs)
        _positive("schedule.updates_per_epoch", self.updates_per_epoch)
        _positive("schedule.eval_every", self.eval_every)
        _positive("schedule.eval_episodes", self.eval_episodes)
        if self.checkpoint_every < 0:
            raise ConfigError(f"schedule.checkpoint_every: expected an int >= 0, found {self.checkpoint_every}")

    @property
    def checkpoint_period(self) -> int:
        return self.checkpoint_every or self.eval_every


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Where metrics go besides `metrics.jsonl`: the terminal (progress bar) and optional trackers.

    tensorboard / wandb need the `tracking` extra (pip install 'offline-mbrl[tracking]').
    """

    progress: bool = True
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "offline-mbrl"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run. `config.json` in a run directory is this, as JSON.

    algo: ravl | mopo | bc | neubay.
    dataset: a dataset SOURCE (`mbrl data list`): a made dataset name such as hopper-medium, a
        .hdf5/.npz path or minari:ID.
    preset: quick (sized for 2 CPU cores) | paper (the published settings).
    seed / seeds: train seeds seed, seed+1, ..., seed+seeds-1 in one compiled program.
    """

    algo: str = "ravl"
    dataset: str = "hopper-medium"
    preset: str = "quick"
    seed: int = 0
    seeds: int = 1
    sac: SACNConfig = SACNConfig()
    mopo: MOPOConfig = MOPOConfig()
    bc: BCConfig = BCConfig()
    neubay: NeubayConfig = NeubayConfig()
    imagination: ImaginationConfig = ImaginationConfig()
    ensemble: EnsembleConfig = EnsembleConfig()
    fit: FitConfig = FitConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    logging: LoggingConfig = LoggingConfig()

    def __post_init__(self):
        if self.algo not in presets.ALGOS:
            raise ConfigError(f"algo: unknown algorithm {self.algo!r}; expected one of {', '.join(presets.ALGOS)}")
        if self.preset not in presets.PRESETS:
            raise ConfigError(f"preset: unknown preset {self.preset!r}; expected one of {', '.join(presets.PRESETS)}")
        _positive("seeds", self.seeds)
        if self.seed < 0:
            raise ConfigError(f"seed: expected an int >= 0, found {self.seed}")
        _check_sac(self.sac)
        if self.sac.actor_bc_coef > 0 and self.uses_model and real_count(self.sac.batch_size, self.imagination.real_ratio) == 0:
            raise ConfigError(
                f"sac.actor_bc_coef: the BC term imitates the real rows of each batch, but imagination.real_ratio "
                f"{self.imagination.real_ratio} of batch {self.sac.batch_size} gives none"
            )

    @property
    def uses_model(self) -> bool:
        return self.algo != "bc"

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))


# -------------------------------------------------------------------------------------------------
# Building a config from layers of nested dicts


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value, hint, where: str):
    """Check a JSON/CLI value against a field's annotation; lists become tuples for sequences."""
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
                return _coerce(value, option, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: unexpected value {value!r}")
    if origin in (tuple, Sequence, list, typing.Sequence) or hint in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, found {value!r}")
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        inner = args[0] if args else Any
        return tuple(_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
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
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, found {value!r}")
        return value
    return value


def _apply(obj, overrides: dict[str, Any], where: str = ""):
    """A copy of the frozen dataclass `obj` with the nested `overrides` applied and type-checked."""
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping of fields, found {overrides!r}")
    hints = _hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    changes = {}
    for key, value in overrides.items():
        path = f"{where}.{key}" if where else key
        if key not in names:
            raise ConfigError(f"{path}: unknown field; expected one of {', '.join(names)}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            changes[key] = _apply(current, value, path)
        else:
            changes[key] = _coerce(value, hints[key], path)
    try:
        return dataclasses.replace(obj, **changes)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from None


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def dataset_key(source: str) -> str:
    """The name presets are keyed by: `hopper-medium` for a made dataset or a file `hopper-medium-v2.hdf5`."""
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


def build(algo: str = "ravl", dataset: str = "hopper-medium", preset: str = "quick", overrides: dict | None = None) -> TrainConfig:
    """The preset of `algo` for `dataset`, with nested `overrides` on top."""
    if algo not in presets.ALGOS:
        raise ConfigError(f"algo: unknown algorithm {algo!r}; expected one of {', '.join(presets.ALGOS)}")
    if preset not in presets.PRESETS:
        raise ConfigError(f"preset: unknown preset {preset!r}; expected one of {', '.join(presets.PRESETS)}")
    layers = _merge(presets.preset(algo, preset, dataset_key(dataset)), {"algo": algo, "dataset": dataset, "preset": preset})
    layers = _merge(layers, overrides or {})
    return _apply(TrainConfig(algo=algo, preset=preset), layers)


def to_dict(config) -> dict[str, Any]:
    def convert(value):
        if dataclasses.is_dataclass(value):
            return {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (tuple, list)):
            return [convert(v) for v in value]
        return value

    return {"version": CONFIG_VERSION, **convert(config)}


def from_dict(data: dict[str, Any], where: str = "config") -> TrainConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, found {type(data).__name__}")
    data = dict(data)
    version = data.pop("version", CONFIG_VERSION)
    if version != CONFIG_VERSION:
        raise ConfigError(f"{where}: field 'version' is {version!r}; expected {CONFIG_VERSION}")
    try:
        return _apply(TrainConfig(algo=data.get("algo", "ravl"), preset=data.get("preset", "quick")), data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def save(config: TrainConfig, path: Path) -> None:
    """Write `config.json` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(to_dict(config), indent=2) + "\n")
    tmp.replace(path)


def load(path: Path) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    return from_dict(data, str(path))


# -------------------------------------------------------------------------------------------------
# The command line: a mirror of TrainConfig whose every field is optional (None: keep the layer below)


# Help for the fields of classes whose docstrings do not describe them one by one.
_SAC_HELP = {
    "num_critics": "N critics; the TD target takes the min over N target critics",
    "hidden_sizes": "hidden layer widths of the actor and each critic",
    "actor_lr": "Adam learning rate of the actor",
    "critic_lr": "Adam learning rate of the critics",
    "alpha_lr": "Adam learning rate of the entropy temperature",
    "gamma": "discount factor",
    "tau": "Polyak rate of the target critics",
    "batch_size": "rows per update (real + model)",
    "eta": "EDAC gradient-diversity weight (0: plain SAC-N)",
    "target_entropy": "entropy target of automatic tuning (default -act_dim)",
    "init_alpha": "initial entropy temperature",
    "critic_layer_norm": "LayerNorm in each critic's hidden layers",
    "actor_bc_coef": "weight of a BC term on the real rows in the actor loss, times the batch's mean |Q| "
    "(TD3+BC's ratio: its alpha 2.5 is 0.4 here; 0: off)",
}


def _field_help(cls, name: str) -> str | None:
    """The `name: text` entry of the class docstring (our convention), else a known description."""
    if cls is SACNConfig:
        return _SAC_HELP.get(name)
    lines = (cls.__doc__ or "").splitlines()
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


def _mirror(cls, prefix: str = ""):
    """A frozen dataclass with the fields of `cls`, each `T | None = None`; nested dataclasses mirror too."""
    import tyro

    hints = _hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            nested = _mirror(type(default), prefix + f.name.capitalize())
            fields.append((f.name, nested, dataclasses.field(default_factory=nested)))
            continue
        cli_type = _cli_type(hints[f.name])
        arg = tyro.conf.arg(help=(_field_help(cls, f.name) or "").strip() or None, metavar=_metavar(cli_type),
                            help_behavior_hint="(default: from the preset)")
        hint = Annotated[cli_type | None, arg]
        fields.append((f.name, hint, dataclasses.field(default=None)))
    mirror = dataclasses.make_dataclass(f"{prefix}{cls.__name__}Options", fields, frozen=True)
    mirror.__module__ = __name__
    return mirror


def _path_arg(help_: str, hint: str = ""):
    import tyro

    return Annotated[Path | None, tyro.conf.arg(help=help_, metavar="DIR" if "config" not in help_ else "FILE", help_behavior_hint=hint)]


def _train_args_class():
    import tyro

    base = _mirror(TrainConfig)
    extra = [
        ("run_dir", _path_arg("where the run is written", "(default: runs/ALGO-DATASET-TIME)"), dataclasses.field(default=None)),
        ("resume", _path_arg("continue the run in this directory from its last checkpoint"), dataclasses.field(default=None)),
        ("config", _path_arg("a config.json to start from (options given here override it)"), dataclasses.field(default=None)),
        ("world_model", _path_arg("reuse this fitted world model (from `mbrl model fit` or a run's world_model/)", "(default: fit one)"), dataclasses.field(default=None)),
    ]
    fields = [(f.name, f.type, f) for f in dataclasses.fields(base)]
    fields = [(name, typ, dataclasses.field(default=f.default, default_factory=f.default_factory)) for name, typ, f in fields]
    cls = dataclasses.make_dataclass("TrainArgs", extra + fields, frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = "Train an agent. With no options: RAVL, quick preset, hopper-medium (made first if missing)."
    return cls


TrainArgs = _train_args_class()


def overrides_of(args) -> dict[str, Any]:
    """The options that were given, as nested dicts (mirror fields left at None are dropped)."""

    def collect(obj):
        out = {}
        for f in dataclasses.fields(obj):
            if f.name in ("run_dir", "resume", "config", "world_model"):
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


def resolve(args) -> TrainConfig:
    """The run's config from `TrainArgs`: preset (or --config file) with the given options on top."""
    given = overrides_of(args)
    if args.config is not None:
        base = to_dict(load(args.config))
        base.pop("version", None)
        return from_dict(_merge(base, given), str(args.config))
    algo = given.pop("algo", "ravl")
    dataset = given.pop("dataset", "hopper-medium")
    preset = given.pop("preset", "quick")
    return build(algo, dataset, preset, given)
