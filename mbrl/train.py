"""The training loop: the one place that wires dataset, world model, rollouts, buffers and agent together.

One epoch is a pure function of the training state (agent, model buffer, RNG key, epoch counter):

    rollouts from dataset start states into the model buffer   (one compiled `lax.scan` over time)
    K updates on mixed real:model batches                      (one compiled `lax.scan` over updates)

and the host only sees the epoch's averaged metrics. Because the epoch is pure, `--seeds N` vmaps the
whole state over a leading seed axis and runs N seeds in one compiled program; the world model is
shared (an unbatched argument) or one per seed (batched). Every E epochs the host evaluates all seeds'
policies in the real MuJoCo env in one batched call per step, and writes an orbax checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agents.bc import BC
from agents.mopo import MOPO
from agents.ravl import RAVL
from mbrl.core import replay
from mbrl.config import TrainConfig
from mbrl.core.errors import ConfigError
from mbrl.core.replay import ReplayBuffer
from mbrl.core.types import Transitions
from world_models.rollout import MarkovPolicy, RolloutConfig, rollout


# Rollouts of many start states step in slices of this many trajectories, so that one slice's ensemble
# activations stay in the CPU's cache (the `rollout_h5` figure's setting).
ROLLOUT_SLICE = 2000


def make_agent(config: TrainConfig, obs_dim: int, act_dim: int):
    """The agent named by `config.algo`, with its (init, update_many, act, model_reward) functions."""
    real_rows = replay.real_count(config.sac.batch_size, config.imagination.real_ratio)  # BC imitates these
    if config.algo == "ravl":
        return RAVL(config.sac, obs_dim, act_dim, real_rows)
    if config.algo == "mopo":
        return MOPO(config.sac, config.mopo, obs_dim, act_dim, real_rows)
    if config.algo == "bc":
        return BC(config.bc, obs_dim, act_dim)
    raise ConfigError(f"algo: unknown algorithm {config.algo!r}; expected one of ravl, mopo, bc")


@struct.dataclass
class TrainState:
    """Everything that changes during training, for one seed (a leading seed axis when vmapped)."""

    agent: Any
    model_buffer: ReplayBuffer | None
    key: jax.Array
    epoch: jax.Array  # () int32, epochs done


def real_buffer(transitions: Transitions) -> ReplayBuffer:
    """The dataset as a full device buffer (shared by all seeds, never written)."""
    return replay.from_transitions(transitions)


def compile_key(config: TrainConfig) -> TrainConfig:
    """The part of a config that the compiled programs depend on (seeds, dataset, epochs, logging do not)."""
    return TrainConfig(
        algo=config.algo,
        sac=config.sac,
        mopo=config.mopo,
        bc=config.bc,
        imagination=config.imagination,
        schedule=type(config.schedule)(updates_per_epoch=config.schedule.updates_per_epoch),
    )


@functools.lru_cache(maxsize=8)
def _cached_trainer(key: TrainConfig, obs_dim: int, act_dim: int) -> Trainer:
    return Trainer(key, obs_dim, act_dim)


def trainer_for(config: TrainConfig, obs_dim: int, act_dim: int) -> Trainer:
    """A Trainer shared by all runs whose compiled programs are the same (runs in one process compile once)."""
    if config.algo == "neubay":  # its own epoch: sequence tape, recurrent rollouts (mbrl/train_neubay.py)
        from mbrl.train_neubay import neubay_trainer_for

        return neubay_trainer_for(config, obs_dim, act_dim)
    return _cached_trainer(compile_key(config), obs_dim, act_dim)


class Trainer:
    """The pure pieces of training for one config: `init_state`, `epoch`, and their compiled, seed-vmapped forms.

    Only `compile_key(config)` matters here; use `trainer_for` to share compiles between runs.
    """

    def __init__(self, config: TrainConfig, obs_dim: int, act_dim: int):
        self.config = config
        self.agent = make_agent(config, obs_dim, act_dim)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        imagination = config.imagination
        self.uses_model = self.agent.uses_model
        self.model_capacity = imagination.rollouts_per_epoch * imagination.horizon * imagination.retain_epochs
        starts = imagination.rollouts_per_epoch
        chunk = ROLLOUT_SLICE if starts > ROLLOUT_SLICE and starts % ROLLOUT_SLICE == 0 else None
        self.rollout_config = RolloutConfig(
            uncertainty=getattr(self.agent, "uncertainty", None) or "aleatoric_max", batch_chunk=chunk
        )
        batch = self.agent.batch_size
        self.num_real = replay.real_count(batch, imagination.real_ratio) if self.uses_model else batch
        # Compiled once per run: S seeds share the program; the state is donated (updated in place).
        model_axis = 0 if imagination.per_seed_model else None
        self.init_states = jax.jit(jax.vmap(self.init_state))
        self.run_epoch = jax.jit(jax.vmap(self.epoch, in_axes=(0, None, model_axis)), donate_argnums=0)
        self.policy = jax.jit(self._batched_policy, static_argnames="episodes")

    # ------------------------------------------------------------------ pure functions (one seed)

    def real_data(self, dataset) -> ReplayBuffer:
        """The dataset in the form `epoch` takes it."""
        return real_buffer(dataset.transitions)

    def init_state(self, key: jax.Array) -> TrainState:
        agent_key, key = jax.random.split(key)
        buffer = replay.empty(self.model_capacity, self.obs_dim, self.act_dim) if self.uses_model else None
        return TrainState(self.agent.init(agent_key), buffer, key, jnp.zeros((), jnp.int32))

    def _rollout_act(self, actor_params, obs, key):
        return self.agent.act(actor_params, obs, key, False)

    def imagine(self, state: TrainState, real: ReplayBuffer, world_model, key) -> tuple[ReplayBuffer, dict]:
        """One epoch of model rollouts from dataset start states, written into the model buffer."""
        imagination = self.config.imagination
        start_key, rollout_key = jax.random.split(key)
        starts = jax.random.randint(start_key, (imagination.rollouts_per_epoch,), 0, real.size)
        imagined = rollout(
            rollout_key,
            world_model,
            MarkovPolicy(self._rollout_act),
            self.agent.actor_params(state.agent),
            real.data.obs[starts],
            imagination.horizon,
            self.rollout_config,
        )
        rows, valid = imagined.flat()
        raw, u = imagined.raw_reward.reshape(-1), imagined.uncertainty.reshape(-1)
        rows = rows.replace(reward=self.agent.model_reward(raw, u))
        buffer = replay.insert(state.model_buffer, rows, valid)
        count = jnp.maximum(jnp.sum(valid), 1)
        metrics = {
            "rollout_length": imagined.stats.mean_length,
            "rollout_terminated": jnp.mean(imagined.stats.terminated.astype(jnp.float32)),
            "model_reward": jnp.sum(jnp.where(valid, raw, 0.0)) / count,
            "model_uncertainty": jnp.sum(jnp.where(valid, u, 0.0)) / count,
            "model_buffer_size": buffer.size.astype(jnp.float32),
        }
        return buffer, metrics

    def sample_batches(self, real: ReplayBuffer, model: ReplayBuffer | None, key) -> Transitions:
        """All K batches of the epoch at once, (K, batch, ...): `num_real` real rows then model rows.

        The buffers do not change during the K updates, so gathering up front is the same draw as
        gathering inside the scan, and faster on CPU (one large gather instead of K small ones).
        """
        k, batch = self.config.schedule.updates_per_epoch, self.agent.batch_size
        real_key, model_key = jax.random.split(key)
        parts = []
        if self.num_real:
            parts.append(replay.sample(real, real_key, k * self.num_real))
        if batch - self.num_real:
            parts.append(replay.sample(model, model_key, k * (batch - self.num_real)))
        parts = [jax.tree.map(lambda x: x.reshape(k, -1, *x.shape[1:]), p) for p in parts]
        return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *parts)

    def epoch(self, state: TrainState, real: ReplayBuffer, world_model) -> tuple[TrainState, dict]:
        """Rollouts (model-based agents), then K updates; metrics are means over the K updates."""
        key, imagine_key, sample_key, update_key = jax.random.split(state.key, 4)
        metrics = {}
        buffer = state.model_buffer
        if self.uses_model:
            buffer, metrics = self.imagine(state, real, world_model, imagine_key)
        batches = self.sample_batches(real, buffer, sample_key)
        agent, update_metrics = self.agent.update_many(state.agent, batches, update_key)
        metrics.update(update_metrics)
        return TrainState(agent, buffer, key, state.epoch + 1), metrics

    def _batched_policy(self, actor_params, obs, episodes: int):
        """Deterministic actions of S seeds' policies on (S * episodes, obs_dim) observations."""
        obs = obs.reshape(-1, episodes, obs.shape[-1])
        key = jax.random.PRNGKey(0)  # unused by deterministic policies
        actions = jax.vmap(lambda p, o: self.agent.act(p, o, key, True))(actor_params, obs)
        return actions.reshape(-1, actions.shape[-1])

    # ------------------------------------------------------------------ host side

    def initial_state(self, seeds: list[int]) -> TrainState:
        keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
        return self.init_states(keys)

    def evaluate(self, state: TrainState, task, seeds: list[int], ref_scores: tuple[float, float] | None,
                 episodes: int = 10, eval_seed: int = 0) -> dict:
        """Deterministic policies of all seeds in the real env, batched; per-seed lists of results.

        Episode i of training seed s resets with `eval_seed + s * episodes + i`, so a seed's score does not
        depend on which other seeds ran with it.
        """
        from mbrl.evaluate import evaluate, normalized_score

        params = self.agent.actor_params(state.agent)
        result = evaluate(
            lambda obs: np.asarray(self.policy(params, jnp.asarray(obs, jnp.float32), episodes=episodes)),
            task,
            episodes=episodes * len(seeds),
            seed=eval_seed + seeds[0] * episodes,
        )
        returns = result.returns.reshape(len(seeds), episodes)
        out = {"return_mean": returns.mean(axis=1).tolist(), "return_std": returns.std(axis=1).tolist()}
        out["normalized_score"] = (
            None if ref_scores is None else [float(normalized_score(r, *ref_scores)) for r in returns.mean(axis=1)]
        )
        out["length_mean"] = result.lengths.reshape(len(seeds), episodes).mean(axis=1).tolist()
        return out


def stack_models(models: list) -> Any:
    """Per-seed world models as one pytree with a leading seed axis (static metadata from the first)."""
    first = models[0]
    models = [m.replace(info=first.info) for m in models]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *models)


class StopSignal:
    """Turns the first SIGINT/SIGTERM into a flag the loop checks between epochs; a second one aborts."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        return False


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
) -> tuple[TrainState, int]:
    """The host loop from `start_epoch`; returns the final state and the last epoch done.

    Checks for a stop signal after each epoch: it checkpoints and returns early.
    """
    epoch = start_epoch
    while epoch < schedule.epochs:
        state, metrics = trainer.run_epoch(state, real, world_model)
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


def time_epochs(trainer: Trainer, state: TrainState, real: ReplayBuffer, world_model, epochs: int) -> tuple[TrainState, float]:
    """Run `epochs` compiled epochs (after one warm-up epoch) and return the seconds they took (benchmarks)."""
    state, metrics = trainer.run_epoch(state, real, world_model)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(epochs):
        state, metrics = trainer.run_epoch(state, real, world_model)
    jax.block_until_ready((state, metrics))
    return state, time.perf_counter() - start



# ---------------------------------------------------------------------------------------------------
# A run directory: config.json, run.json, world_model*/, checkpoints/, metrics.jsonl, learning_curve.png


@dataclasses.dataclass
class RunResult:
    run_dir: Path
    config: TrainConfig
    epochs_done: int
    records: list[dict]  # metrics.jsonl, all epochs of the run (also those before a resume)
    final_eval: dict | None  # the last evaluation's per-seed results
    dataset_score: float | None  # the dataset's own mean normalized score (episode returns)
    interrupted: int | None  # the signal that stopped the run early, if any
    seconds: float


def _reference_scores(dataset, task) -> tuple[float, float] | None:
    info = dataset.info
    if info.ref_min_score is not None and info.ref_max_score is not None:
        return float(info.ref_min_score), float(info.ref_max_score)
    if task is not None:
        return task.d4rl_ref_min_score, task.d4rl_ref_max_score
    return None


def _model_paths(config: TrainConfig, run_dir: Path, world_model_dir: Path | None) -> list[Path]:
    if world_model_dir is not None:
        if config.imagination.per_seed_model:
            raise ConfigError("--world-model gives one model; it cannot be combined with imagination.per_seed_model")
        return [Path(world_model_dir).absolute()]
    if config.imagination.per_seed_model:
        return [run_dir / f"world_model_seed{s}" for s in config.seed_list]
    return [run_dir / "world_model"]


def _world_models(config: TrainConfig, dataset, task, paths: list[Path], progress: bool):
    """Load each model that exists, fit (and save) the others; one pytree, seed-stacked when per seed."""
    from world_models.fit import fit_world_model
    from world_models.model import ModelInfo, WorldModel

    termination_fn = task.termination_fn if task is not None else None
    models = []
    for index, path in enumerate(paths):
        if (path / "model.json").is_file():
            models.append(WorldModel.load(path, termination_fn))
            continue
        fit_seed = config.fit.seed + (config.seed_list[index] if config.imagination.per_seed_model else 0)
        fit_config = dataclasses.replace(config.fit, seed=fit_seed)
        result = fit_world_model(dataset, config=config.ensemble, fit_config=fit_config,
                                 termination_fn=termination_fn, progress=progress)
        result.model.save(path)
        models.append(result.model)
    for model in models:
        if model.obs_dim != dataset.info.obs_dim or model.act_dim != dataset.info.act_dim:
            raise ConfigError(
                f"world model {paths[0]}: obs/act dims {model.obs_dim}/{model.act_dim} do not match the dataset's "
                f"{dataset.info.obs_dim}/{dataset.info.act_dim}"
            )
    # Static metadata (where it was fitted) would make each model a new jit cache entry: drop it here.
    models = [m.replace(info=ModelInfo()) for m in models]
    return models[0] if len(models) == 1 and not config.imagination.per_seed_model else stack_models(models)


RUN_FILE = "run.json"  # facts a run needs besides its config: world-model paths, task, reference scores


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def read_run_facts(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(Path(path).absolute().relative_to(run_dir.absolute()))
    except ValueError:
        return str(Path(path).absolute())


def run(
    config: TrainConfig | None,
    run_dir: str | Path,
    *,
    resume: bool = False,
    world_model_dir: str | Path | None = None,
    dataset=None,
    progress: bool | None = None,
    on_epoch: Callable[[EpochReport], None] | None = None,
) -> RunResult:
    """Train as `config` says into `run_dir`, or (`resume=True`) continue the run there from its last checkpoint.

    `dataset`: an already loaded `OfflineDataset` (else `mbrl.datasets.load(config.dataset)`).
    `on_epoch`: called on the host after each epoch's record is written (tests, scripts).
    """
    from envs.tasks import TASKS
    from mbrl import config as config_io
    from mbrl import datasets
    from mbrl.checkpoint import Checkpointer
    from mbrl.logging import METRICS_FILE, Progress, RunLogger, mean_stderr, plot_learning_curve, read_metrics, truncate_metrics

    start_time = time.perf_counter()
    run_dir = Path(run_dir).absolute()
    if resume:
        if not (run_dir / "config.json").is_file():
            raise ConfigError(f"{run_dir}: not a run directory (no config.json) to resume")
        config = config_io.load(run_dir / "config.json")
        facts = read_run_facts(run_dir)
        model_paths = [run_dir / p for p in facts["world_models"]] if facts else _model_paths(config, run_dir, world_model_dir)
    else:
        if (run_dir / "config.json").exists():
            raise ConfigError(f"{run_dir}: already holds a run; continue it with --resume {run_dir} or choose another --run-dir")
        model_paths = _model_paths(config, run_dir, world_model_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        config_io.save(config, run_dir / "config.json")
    progress = config.logging.progress if progress is None else progress

    dataset = dataset if dataset is not None else datasets.load(config.dataset)
    task = TASKS.get(dataset.info.task) if dataset.info.task else None
    ref_scores = _reference_scores(dataset, task)
    dataset_score = None
    if ref_scores is not None and dataset.num_episodes:
        dataset_score = float(100.0 * (dataset.episode_returns().mean() - ref_scores[0]) / (ref_scores[1] - ref_scores[0]))
    _write_json(run_dir / RUN_FILE, {
        "world_models": [_relative(p, run_dir) for p in model_paths] if config.uses_model else [],
        "task": task.name if task is not None else None,
        "ref_scores": list(ref_scores) if ref_scores is not None else None,
        "obs_dim": dataset.info.obs_dim,
        "act_dim": dataset.info.act_dim,
        "dataset_score": dataset_score,
    })

    seeds = config.seed_list
    trainer = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim)
    real = trainer.real_data(dataset)
    world_model = _world_models(config, dataset, task, model_paths, progress) if trainer.uses_model else None

    checkpointer = Checkpointer(run_dir / "checkpoints")
    start_epoch = 0
    if resume and checkpointer.latest_epoch() is not None:
        like = jax.eval_shape(trainer.initial_state, seeds)
        state, record = checkpointer.restore(like)
        start_epoch = int(record["epoch"])
        truncate_metrics(run_dir / METRICS_FILE, start_epoch)
    else:
        state = trainer.initial_state(seeds)
        truncate_metrics(run_dir / METRICS_FILE, 0)

    def checkpoint(state, epoch):
        record = {
            "epoch": epoch,
            "updates": epoch * config.schedule.updates_per_epoch,
            "seeds": seeds,
            "world_models": [_relative(p, run_dir) for p in model_paths] if trainer.uses_model else [],
        }
        checkpointer.save(epoch, state, record)

    evaluate = None
    if task is not None:
        evaluate = functools.partial(trainer.evaluate, task=task, seeds=seeds, ref_scores=ref_scores,
                                     episodes=config.schedule.eval_episodes, eval_seed=config.schedule.eval_seed)

    logger = RunLogger(run_dir, tensorboard=config.logging.tensorboard, wandb=config.logging.wandb,
                       wandb_project=config.logging.wandb_project, config=config_io.to_dict(config))
    title = f"{config.algo.upper()} · {config_io.dataset_key(config.dataset)}"
    last_status = ""

    with StopSignal() as stop, Progress(config.schedule.epochs, start_epoch, title, enabled=progress) as bar:

        def report(r: EpochReport):
            nonlocal last_status
            record = {"epoch": r.epoch, "updates": r.updates, "seeds": seeds, "train": r.train}
            if r.eval is not None:
                record["eval"] = r.eval
                scores = r.eval["normalized_score"] or r.eval["return_mean"]
                mean, stderr = mean_stderr(scores)
                record["score_mean"], record["score_stderr"] = mean, stderr
                last_status = f"score {mean:.1f} ± {stderr:.1f}"
            logger.log(record)
            bar.update(r.epoch, last_status)
            if on_epoch is not None:
                on_epoch(r)

        try:
            state, epochs_done = train_epochs(trainer, config.schedule, state, real, world_model, start_epoch=start_epoch,
                                              evaluate=evaluate, checkpoint=checkpoint, on_epoch=report, stop=stop)
        finally:
            logger.close()
            checkpointer.close()
        interrupted = stop.signum

    records = read_metrics(run_dir / METRICS_FILE)
    plot_learning_curve(records, run_dir / "learning_curve.png", title)
    evals = [r["eval"] for r in records if r.get("eval")]
    return RunResult(
        run_dir=run_dir,
        config=config,
        epochs_done=epochs_done,
        records=records,
        final_eval=evals[-1] if evals else None,
        dataset_score=dataset_score,
        interrupted=interrupted,
        seconds=time.perf_counter() - start_time,
    )
