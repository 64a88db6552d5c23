"""Workers of `mbrl sweep` sharing one study in a real PostgreSQL server.

Each worker is a real `mbrl sweep` process (`python -m mbrl.cli sweep`) on the same `--storage
postgresql://...` and `--study`: two at once complete exactly `--trials` trials between them, and a worker
killed with SIGKILL mid-trial leaves a trial whose heartbeat goes stale; the next worker fails it and runs
its parameters again (Optuna's RetryHeartbeatStaleTrialCallback).

The server is started from the PostgreSQL binaries on PATH (initdb, pg_ctl, postgres), as user `nobody`
when the tests run as root (PostgreSQL refuses root); the tests are skipped without them. One small world
model is fitted per module and passed as `--world-model`; the workers share JAX's compile cache
(MBRL_CACHE_DIR), so the second test reuses the first one's compiled program.

Two races have tests of their own at the end: workers opening a fresh database at the same moment, and a trial
asked but killed before its first heartbeat.
"""

from __future__ import annotations

import functools
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from mbrl import config as config_io, datasets
from mbrl.core.errors import ConfigError
from mbrl.envs.tasks import TASKS
from mbrl.sweep import engine, space as space_io
from mbrl.world_models.fit import fit_world_model

from test_sweep import SPACE, TINY as TINY_ARGS  # the base of every trial: tiny sizes, one compiled program

pytestmark = pytest.mark.slow

POPULATION = 2
HOST = socket.gethostname()


# ------------------------------------------------------------------------------------------------ PostgreSQL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    """A throw-away PostgreSQL server on 127.0.0.1 holding an empty database `sweeps`; yields
    `postgresql://USER@127.0.0.1:PORT/sweeps`."""
    missing = [name for name in ("initdb", "pg_ctl", "postgres") if shutil.which(name) is None]
    if missing:
        pytest.skip(f"PostgreSQL server binaries not on PATH: {', '.join(missing)}")
    root_user = os.geteuid() == 0
    if root_user and shutil.which("runuser") is None:
        pytest.skip("PostgreSQL refuses to run as root, and runuser (to run it as nobody) is not on PATH")
    user = "nobody" if root_user else getpass.getuser()
    prefix = ["runuser", "-u", user, "--"] if root_user else []
    # Not pytest's tmp dir (0700, the test's user's): a folder `user` can reach and own, with a short socket path.
    root = Path(tempfile.mkdtemp(prefix="mbrl-pg-", dir="/tmp" if root_user and os.path.isdir("/tmp") else None))
    if root_user:
        shutil.chown(root, user)
    data, port = root / "data", _free_port()

    def pg(*args, **kwargs):
        return subprocess.run([*prefix, *args], cwd=root, capture_output=True, text=True, timeout=60, **kwargs)

    started, reader = False, None
    try:
        done = pg("initdb", "-D", str(data), "-A", "trust", "-U", user, "-E", "UTF8", "--no-sync")
        assert done.returncode == 0, f"initdb failed:\n{done.stdout}\n{done.stderr}"
        done = pg("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "30",
                  "-o", f"-p {port} -k {root} -h 127.0.0.1 -c fsync=off", "start")
        started = done.returncode == 0
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        assert started, f"pg_ctl start failed:\n{done.stdout}\n{done.stderr}\n{log}"
        import psycopg  # optional: the postgres extra

        with psycopg.connect(f"postgresql://{user}@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE sweeps")
        # Optuna's tables, made once here: workers that make them at the same moment collide
        # (test_workers_opening_a_fresh_database_at_once_all_get_the_storage).
        reader = _storage(f"postgresql://{user}@127.0.0.1:{port}/sweeps")
        yield f"postgresql://{user}@127.0.0.1:{port}/sweeps"
    finally:
        if reader is not None:
            reader.engine.dispose()
            _storage.cache_clear()
        if started:
            pg("pg_ctl", "-D", str(data), "stop", "-m", "immediate")
        shutil.rmtree(root, ignore_errors=True)


def _driver_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


@functools.cache
def _storage(url: str):
    """The test's own reader of the storage (one, not one per poll: the server has 100 connections)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.storages.RDBStorage(_driver_url(url))


def _trials(url: str, study: str):
    """The study's trials as Optuna reads them back ([] before a worker created it)."""
    try:
        return optuna.load_study(study_name=study, storage=_storage(url)).get_trials(deepcopy=False)
    except KeyError:
        return []


def _heartbeats(url: str, trial_ids: list[int]) -> int:
    """How many of these trials have a heartbeat recorded (Optuna's table; a trial without one never goes stale)."""
    with _storage(url).engine.connect() as conn:
        return conn.execute(sqlalchemy.text("SELECT count(*) FROM trial_heartbeats WHERE trial_id = ANY(:ids)"),
                            {"ids": list(trial_ids)}).scalar_one()


def _identity_written(url: str, study: str) -> bool:
    storage = _storage(url)
    try:
        return "mbrl" in storage.get_study_user_attrs(storage.get_study_id_from_name(study))
    except KeyError:
        return False


# ------------------------------------------------------------------------------------------------ workers


@pytest.fixture(scope="module")
def world_model_dir(hopper_tiny_path, tmp_path_factory):
    """One world model of TINY_ARGS' ensemble and fit settings, passed to every worker as --world-model."""
    config = config_io.build("mopo", str(hopper_tiny_path), "quick", {
        "ensemble": {"num_members": 3, "num_elites": 2, "hidden_dims": [32, 32]}, "fit": {"max_epochs": 2}})
    result = fit_world_model(datasets.load(hopper_tiny_path), config=config.ensemble, fit_config=config.fit,
                             termination_fn=TASKS["hopper"].termination_fn, progress=False)
    return result.model.save(tmp_path_factory.mktemp("sweep-model") / "world_model")


@pytest.fixture(scope="module")
def sweep(hopper_tiny_path, world_model_dir, postgres_url, tmp_path_factory):
    """`sweep(study, trials, seed, heartbeat)` starts one `mbrl sweep` worker process on the shared study."""
    root = tmp_path_factory.mktemp("sweep-workers")
    space = root / "space.toml"
    space.write_text(SPACE)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               MBRL_CACHE_DIR=str(tmp_path_factory.getbasetemp() / "jax-cache"),  # shared by every worker
               MBRL_DATA_DIR=str(tmp_path_factory.getbasetemp() / "mbrl-datasets"))
    procs = []

    def start(study, trials, seed, heartbeat=60):
        log = root / f"{study}-worker{len(procs)}.log"
        cmd = [sys.executable, "-m", "mbrl.cli", "sweep", "--algo", "mopo", "--dataset", str(hopper_tiny_path),
               "--space", str(space), "--trials", str(trials), "--population", str(POPULATION),
               "--storage", postgres_url, "--study", study, "--sweep-dir", str(root / study / f"w{len(procs)}"),
               "--world-model", str(world_model_dir), "--sampler-seed", str(seed), "--heartbeat", str(heartbeat),
               *TINY_ARGS]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
        proc.log = log
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _logs(*procs) -> str:
    return "\n".join(f"--- worker pid {p.pid} (exit {p.poll()}):\n{p.log.read_text()[-4000:]}" for p in procs)


def _wait_for(condition, timeout: float, what: str, procs):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if any(p.poll() is not None for p in procs):
            pytest.fail(f"a worker exited while waiting for {what}\n{_logs(*procs)}")
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{_logs(*procs)}")


def _finish(procs, timeout: float):
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"workers still running after {timeout:.0f} s\n{_logs(*procs)}")
    assert [p.returncode for p in procs] == [0] * len(procs), _logs(*procs)


def _state(t) -> str:
    return t.state.name


# ------------------------------------------------------------------------------------------------ tests


def test_two_workers_complete_exactly_the_trials_between_them(sweep, postgres_url):
    trials = 4
    first = sweep("shared", trials, seed=0)
    # The second starts once the first has created the study (tables, study and its identity attribute):
    # both then ask while the first is still compiling, so each gets a population of its own.
    _wait_for(lambda: _identity_written(postgres_url, "shared"), 60, "the study to be created", [first])
    second = sweep("shared", trials, seed=1)
    _finish([first, second], timeout=180)

    found = _trials(postgres_url, "shared")
    complete = [t for t in found if _state(t) == "COMPLETE"]
    assert len(complete) == trials, [(t.number, _state(t), t.user_attrs) for t in found]
    assert len({t.number for t in found}) == len(found)
    assert all(t.value is not None and t.user_attrs.get("sim_score") is not None for t in complete)
    # No trial ran twice: every completed trial has its own parameters.
    assert len({tuple(sorted(t.params.items())) for t in complete}) == trials
    workers = {t.user_attrs["worker"] for t in complete}
    assert workers == {f"{HOST}:{first.pid}", f"{HOST}:{second.pid}"}, _logs(first, second)


def test_a_killed_workers_trials_are_run_again_by_the_next_worker(sweep, postgres_url):
    trials = 2
    doomed = sweep("killed", trials, seed=0, heartbeat=1)
    owner = f"{HOST}:{doomed.pid}"

    def training():  # its population asked, the training started and the heartbeat of every trial recorded
        running = [t for t in _trials(postgres_url, "killed")
                   if _state(t) == "RUNNING" and t.user_attrs.get("worker") == owner]
        return (len(running) == POPULATION and "training trials" in doomed.log.read_text()
                and _heartbeats(postgres_url, [t._trial_id for t in running]) == POPULATION)

    _wait_for(training, 90, "the first worker to train its trials", [doomed])
    os.kill(doomed.pid, signal.SIGKILL)  # mid-training: with a warm compile cache it trains for ~4 s
    doomed.wait()
    killed = {t.number: t for t in _trials(postgres_url, "killed") if t.user_attrs.get("worker") == owner}
    assert len(killed) == POPULATION and all(_state(t) == "RUNNING" for t in killed.values())

    rescuer = sweep("killed", trials, seed=1, heartbeat=1)  # grace: 2 s of silence
    _finish([rescuer], timeout=120)

    found = {t.number: t for t in _trials(postgres_url, "killed")}
    complete = [t for t in found.values() if _state(t) == "COMPLETE"]
    assert len(complete) == trials, [(t.number, _state(t), t.system_attrs) for t in found.values()]
    assert all(t.user_attrs["worker"] == f"{HOST}:{rescuer.pid}" for t in complete)
    for number, original in killed.items():
        assert _state(found[number]) == "FAIL"
        retries = [t for t in complete if t.system_attrs.get("failed_trial") == number]
        assert len(retries) == 1, (number, [(t.number, t.system_attrs) for t in complete])
        assert retries[0].params == original.params


def test_workers_opening_a_fresh_database_at_once_all_get_the_storage(postgres_url):
    import psycopg  # optional: the postgres extra

    admin = sqlalchemy.engine.make_url(postgres_url).set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE fresh")
    url = engine.storage_url(postgres_url.rsplit("/", 1)[0] + "/fresh", Path("."))
    workers = 3
    barrier, errors, storages = threading.Barrier(workers), [], []

    def open_it():
        barrier.wait()
        try:
            storages.append(engine.open_storage(url, 60))
        except ConfigError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=open_it) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for storage in storages:
        storage.engine.dispose()
    assert errors == []


def test_a_trial_asked_and_never_trained_goes_stale(postgres_url, hopper_tiny_path, tmp_path):
    (tmp_path / "space.toml").write_text(SPACE)
    base = config_io.build("mopo", str(hopper_tiny_path), "quick", {"logging": {"progress": False}})
    settings = engine.Settings(
        space=space_io.load(tmp_path / "space.toml", base), base=base, trials=1, population=1, objective="sim",
        sampler="random", storage_url=engine.storage_url(postgres_url, tmp_path), study_name="unbeaten",
        sweep_dir=tmp_path, heartbeat=1)
    [asked] = engine.Sweep(settings).ask()  # this worker dies here, before its first heartbeat
    time.sleep(2 * settings.heartbeat + 1.5)
    again = engine.Sweep(settings).ask()  # the next worker
    assert [a.trial.number for a in again] and again[0].trial.params == asked.trial.params
    assert _state(_trials(postgres_url, "unbeaten")[asked.trial.number]) == "FAIL"
