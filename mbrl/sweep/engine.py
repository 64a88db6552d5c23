"""The sweep engine: Optuna asks, the one training program runs K trials as one population, Optuna is told.

A worker's loop:
1. fail the trials whose heartbeat went stale (a worker killed mid-trial); Optuna's retry callback puts
   their parameters back as a waiting trial, which the next `ask` hands out first;
2. stop when the study holds `--trials` completed trials; wait while the rest are running elsewhere
   (a worker that dies there leaves stale trials to retry);
3. ask up to K trials; a trial beyond the N-th non-failed one (two workers asked at once) is given back;
4. group the trials by what changes the compiled program (shapes, which terms exist, the schedule) and
   by world model (ensemble and fit settings: fitted once per dataset and setting, cached in the sweep
   directory); train each group as one population (`mbrl.population.train_population`, every trial with the
   same `--seeds`), beating the heartbeat of its trials meanwhile;
5. score every member (`mbrl.sweep.objective`) and tell each trial its objective. The offline estimate
   of every trial rolls its policy out in the world model, so a sweep fits one even for BC.

Ctrl-C stops after the running epoch: the trials in flight are marked failed and queued again, so
running the same command continues the study. Many machines share a study through its storage
(PostgreSQL); there is no RPC here.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import os
import random
import socket
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from mbrl import config as config_io, datasets
from mbrl.agents import registry
from mbrl.core import checks
from mbrl.core.errors import ConfigError
from mbrl.core.files import write_text_atomic
from mbrl.core.score import normalized_score
from mbrl.ope.fqe import FQEConfig
from mbrl.ope.holdout import fqe_values, split_holdout
from mbrl.ope.model_return import model_returns
from mbrl.sweep import objective as objectives
from mbrl.sweep.space import Space, nested
from mbrl.trainer import compile_key, trainer_of_data

SAMPLERS = ("tpe", "gp", "random")
MAX_RETRIES = 3  # a trial whose worker keeps dying is run at most this many more times
IDENTITY_ATTR = "mbrl"


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """What a user chooses of a sweep besides its space and base config.

    trials: completed trials the study should hold (a rerun continues to it).
    population: trials asked and trained at once, as one population.
    objective: sim: normalized score in MuJoCo; offline: the model's pessimistic return estimate; fqe: Fitted Q
        Evaluation's value (both need no simulator).
    sampler: the Optuna sampler: tpe, gp or random.
    sampler_seed: seed of the sampler (default: random; workers must differ).
    world_model: reuse this fitted world model in every trial (default: fit once per ensemble/fit setting, cached
        in SWEEP_DIR/models).
    objective_evals: sim objective: the mean over the last E evaluations.
    holdout: fraction of the dataset's episodes held out of training, for the critic's held-out TD error.
    offline_starts: offline objective: dataset start states per model member.
    offline_horizon: offline objective: imagined steps (default: the dataset's longest episode).
    fqe_steps: fqe objective: FQE's gradient steps per trial member.
    heartbeat: seconds between heartbeats; a trial silent for twice this is failed and run again.

    `mbrl sweep` generates its options from these fields (`mbrl.config.option_fields`), with the entries above as
    their help.
    """

    trials: int = 24
    population: int = 4
    objective: str = "sim"
    sampler: str = "tpe"
    sampler_seed: int | None = None
    world_model: Path | None = None
    objective_evals: int = 3
    holdout: float = 0.05
    offline_starts: int = 64
    offline_horizon: int | None = None
    fqe_steps: int = 20_000
    heartbeat: int = 60


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings(SweepOptions):
    """A worker's whole sweep: the user's options, and what the command resolved around them."""

    space: Space
    base: Any  # TrainConfig: the fixed part of every trial
    storage_url: str
    study_name: str
    sweep_dir: Path
    progress: bool = True

    def __post_init__(self):
        if self.objective not in objectives.OBJECTIVES:
            raise ConfigError(f"--objective: expected one of {', '.join(objectives.OBJECTIVES)}, found {self.objective!r}")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"--sampler: expected one of {', '.join(SAMPLERS)}, found {self.sampler!r}")
        checks.positive_ints(checks.FLAG, self, "trials", "population", "heartbeat", "objective_evals", "offline_starts",
                             "fqe_steps")
        checks.optional_positive_ints(checks.FLAG, self, "offline_horizon")
        if not 0.0 <= self.holdout < 0.5:
            raise ConfigError(f"--holdout: expected a fraction in [0, 0.5), found {self.holdout}")
        model_sections = config_io.model_sections(self.base.algo)
        if self.world_model is not None and any(d.name.split(".")[0] in model_sections for d in self.space.dimensions):
            raise ConfigError(f"--world-model fixes the world model, but the space {self.space.source} changes it "
                              f"({', '.join(d.name for d in self.space.dimensions if d.name.split('.')[0] in model_sections)})")


# ------------------------------------------------------------------------------------------------ storage


def storage_url(text: str | None, sweep_dir: Path) -> str:
    """The SQLAlchemy URL of `--storage` (default: a SQLite file in the sweep directory)."""
    import sqlalchemy  # lazy: 0.2-0.3 s more for `mbrl sweep --help` (measured; optuna loads it only for a storage)

    if text is None:
        return f"sqlite:///{(Path(sweep_dir) / 'study.db').absolute()}"
    try:
        url = sqlalchemy.engine.make_url(text)
    except sqlalchemy.exc.ArgumentError:
        raise ConfigError(f"--storage: {text!r} is not a database URL; expected sqlite:///FILE or "
                          "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE") from None
    backend = url.get_backend_name()
    if backend in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")  # psycopg 3, not SQLAlchemy's default psycopg2
    elif backend != "sqlite":
        raise ConfigError(f"--storage: unsupported database {backend!r}; expected sqlite:///FILE or postgresql://...")
    return url.render_as_string(hide_password=False)


def _shown(url: str) -> str:
    import sqlalchemy  # lazy: 0.2-0.3 s more for `mbrl sweep --help` (measured; optuna loads it only for a storage)

    return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)


def open_storage(url: str, heartbeat: int):
    """An Optuna RDB storage with heartbeats, and the retry of a heartbeat-stale trial's parameters."""
    import sqlalchemy  # lazy: 0.2-0.3 s more for `mbrl sweep --help` (measured; optuna loads it only for a storage)

    # Heartbeats and their retry are experimental in Optuna and documented for `optimize`; this engine asks
    # and tells itself and beats its trials' heartbeat in `Heartbeat`.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")

    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("postgresql"):
        kwargs["connect_args"] = {"connect_timeout": 10}
    else:
        kwargs["connect_args"] = {"timeout": 60}  # SQLite: wait for another worker's write lock
        path = sqlalchemy.engine.make_url(url).database
        if path and not Path(path).parent.is_dir():
            raise ConfigError(f"--storage: the folder of {path} does not exist")
    for attempt in range(6):
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs=kwargs, heartbeat_interval=heartbeat, grace_period=2 * heartbeat,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            # Workers opening a fresh database at once race to create Optuna's tables; the loser finds
            # them made on its next try.
            if attempt == 5:
                raise
            time.sleep(random.uniform(0.1, 1.0))
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.DatabaseError, sqlalchemy.exc.InterfaceError) as exc:
            reason = " ".join(str(exc.orig if getattr(exc, "orig", None) else exc).split())[:300]
            raise ConfigError(f"--storage: cannot reach {_shown(url)} ({reason})") from None
        except (ImportError, sqlalchemy.exc.NoSuchModuleError) as exc:
            extra = " (pip install 'offline-mbrl[postgres]')" if url.startswith("postgresql") else ""
            raise ConfigError(f"--storage: no database driver for {_shown(url)}{extra}: {exc}") from None


def identity(settings: Settings) -> dict[str, Any]:
    """What a study is for; a worker whose sweep differs is refused rather than mixed in."""
    base = config_io.to_dict(settings.base)
    base.pop("logging", None)  # where the output goes does not change the trials
    space = {d.name: json.loads(json.dumps(dataclasses.asdict(d))) for d in settings.space.dimensions}
    return {
        "algo": settings.base.algo,
        "dataset": settings.base.dataset,
        "objective": settings.objective,
        "space": space,
        "base": hashlib.sha1(json.dumps(base, sort_keys=True).encode()).hexdigest()[:16],
    }


def make_sampler(name: str, seed: int | None):
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        try:
            import torch  # noqa: F401  (lazy: an optional dependency, Optuna's GP sampler runs on PyTorch)
        except ImportError:
            raise ConfigError("--sampler gp: Optuna's GP sampler needs PyTorch (pip install torch); "
                              "use --sampler tpe or random without it") from None
        return optuna.samplers.GPSampler(seed=seed)
    # Constant liar: trials running in this or another worker count as bad guesses, so K trials asked
    # at once (and other workers' trials) spread out instead of piling on one point.
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


_DIFFERENCES = {
    "algo": "algorithm", "dataset": "dataset", "objective": "objective", "space": "search space",
    "base": "base config (the train options given with the sweep)",
}


def open_study(storage, name: str, wanted: dict[str, Any], sampler, url: str):
    """The study `name`, created if new; refused when it was created for another sweep."""
    def check(study_id: int, patience: float) -> None:
        found = storage.get_study_user_attrs(study_id).get(IDENTITY_ATTR)
        deadline = time.time() + patience
        while found is None and time.time() < deadline:  # another worker created it a moment ago
            time.sleep(0.5)
            found = storage.get_study_user_attrs(study_id).get(IDENTITY_ATTR)
        if found is None:
            raise ConfigError(f"--study {name}: {_shown(url)} holds a study of that name not created by mbrl sweep")
        for key, label in _DIFFERENCES.items():
            if found.get(key) != wanted[key]:
                shown = found.get(key) if key in ("algo", "dataset", "objective") else "another one"
                raise ConfigError(f"--study {name}: the study in {_shown(url)} was created for {label} {shown!r}, "
                                  f"not {wanted[key] if key in ('algo', 'dataset', 'objective') else 'this one'}; "
                                  "choose another --study or --storage")

    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        study_id = None
    if study_id is not None:
        check(study_id, patience=10.0)
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="maximize",
                                load_if_exists=True)
    if IDENTITY_ATTR in study.user_attrs:  # lost the race to create it: compare with the winner's
        check(study._study_id, patience=0.0)
    else:
        study.set_user_attr(IDENTITY_ATTR, wanted)
    return study


class Heartbeat:
    """Records the heartbeat of this worker's running trials every `interval` seconds, in a thread."""

    def __init__(self, storage, trial_ids: list[int], interval: int):
        self.storage, self.trial_ids, self.interval = storage, trial_ids, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        while True:
            for trial_id in self.trial_ids:
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception:  # a transient database error: the next beat tries again
                    pass
            if self._stop.wait(self.interval):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


# ------------------------------------------------------------------------------------------------ the loop


@dataclasses.dataclass
class Asked:
    trial: Any  # optuna.Trial
    config: Any  # TrainConfig


def trial_config(base, params: dict[str, Any]):
    return config_io.override(base, nested(params))


def group_key(config):
    """Trials with the same key run as one population: one compiled program and one world model."""
    return (compile_key(config), config.schedule, *model_settings(config).values())


def model_settings(config) -> dict:
    """The sections that define the algorithm's world model (the MLP ensemble's or RWM-U's), by name."""
    return {name: getattr(config, name) for name in config_io.model_sections(config.algo)}


def model_key(config) -> str:
    data = {"dataset": config.dataset, **{name: dataclasses.asdict(v) for name, v in model_settings(config).items()}}
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


class Sweep:
    """One worker on one study."""

    def __init__(self, settings: Settings, on_event: Callable[[str], None] | None = None, stop=None):
        """`stop`: the caller's `mbrl.core.signals.StopSignal` (Ctrl-C and SIGTERM stop after the running epoch)."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.settings = settings
        self.on_event = on_event or (lambda message: None)
        self.stop = stop
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._data = None
        train, _, task, _ = self.data()  # a bad dataset fails before anything is written to the study
        if settings.objective == "sim" and task is None:
            raise ConfigError(f"--objective sim: dataset {settings.base.dataset} has no simulator task to evaluate in; "
                              "use --objective offline")
        self.storage = open_storage(settings.storage_url, settings.heartbeat)
        sampler = make_sampler(settings.sampler, settings.sampler_seed)
        self.study = open_study(self.storage, settings.study_name, identity(settings), sampler, settings.storage_url)
        self.distributions = settings.space.distributions()
        self.started = time.time()
        self.done_here = 0
        self.interrupted = False

    # -------------------------------------------------------------- data and models

    def data(self):
        """(training dataset, held-out transitions, task, reference scores), loaded once."""
        if self._data is None:
            from mbrl.envs.tasks import find_task  # lazy: 1.4 s more for `mbrl sweep --help` (MuJoCo; measured)
            from mbrl.train import dataset_reference_scores  # lazy: 2.5 s more for `mbrl sweep --help` (measured)

            dataset = datasets.load(self.settings.base.dataset, task=self.settings.base.task)
            task = find_task(dataset.info.task)
            train, heldout = split_holdout(dataset, self.settings.holdout, seed=self.settings.base.seed)
            self._data = (train, heldout, task, dataset_reference_scores(dataset, task))
        return self._data

    def world_model(self, config):
        from mbrl.train import world_models_for  # lazy: 2.5 s more for `mbrl sweep --help` (measured)

        train, _, task, _ = self.data()
        if self.settings.world_model is not None:
            path = Path(self.settings.world_model).absolute()
            if not (path / "model.json").is_file():
                raise ConfigError(f"--world-model {path}: no model.json; expected a directory written by `mbrl model fit`")
        else:
            path = self.settings.sweep_dir / "models" / model_key(config)
            if not (path / "model.json").is_file():
                self.on_event(f"fitting the world model {path.name} (the model settings of this group)")
        return world_models_for(config, train, task, [path], progress=False)

    # -------------------------------------------------------------- study bookkeeping

    def counts(self) -> dict[str, int]:
        trials = self.study.get_trials(deepcopy=False)
        return {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}

    def _requeue(self, frozen, reason: str) -> None:
        system = {k: v for k, v in frozen.system_attrs.items() if k in ("failed_trial", "retry_history")}
        system.setdefault("failed_trial", frozen.number)
        self.study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.WAITING, params=frozen.params,
                                                       distributions=frozen.distributions,
                                                       user_attrs={"requeued": reason}, system_attrs=system))

    def _give_back(self, asked: Asked, reason: str) -> None:
        """Fail a trial this worker will not finish and queue its parameters again."""
        trial = asked.trial
        frozen = self.study._storage.get_trial(trial._trial_id)
        if frozen.state != optuna.trial.TrialState.RUNNING:  # told already
            return
        trial.set_user_attr("stopped", reason)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self._requeue(frozen, reason)

    def _surplus(self, asked: list[Asked]) -> list[Asked]:
        """Drop (fail, and queue again if their parameters were a retry) the asked trials past the N-th
        non-failed trial of the study: two workers asked at the same moment."""
        trials = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        rank = {t.number: i for i, t in enumerate(sorted(trials, key=lambda t: t.number))}
        kept = []
        for a in asked:
            if rank.get(a.trial.number, 0) < self.settings.trials:
                kept.append(a)
                continue
            frozen = self.study._storage.get_trial(a.trial._trial_id)
            a.trial.set_user_attr("stopped", "surplus")
            self.study.tell(a.trial, state=optuna.trial.TrialState.FAIL)
            if "failed_trial" in frozen.system_attrs or frozen.user_attrs.get("requeued"):
                self._requeue(frozen, "surplus")
        return kept

    def ask(self) -> list[Asked]:
        """Up to K trials this worker should run now; [] when the study is done or the rest runs elsewhere."""
        optuna.storages.fail_stale_trials(self.study)
        counts = self.counts()
        free = self.settings.trials - counts["complete"] - counts["running"]
        if free <= 0:
            return []
        asked = []
        for _ in range(min(self.settings.population, free)):
            trial = self.study.ask(self.distributions)
            # A RUNNING trial without a heartbeat never goes stale: beat once now, so a worker killed before
            # training starts leaves a trial that others retry.
            self.storage.record_heartbeat(trial._trial_id)
            trial.set_user_attr("worker", self.worker)
            try:
                config = trial_config(self.settings.base, trial.params)
            except ConfigError as exc:  # a combination of values no config accepts: a failed trial
                trial.set_user_attr("error", str(exc))
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            asked.append(Asked(trial, config))
        return self._surplus(asked)

    # -------------------------------------------------------------- running

    def _stopping(self) -> bool:
        if self.stop is not None and self.stop.signum is not None:
            self.interrupted = True
        return self.interrupted

    def run(self) -> dict[str, int]:
        """Work until the study holds `trials` completed trials (or Ctrl-C); returns the final counts."""
        while not self._stopping():
            counts = self.counts()
            if counts["complete"] >= self.settings.trials:
                break
            asked = self.ask()
            if not asked:
                if self.counts()["complete"] >= self.settings.trials:
                    break
                self.on_event("waiting for trials running in other workers")
                time.sleep(min(self.settings.heartbeat, 5))
                continue
            self.run_batch(asked)
        return self.counts()

    def run_batch(self, asked: list[Asked]) -> None:
        groups: dict[Any, list[Asked]] = {}
        for a in asked:
            groups.setdefault(group_key(a.config), []).append(a)
        try:
            with Heartbeat(self.storage, [a.trial._trial_id for a in asked], self.settings.heartbeat):
                for members in groups.values():
                    if self._stopping():
                        break
                    self.run_group(members)
        except KeyboardInterrupt:  # a second Ctrl-C
            self.interrupted = True
        finally:
            for a in asked:  # those not told: back to the queue, for the next run or another worker
                self._give_back(a, "interrupted" if self._stopping() else "error")

    def run_group(self, members: list[Asked]) -> None:
        from mbrl.population import train_population  # lazy: 3.0 s more for `mbrl sweep --help` (measured)

        settings = self.settings
        base = members[0].config
        seeds = base.seed_list
        train, heldout, task, ref = self.data()
        model = self.world_model(base)
        entry = registry.entry(base.algo)
        hypers = [entry.hyper_values(a.config) for a in members for _ in seeds]
        member_seeds = seeds * len(members)
        numbers = ", ".join(str(a.trial.number) for a in members)
        self.on_event(f"training trials {numbers} as one population of {len(hypers)} members")
        start = time.perf_counter()
        result = train_population(base, hypers, member_seeds, dataset=train, world_model=model, stop=self.stop)
        if self._stopping():
            return
        seconds = time.perf_counter() - start
        trainer = trainer_of_data(base, train)

        sim = objectives.sim_scores(result.records, settings.objective_evals)
        trends = objectives.q_trends(result.records)
        td = objectives.heldout_td_errors(trainer, result.state, heldout, seed=base.seed)
        horizon = settings.offline_horizon or int(train.episode_lengths().max())
        returns = model_returns(trainer, result.state, model, train, starts=settings.offline_starts,
                                           horizon=horizon, seed=base.seed)  # (members, elites)

        def scored(value):
            return float(value) if ref is None else float(normalized_score(value, *ref))

        fqe = None
        if settings.objective == "fqe":
            config = FQEConfig(steps=settings.fqe_steps, min_steps=min(FQEConfig.min_steps, settings.fqe_steps // 2),
                               seed=base.seed)
            fqe = np.asarray(fqe_values(trainer, result.state, train, heldout, config))  # (members, 2)

        estimate = [scored(r.mean()) for r in returns]
        spread = [scored(r.mean() + r.std()) - scored(r.mean()) for r in returns]
        lcb = [scored(r.mean() - r.std()) for r in returns]
        n = len(seeds)
        for i, a in enumerate(members):
            rows = slice(i * n, (i + 1) * n)

            def mean(values):
                return None if values is None else float(np.mean(values[rows]))

            attrs = {"sim_score": mean(sim), "offline_estimate": mean(estimate), "offline_std": mean(spread),
                     "offline_objective": mean(lcb), "fqe_estimate": None if fqe is None else mean(fqe[:, 0]),
                     "fqe_objective": None if fqe is None else mean(fqe[:, 1]), "q_trend": mean(trends),
                     "heldout_td": mean(td),
                     "wall_seconds": round(seconds, 1), "population": len(members), "seeds": seeds}
            for name, value in attrs.items():
                a.trial.set_user_attr(name, value)
            value = {"sim": attrs["sim_score"], "offline": attrs["offline_objective"],
                     "fqe": attrs["fqe_objective"]}[settings.objective]
            if value is None:
                raise ConfigError("--objective sim: the dataset has no simulator task to evaluate in; use --objective offline")
            self.study.tell(a.trial, value if np.isfinite(value) else float("nan"))
            self.done_here += 1
        self.on_event(f"trials {numbers} done in {seconds:.0f} s")


# ------------------------------------------------------------------------------------------------ outputs


COLUMNS = ("sim_score", "offline_objective", "offline_estimate", "offline_std", "fqe_objective", "fqe_estimate", "q_trend",
           "heldout_td", "wall_seconds", "population", "worker")


def trial_rows(study, space: Space) -> list[dict[str, Any]]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {"number": t.number, "state": t.state.name, "value": t.value}
        row.update({f"param.{name}": t.params.get(name) for name in space.names()})
        row.update({name: t.user_attrs.get(name) for name in COLUMNS})
        row["retry_of"] = t.system_attrs.get("failed_trial")
        row["note"] = t.user_attrs.get("stopped") or t.user_attrs.get("error")
        rows.append(row)
    return rows


def write_outputs(settings: Settings, study, plots: bool = False) -> dict[str, Any]:
    """trials.csv, best/config.json, summary.json (and, with `plots`, the PNGs) in the sweep directory."""
    out = settings.sweep_dir
    rows = trial_rows(study, settings.space)
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    write_text_atomic(out / "trials.csv", buffer.getvalue())
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    summary: dict[str, Any] = {"study": settings.study_name, "complete": len(complete), "objective": settings.objective}
    both = [t for t in complete if t.user_attrs.get("sim_score") is not None
            and t.user_attrs.get("offline_objective") is not None]
    summary["spearman_offline_vs_sim"] = objectives.spearman([t.user_attrs["offline_objective"] for t in both],
                                                             [t.user_attrs["sim_score"] for t in both])
    summary["trials_with_both"] = len(both)
    with_fqe = [t for t in complete if t.user_attrs.get("sim_score") is not None
                and t.user_attrs.get("fqe_objective") is not None]
    if with_fqe:
        summary["spearman_fqe_vs_sim"] = objectives.spearman([t.user_attrs["fqe_objective"] for t in with_fqe],
                                                             [t.user_attrs["sim_score"] for t in with_fqe])
    if complete:
        best = max(complete, key=lambda t: t.value)
        config = trial_config(settings.base, best.params)
        (out / "best").mkdir(parents=True, exist_ok=True)
        config_io.save(config, out / "best" / "config.json")
        summary["best"] = {"number": best.number, "value": best.value, "params": best.params,
                           **{k: best.user_attrs.get(k) for k in ("sim_score", "offline_objective", "fqe_objective")}}
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    if plots and len(complete) >= 2:
        write_plots(study, out)
    return summary


def write_plots(study, out: Path) -> list[str]:
    """Optuna's optimisation history, parameter importances and parallel coordinates, as PNGs."""
    # lazy: matplotlib and Optuna's plots add 0.5-0.6 s to `mbrl sweep --help` (measured)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    written = []
    for name, plot in (("history", ovm.plot_optimization_history), ("importances", ovm.plot_param_importances),
                       ("parallel_coordinates", ovm.plot_parallel_coordinate)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                axes = plot(study)
            except (ValueError, RuntimeError, ZeroDivisionError):  # e.g. importances of a one-valued space
                continue
        figure = (axes.flat[0] if hasattr(axes, "flat") else axes).get_figure()
        figure.set_size_inches(10, 6)
        figure.tight_layout()
        tmp = out / f".{name}.tmp.png"
        figure.savefig(tmp, dpi=100)
        tmp.replace(out / f"{name}.png")
        plt.close(figure)
        written.append(f"{name}.png")
    return written
