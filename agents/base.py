"""The one interface every learning algorithm implements, what it asks of imagination, and how a module declares one.

An algorithm is a handful of pure functions over pytrees, so the training program (`mbrl.trainer`) can jit
them, `lax.scan` K updates and vmap a population (seeds and configurations alike) without knowing which
algorithm it runs:

- hypers: the values a sweep may vary that do not change array shapes (learning rates, gamma, tau,
  MOPO's lambda, EDAC's eta, ...), as a nested dict of float32 scalars keyed like the config's sections
  (`{"sac": {"actor_lr": ...}, "mopo": {"penalty_coef": ...}}`). Which fields: each config dataclass marks
  them on the field itself (`traced`, `static_when_zero`; unmarked fields are static). They are traced
  data: the training state carries them, so changing one never recompiles.
- `init(key, hypers)` -> the algorithm's state.
- `update_many(state, batches, key, hypers)` -> (state, metrics): K updates on batches with a leading K axis
  (flat `Transitions` or `SequenceBatch` windows, by `imagination`), metrics averaged over K.
- `act(actor_params, carry, inputs, key, deterministic)` -> (action in [-1, 1], carry): `inputs` is a
  `mbrl.core.types.PolicyInput`; Markov policies read `inputs.obs` and hand the carry back untouched.
- `initial_carry(batch)`: the policy's memory at an episode start; `()` for Markov policies.
- `actor_params(state)`: what acting needs (what is exported).

`imagination` says what the algorithm needs from the world model:
- "none": real data only (BC);
- "transitions": short rollouts as flat rows in a ring buffer, rewards through `model_reward(hypers,
  reward, uncertainty)` (MOPO, RAVL);
- "sequences": whole imagined trajectories after real prefixes, on a sequence tape (NEUBAY);
- "onpolicy": a fresh batch of long rollouts every iteration, from real histories, handed to the algorithm's
  `prepare(state, rollout, valid, hypers, demonstrations=None)` and used for that iteration's updates only
  (MOPO-PPO; `demonstrations`: dataset rows, for an algorithm that asks for them).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp

from mbrl.core.errors import ConfigError

IMAGINATION_KINDS = ("none", "transitions", "sequences", "onpolicy")

Hypers = dict[str, dict[str, jax.Array]]


class Algorithm(Protocol):
    imagination: ClassVar[str]
    recurrent: ClassVar[bool]
    obs_dim: int
    act_dim: int

    def init(self, key: jax.Array, hypers: Hypers) -> Any: ...

    def update_many(self, state: Any, batches: Any, key: jax.Array, hypers: Hypers) -> tuple[Any, dict]: ...

    def act(self, actor_params: Any, carry: Any, inputs: Any, key: jax.Array, deterministic: bool) -> tuple[jax.Array, Any]: ...

    def initial_carry(self, batch: int) -> Any: ...

    def actor_params(self, state: Any) -> Any: ...


class FlatLearner(Algorithm, Protocol):
    """An algorithm on flat batches of transitions (imagination "none" or "transitions")."""

    batch_size: int  # rows per update


class TransitionLearner(FlatLearner, Protocol):
    """An algorithm on flat imagined transitions: it decides what an imagined reward is worth."""

    uncertainty: str  # the measure rollouts compute (`mbrl.world_models.uncertainty.MEASURES`)

    def model_reward(self, hypers: Hypers, reward: jax.Array, uncertainty: jax.Array) -> jax.Array: ...


class ModelReader(FlatLearner, Protocol):
    """An algorithm whose updates query the world model themselves (MOBILE samples next states from the ensemble at
    every update): the training program hands the model to its `update_many` as `world_model`."""

    reads_model: ClassVar[bool]  # True

    def update_many(self, state: Any, batches: Any, key: jax.Array, hypers: Hypers,
                    world_model: Any = None) -> tuple[Any, dict]: ...


class SequenceSettings(Protocol):
    """What sequence imagination reads of its algorithm's settings."""

    max_episode_steps: int  # a tape row's length: a real prefix and its imagined continuation
    parallel_size: int  # trajectories per collect
    tape_capacity: int
    num_sequences: int  # windows per update
    sequence_length: int
    warmup_length: int  # leading steps of a window that only warm the memory
    threshold_rows: int | None  # dataset rows the uncertainty threshold is measured on (None: all)
    model_noise: bool  # sample the model's aleatoric noise (else its mean)


class SequenceLearner(Algorithm, Protocol):
    """An algorithm on imagined trajectories after real prefixes ("sequences")."""

    uncertainty: str
    sequence_settings: SequenceSettings

    def uncertainty_quantile(self, hypers: Hypers) -> jax.Array: ...


class OnPolicyLearner(Algorithm, Protocol):
    """An algorithm on a fresh batch of long rollouts each iteration ("onpolicy")."""

    uncertainty: str
    head_mode: str  # "per_trajectory": one model head per imagined trajectory; else one per step
    updates_per_iteration: int  # the updates one batch of rollouts pays for

    def uncertainty_quantile(self, hypers: Hypers) -> jax.Array: ...

    def model_reward(self, hypers: Hypers, reward: jax.Array, uncertainty: jax.Array) -> jax.Array: ...

    def explore(self, actor_params: Any, inputs: Any, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """A sampled action and what `prepare` scores it by (its sample before any squashing)."""
        ...

    def prepare(self, state: Any, rollout: Any, valid: jax.Array, hypers: Hypers, samples: jax.Array
                ) -> tuple[Any, Any, dict]: ...

    def minibatches(self, batch: Any, key: jax.Array) -> Any: ...


# -------------------------------------------------------------------------------------------------
# Capabilities: optional methods that `mbrl/` asks for by name (`capability`), never by the algorithm's class


class CriticJudge(Protocol):
    """An algorithm whose critics can judge its own policy: `mbrl ope --method critic` and the sweep's held-out
    TD check."""

    def critic_values(self, agent_state: Any, obs: jax.Array, action: jax.Array) -> jax.Array:
        """Q of every critic at (obs, action), (critics, batch), for one member's state."""
        ...

    def critic_gamma(self) -> float:
        """The discount its critics' values are measured with."""
        ...

    def heldout_td_error(self, agent_state: Any, batch: Any, key: jax.Array, hypers: Hypers) -> jax.Array:
        """The critics' mean squared TD error on `batch` (per critic, no regulariser), for one member."""
        ...


class DataNoticer(Protocol):
    """An algorithm with something to tell the user about the data before it trains (`mbrl train` prints it)."""

    def data_notice(self, actions: Any) -> str | None:
        """One line on what in the data's actions, (rows, act_dim), works against this algorithm's settings, or None."""
        ...


@dataclasses.dataclass(frozen=True)
class OnlineSettings:
    """What `mbrl finetune` asks of an online learner (WSRL).

    anchor: the BC weight towards the frozen warm-start policy (0: none).
    capacity: transitions the online buffer holds.
    warmup / chunk_steps / utd: steps before the first update, steps per compiled chunk, updates per new step.
    retain_offline_ratio: the share of every batch drawn from the offline data.
    """

    anchor: float
    capacity: int
    warmup: int
    chunk_steps: int
    utd: int
    retain_offline_ratio: float


class OnlineFinetuner(Protocol):
    """An algorithm that continues online from its offline state (`mbrl finetune`)."""

    def offline_anchor(self) -> float:
        """The BC weight its offline actor was trained with (0: none); fine-tuning keeps it unless told otherwise."""
        ...

    def online_learner(self, settings: OnlineSettings, obs_scale: Any) -> Any:
        """A learner with `init(key)`, `policy_step`, `chunk(...)`, `deterministic_policy()` and `act_dim`
        (`mbrl.agents.sac.OnlineSAC`), on this algorithm's networks."""
        ...


class DemonstrationReader(OnPolicyLearner, Protocol):
    """An on-policy algorithm whose `prepare` wants dataset rows (`demonstrations=`) for a behaviour-cloning phase:
    on-policy imagination hands it as many rows as it imagined, drawn uniformly (PPO with `bc_init_iterations`)."""

    demonstrations: bool  # True when it wants them (a property: it may depend on the config)


# Every capability, by name: an optional method or flag of an algorithm, and the protocol that declares it. `mbrl/`
# asks for one only through `capability`, which refuses a name not listed here.
CAPABILITIES: dict[str, type] = {
    "critic_values": CriticJudge,
    "critic_gamma": CriticJudge,
    "heldout_td_error": CriticJudge,
    "data_notice": DataNoticer,
    "offline_anchor": OnlineFinetuner,
    "online_learner": OnlineFinetuner,
    "reads_model": ModelReader,
    "demonstrations": DemonstrationReader,
}


def capability(agent: Any, name: str, what: str | None = None, where: str = "", algo: str = "") -> Any:
    """`agent`'s capability `name` (a key of `CAPABILITIES`: its method, or its flag's value), None where it has none.

    `what`: the feature that needs it; then a missing capability is a `ConfigError` naming the feature, the run
    (`where`) and the algorithm (`algo`) instead of None. A name outside `CAPABILITIES` (a typo) is a `ValueError`.
    """
    if name not in CAPABILITIES:
        raise ValueError(f"capability {name!r}: not a declared capability; expected one of {sorted(CAPABILITIES)} "
                         f"(mbrl.agents.base.CAPABILITIES)")
    value = getattr(agent, name, None)
    if value is None and what is not None:
        raise ConfigError(f"{where}: {what} needs an algorithm with {name}(); {algo} has none")
    return value


def merge_sections(overrides: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`overrides` with `extra` on top, one section deep: a dict updates its section, any other value (a top-level
    field such as `ignore_obs_dims`) replaces."""
    out = dict(overrides)
    for key, values in extra.items():
        out[key] = {**out.get(key, {}), **values} if isinstance(values, dict) else values
    return out


def as_hypers(values: dict[str, dict[str, float]]) -> Hypers:
    """Plain numbers -> the float32 scalars a training state carries."""
    return {section: {name: jnp.asarray(v, jnp.float32) for name, v in fields.items()} for section, fields in values.items()}


def scan_updates(update, state, batches, key):
    """`update(state, batch, key)` over the leading K axis of `batches` in one `lax.scan`, metrics
    averaged over K: every algorithm's `update_many`."""
    keys = jax.random.split(key, jax.tree.leaves(batches)[0].shape[0])
    state, metrics = jax.lax.scan(lambda s, xs: update(s, *xs), state, (batches, keys))
    return state, jax.tree.map(jnp.mean, metrics)


# -------------------------------------------------------------------------------------------------
# Traced or static: said once, on the config field

TRACED = "traced"  # data in the training state: a population or a sweep varies it without recompiling
STATIC_WHEN_ZERO = "static_when_zero"  # traced, but zero leaves a term out of the program (EDAC's eta, a BC weight)


def traced(default, **kwargs):
    """A config field whose value is traced data (a learning rate, gamma, a penalty weight)."""
    return dataclasses.field(default=default, metadata={"kind": TRACED}, **kwargs)


def static_when_zero(default, **kwargs):
    """A traced config field whose zero removes its term from the compiled program: only "zero or not" is static."""
    return dataclasses.field(default=default, metadata={"kind": STATIC_WHEN_ZERO}, **kwargs)


def field_kind(section_class: type, name: str) -> str:
    """"traced", "static_when_zero" or "static" (unmarked) for field `name` of a config dataclass."""
    field = {f.name: f for f in dataclasses.fields(section_class)}[name]
    return field.metadata.get("kind", "static")


def traced_fields(section_class: type) -> tuple[str, ...]:
    """The fields of a config dataclass carried as traced data (static-when-zero ones included)."""
    return tuple(f.name for f in dataclasses.fields(section_class) if f.metadata.get("kind") in (TRACED, STATIC_WHEN_ZERO))


def traced_values(section) -> dict[str, jax.Array]:
    """The traced fields of a config section instance as float32 scalars."""
    return {name: jnp.asarray(getattr(section, name), jnp.float32) for name in traced_fields(type(section))}


def compile_canonical(section):
    """`section` with its traced values replaced by canonical ones (the class defaults; for a static-when-zero
    field, 0 or a non-zero default): two sections that compile to the same program compare equal."""
    defaults = type(section)()
    canonical = {}
    for name in traced_fields(type(section)):
        if field_kind(type(section), name) == STATIC_WHEN_ZERO:
            canonical[name] = 0.0 if getattr(section, name) == 0 else (getattr(defaults, name) or 1.0)
        else:
            canonical[name] = getattr(defaults, name)
    return dataclasses.replace(section, **canonical)


# -------------------------------------------------------------------------------------------------
# An algorithm declares itself: its module's `ALGORITHM`, listed in `mbrl.agents.registry.MODULES`

# The fields of the `imagination` section (`mbrl.config.ImaginationConfig`).
IMAGINATION_FIELDS = ("horizon", "rollouts_per_epoch", "retain_epochs", "real_ratio", "per_seed_model",
                      "model_noise")
PRESET_NAMES = ("quick", "paper")


@dataclasses.dataclass(frozen=True)
class AlgorithmEntry:
    """What the training program, the config and the commands know of an algorithm.

    name: its `--algo` name.
    sections: its own config sections, name -> frozen dataclass (a section may be shared: `sac` by RAVL and MOPO).
    make: (TrainConfig, obs_dim, act_dim, ObsScale | None) -> an `Algorithm`.
    presets: "quick" and "paper" -> nested overrides keyed like TrainConfig's sections (with their sources).
    per_dataset: dataset name (or None) -> more overrides on top of a preset (may be empty).
    model_kind: the name of the world-model kind it fits by default (a `mbrl.world_models.registry` entry: "mlp", the
        ensemble; "rwm", RWM-U) or None (no model). A declaration: the roof (`mbrl.config`) checks it against the
        world-model registry and adds that kind's sections to what the algorithm reads.
    imagination_fields: the fields of the `imagination` section it reads (empty: none).
    compiled_schedule: TrainConfig -> the schedule fields, besides updates_per_epoch, its compiled program reads.
    finalize: TrainConfig -> {section: replacement}: its rules across sections, run when a config is built; raises
        `ConfigError` for a combination it refuses, returns values that follow from others (may be empty).
    smoke: the smallest sizes of its own sections that still exercise every part (tests, smoke runs).
    space: its shipped search space (`mbrl sweep --space NAME`), keyed as a TOML space file is
        (`mbrl.sweep.space`): option -> {low, high[, log, step]} or {choices}; empty: none.
    scales_observations: its networks take the run's observation scale (`normalize_obs`, `ignore_obs_dims`); False
        for one that standardises its observations itself and refuses those.
    """

    name: str
    sections: Mapping[str, type]
    make: Callable[[Any, int, int, Any], Any]
    presets: Mapping[str, Mapping[str, Any]]
    per_dataset: Callable[[str | None], dict[str, Any]] = lambda dataset: {}
    model_kind: str | None = None
    imagination_fields: tuple[str, ...] = ()
    compiled_schedule: Callable[[Any], dict[str, Any]] = lambda config: {}
    finalize: Callable[[Any], dict[str, Any]] = lambda config: {}
    smoke: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    space: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    scales_observations: bool = True

    def __post_init__(self):
        if self.model_kind is not None and not isinstance(self.model_kind, str):
            raise ValueError(f"{self.name}: model_kind {self.model_kind!r}; expected a world-model kind's name or None")
        if self.imagination_fields and self.model_kind is None or set(self.imagination_fields) - set(IMAGINATION_FIELDS):
            raise ValueError(f"{self.name}: imagination fields {self.imagination_fields} need a model and must be "
                             f"among {IMAGINATION_FIELDS}")
        if set(self.presets) != set(PRESET_NAMES):
            raise ValueError(f"{self.name}: presets {sorted(self.presets)}; expected {list(PRESET_NAMES)}")

    @property
    def uses_model(self) -> bool:
        return self.model_kind is not None

    @property
    def reads(self) -> tuple[str, ...]:
        """The sections it reads of its own: its sections and imagination. Those of its world model and those every
        run has (schedule, select, logging) come on top (`mbrl.config.sections_read`)."""
        return (*self.sections, *(("imagination",) if self.imagination_fields else ()))

    @property
    def hyper_fields(self) -> dict[str, tuple[str, ...]]:
        """Section -> the fields carried as traced data (what a population or a sweep may vary without recompiling)."""
        return {name: traced_fields(cls) for name, cls in self.sections.items() if traced_fields(cls)}

    def hyper_values(self, config) -> dict[str, dict[str, float]]:
        """The values of `config` (a TrainConfig) carried as traced data, as nested dicts of floats."""
        return {section: {name: getattr(getattr(config, section), name) for name in names}
                for section, names in self.hyper_fields.items()}

    def hypers_of(self, config) -> Hypers:
        """The traced values of `config` as float32 scalars."""
        return as_hypers(self.hyper_values(config))

    def compile_sections(self, config) -> dict[str, Any]:
        """Its own sections of `config` with the traced values canonical (`compile_canonical`)."""
        return {name: compile_canonical(getattr(config, name)) for name in self.sections}

    def preset(self, name: str, dataset: str | None = None) -> dict[str, Any]:
        """The nested overrides of preset `name` on `dataset` (a fresh copy); a per-dataset entry may set a top-level
        field (`ignore_obs_dims`) besides sections."""
        return merge_sections(copy.deepcopy(dict(self.presets[name])), self.per_dataset(dataset))
