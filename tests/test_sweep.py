"""`mbrl sweep`: spaces, storages, the study's identity, objectives, continuing a study, Ctrl-C.

Sweeps run in-process through `mbrl.cli.main` on conftest's tiny Hopper file (one compiled program shared by
the tests), with a SQLite study in a temp folder. PostgreSQL and several workers: tests/test_sweep_workers.py.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest

from mbrl import config as config_io
from mbrl.agents import registry
from mbrl.cli import main
from mbrl.ope.holdout import split_holdout
from mbrl.core.errors import ConfigError
from mbrl.sweep import objective
from mbrl.sweep import space as space_io

TINY = [
    "--sac.num-critics", "2", "--sac.hidden-sizes", "32", "32", "--sac.batch-size", "32",
    "--imagination.rollouts-per-epoch", "64", "--imagination.retain-epochs", "2", "--imagination.horizon", "3",
    "--ensemble.num-members", "3", "--ensemble.num-elites", "2", "--ensemble.hidden-dims", "32", "32",
    "--fit.max-epochs", "2", "--schedule.epochs", "2", "--schedule.updates-per-epoch", "25",
    "--schedule.eval-every", "1", "--schedule.eval-episodes", "2", "--logging.progress", "False",
]
SPACE = '"mopo.penalty_coef" = {low = 0.1, high = 10.0, log = true}\n"sac.actor_bc_coef" = {low = 0.5, high = 5.0, log = true}\n'


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def sweep_args(dataset, space, sweep_dir, *extra, algo="mopo"):
    return ["sweep", "--algo", algo, "--dataset", str(dataset), "--space", str(space), "--sweep-dir", str(sweep_dir),
            "--sampler-seed", "0", *TINY, *extra]


def study_of(sweep_dir: Path, name: str):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir / 'study.db'}")


def rows(sweep_dir: Path) -> list[dict]:
    with open(sweep_dir / "trials.csv") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("text, expected", [
    ('"sac.nope" = {low = 1, high = 2}\n', "sac.nope: unknown option"),
    ('"bc.learning_rate" = {low = 0.001, high = 0.01}\n', "not read by algorithm mopo"),
    ('"imagination.real_ratio" = {low = 0.5, high = 1.5}\n', "outside the option's valid values"),
    ('"mopo.penalty_coef" = {low = 0.0, high = 1.0, log = true}\n', "a log range needs low > 0"),
    ('"mopo.penalty_coef" = {low = 2.0, high = 1.0}\n', "expected low < high"),
    ('"sac.num_critics" = {low = 2.5, high = 4}\n', "must be an integer"),
    ('"seed" = {choices = [0, 1]}\n', "fixed for a whole sweep"),
    ('"mopo.penalty_coef" = {low = 1.0, hgh = 2.0}\n', "expected low and high"),
    ('"mopo.penalty_coef" = {low = 1.0\n', "not a valid TOML space"),
    ('', "the space is empty"),
])
def test_a_bad_space_gets_one_line_and_exit_2_and_writes_no_study(text, expected, hopper_tiny_path, tmp_path, capsys):
    space = write(tmp_path / "space.toml", text)
    code = main(sweep_args(hopper_tiny_path, space, tmp_path / "sweep"))
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and expected in err and "space.toml" in err
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("storage, expected", [
    ("nosuchdb://x/y", "unsupported database"),
    ("not a url", "not a database URL"),
    ("postgresql://nobody@127.0.0.1:1/sweeps", "cannot reach postgresql+psycopg://nobody@127.0.0.1:1/sweeps"),
])
def test_a_bad_or_unreachable_storage_gets_one_line_and_exit_2(storage, expected, hopper_tiny_path, tmp_path, capsys):
    space = write(tmp_path / "space.toml", SPACE)
    code = main(sweep_args(hopper_tiny_path, space, tmp_path / "sweep", "--storage", storage))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and expected in err, err


def test_every_new_algorithm_ships_a_space_that_loads_against_its_presets():

    names = space_io.shipped_names()
    assert set(names) >= {"bc", "mopo", "ravl", "edac", "td3-bc", "cql", "iql", "combo", "mobile"}
    for name in names:
        base = config_io.build(name, "hopper-medium")
        space = space_io.load(name, base)
        assert space.names() == list(registry.entry(name).space)
        # Every end of every dimension is a value the algorithm's config takes, and takes as given.
        for dim in space.dimensions:
            section, _, field = dim.name.partition(".")
            for value in dim.values_to_check():
                applied = getattr(getattr(config_io.override(base, {section: {field: value}}), section), field)
                assert applied == (tuple(value) if isinstance(value, list) else value), (dim.name, value, applied)


def test_an_unknown_space_name_lists_the_shipped_ones():

    with pytest.raises(ConfigError, match=r"nosuch: no such space file \(shipped spaces: ravl, mopo, bc, .*mobile\)"):
        space_io.load("nosuch", config_io.build("bc", "hopper-medium"))


# ------------------------------------------------------------------------------------------------ a sweep


@pytest.fixture(scope="module")
def first_sweep(hopper_tiny_path, tmp_path_factory):
    """2 trials, asked together, on one SQLite study (the world model fitted once, in the sweep's cache)."""
    root = tmp_path_factory.mktemp("sweep")
    space = write(root / "space.toml", SPACE)
    sweep_dir = root / "out"
    args = sweep_args(hopper_tiny_path, space, sweep_dir, "--trials", "2", "--population", "2")
    assert main(args) == 0
    return args, sweep_dir


def test_a_sweep_completes_its_trials_and_writes_its_outputs(first_sweep):
    args, sweep_dir = first_sweep
    table = rows(sweep_dir)
    assert [r["state"] for r in table] == ["COMPLETE"] * 2
    for r in table:
        assert float(r["value"]) == float(r["sim_score"])  # the sim objective
        assert np.isfinite(float(r["offline_objective"])) and float(r["offline_std"]) >= 0
        assert np.isfinite(float(r["heldout_td"])) and np.isfinite(float(r["q_trend"]))
    assert {r["population"] for r in table} == {"2"}  # one population
    assert len(list((sweep_dir / "models").iterdir())) == 1  # one fit, reused
    summary = json.loads((sweep_dir / "summary.json").read_text())
    best = max(table, key=lambda r: float(r["value"]))
    assert summary["best"]["number"] == int(best["number"])
    config = config_io.load(sweep_dir / "best" / "config.json")  # what `mbrl train --config` reloads
    assert config.mopo.penalty_coef == pytest.approx(float(best["param.mopo.penalty_coef"]))
    assert config.sac.actor_bc_coef == pytest.approx(float(best["param.sac.actor_bc_coef"]))
    assert config.schedule.epochs == 2 and config.algo == "mopo"
    for png in ("history.png", "parallel_coordinates.png"):
        assert (sweep_dir / png).stat().st_size > 1000


def test_the_same_command_continues_the_study(first_sweep):
    args, sweep_dir = first_sweep
    more = list(args)
    more[more.index("--trials") + 1] = "4"
    assert main(more) == 0
    assert len(list((sweep_dir / "models").iterdir())) == 1  # the cached fit, not a second one
    study = study_of(sweep_dir, "mopo-hopper-tiny")
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers)) == 4
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)


def test_a_study_of_another_algorithm_is_refused_and_left_untouched(first_sweep, tmp_path, capsys):
    args, sweep_dir = first_sweep
    before = len(study_of(sweep_dir, "mopo-hopper-tiny").trials)
    space = write(tmp_path / "ravl.toml", '"sac.eta" = {low = 0.5, high = 2.0}\n')
    other = [a for a in args if a not in ("--mopo.penalty-coef",)]
    other[other.index("--algo") + 1] = "ravl"
    other[other.index("--space") + 1] = str(space)
    code = main([*other, "--study", "mopo-hopper-tiny"])
    err = capsys.readouterr().err
    assert code == 2 and "created for algorithm 'mopo'" in err
    assert len(study_of(sweep_dir, "mopo-hopper-tiny").trials) == before


# ------------------------------------------------------------------------------------------------ offline objective


def test_the_offline_objective_needs_no_simulator(robot_only_dataset, tmp_path, capsys):
    space = write(tmp_path / "space.toml", SPACE)
    sim = main(sweep_args(robot_only_dataset, space, tmp_path / "sim"))
    err = capsys.readouterr().err
    assert sim == 2 and "no simulator task" in err and not (tmp_path / "sim" / "study.db").exists()
    assert main(sweep_args(robot_only_dataset, space, tmp_path / "offline", "--objective", "offline", "--trials", "2",
                           "--population", "2")) == 0
    table = rows(tmp_path / "offline")
    assert len(table) == 2 and all(r["sim_score"] == "" for r in table)
    # Raw returns (no reference scores): the pessimistic estimate is below the mean return over members.
    assert all(float(r["value"]) == float(r["offline_objective"]) < float(r["offline_estimate"]) for r in table)


def test_the_fqe_objective_scores_each_trial_by_its_fqe_value(robot_only_dataset, tmp_path):
    space = write(tmp_path / "space.toml", SPACE)
    assert main(sweep_args(robot_only_dataset, space, tmp_path / "fqe", "--objective", "fqe", "--trials", "2",
                           "--population", "2", "--fqe-steps", "100", "--holdout", "0.2")) == 0
    table = rows(tmp_path / "fqe")
    assert len(table) == 2 and all(r["sim_score"] == "" for r in table)
    # The objective is the low end of FQE's interval: below its estimate.
    assert all(float(r["value"]) == float(r["fqe_objective"]) < float(r["fqe_estimate"]) for r in table)
    assert table[0]["fqe_estimate"] != table[1]["fqe_estimate"]  # two policies, two values


# ------------------------------------------------------------------------------------------------ Ctrl-C


def test_ctrl_c_fails_and_requeues_the_trials_in_flight_and_a_rerun_finishes_them(hopper_tiny_path, tmp_path):
    space = write(tmp_path / "space.toml", SPACE)
    sweep_dir = tmp_path / "sweep"
    args = sweep_args(hopper_tiny_path, space, sweep_dir, "--trials", "2", "--population", "2",
                      "--schedule.eval-every", "40", "--schedule.epochs", "80")  # long enough to be interrupted
    worker = subprocess.Popen([sys.executable, "-m", "mbrl.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in worker.stdout:
        if "training trials" in line:
            break
    # Soon: with the program already in the compile cache (the tests before this one), training takes seconds.
    time.sleep(0.5)
    worker.send_signal(signal.SIGINT)
    out, _ = worker.communicate(timeout=300)
    assert worker.returncode == 130 and "done in" not in out, out
    study = study_of(sweep_dir, "mopo-hopper-tiny")
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert len(failed) == 2 and all(t.user_attrs["stopped"] == "interrupted" for t in failed)
    assert sorted(t.params["mopo.penalty_coef"] for t in waiting) == sorted(t.params["mopo.penalty_coef"] for t in failed)

    assert main([*args[:-2], "--schedule.epochs", "2"]) == 2  # another base config: refused, not mixed in
    assert main(args) == 0
    study = study_of(sweep_dir, "mopo-hopper-tiny")
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 2 and not [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert sorted(t.params["mopo.penalty_coef"] for t in complete) == sorted(t.params["mopo.penalty_coef"] for t in failed)


# ------------------------------------------------------------------------------------------------ pieces


def test_spearman_is_the_rank_correlation():
    assert objective.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert objective.spearman([1, 2, 3, 4], [4, 1, 0, -5]) == pytest.approx(-1.0)
    assert objective.spearman([1, 2, 3, 4, 5], [1, 4, 9, 16, 25.0]) == pytest.approx(1.0)  # monotone, not linear
    # x ranks 1..4, y ranks 1.5, 1.5, 3, 4 (a tie): Pearson of the ranks.
    assert objective.spearman([1, 2, 3, 4], [5, 5, 6, 7]) == pytest.approx(np.corrcoef([1, 2, 3, 4], [1.5, 1.5, 3, 4])[0, 1])
    assert objective.spearman([1, 2], [1, 2]) is None


def test_the_holdout_takes_whole_episodes(hopper_tiny_path):
    from mbrl import datasets

    dataset = datasets.load(hopper_tiny_path)
    train, heldout = split_holdout(dataset, 0.25, seed=0)
    lengths = dataset.episode_lengths()
    assert len(train) + len(heldout) == len(dataset)
    assert train.num_episodes == dataset.num_episodes - round(0.25 * dataset.num_episodes)
    kept = {tuple(train.transitions.obs[s]) for s in train.episode_starts}
    firsts = [tuple(dataset.transitions.obs[s]) for s in dataset.episode_starts]
    assert kept <= set(firsts) and sum(lengths[[f in kept for f in firsts]]) == len(train)


def test_sim_score_is_the_mean_of_the_last_evaluations_and_the_q_trend_a_slope():
    records = [{"epoch": e, "updates": 1000 * e, "train": {"q_mean": [2.0 * e, 5.0]},
                "eval": {"normalized_score": [float(e), 10.0 * e]} if e % 2 == 0 else None} for e in range(1, 9)]
    assert objective.sim_scores(records, 3) == pytest.approx([6.0, 60.0])  # evals at 4, 6, 8
    assert objective.q_trends(records) == pytest.approx([2.0, 0.0])  # per 1,000 updates


def test_the_heldout_td_error_is_the_critics_td_error_alone(hopper_tiny_path):
    """Two RAVL members with the same seed and different EDAC weights have the same critics at init: their
    held-out TD errors must agree: the diversity term is not a TD error."""
    from mbrl import datasets
    from mbrl.population import member_config
    from mbrl.trainer import hypers_of, trainer_for

    dataset = datasets.load(hopper_tiny_path)
    config = config_io.build("ravl", str(hopper_tiny_path), "quick",
                             {"sac": {"num_critics": 3, "hidden_sizes": [16, 16], "batch_size": 16}})
    trainer = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim)
    members = [member_config(config, {"sac": {"eta": eta}}) for eta in (1.0, 50.0)]
    state = trainer.initial_state([0, 0], [hypers_of(c) for c in members])
    _, heldout = split_holdout(dataset, 0.3)
    td = objective.heldout_td_errors(trainer, state, heldout, rows=64)
    assert td[0] == pytest.approx(td[1], rel=1e-6) and td[0] > 0
