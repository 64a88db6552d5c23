"""Collecting episodes in lockstep and `mbrl data make` into real Minari datasets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from envs import collect
from mbrl.cli import main


def test_unknown_task_or_level_exits_2_and_lists_the_valid_ones(capsys):
    assert main(["data", "make", "hoppr-medium", "--transitions", "10"]) == 2
    err = capsys.readouterr().err
    assert "hoppr-medium" in err and "hopper" in err and "medium-replay" in err
    assert main(["data", "make", "hopper-great"]) == 2
    assert "random, medium, medium-replay, expert, medium-expert" in capsys.readouterr().err


def test_bad_transition_count_is_a_user_error(capsys):
    assert main(["data", "make", "hopper-random", "--transitions", "0"]) == 2
    assert "--transitions" in capsys.readouterr().err


@pytest.fixture(scope="module")
def lockstep_runs():
    def run(seed):
        envs = [collect.make_env("hopper") for _ in range(2)]
        return collect.run_lockstep(envs, collect.uniform_policy(3, seed), seed, steps_per_env=[30, 45])

    return run(0), run(0), run(1)


def test_lockstep_meets_step_quotas_and_cuts_the_last_episode(lockstep_runs):
    slots, _, _ = lockstep_runs
    assert [sum(len(ep) for ep in slot) for slot in slots] == [30, 45]
    for slot in slots:
        for ep in slot[:-1]:
            assert ep.terminations[-1] or ep.truncations[-1]
        assert slot[-1].terminations[-1] or slot[-1].truncations[-1]  # cut at the quota: truncated
        for ep in slot:
            assert ep.observations.shape == (len(ep) + 1, 11) and ep.actions.shape == (len(ep), 3)
            assert np.all(np.abs(ep.actions) <= 1.0)
            assert not np.any(ep.terminations[:-1] | ep.truncations[:-1])


def test_lockstep_is_deterministic_for_a_seed(lockstep_runs):
    a, b, c = lockstep_runs
    flat = [[ep.observations for slot in run for ep in slot] for run in (a, b, c)]
    for x, y in zip(flat[0], flat[1]):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(flat[0][0], flat[2][0])


def test_evaluate_returns_counts_whole_episodes():
    returns = collect.evaluate_returns("hopper", collect.uniform_policy(3, 0), 5, seed=0, num_envs=2)
    assert returns.shape == (5,) and np.all(np.isfinite(returns))


@pytest.mark.parametrize("continuous", [False, True])
def test_segments_switch_policy_mid_episode_only_when_continuous(continuous):
    """medium-replay's segments continue the run's episodes across a policy change; others start afresh."""
    zero = lambda obs, step: np.zeros((obs.shape[0], 6), np.float32)  # noqa: E731
    segments = [collect.Segment(collect.uniform_policy(6, 0), 1200, "a"), collect.Segment(zero, 1200, "b")]
    episodes = collect.collect_segments("halfcheetah", segments, seed=0, num_envs=2, continuous=continuous)
    assert sum(len(ep) for ep in episodes) == 2400
    if continuous:  # per env: one whole 1,000-step episode (600 steps of each policy), then 200 cut steps
        whole = [ep for ep in episodes if len(ep) == 1000]
        assert len(whole) == 2
        for ep in whole:
            assert np.all(np.abs(ep.actions[:600]).sum(axis=1) > 0) and np.all(ep.actions[600:] == 0)
    else:  # each segment is cut at its quota of 600 steps per env
        assert sorted(len(ep) for ep in episodes) == [600] * 4
        assert all(ep.truncations[-1] for ep in episodes)


def test_interrupted_write_leaves_nothing_behind(tmp_path, lockstep_runs):
    episodes = [ep for slot in lockstep_runs[0] for ep in slot]
    # Rewards that HDF5 cannot store: the write fails after the earlier episodes were written.
    unstorable = np.array([object()] * len(episodes[0]), dtype=object)
    broken = collect.Episode(
        observations=episodes[0].observations, actions=episodes[0].actions, rewards=unstorable,
        terminations=episodes[0].terminations, truncations=episodes[0].truncations,
    )
    with pytest.raises(Exception):
        collect.write_minari(tmp_path, "hopper", "random", episodes + [broken], 0.0, 1.0, {})
    assert not (tmp_path / collect.dataset_id("hopper", "random")).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-make-")]
    assert not collect.is_complete(tmp_path, "hopper", "random")


# ---------------------------------------------------------------- with the shipped behaviour policies

needs_hopper_policies = pytest.mark.skipif(
    not all((collect.BEHAVIOUR_DIR / f"hopper_{p}.json").exists() for p in ("random", "medium", "expert", "medium_replay")),
    reason="the shipped hopper behaviour policies are missing (scripts/train_behaviour.py finalize --task hopper)",
)


SHIPPED_TASKS = sorted(t for t in collect.EXPERT_BAR if (collect.BEHAVIOUR_DIR / f"{t}_expert.json").exists())


@pytest.fixture(scope="module")
def made_hopper_medium(tmp_path_factory):
    root = tmp_path_factory.mktemp("made")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MBRL_DATA_DIR", str(root))
        mp.setenv("MINARI_DATASETS_PATH", str(root))
        mp.setenv("MBRL_NO_PROGRESS", "1")
        code = main(["data", "make", "hopper-medium", "--transitions", "5000"])
    return root, code


@needs_hopper_policies
def test_make_hopper_medium_is_read_by_minari_with_reference_scores(made_hopper_medium, monkeypatch):
    import minari

    root, code = made_hopper_medium
    assert code == 0
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    dataset = minari.load_dataset("mbrl/hopper/medium-v0")
    assert dataset.total_steps == 5000
    meta = dataset.storage.metadata
    random_record = json.loads((collect.BEHAVIOUR_DIR / "hopper_random.json").read_text())
    expert_record = json.loads((collect.BEHAVIOUR_DIR / "hopper_expert.json").read_text())
    assert meta["ref_min_score"] == pytest.approx(random_record["mean_return"])
    assert meta["ref_max_score"] == pytest.approx(expert_record["mean_return"])
    assert meta["mbrl_level"] == "medium" and meta["mbrl_seed"] == 0
    steps = sum(len(ep.rewards) for ep in dataset.iterate_episodes())
    assert steps == 5000


@needs_hopper_policies
def test_make_hopper_medium_is_read_by_mbrl_datasets(made_hopper_medium, monkeypatch):
    datasets = pytest.importorskip("mbrl.datasets")
    root, _ = made_hopper_medium
    monkeypatch.setenv("MBRL_DATA_DIR", str(root))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    data = datasets.load("hopper-medium")
    assert len(data) == 5000
    assert data.info.ref_min_score is not None and data.info.ref_max_score is not None


@needs_hopper_policies
def test_an_existing_dataset_is_reused(made_hopper_medium, monkeypatch, capsys):
    root, _ = made_hopper_medium
    monkeypatch.setenv("MBRL_DATA_DIR", str(root))
    data_file = root / "mbrl" / "hopper" / "medium-v0" / "data" / "main_data.hdf5"
    before = os.stat(data_file).st_mtime_ns
    assert main(["data", "make", "hopper-medium", "--transitions", "5000"]) == 0
    assert "already made" in capsys.readouterr().out
    assert os.stat(data_file).st_mtime_ns == before


@needs_hopper_policies
def test_medium_replay_plan_follows_the_recorded_segments():
    from mbrl.commands.data_make import plan_segments

    record = collect.read_record("hopper", "medium_replay")
    segments = plan_segments("hopper", "medium-replay", 1000, seed=0)
    assert sum(s.steps for s in segments) == 1000
    assert segments[0].label == "snapshot@0"  # the uniform warm-up comes first
    assert len(segments) <= len(record["segments"])


# Enough whole episodes for a score: hopper's medium episodes last about 400 steps, so 20,000 steps over 16
# lockstep envs give dozens; halfcheetah's last 1,000, so 4 envs of 6,000 steps give 24.
BAND_SIZES = {"hopper": ("20000", "16"), "halfcheetah": ("24000", "4"), "walker2d": ("24000", "4")}


@pytest.mark.parametrize("task", SHIPPED_TASKS)
def test_made_medium_scores_in_the_band_the_readme_records(task, tmp_path, monkeypatch):
    import re

    import minari

    for var in ("MBRL_DATA_DIR", "MINARI_DATASETS_PATH"):
        monkeypatch.setenv(var, str(tmp_path))
    monkeypatch.setenv("MBRL_NO_PROGRESS", "1")
    transitions, envs = BAND_SIZES[task]
    assert main(["data", "make", f"{task}-medium", "--transitions", transitions, "--num-envs", envs]) == 0
    dataset = minari.load_dataset(f"mbrl/{task}/medium-v0")
    meta = dataset.storage.metadata
    episodes = list(dataset.iterate_episodes())
    complete = [bool(ep.terminations[-1]) or len(ep.rewards) == 1000 for ep in episodes]
    assert sum(complete) >= 20
    score = collect.data_score([ep.rewards.sum() for ep in episodes], complete, meta["ref_min_score"], meta["ref_max_score"])
    low, high = collect.SCORE_BANDS["medium"]
    assert low <= score <= high
    # The README's dataset table records the same band for the level.
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    # The datasets table's row (its second column is the transitions), not a learning-quality table's.
    row = re.search(rf"^\| {task}-medium \| [0-9,]+ \|.*$", readme, re.M)
    assert row is not None and row.group(0).rstrip(" |").endswith(f"{low:g} to {high:g}")



@pytest.mark.parametrize("task", SHIPPED_TASKS)
def test_shipped_policies_meet_their_bars_and_reproduce_their_records(task):
    """Each shipped expert clears 80% of D4RL's expert return, medium is about a third of it, and both
    policies, reloaded from their files, return what their 100-episode records say."""
    from mbrl.commands.data_make import _actor_policy, load_actor

    spec = collect.TASK_SPECS[task]
    expert, medium = collect.read_record(task, "expert"), collect.read_record(task, "medium")
    assert not expert["provisional"] and expert["episodes"] == 100
    assert expert["mean_return"] >= collect.EXPERT_BAR[task]
    assert 0.2 <= medium["mean_return"] / expert["mean_return"] <= 0.5  # D4RL: about one third
    assert medium["env_steps"] < expert["env_steps"]  # both from the same run
    for record in (expert, medium):
        path = collect.BEHAVIOUR_DIR / record["file"]
        assert path.stat().st_size <= 1 << 20
        params = load_actor(path, record["hidden_sizes"], spec.obs_dim, spec.act_dim)
        policy = _actor_policy(params, record["hidden_sizes"], spec.act_dim, seed=1)
        returns = collect.evaluate_returns(task, policy, 3, seed=record["eval_seed"], num_envs=3)
        # 3 episodes against the 100-episode record: within 4 standard errors.
        assert abs(returns.mean() - record["mean_return"]) <= 4 * record["std_return"] / np.sqrt(3) + 1.0
