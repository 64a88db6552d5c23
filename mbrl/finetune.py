"""Offline-to-online fine-tuning on a robot, as WSRL (Zhou et al. 2024, "Efficient Online Reinforcement Learning
Fine-Tuning Need Not Retain Offline Data"):

1. warm-up: `warmup` steps of the frozen offline policy (sampled) fill a fresh online buffer; no update;
2. online learning on the same networks (the algorithm's `online_learner`, `mbrl.agents.base.OnlineFinetuner`: SAC-N
   for the SAC-N family) at `utd` updates per new step, keeping none of the offline data (`retain_offline_ratio`
   mixes a share of it back into every batch, for comparison). A run trained with a BC anchor keeps it, towards
   the frozen warm-start policy (`online_learner`).

Every command goes through the deploy safety layer and control loop (`mbrl.envs.robots.loop.ControlLoop`): clip, rate
limit, watchdog, safe stop; episodes start with the robot adapter's reset. A transition is stored when a tick
whose command the policy chose is followed by a fresh observation: the action stored is the command the robot
reports it sent. Every `update_every` steps one compiled call inserts the new rows and runs `utd * update_every`
updates; the policy acting meanwhile is fixed.

The run directory: `finetune.json` (the options and the offline run), `metrics.jsonl` (one record every
`eval_every` steps: the policy's score in the simulator when the run's task is known, the online episodes'
returns, the update metrics), `ticks.jsonl` (the control loop's per-tick log), `checkpoints/`,
`learning_curve.png` and `export/` (the fine-tuned policy, as `mbrl export` writes it).

A checkpoint holds the agent, the online buffer, the keys and the host side of the episode in progress; on a
simulated robot (`mujoco:`) also the simulator's whole state, so `--resume` continues bit for bit, mid-episode.
A networked robot cannot be put back where it was: a resumed run starts a new episode there. SIGINT/SIGTERM
end the tick in progress, stop the robot safely, then checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mbrl import datasets
from mbrl.agents.base import OnlineSettings, capability
from mbrl.config import override
from mbrl.core import checks, replay
from mbrl.core.errors import ConfigError
from mbrl.core.files import read_json, write_text_atomic
from mbrl.core.score import evaluation_record, normalized_score, scores_of
from mbrl.core.types import Transitions
from mbrl.envs.lockstep import markov
from mbrl.envs.robots.connect import SimOptions, check_fit, make_robot
from mbrl.envs.robots.loop import ControlLoop, EpisodeProgress
from mbrl.envs.robots.safety import SafetyConfig, SafetyLayer
from mbrl.export import export_policy

CONFIG_FILE = "finetune.json"
TICKS_FILE = "ticks.jsonl"
FIELDS = ("obs", "action", "reward", "next_obs", "terminal", "timeout")


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """A fine-tuning run: `finetune.json` in its directory is this, as JSON. The options of `mbrl finetune` are
    generated from these fields (`mbrl.config.option_fields`), whose entries here are their help.

    run: a run directory written by `mbrl train` with a SAC-N agent (ravl, mopo).
    robot: mujoco:ENV_ID | udp://HOST:PORT | ros2:PREFIX (with --resume: the robot at a new address).
    steps: online env steps in all, the warm-up's included.
    warmup: steps of the frozen offline policy (uniform random actions with --scratch) before the first update.
    utd: updates per new env step once the warm-up is over.
    retain_offline_ratio: share of every batch drawn from the run's offline dataset (WSRL keeps none).
    scratch: SAC from scratch: fresh networks of the run's shapes instead of its trained ones (a baseline).
    seed: seed of the fine-tuning: its sampling, its updates and its episodes' resets.
    seed_index: which of the run's training seeds to fine-tune.
    update_every: env steps between update chunks (utd x this many updates each); the policy is fixed in between.
    eval_every: env steps between metrics records (and evaluations in simulation when the run's task is known).
    eval_episodes: episodes of each evaluation of the deterministic policy in simulation (0: none).
    eval_seed: evaluation episode i resets with eval_seed + i, the same episodes at every evaluation.
    checkpoint_every: env steps between checkpoints (default: --eval-every).
    anchor: weight of a BC anchor to the warm-start policy's actions online (default: the offline run's
        sac.actor_bc_coef, 0 with --scratch; 0: none, plain WSRL).
    anchor_final: the anchor's weight at the run's end, reached linearly from --anchor over the online phase
        (default: constant).
    rate: control rate in Hz; 0 runs unpaced, as fast as the robot answers.
    safety: the safety layer between the policy and the robot (`mbrl.envs.robots.safety`).
    obs_timeout: udp/ros2: seconds to wait for a new observation each tick.
    ros2_backend: ros2: `dds` (cyclonedds, the `ros2` extra) or `rclpy` (a ROS 2 installation).
    """

    run: str
    robot: str
    steps: int = 30_000
    warmup: int = 5_000
    utd: int = 4
    retain_offline_ratio: float = 0.0
    scratch: bool = False
    seed: int = 0
    seed_index: int = 0
    update_every: int = 50
    eval_every: int = 2_500
    eval_episodes: int = 10
    eval_seed: int = 0
    checkpoint_every: int | None = None
    anchor: float | None = None
    anchor_final: float | None = None
    rate: float = 0.0
    safety: SafetyConfig = SafetyConfig()
    obs_timeout: float = 1.0
    ros2_backend: str = "dds"

    def __post_init__(self):
        checks.positive_ints(checks.FLAG, self, "steps", "utd", "update_every", "eval_every")
        checks.non_negative_ints(checks.FLAG, self, "warmup", "eval_episodes")
        for name in ("steps", "warmup", "eval_every") + (("checkpoint_every",) if self.checkpoint_every else ()):
            if getattr(self, name) % self.update_every:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected a multiple of "
                                  f"--update-every ({self.update_every}); updates and records fall on chunk ends")
        checks.optional_positive_ints(checks.FLAG, self, "checkpoint_every")
        if not 0.0 <= self.retain_offline_ratio <= 1.0:
            raise ConfigError(f"--retain-offline-ratio: expected a fraction in [0, 1], found {self.retain_offline_ratio}")
        if self.scratch and self.retain_offline_ratio:
            raise ConfigError("--scratch trains SAC from scratch, without the offline data: drop --retain-offline-ratio")
        if self.anchor is not None and not self.anchor >= 0:
            raise ConfigError(f"--anchor: expected a BC weight >= 0 (or None: the run's own), found {self.anchor}")
        if self.anchor_final is not None and not self.anchor_final >= 0:
            raise ConfigError(f"--anchor-final: expected a BC weight >= 0 (or None: constant), found {self.anchor_final}")
        if self.rate < 0:
            raise ConfigError(f"--rate: expected Hz >= 0 (0: unpaced), found {self.rate}")
        if not self.obs_timeout > 0:
            raise ConfigError(f"--obs-timeout: expected seconds > 0, found {self.obs_timeout}")

    @property
    def checkpoint_period(self) -> int:
        return self.checkpoint_every or self.eval_every


@dataclasses.dataclass
class FinetuneResult:
    run_dir: Path
    records: list[dict]
    steps: int
    interrupted: str | None  # the signal's name, "watchdog", or None when the budget was spent
    export_dir: Path | None
    seconds: float


class OnlinePolicy:
    """The acting policy: the actor sampled with key (`key`, call count), or uniform actions in [-1, 1] (SAC from
    scratch during its warm-up). Stateless given `calls`, so a resumed run acts as the uninterrupted one."""

    def __init__(self, learner, params, key: jax.Array, seed: int, uniform: bool):
        self.learner, self.params, self.key, self.seed, self.uniform = learner, params, key, seed, uniform
        self.calls = 0

    def __call__(self, obs) -> np.ndarray:
        call, self.calls = self.calls, self.calls + 1
        if self.uniform:
            return np.random.default_rng([self.seed, call]).uniform(-1.0, 1.0, self.learner.act_dim).astype(np.float32)
        return np.asarray(self.learner.policy_step(self.params, jnp.asarray(obs, jnp.float32), self.key, call))


def _reset_seed(seed: int, episode: int) -> int:
    """Episode `episode` of fine-tuning seed `seed`: distinct from other seeds' and from evaluation's (< 1e6)."""
    return 1_000_000 * (seed + 1) + episode


def anchor_weight(config: FinetuneConfig, offline_anchor: float) -> float:
    """The BC weight the online phase starts with: `--anchor`, else the offline run's own (`offline_anchor`)."""
    if config.anchor is not None:
        return float(config.anchor)
    return 0.0 if config.scratch else float(offline_anchor)  # from scratch there is nothing to keep


def online_learner(config: FinetuneConfig, source):
    """The online learner on the offline run's networks (`OnlineFinetuner.online_learner`). An offline run whose
    actor was anchored to its data (the quick presets) keeps an anchor of that weight (`anchor_weight`): to the
    frozen warm-start policy's deterministic actions (`--anchor-final` moves it linearly to another weight by the
    run's end). Such an actor is not a maximiser of its critics: let go, it leaves the policy's good region within
    a few thousand updates (docs/finetune.md)."""
    agent = source.trainer.agent
    where, algo = str(source.run_dir), source.config.algo
    offline_anchor = capability(agent, "offline_anchor", "fine-tuning", where, algo)()
    settings = OnlineSettings(anchor=anchor_weight(config, offline_anchor),
                              capacity=config.warmup + config.steps,  # the whole run fits: nothing online is overwritten
                              warmup=config.warmup, chunk_steps=config.update_every, utd=config.utd,
                              retain_offline_ratio=config.retain_offline_ratio)
    return capability(agent, "online_learner", "fine-tuning", where, algo)(settings, source.trainer.obs_scale)


def _source_run(config: FinetuneConfig):
    from mbrl.train import load_run  # lazy: 3.4 s more for `mbrl finetune --help` (measured)

    source = load_run(config.run)
    capability(source.trainer.agent, "online_learner", "fine-tuning", str(source.run_dir), source.config.algo)
    if not 0 <= config.seed_index < len(source.seeds):
        raise ConfigError(f"--seed-index: the run trained {len(source.seeds)} seed(s) {source.seeds}, found {config.seed_index}")
    return source


def _robot(config: FinetuneConfig, source):
    from mbrl.envs.tasks import get_task  # lazy: 1.5 s more for `mbrl finetune --help` (MuJoCo; measured)

    obs_dim, act_dim = int(source.facts["obs_dim"]), int(source.facts["act_dim"])
    low, high = -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32)
    if source.facts.get("task"):
        task = get_task(source.facts["task"])
        low, high = task.action_bounds()
    robot = make_robot(config.robot, obs_dim=obs_dim, action_low=low, action_high=high, obs_timeout=config.obs_timeout,
                       sim=SimOptions(noise_seed=config.seed), ros2_backend=config.ros2_backend)
    return robot, low, high


class _Records:
    """The running sums behind one metrics record: update metrics per chunk, online episodes' returns."""

    def __init__(self, saved: dict | None = None):
        saved = saved or {}
        self.sums: dict[str, float] = dict(saved.get("sums", {}))
        self.chunks: int = saved.get("chunks", 0)
        self.returns: list[float] = list(saved.get("returns", []))
        self.lengths: list[int] = list(saved.get("lengths", []))

    def add_chunk(self, metrics: dict) -> None:
        for name, value in jax.device_get(metrics).items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value)
        self.chunks += 1

    def state(self) -> dict:
        return {"sums": self.sums, "chunks": self.chunks, "returns": self.returns, "lengths": self.lengths}


def run(config: FinetuneConfig | None, run_dir: str | Path, *, resume: bool = False, robot_uri: str | None = None,
        progress: bool = True) -> FinetuneResult:
    """Fine-tune as `config` says into `run_dir`, or (`resume`) continue the fine-tuning run there from its last
    checkpoint (`robot_uri`: the robot at a new address)."""
    started = time.perf_counter()
    run_dir = Path(run_dir).absolute()
    tuning = _Finetuning(_configure(config, run_dir, resume, robot_uri), run_dir, resume, started)
    tuning.session(progress)
    return tuning.finish()


def _configure(config: FinetuneConfig | None, run_dir: Path, resume: bool, robot_uri: str | None) -> FinetuneConfig:
    """The run's configuration: the given one for a new run, `finetune.json`'s (at `robot_uri` if given) for a resume."""
    if resume:
        config = _read_config(run_dir)
        if robot_uri is not None:
            config = dataclasses.replace(config, robot=robot_uri)
    elif (run_dir / CONFIG_FILE).exists():
        raise ConfigError(f"{run_dir}: already holds a fine-tuning run; continue it with --resume {run_dir} or choose another --run-dir")
    return config


def _online_state(config: FinetuneConfig, source, learner):
    """The online state: the offline agent (a fresh one with --scratch) with an empty buffer; its key; the anchor,
    the warm-start policy frozen (a copy: the state's own buffers are donated to the updates), None without BC."""
    key = jax.random.PRNGKey(config.seed)
    state = learner.init(key)
    member = state.agent
    if not config.scratch:
        member = jax.tree.map(lambda x: jnp.asarray(x[config.seed_index]), source.state.agent)
        state = state.replace(agent=member)
    anchor = jax.tree.map(jnp.copy, member.actor_params) if learner.core.use_bc else None
    return key, state, anchor


def _offline_buffer(source, learner):
    """The offline dataset as a fixed buffer, when a share of every batch comes from it (--retain-offline-ratio)."""
    if not learner.config.offline_rows:
        return None
    return replay.from_transitions(datasets.load(source.config.dataset, task=source.facts.get("task")).transitions)


class _Finetuning:
    """One fine-tuning run's state and its phases: set up (`__init__`: the source run, the online SAC state, the robot,
    the checkpoint to continue from, the control loop), the tick loop (`drive`), the update chunk (`update_chunk`),
    the record (`write_record`), the checkpoint (`host_state`, `checkpoint`) and finishing (`finish`)."""

    def __init__(self, config: FinetuneConfig, run_dir: Path, resume: bool, started: float):
        from mbrl.envs.tasks import get_task  # lazy: 1.5 s more for `mbrl finetune --help` (MuJoCo; measured)

        self.config, self.run_dir, self.started = config, run_dir, started
        self.source = source = _source_run(config)
        obs_dim, act_dim = int(source.facts["obs_dim"]), int(source.facts["act_dim"])
        self.learner = online_learner(config, source)
        self.task = get_task(source.facts["task"]) if source.facts.get("task") else None
        self.ref_scores = source.facts.get("ref_scores")
        self.key, self.state, self.anchor = _online_state(config, source, self.learner)
        self.fixed = _offline_buffer(source, self.learner)
        self._connect(resume, obs_dim, act_dim)
        self._continue(self.saved)
        self._control(resume)

    def _connect(self, resume: bool, obs_dim: int, act_dim: int) -> None:
        """Connect the robot and check it fits the run; only then write `finetune.json` (a new run) or restore the
        latest checkpoint (a resume). The robot is disconnected if any of it fails."""
        from mbrl.checkpoint import Checkpointer  # lazy: 0.5 s more for `mbrl finetune --help` (orbax; measured)

        config, run_dir = self.config, self.run_dir
        self.robot, low, high = _robot(config, self.source)
        self.robot.connect()
        try:
            self.low, self.high = check_fit(self.robot, f"run {self.source.run_dir}", obs_dim, act_dim, low, high)
            if not resume:  # nothing is written before the robot is known to fit
                run_dir.mkdir(parents=True, exist_ok=True)
                write_text_atomic(run_dir / CONFIG_FILE,
                                  json.dumps(dataclasses.asdict(config) | {"run": str(self.source.run_dir)}, indent=1) + "\n")
            self.checkpointer = Checkpointer(run_dir / "checkpoints")
            self.saved = None
            if resume and self.checkpointer.latest_epoch() is not None:
                self.state, self.saved = self.checkpointer.restore(self.state)
        except BaseException:
            self.robot.disconnect()
            raise

    def _continue(self, saved: dict | None) -> None:
        """The host side: zero for a new run, the checkpoint's for a resume; metrics records after it are dropped."""
        # lazy: 1.2 s more for `mbrl finetune --help` (matplotlib; measured)
        from mbrl.logging import METRICS_FILE, truncate_metrics

        self.steps = saved["step"] if saved else 0
        truncate_metrics(self.run_dir / METRICS_FILE, self.steps if self.steps else -1, key="step")  # step 0's record is redone
        self.updates = saved["updates"] if saved else 0
        self.episodes = saved["episodes"] if saved else 0
        self.records = _Records(saved.get("records") if saved else None)
        self.rows: list[tuple] = [tuple(np.asarray(v) for v in row) for row in saved["rows"]] if saved else []
        self.pending = saved["pending"] if saved else None
        self.seconds_before = saved["seconds"] if saved else 0.0

    def _control(self, resume: bool) -> None:
        """The acting policy, the evaluated one, the safety layer and control loop (`ticks.jsonl`), the metrics log."""
        from mbrl.logging import RunLogger  # lazy: 1.2 s more for `mbrl finetune --help` (matplotlib; measured)

        config = self.config
        self.policy = OnlinePolicy(self.learner, self.state.agent.actor_params, jax.random.fold_in(self.key, 1), config.seed,
                                   uniform=config.scratch and self.steps < config.warmup)
        self.policy.calls = self.saved["policy_calls"] if self.saved else 0
        self.deterministic = self.learner.deterministic_policy()
        self.safety = SafetyLayer(self.low, self.high, config.safety)
        self.loop = ControlLoop(self.robot, self.policy, self.safety, config.rate or None, self.run_dir / TICKS_FILE,
                                append_log=resume)
        self.logger = RunLogger(self.run_dir)
        self.interrupted: str | None = None
        self.snapshot: dict | None = None  # the host state at a stop, checkpointed after the robot's safe stop
        self.last_score = "—"

    # ------------------------------------------------------------------ the tick loop

    def session(self, progress: bool) -> None:
        """The tick loop inside the control loop's session (a safe stop and a disconnect in every case), then the
        last checkpoint: the stop's host state, or the finished run's."""
        from mbrl.logging import Progress  # lazy: 1.2 s more for `mbrl finetune --help` (matplotlib; measured)

        self.bar = Progress(self.config.steps, self.steps, f"fine-tune · {self.config.robot}", enabled=progress, unit="steps")
        try:
            with self.bar:
                self.loop.session(self.drive, connect=False)
        finally:
            self.logger.close()
            if self.snapshot is not None:
                self.checkpoint(self.snapshot)  # after the robot's safe stop
            elif self.interrupted is None and self.steps >= self.config.steps:
                self.checkpoint(self.host_state())
            self.checkpointer.close()

    def drive(self, signals) -> None:
        """Tick the robot until the budget of steps is spent, a signal or the watchdog stops it: episodes begin
        with the robot's reset, a fresh observation after a command the policy chose completes a transition."""
        config, loop = self.config, self.loop
        self._restore_episode()
        if self.steps == 0:
            self.write_record()
        while self.steps < config.steps:
            if loop.progress is None:
                loop.begin_episode(self.episodes, _reset_seed(config.seed, self.episodes))
                self.pending = None
            tick = loop.tick(signals)
            if tick.obs is None:  # a signal, before this tick observed anything: checkpoint after the stop
                self._stop(tick.end)
                return
            due = self._collect(tick) if tick.fresh and self.pending is not None else False
            fresh_choice = tick.acted and tick.fresh and tick.sent is not None
            self.pending = (tick.obs.values.tolist(), tick.sent.tolist()) if fresh_choice else None
            if tick.end in ("terminated", "truncated"):
                result = loop.finish_episode(tick.end)
                self.records.returns.append(result["return"])
                self.records.lengths.append(result["length"])
                self.episodes += 1
            elif tick.end is not None:  # the watchdog: checkpoint after the stop
                self._stop(tick.end)
                return
            if due:  # at the tick's end: the checkpoint holds the tick's outcome too
                self.checkpoint(self.host_state())
        if loop.progress is not None:
            loop.finish_episode("max_steps")

    def _restore_episode(self) -> None:
        """The checkpoint's episode in progress, put back on a simulated robot at the same address; a networked
        robot cannot be put back mid-episode: a new episode starts."""
        if not self.saved or self.saved["episode"] is None:
            return
        episode = self.saved["episode"]
        # Only a simulated robot snapshots its episode (`Robot.snapshot`); the others give None.
        if episode["robot"] is not None and self.saved["robot"] == self.config.robot:
            self.robot.restore(episode["robot"])
            self.safety.restore(episode["safety"])
            self.loop.resume_episode(EpisodeProgress(**episode["progress"]))
        else:
            self.pending = None

    def _stop(self, reason: str) -> None:
        """A signal or the watchdog ended the run: its host state now, checkpointed after the robot's safe stop."""
        self.interrupted = reason
        self.snapshot = self.host_state()

    def _collect(self, tick) -> bool:
        """Store the transition from the pending choice to `tick`'s observation; at a chunk's end the update chunk,
        at a record's the record. Whether a checkpoint falls due at this tick's end."""
        config = self.config
        self.rows.append(self._row(tick))
        self.steps += 1
        if len(self.rows) == config.update_every:
            self.update_chunk()
            self.bar.update(self.steps, f"{self._phase()} · {self.updates:,} updates · score {self.last_score}")
        if self.steps % config.eval_every == 0 or self.steps == config.steps:
            record = self.write_record()
            if "score_mean" in record:
                self.last_score = f"{record['score_mean']:.1f}"
        return self.steps % config.checkpoint_period == 0 and self.steps < config.steps

    def _row(self, tick) -> tuple:
        """(obs, action, reward, next_obs, terminal, timeout): the action is the command the robot reported sent."""
        obs, action = self.pending
        reward, task = tick.reward, self.task
        if tick.obs.reward is None and task is not None and task.reward_fn is not None:
            # A robot that reports no reward: the declared rule scores the step.
            reward = float(task.reward_fn(np.asarray(obs, np.float32)[None], np.asarray(action, np.float32)[None],
                                          np.asarray(tick.obs.values, np.float32)[None])[0])
        return (np.asarray(obs, np.float32), np.asarray(action, np.float32), np.float32(reward),
                tick.obs.values, bool(tick.obs.terminated), bool(tick.obs.truncated))

    # ------------------------------------------------------------------ the update chunk

    def update_chunk(self) -> None:
        """One compiled call (`OnlineSAC.chunk`): insert the chunk's rows and, past the warm-up, run utd x
        update_every updates; then the acting policy takes the new actor."""
        config = self.config
        arrays = Transitions(*[np.stack([row[i] for row in self.rows]).astype(dtype) for i, dtype in
                               enumerate((np.float32, np.float32, np.float32, np.float32, bool, bool))])
        self.state, metrics = self.learner.chunk(self.state, arrays, self.steps, self.fixed, self._hypers(), self.anchor)
        if metrics is not None:
            self.updates += config.update_every * config.utd
            self.records.add_chunk(metrics)
        self.rows = []
        self.policy.params = self.state.agent.actor_params
        self.policy.uniform = config.scratch and self.steps < config.warmup

    def _hypers(self) -> dict:
        """The core's traced values for this chunk: the BC anchor's weight moves linearly from --anchor at the
        warm-up's end to --anchor-final at the run's (constant without it)."""
        config, learner = self.config, self.learner
        hypers = dict(learner.core.hypers())
        if learner.core.use_bc and config.anchor_final is not None:
            start, left = learner.config.sacn.actor_bc_coef, (config.steps - self.steps) / max(config.steps - config.warmup, 1)
            hypers["actor_bc_coef"] = jnp.asarray(config.anchor_final + (start - config.anchor_final) * left, jnp.float32)
        return hypers

    # ------------------------------------------------------------------ the record

    def _phase(self) -> str:
        return "offline" if self.steps == 0 else "warmup" if self.steps <= self.config.warmup else "online"

    def write_record(self) -> dict:
        """One record of metrics.jsonl: the counters, the update metrics' means since the last record, the online
        episodes' returns, the evaluation in simulation and its score (`scores_of`)."""
        records, ref_scores = self.records, self.ref_scores
        record = {"step": self.steps, "updates": self.updates, "phase": self._phase(), "episodes": self.episodes,
                  "train": {name: [value / records.chunks] for name, value in records.sums.items()} if records.chunks else {}}
        if records.returns:
            mean = float(np.mean(records.returns))
            record["online"] = {"episodes": len(records.returns), "return_mean": mean,
                                "length_mean": float(np.mean(records.lengths)),
                                "normalized_score": float(normalized_score(mean, *ref_scores)) if ref_scores else None}
        results = self._evaluation()
        if results is not None:
            record["eval"] = results
            record["score_mean"] = scores_of(results)[0]
        record["seconds"] = self._seconds()
        self.logger.log(record)
        self.records = _Records()
        return record

    def _evaluation(self) -> dict | None:
        """The deterministic policy's episodes in simulation (`mbrl.evaluate`), when the run's task is known."""
        from mbrl.evaluate import evaluate  # lazy: 1.2 s more for `mbrl finetune --help` (MuJoCo; measured)

        config, ref_scores = self.config, self.ref_scores
        if self.task is None or not config.eval_episodes:
            return None
        params, eval_key, deterministic = self.state.agent.actor_params, jax.random.PRNGKey(0), self.deterministic
        result = evaluate(markov(lambda obs: np.asarray(deterministic(params, jnp.asarray(obs), eval_key))), self.task,
                          config.eval_episodes, config.eval_seed, *(ref_scores if ref_scores else (None, None)))
        return evaluation_record(result.returns[None], ref_scores, result.lengths[None])

    def _seconds(self) -> float:
        return round(self.seconds_before + time.perf_counter() - self.started, 3)

    # ------------------------------------------------------------------ the checkpoint

    def host_state(self) -> dict:
        """What a checkpoint holds besides the arrays: counters, the rows not yet inserted, the episode in progress."""
        episode = None
        if self.loop.progress is not None:
            robot = self.robot
            episode = {"progress": dataclasses.asdict(self.loop.progress), "safety": self.safety.state(),
                       "robot": robot.snapshot()}
        return {"step": self.steps, "updates": self.updates, "episodes": self.episodes, "policy_calls": self.policy.calls,
                "records": self.records.state(), "rows": [[np.asarray(v).tolist() for v in row] for row in self.rows],
                "pending": self.pending, "episode": episode, "robot": self.config.robot, "seconds": self._seconds()}

    def checkpoint(self, host: dict) -> None:
        self.checkpointer.save(self.steps, jax.device_get(self.state), host)

    # ------------------------------------------------------------------ finishing

    def finish(self) -> FinetuneResult:
        """The learning curve, the export of a run that spent its budget, the result."""
        # lazy: 1.2 s more for `mbrl finetune --help` (matplotlib; measured)
        from mbrl.logging import METRICS_FILE, plot_learning_curve, read_metrics

        config = self.config
        records = read_metrics(self.run_dir / METRICS_FILE)
        plot_learning_curve(records, self.run_dir / "learning_curve.png", f"fine-tune on {config.robot}", x_key="step",
                            x_label="online env steps")
        export_dir = None
        if self.interrupted is None:
            export_dir = _export(self.source, self.state.agent.actor_params, self.run_dir, config, self.steps)
        return FinetuneResult(self.run_dir, records, self.steps, self.interrupted, export_dir,
                              time.perf_counter() - self.started)


def _export(source, actor_params, run_dir: Path, config: FinetuneConfig, steps: int) -> Path:
    from mbrl.export_run import run_policy_spec  # lazy: 2.4 s more for `mbrl finetune --help` (measured)

    metadata = {"algo": source.config.algo, "finetuned": {"steps": steps, "utd": config.utd, "robot": config.robot,
                "retain_offline_ratio": config.retain_offline_ratio, "scratch": config.scratch, "seed": config.seed},
                "run_dir": str(source.run_dir), "train_seed": source.seeds[config.seed_index]}
    params = jax.tree.map(np.asarray, actor_params)
    return export_policy(run_policy_spec(source, params, run_dir.name, metadata), run_dir / "export")


# The safety layer's limits that a finetune.json written before its `safety` section held at the top level.
_FLAT_SAFETY = ("max_delta", "max_stale_ticks", "max_obs_age")


def _read_config(run_dir: Path) -> FinetuneConfig:
    """`finetune.json` of `run_dir`, its values checked as a config file's are (`mbrl.config.override`)."""
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir}: not a fine-tuning run (no {CONFIG_FILE}); expected a directory written by `mbrl finetune`")
    path = run_dir / CONFIG_FILE
    data = read_json(path, "missing", ConfigError)
    try:
        if not isinstance(data, dict):
            raise ConfigError(f"expected a JSON object, found {type(data).__name__}")
        missing = [name for name in ("run", "robot") if name not in data]
        if missing:
            raise ConfigError(f"field {missing[0]!r} is missing")
        flat = {name: data.pop(name) for name in _FLAT_SAFETY if name in data}
        data["safety"] = {**flat, **data.pop("safety", {})}
        return override(FinetuneConfig(run=data["run"], robot=data["robot"]), data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: not a fine-tuning configuration ({exc})") from None
