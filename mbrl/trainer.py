"""The one training program: every algorithm (`mbrl.agents.registry`) runs in it.

One epoch is a pure function of the training state (agent state, imagined data, counters, hyperparameters,
RNG key, epoch counter):

    collect imagined data into the store    (`mbrl.imagination`: nothing for BC, short rollouts into a ring
                                            buffer for MOPO/RAVL, long trajectories on a tape for NEUBAY, one
                                            PPO iteration's rollouts for MOPO-PPO)
    spend the updates the collect earned    (the algorithm's `update_many`, one compiled `lax.scan`)

until the epoch's `updates_per_epoch` updates are done: once for a part whose collect earns the whole
epoch, whenever the earned updates are spent for NEUBAY's update-to-data credit. The host only sees the
epoch's averaged metrics.

A run is a *population*: every leaf of the state leads with a member axis, and a member is a seed and a
set of hyperparameters (the values that do not change array shapes: learning rates, gamma, tau, MOPO's
lambda, EDAC's eta, the BC weight, the initial temperature, NEUBAY's uncertainty quantile; see
`mbrl.agents.registry`). `--seeds N` is a population of N seeds with the config's values;
`train_population(config, hypers, seeds)` varies the values too. The epoch is vmapped over the members,
or mapped one after another (`lax.map`) where the collect decision is per member (NEUBAY: a vmap would
run both branches of it). The world model is shared (an unbatched argument) or one per member. Every E
epochs the host evaluates all members' policies in the real MuJoCo env in one batched call per step, and
writes an orbax checkpoint.

A population is sharded over the local accelerators on a `population` mesh axis (`shard_population`):
each device runs the epoch for its own members (`shard_map`, no communication), with the real data and a
shared world model replicated.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mbrl.agents import registry
from mbrl.agents.base import capability
from mbrl.agents.networks import ObsScale
from mbrl import imagination
from mbrl.config import TrainConfig
from mbrl.core.errors import ConfigError
from mbrl.core.files import cache_dir, write_text_atomic
from mbrl.core.replay import ReplayBuffer
from mbrl.core.signals import StopSignal
from mbrl.core.types import PolicyInput
from mbrl.world_models.ensemble import observation_indices


@struct.dataclass
class TrainState:
    """Everything that changes during training, for one member (a leading member axis when batched)."""

    agent: Any
    store: Any  # the imagined data: a ReplayBuffer, a sequence Tape, or None (BC)
    counters: Any  # the imagination part's own counters (NEUBAY: collects, the last collect's stats)
    credit: jax.Array  # () int32: updates earned by collected data, not yet done
    hypers: Any  # the member's hyperparameters as traced data (`mbrl.agents.base.Hypers`)
    key: jax.Array
    epoch: jax.Array  # () int32, epochs done


def compile_key(config: TrainConfig) -> TrainConfig:
    """The part of a config that the compiled programs depend on: the algorithm's own sections with their traced
    values canonical (`mbrl.agents.base.compile_canonical`), the imagination it reads, and the updates per epoch with
    the schedule fields its program reads (`compiled_schedule`); seeds, dataset, world model (an argument of the
    program, not part of it), evaluation and logging do not matter."""
    entry = registry.entry(config.algo)
    sections = entry.compile_sections(config)
    if entry.imagination_fields:
        sections["imagination"] = config.imagination
    schedule = type(config.schedule)(updates_per_epoch=config.schedule.updates_per_epoch,
                                     **entry.compiled_schedule(config))
    return TrainConfig(algo=config.algo, preset=config.preset, schedule=schedule, **sections)


@functools.lru_cache(maxsize=8)
def _cached_trainer(key: TrainConfig, obs_dim: int, act_dim: int, obs_scale: ObsScale | None) -> Trainer:
    return Trainer(key, obs_dim, act_dim, obs_scale)


def trainer_for(config: TrainConfig, obs_dim: int, act_dim: int, obs_scale: ObsScale | None = None) -> Trainer:
    """The Trainer shared by all runs whose compiled programs are the same (one compile cache per process).
    `obs_scale`: the observations' standardisation inside the agent's networks (`observation_scale`)."""
    return _cached_trainer(compile_key(config), obs_dim, act_dim, obs_scale)


def observation_scale(config: TrainConfig, dataset) -> ObsScale | None:
    """The standardisation of the dataset's observations when `config.normalize_obs`, with the dimensions the agent
    ignores (`config.ignore_obs_dims`) held at 0; None when neither is asked for."""
    obs_dim = dataset.info.obs_dim
    ignored = observation_indices("ignore_obs_dims", config.ignore_obs_dims, obs_dim)
    if config.normalize_obs:
        return ObsScale.of(dataset.transitions.obs, ignored)
    return ObsScale.identity(obs_dim, ignored) if ignored else None


def trainer_of_data(config: TrainConfig, dataset) -> Trainer:
    """`trainer_for` the dataset's dimensions and, with `config.normalize_obs`, its observation scale."""
    return trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim, observation_scale(config, dataset))


def hypers_of(config: TrainConfig):
    """The config's traced hyperparameters (float32 scalars)."""
    return registry.entry(config.algo).hypers_of(config)


class Trainer:
    """The pure pieces of training for one compile key: `init_state`, `epoch`, and their compiled,
    population-batched forms. Use `trainer_for` to share compiles between runs."""

    def __init__(self, config: TrainConfig, obs_dim: int, act_dim: int, obs_scale: ObsScale | None = None):
        self.config = config
        self.obs_scale = obs_scale
        self.agent = registry.make(config, obs_dim, act_dim, obs_scale)
        self.part = imagination.make(self.agent, config)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.uses_model = self.part.uses_model
        self.budget = config.schedule.updates_per_epoch
        fixed = self.part.fixed_credit
        if fixed is not None and fixed != self.budget:
            raise ConfigError(f"imagination: a collect earns {fixed} updates, the epoch has {self.budget}")
        # A collect that earns the whole epoch has no data-dependent branch: the population is vmapped.
        self.vmapped = fixed is not None
        self.per_member_model = config.imagination.per_seed_model if self.uses_model else False
        self.init_states = jax.jit(jax.vmap(self.init_state))
        self._runs: dict[str, Callable] = {}  # layout -> the population's compiled epoch
        self._sharded_runs: dict[tuple[Mesh, str], Callable] = {}
        self._layouts: dict[tuple, tuple[str, dict]] = {}  # (members, data shapes) -> the measured choice
        self.policy = jax.jit(self._population_policy)

    # ------------------------------------------------------------------ pure functions (one member)

    def real_data(self, dataset):
        """The dataset in the form `epoch` takes it (a full ring buffer, or a tape of its episodes)."""
        return self.part.real_data(dataset)

    def init_state(self, key: jax.Array, hypers) -> TrainState:
        agent_key, key = jax.random.split(key)
        zero = jnp.zeros((), jnp.int32)
        return TrainState(self.agent.init(agent_key, hypers), self.part.empty(), self.part.initial_counters(), zero,
                          hypers, key, zero)

    def epoch(self, state: TrainState, real, world_model, aux) -> tuple[TrainState, dict]:
        """`updates_per_epoch` updates; collects whenever the earned ones are spent. Metrics are means over
        the epoch's updates, plus the collects' summaries."""
        if self.part.fixed_credit is not None:  # one collect earns the epoch: it, then one scan of K updates
            key, collect_key, sample_key, update_key = jax.random.split(state.key, 4)
            store, counters, metrics, _ = self.part.collect(state.agent, state.store, state.counters, real, world_model,
                                                            aux, state.hypers, collect_key)
            batches = self.part.sample(real, store, sample_key, self.budget)
            agent, update_metrics = self._update_many(state.agent, batches, update_key, state.hypers, world_model)
            kept = store if self.part.retains_store else state.store
            state = state.replace(agent=agent, store=kept, counters=counters, key=key, epoch=state.epoch + 1)
            return state, {**metrics, **update_metrics}
        return self._credit_epoch(state, real, world_model, aux)

    def _update_many(self, agent_state, batches, key, hypers, world_model):
        """The algorithm's K updates; one that queries the world model in its updates (`ModelReader`) is handed it."""
        reads = {"world_model": world_model} if capability(self.agent, "reads_model") else {}
        return self.agent.update_many(agent_state, batches, key, hypers, **reads)

    def _credit_epoch(self, state: TrainState, real, world_model, aux):
        budget = self.budget

        def update_block(agent, store, key, hypers):
            sample_key, update_key = jax.random.split(key)
            return self._update_many(agent, self.part.sample(real, store, sample_key, 1), update_key, hypers, world_model)

        def collect(state, key):
            return self.part.collect(state.agent, state.store, state.counters, real, world_model, aux, state.hypers, key)

        def zeros(shapes):
            return jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)

        sums = zeros(jax.eval_shape(update_block, state.agent, state.store, state.key, state.hypers)[1])
        collect_sums = zeros(jax.eval_shape(collect, state, state.key)[2])

        def do_collect(args):
            state, key, (collects, collect_sums) = args
            store, counters, metrics, earned = collect(state, key)
            state = state.replace(store=store, counters=counters, credit=state.credit + earned)
            return state, (collects + 1, jax.tree.map(lambda s, m: s + m.astype(jnp.float32), collect_sums, metrics))

        def one_update(_, carry):
            agent, store, key, sums = carry
            key, block_key = jax.random.split(key)
            agent, metrics = update_block(agent, store, block_key, state.hypers)
            return agent, store, key, jax.tree.map(lambda s, m: s + m.astype(jnp.float32), sums, metrics)

        def body(c):
            state, done, sums, collected = c
            key, collect_key, update_key = jax.random.split(state.key, 3)
            state, collected = jax.lax.cond(state.credit <= 0, do_collect, lambda a: (a[0], a[2]),
                                            (state.replace(key=key), collect_key, collected))
            count = jnp.minimum(state.credit, budget - done)
            agent, _, _, sums = jax.lax.fori_loop(0, count, one_update, (state.agent, state.store, update_key, sums))
            return state.replace(agent=agent, credit=state.credit - count), done + count, sums, collected

        zero = jnp.zeros((), jnp.int32)
        state, _, sums, (collects, collect_sums) = jax.lax.while_loop(
            lambda c: c[1] < budget, body, (state, zero, sums, (zero, collect_sums)))
        metrics = {name: value / budget for name, value in sums.items()}
        collect_means = {name: value / jnp.maximum(collects, 1) for name, value in collect_sums.items()}
        metrics.update(self.part.epoch_metrics(state.counters, state.store, collects, collect_means, aux, state.hypers))
        return state.replace(epoch=state.epoch + 1), metrics

    def _population_epoch(self, states, real, world_model, aux, layout: str = "vmap"):
        member = self.per_member_model
        if self.vmapped and layout == "vmap":
            axis = 0 if member else None
            return jax.vmap(self.epoch, in_axes=(0, None, axis, axis))(states, real, world_model, aux)
        if member:
            return jax.lax.map(lambda a: self.epoch(a[0], real, a[1], a[2]), (states, world_model, aux))
        return jax.lax.map(lambda s: self.epoch(s, real, world_model, aux), states)

    def _population_policy(self, actor_params, carry, inputs: PolicyInput):
        """Deterministic actions of P members' policies for (P, E, ...) inputs and carries."""
        key = jax.random.PRNGKey(0)  # unused by deterministic policies
        return jax.vmap(lambda p, c, i: self.agent.act(p, c, i, key, True))(actor_params, carry, inputs)

    # ------------------------------------------------------------------ host side

    def run_epoch(self, state: TrainState, real, world_model, layout: str = "vmap"):
        """One epoch of the population, its members vmapped or mapped (`layout`, `choose_layout`); sharded over
        its mesh when `state` is (`shard_population`)."""
        aux = self.part.prepare(world_model, real)
        mesh = population_mesh_of(state)
        if mesh is None:
            return self._run(layout)(state, real, world_model, aux)
        model_spec = PartitionSpec(POPULATION_AXIS) if self.per_member_model else PartitionSpec()
        aux = jax.device_put(aux, NamedSharding(mesh, model_spec))  # computed from the model: on the mesh
        return self._sharded_run(mesh, layout)(state, real, world_model, aux)

    def _run(self, layout: str, donate: bool = True):
        if layout not in LAYOUTS:
            raise ConfigError(f"member layout: expected one of {', '.join(LAYOUTS)}, found {layout!r}")
        if not donate:  # the layout probe runs an epoch twice from one state
            return jax.jit(functools.partial(self._population_epoch, layout=layout))
        run = self._runs.get(layout)
        if run is None:
            run = self._runs[layout] = jax.jit(functools.partial(self._population_epoch, layout=layout), donate_argnums=0)
        return run

    def _sharded_run(self, mesh: Mesh, layout: str):
        """The epoch under `shard_map`: each device vmaps (or maps) over its own block of members, so the
        per-member program is the unsharded one and NEUBAY's `lax.map` is split across devices too."""
        run = self._sharded_runs.get((mesh, layout))
        if run is None:
            members, shared = PartitionSpec(POPULATION_AXIS), PartitionSpec()
            model = members if self.per_member_model else shared
            # Members are independent (no collectives): skip the varying-axes check, which would ask for
            # `pvary` on every loop carry that starts from a constant.
            body = jax.shard_map(functools.partial(self._population_epoch, layout=layout), mesh=mesh,
                                 in_specs=(members, shared, model, model), out_specs=members, check_vma=False)
            run = self._sharded_runs[(mesh, layout)] = jax.jit(body, donate_argnums=0)
        return run

    def choose_layout(self, state: TrainState, real, world_model) -> tuple[str, dict]:
        """How the population's members run: "vmap" (one batched program) or "map" (one member after another in
        the same program), and the measurement behind the choice.

        A vmap batches every member's matrix products; on an accelerator that is always the faster, and it is the
        only choice for NEUBAY, whose per-member collects map anyway. On a CPU it depends on the machine (on
        some, a vmap of 8 MOPO members ran slower than the members in turn; on others faster), so there the rule
        is measured: each program runs one epoch from `state` (after its compile; the results are dropped), and
        "map" is taken only when it beats the vmap by `LAYOUT_MARGIN`. The choice is kept per program, population
        size, data shapes and CPU model, in this trainer and in `$MBRL_CACHE_DIR/member_layouts.json`, so a machine
        measures a program once. `MBRL_MEMBER_LAYOUT=vmap|map` fixes the layout instead (numbers that must match
        across machines: the layouts round differently).
        """
        members = int(state.epoch.shape[0])
        forced = os.environ.get("MBRL_MEMBER_LAYOUT", "").strip().lower()
        if forced:
            if forced not in LAYOUTS:
                raise ConfigError(f"MBRL_MEMBER_LAYOUT={forced!r}: expected one of {', '.join(LAYOUTS)}")
            return (forced if self.vmapped else "map"), {"rule": "MBRL_MEMBER_LAYOUT"}
        if not self.vmapped or members == 1 or jax.default_backend() != "cpu":
            return ("vmap" if self.vmapped else "map"), {"rule": "fixed"}
        shapes = jax.tree.map(lambda x: (x.shape, str(x.dtype)), (real, world_model))
        key = hashlib.sha256(repr((self.config, self.obs_dim, self.act_dim, members, shapes, _machine())).encode()).hexdigest()
        if key not in self._layouts:
            known = _read_layouts().get(key)
            self._layouts[key] = tuple(known) if known else self._measure_layouts(state, real, world_model)
            if not known:
                _write_layout(key, self._layouts[key])
        return self._layouts[key]

    def _measure_layouts(self, state: TrainState, real, world_model) -> tuple[str, dict]:
        """One epoch of each layout from `state`, after compiling it; the results are dropped."""
        aux = self.part.prepare(world_model, real)
        seconds = {}
        for layout in LAYOUTS:
            compiled = self._run(layout, donate=False).lower(state, real, world_model, aux).compile()
            start = time.perf_counter()
            jax.block_until_ready(compiled(state, real, world_model, aux))
            seconds[layout] = time.perf_counter() - start
        layout = "map" if seconds["map"] < (1.0 - LAYOUT_MARGIN) * seconds["vmap"] else "vmap"
        return layout, {"rule": "measured", "epoch_seconds": {k: round(v, 4) for k, v in seconds.items()}}

    def initial_state(self, seeds: Sequence[int], hypers: Sequence) -> TrainState:
        """The population's first state: member i has seed `seeds[i]` and hyperparameters `hypers[i]`."""
        keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
        return self.init_states(keys, jax.tree.map(lambda *xs: jnp.stack(xs), *hypers))

    def evaluate(self, state: TrainState, task, seeds: Sequence[int], ref_scores: tuple[float, float] | None,
                 episodes: int = 10, eval_seed: int = 0) -> dict:
        """Deterministic policies of all members in the real env, batched; per-member lists of results.

        Episode i of the member with training seed s resets with `eval_seed + s * episodes + i`, so a
        member's score does not depend on which others ran with it. Recurrent policies carry their memory
        along each episode.
        """
        from mbrl.core.score import evaluation_record
        from mbrl.evaluate import evaluate, member_reset_seeds

        members = len(seeds)
        result = evaluate(self.lockstep_policy(state, members, episodes), task, episodes=members * episodes,
                          seed=member_reset_seeds(seeds, episodes, eval_seed))
        return evaluation_record(result.returns.reshape(members, episodes), ref_scores,
                                 result.lengths.reshape(members, episodes))

    def lockstep_policy(self, state: TrainState, members: int, episodes: int):
        """The deterministic policies of all members as one lockstep policy of `members * episodes` slots (member m's
        episodes in slots m * episodes, ...), recurrent ones carrying their memory along each slot's episode."""
        params = self.agent.actor_params(state.agent)
        carry = jax.tree.map(lambda x: x.reshape(members, episodes, *x.shape[1:]),
                             self.agent.initial_carry(members * episodes))

        def policy(inputs: PolicyInput):
            nonlocal carry
            shaped = jax.tree.map(lambda x: jnp.asarray(x).reshape(members, episodes, *np.shape(x)[1:]), inputs)
            actions, carry = self.policy(params, carry, shaped)
            return np.asarray(actions).reshape(members * episodes, -1)

        return policy


POPULATION_AXIS = "population"


def population_sharding(members: int, devices: Sequence | None = None) -> NamedSharding | None:
    """The sharding of a population of `members` over the largest number of `devices` (default: the local
    ones) that divides it, on a 1-D `population` mesh, leading axis split; None where that is one device."""
    devices = list(jax.local_devices() if devices is None else devices)
    count = max(d for d in range(1, len(devices) + 1) if members % d == 0)
    if count == 1:
        return None
    return NamedSharding(Mesh(np.array(devices[:count]), (POPULATION_AXIS,)), PartitionSpec(POPULATION_AXIS))


def population_mesh_of(state: TrainState) -> Mesh | None:
    """The mesh a population state is sharded over by `shard_population`, or None."""
    sharding = getattr(state.epoch, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh.axis_names == (POPULATION_AXIS,) and sharding.mesh.size > 1:
        return sharding.mesh
    return None


# How a population's members run in its program (`Trainer.choose_layout`), and how much faster a map must be.
LAYOUTS = ("vmap", "map")
LAYOUT_MARGIN = 0.05
LAYOUTS_FILE = "member_layouts.json"  # measured choices, kept beside the compile cache ($MBRL_CACHE_DIR)


def _machine() -> str:
    """The CPU's model name: a choice measured on one machine holds for another of the same model."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def _layouts_path() -> Path | None:
    where = cache_dir()
    return None if where is None else where / LAYOUTS_FILE


def _read_layouts() -> dict:
    path = _layouts_path()
    try:
        return json.loads(path.read_text()) if path is not None and path.is_file() else {}
    except (OSError, ValueError):  # a damaged cache is measured again
        return {}


def _write_layout(key: str, choice: tuple[str, dict]) -> None:
    path = _layouts_path()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({**_read_layouts(), key: list(choice)}, indent=1) + "\n")
    except OSError:  # a read-only cache: measured again next time
        pass


def shard_population(state: TrainState, real, world_model, *, per_member_model: bool = False,
                     devices: Sequence | None = None) -> tuple[TrainState, Any, Any]:
    """`(state, real, world_model)` placed for a sharded epoch: the state's leading member axis split over
    the `population_sharding` mesh, the real data and a shared world model replicated on the same mesh
    (jit refuses committed arguments on different device sets); a per-member model is split like the
    state. Unchanged where the population does not split."""
    sharding = population_sharding(int(state.epoch.shape[0]), devices)
    if sharding is None:
        return state, real, world_model
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    state = jax.device_put(state, sharding)
    real = jax.device_put(real, replicated)
    world_model = jax.device_put(world_model, sharding if per_member_model else replicated)
    return state, real, world_model


def stack_models(models: list) -> Any:
    """Per-seed world models as one pytree with a leading seed axis (static metadata from the first)."""
    first = models[0]
    models = [m.replace(info=first.info) for m in models]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *models)


@dataclasses.dataclass
class EpochReport:
    epoch: int
    updates: int
    train: dict[str, list[float]]
    eval: dict | None


def host_metrics(metrics: dict) -> dict[str, list[float]]:
    """Device metrics with a leading seed axis -> {name: [value per seed]}."""
    return {name: np.asarray(value, np.float64).reshape(-1).tolist() for name, value in jax.device_get(metrics).items()}


def train_epochs(
    trainer: Trainer,
    schedule,
    state: TrainState,
    real: ReplayBuffer,
    world_model,
    *,
    start_epoch: int,
    evaluate: Callable[[TrainState], dict] | None,
    checkpoint: Callable[[TrainState, int], None],
    on_epoch: Callable[[EpochReport], None],
    stop: StopSignal,
    layout: str = "vmap",
) -> tuple[TrainState, int]:
    """The host loop from `start_epoch`, members laid out as `layout` (`Trainer.choose_layout`); returns the final
    state and the last epoch done.

    Checks for a stop signal after each epoch: it checkpoints and returns early.
    """
    epoch = start_epoch
    while epoch < schedule.epochs:
        state, metrics = trainer.run_epoch(state, real, world_model, layout)
        epoch += 1
        last = epoch == schedule.epochs
        results = None
        if evaluate is not None and (epoch % schedule.eval_every == 0 or last):
            results = evaluate(state)
        on_epoch(EpochReport(epoch, epoch * schedule.updates_per_epoch, host_metrics(metrics), results))
        if last or epoch % schedule.checkpoint_period == 0 or stop.signum is not None:
            checkpoint(state, epoch)
        if stop.signum is not None:
            break
    return state, epoch


def time_epochs(trainer: Trainer, state: TrainState, real, world_model, epochs: int,
                layout: str = "vmap") -> tuple[TrainState, float]:
    """Run `epochs` compiled epochs (after one warm-up epoch) and return the seconds they took (benchmarks)."""
    state, metrics = trainer.run_epoch(state, real, world_model, layout)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(epochs):
        state, metrics = trainer.run_epoch(state, real, world_model, layout)
    jax.block_until_ready((state, metrics))
    return state, time.perf_counter() - start
