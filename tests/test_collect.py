"""The lockstep loop, collecting episodes with it, and `mbrl data make` into real Minari datasets."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import gymnasium as gym
import jax
import minari
import numpy as np
import pytest

from mbrl.envs import behaviour, collect, lockstep
from mbrl import datasets
from mbrl.cli import main
from mbrl.core import dataset_registry as registry
from mbrl.core.errors import ConfigError
from mbrl.evaluate import evaluate


def test_unknown_task_or_level_exits_2_and_lists_the_valid_ones(capsys):
    assert main(["data", "make", "hoppr-medium", "--transitions", "10"]) == 2
    err = capsys.readouterr().err
    assert "hoppr-medium" in err and "hopper" in err and "medium-replay" in err
    assert main(["data", "make", "hopper-great"]) == 2
    assert "random, medium, medium-replay, expert, medium-expert" in capsys.readouterr().err


def test_bad_transition_count_is_a_user_error(capsys):
    assert main(["data", "make", "hopper-random", "--transitions", "0"]) == 2
    assert "--transitions" in capsys.readouterr().err


# A fixed linear-tanh hopper controller, elementwise (no matmul) so each row's action is bit-identical
# whatever the batch; hopper falls under it within about 60 steps.
_W = np.array([[0.9, 0.1, -0.7], [-0.9, -0.5, 0.2], [-1.0, -0.2, -0.2], [0.5, 0.2, 0.4]], np.float32)


def hopper_act(obs):
    obs = np.asarray(obs, np.float32)
    return np.tanh(obs[:, 2:5] * _W[0] + obs[:, 5:8] * _W[1] + obs[:, 8:11] * _W[2] + _W[3])


def _plain_episode(env, act, seed: int, limit: int | None = None) -> dict:
    """The plain gymnasium loop the lockstep loop must reproduce: one env, one observation at a time."""
    obs, _ = env.reset(seed=seed)
    rows = {"obs": [obs], "action": [], "reward": [], "terminated": [], "truncated": []}
    total = 0.0
    while True:
        action = np.clip(act(np.asarray(obs, np.float32)[None])[0], env.action_space.low, env.action_space.high)
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        for key, value in zip(rows, (obs, action, reward, terminated, truncated)):
            rows[key].append(value)
        if terminated or truncated or len(rows["reward"]) == limit:
            return {**{k: np.asarray(v) for k, v in rows.items()}, "return": total}


def reset_seed(slot: int, episode: int) -> int:
    return 1000 + 10 * slot + episode


def test_lockstep_episodes_match_a_plain_gymnasium_loop():
    """Two envs, 2 and 1 whole episodes: every episode is the one a plain single-env loop gives."""
    envs = [gym.make("Hopper-v5") for _ in range(2)]
    slots = lockstep.run(envs, lockstep.markov(hopper_act), reset_seed, episodes=[2, 1], record=True)
    assert [len(slot) for slot in slots] == [2, 1]
    plain_env = gym.make("Hopper-v5")
    for i, slot in enumerate(slots):
        for j, ep in enumerate(slot):
            ref = _plain_episode(plain_env, hopper_act, reset_seed(i, j))
            assert ep.episode_return == ref["return"]  # the same float64 sum, in the same order
            assert len(ep) == len(ref["reward"]) and 40 < len(ep) < 1000  # ends by a fall
            np.testing.assert_array_equal(ep.observations, ref["obs"].astype(np.float32))
            np.testing.assert_array_equal(ep.actions, ref["action"])
            np.testing.assert_array_equal(ep.rewards, ref["reward"].astype(np.float32))
            np.testing.assert_array_equal(ep.terminations, ref["terminated"])
            np.testing.assert_array_equal(ep.truncations, ref["truncated"])
    assert slots[0][0].terminations[-1] and not slots[0][0].truncations.any()


def test_lockstep_policy_inputs_carry_the_previous_action_and_reward():
    """What a recurrent policy sees: one call per step with all rows, the slot's previous (clipped) action
    and reward, zeros and `first` at each episode's first step."""
    calls = []

    def policy(inputs):
        calls.append(inputs)
        return 3.0 * hopper_act(inputs.obs)  # beyond the bounds: the loop clips

    envs = [gym.make("Hopper-v5") for _ in range(2)]
    slots = lockstep.run(envs, policy, reset_seed, episodes=[2, 1], record=True)
    (a0, a1), (b0,) = slots
    assert len(calls) == len(a0) + len(a1) > len(b0)
    assert all(c.obs.shape == (2, 11) and c.prev_action.shape == (2, 3) and c.first.shape == (2,) for c in calls)
    assert np.all(np.abs(a0.actions) <= 1.0) and np.any(np.abs(a0.actions) == 1.0)
    for row, episodes in ((0, [a0, a1]), (1, [b0])):
        t = 0
        for ep in episodes:
            for k in range(len(ep)):
                c = calls[t]
                np.testing.assert_array_equal(c.obs[row], ep.observations[k])
                assert c.first[row] == (k == 0)
                np.testing.assert_array_equal(c.prev_action[row], ep.actions[k - 1] if k else np.zeros(3))
                assert c.prev_reward[row] == (ep.rewards[k - 1] if k else 0.0)
                t += 1
    # After its episode, row 1 is padding: its last observation, never a reset.
    np.testing.assert_array_equal(calls[-1].obs[1], b0.observations[-1])
    assert not calls[-1].first[1]


def test_lockstep_stops_a_slot_at_whichever_quota_comes_first():
    """One episode of at most `steps`: cut (truncated) at the step quota, or ended by the fall before it."""
    envs = [gym.make("Hopper-v5") for _ in range(3)]
    seen = []
    slots = lockstep.run(envs, lockstep.markov(hopper_act), reset_seed, episodes=1, steps=[0, 5, 500],
                         on_step=seen.append)
    assert slots[0] == []
    (cut,), (fell,) = slots[1], slots[2]
    assert len(cut) == 5 and cut.truncations[-1] and not cut.terminations.any()
    assert len(fell) < 500 and fell.terminations[-1] and not fell.truncations.any()
    assert cut.observations is None and cut.actions is None  # not recorded
    assert seen[:5] == [2] * 5 and set(seen[5:]) == {1} and sum(seen) == 5 + len(fell)
    ref = _plain_episode(gym.make("Hopper-v5"), hopper_act, reset_seed(1, 0), limit=5)
    assert cut.episode_return == ref["return"]


def test_unit_actions_are_mapped_onto_the_action_space():
    """A behaviour policy acts in [-1, 1]: on Pendulum (torque in [-2, 2]) 0.5 means 1.0, and -3 means -2."""

    def pendulum():
        return gym.make("Pendulum-v1", max_episode_steps=4)

    def constant(value):
        return lambda obs: np.full((len(obs), 1), value, np.float32)

    for value, torque in ((0.5, 1.0), (-3.0, -2.0)):
        ((ep,),) = lockstep.run([pendulum()], lockstep.markov(constant(value)), reset_seed, episodes=1, record=True,
                                unit_actions=True)
        ref = _plain_episode(pendulum(), constant(torque), reset_seed(0, 0))
        np.testing.assert_array_equal(ep.observations, ref["obs"].astype(np.float32))
        np.testing.assert_array_equal(ep.actions, np.full((4, 1), np.clip(value, -1, 1), np.float32))
    # Without unit_actions the same 0.5 is a torque of 0.5.
    ((ep,),) = lockstep.run([pendulum()], lockstep.markov(constant(0.5)), reset_seed, episodes=1)
    assert ep.episode_return == _plain_episode(pendulum(), constant(0.5), reset_seed(0, 0))["return"]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({}, "give a quota"), ({"episodes": [1]}, "one per env"), ({"steps": -1}, "non-negative")],
)
def test_lockstep_refuses_bad_quotas(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        lockstep.run([gym.make("Hopper-v5") for _ in range(2)], lockstep.markov(hopper_act), reset_seed, **kwargs)


@pytest.fixture(scope="module")
def lockstep_runs():
    def run(seed):
        envs = [collect.make_env("hopper") for _ in range(2)]
        policy = behaviour.stepped(behaviour.uniform_policy(3, seed))
        return lockstep.run(envs, policy, functools.partial(collect.episode_seed, seed), steps=[30, 45], record=True,
                            unit_actions=True)

    return run(0), run(0), run(1)


def test_lockstep_meets_step_quotas_and_cuts_the_last_episode(lockstep_runs):
    slots, _, _ = lockstep_runs
    assert [sum(len(ep) for ep in slot) for slot in slots] == [30, 45]
    for slot in slots:
        for ep in slot[:-1]:
            assert ep.terminations[-1] or ep.truncations[-1]
        for ep in slot:
            assert ep.observations.shape == (len(ep) + 1, 11) and ep.actions.shape == (len(ep), 3)
            assert np.all(np.abs(ep.actions) <= 1.0)
            assert not np.any(ep.terminations[:-1] | ep.truncations[:-1])


def test_the_quota_cuts_an_episode_that_goes_on_and_keeps_a_natural_end(lockstep_runs):
    # Each slot's last episode, replayed in a fresh env with its reset seed and actions: where the env goes on
    # past the quota, the loop marks a cut (truncated); where it ended by itself at the quota, an end.
    slots, _, _ = lockstep_runs
    cuts = 0
    for index, slot in enumerate(slots):
        last = slot[-1]
        env = collect.make_env("hopper")
        obs, _ = env.reset(seed=collect.episode_seed(0, index, len(slot) - 1))
        np.testing.assert_array_equal(np.float32(obs), last.observations[0])
        for action in last.actions:  # hopper's action space is [-1, 1]: unit actions are env actions
            obs, _, terminated, truncated, _ = env.step(action)
        np.testing.assert_allclose(obs, last.observations[-1], atol=1e-5)  # (unit actions map affinely: round-off)
        assert (bool(last.terminations[-1]), bool(last.truncations[-1])) == ((True, False) if terminated else (False, True))
        cuts += not terminated and not truncated
    assert cuts == 1  # slot 1 is cut; slot 0's episode falls at exactly its quota of 30 steps


def test_lockstep_is_deterministic_for_a_seed(lockstep_runs):
    a, b, c = lockstep_runs
    flat = [[ep.observations for slot in run for ep in slot] for run in (a, b, c)]
    for x, y in zip(flat[0], flat[1]):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(flat[0][0], flat[2][0])


def test_lockstep_in_chunks_equals_one_run_and_hands_over_its_steps():
    """Online training's use: steps taken 7 at a time, episodes carried across calls, then the cut, give the
    episodes one call gives; the steps handed over are the episodes' own transitions, in order."""
    policy = lockstep.markov(hopper_act)
    whole = lockstep.run([gym.make("Hopper-v5")], policy, reset_seed, steps=100, record=True)[0]
    chunked = lockstep.Lockstep([gym.make("Hopper-v5")], reset_seed, transitions=True)
    rows = []
    for _ in range(100 // 7 + 1):
        chunked.advance(policy, steps=min(7, 100 - chunked.steps[0]))
        rows.append(chunked.take_transitions(0))
    chunked.cut()
    episodes = chunked.take_finished(0)
    assert len(episodes) == len(whole) >= 2 and chunked.take_finished(0) == []
    for a, b in zip(episodes, whole):
        np.testing.assert_array_equal(a.rewards, b.rewards)
        np.testing.assert_array_equal(a.truncations, b.truncations)
        assert a.episode_return == b.episode_return
    obs, action, reward, next_obs, terminated, truncated = (np.concatenate(c) for c in zip(*rows))
    assert len(obs) == 100
    np.testing.assert_array_equal(obs, np.concatenate([ep.observations[:-1] for ep in whole]))
    np.testing.assert_array_equal(next_obs, np.concatenate([ep.observations[1:] for ep in whole]))
    np.testing.assert_array_equal(action, np.concatenate([ep.actions for ep in whole]))
    np.testing.assert_array_equal(reward, np.concatenate([ep.rewards for ep in whole]))
    ends = np.flatnonzero(terminated | truncated)
    np.testing.assert_array_equal(ends + 1, np.cumsum([len(ep) for ep in whole])[:-1])  # the last is cut, not ended


@pytest.mark.parametrize("continuous", [False, True])
def test_segments_switch_policy_mid_episode_only_when_continuous(continuous):
    """medium-replay's segments continue the run's episodes across a policy change; others start afresh."""
    zero = lambda obs, step: np.zeros((obs.shape[0], 6), np.float32)  # noqa: E731
    segments = [collect.Segment(behaviour.uniform_policy(6, 0), 1200, "a"), collect.Segment(zero, 1200, "b")]
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
    broken = lockstep.Episode(
        observations=episodes[0].observations, actions=episodes[0].actions, rewards=unstorable,
        terminations=episodes[0].terminations, truncations=episodes[0].truncations, episode_return=0.0,
    )
    with pytest.raises(Exception):
        collect.write_minari(tmp_path, "hopper", "random", episodes + [broken], 0.0, 1.0, {})
    assert not (tmp_path / registry.minari_id("hopper", "random")).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-make-")]
    assert not registry.is_made("hopper", "random", root=tmp_path)
    # The same episodes, storable, make a dataset there.
    collect.write_minari(tmp_path, "hopper", "random", episodes, 0.0, 1.0, {})
    assert registry.is_made("hopper", "random", root=tmp_path)


# ---------------------------------------------------------------- with the shipped behaviour policies

needs_hopper_policies = pytest.mark.skipif(
    not all((behaviour.BEHAVIOUR_DIR / f"hopper_{p}.json").exists()
            for p in ("random", "medium", "expert", "medium_replay")),
    reason="the shipped hopper behaviour policies are missing (scripts/train_behaviour.py finalize --task hopper)",
)


SHIPPED_TASKS = sorted(t for t in behaviour.EXPERT_BAR if (behaviour.BEHAVIOUR_DIR / f"{t}_expert.json").exists())


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
    root, code = made_hopper_medium
    assert code == 0
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    dataset = minari.load_dataset("mbrl/hopper/medium-v0")
    assert dataset.total_steps == 5000
    meta = dataset.storage.metadata
    random_record = json.loads((behaviour.BEHAVIOUR_DIR / "hopper_random.json").read_text())
    expert_record = json.loads((behaviour.BEHAVIOUR_DIR / "hopper_expert.json").read_text())
    assert meta["ref_min_score"] == pytest.approx(random_record["mean_return"])
    assert meta["ref_max_score"] == pytest.approx(expert_record["mean_return"])
    assert meta["mbrl_level"] == "medium" and meta["mbrl_seed"] == 0
    steps = sum(len(ep.rewards) for ep in dataset.iterate_episodes())
    assert steps == 5000


@needs_hopper_policies
def test_make_hopper_medium_is_read_by_mbrl_datasets(made_hopper_medium, monkeypatch):
    root, _ = made_hopper_medium
    monkeypatch.setenv("MBRL_DATA_DIR", str(root))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    data = datasets.load("hopper-medium")
    assert len(data) == 5000
    # The reference scores come through the loader: the shipped random and expert policies' mean returns.
    random_record = json.loads((behaviour.BEHAVIOUR_DIR / "hopper_random.json").read_text())
    expert_record = json.loads((behaviour.BEHAVIOUR_DIR / "hopper_expert.json").read_text())
    assert data.info.ref_min_score == pytest.approx(random_record["mean_return"])
    assert data.info.ref_max_score == pytest.approx(expert_record["mean_return"])


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
    """Each recorded segment, in order, for its share of the steps, acted by its own snapshot (or the
    uniform warm-up) with the seed seed + k."""
    record = behaviour.read_record("hopper", "medium_replay")
    recorded = record["env_steps"]
    assert recorded % 100 == 0 and all(seg["steps"] % 100 == 0 for seg in record["segments"])
    segments = collect.plan_segments("hopper", "medium-replay", recorded // 100, seed=3)
    assert [s.label for s in segments] == [f"snapshot@{seg['start']}" for seg in record["segments"]]
    assert [s.steps for s in segments] == [seg["steps"] // 100 for seg in record["segments"]]
    assert [s.steps for s in collect.plan_segments("hopper", "medium-replay", None, seed=3)] == [
        seg["steps"] for seg in record["segments"]]

    actor, snapshots = behaviour.load_snapshots("hopper")
    obs = np.random.default_rng(0).normal(size=(4, 11)).astype(np.float32)
    actions = []
    for k, (segment, seg) in enumerate(zip(segments, record["segments"])):
        action = segment.policy(obs, 7)
        if seg["snapshot"] < 0:
            uniform = np.random.default_rng([3 + k, 7]).uniform(-1, 1, (4, 3))
            np.testing.assert_array_equal(action, uniform.astype(np.float32))
        else:  # snapshot j's tanh-Gaussian sample with the key of seed 3 + k at step 7, computed eagerly
            mean, log_std = actor.apply(snapshots[seg["snapshot"]], obs)
            noise = jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(3 + k), 7), mean.shape)
            np.testing.assert_allclose(action, np.tanh(mean + np.exp(log_std) * noise), rtol=1e-5, atol=1e-6)
        actions.append(action)
    assert len({a.tobytes() for a in actions}) == len(actions)  # every segment acts differently


# Enough whole episodes for a score: hopper's medium episodes last about 400 steps, so 20,000 steps over 16
# lockstep envs give dozens; halfcheetah's last 1,000, so 4 envs of 6,000 steps give 24.
BAND_SIZES = {"hopper": ("20000", "16"), "halfcheetah": ("24000", "4"), "walker2d": ("24000", "4")}


@pytest.mark.parametrize("task", SHIPPED_TASKS)
def test_made_medium_scores_in_the_band_the_readme_records(task, tmp_path, monkeypatch):
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
    expert, medium = behaviour.read_record(task, "expert"), behaviour.read_record(task, "medium")
    assert not expert["provisional"] and expert["episodes"] == 100
    assert expert["mean_return"] >= behaviour.EXPERT_BAR[task]
    assert 0.2 <= medium["mean_return"] / expert["mean_return"] <= 0.5  # D4RL: about one third
    assert medium["env_steps"] < expert["env_steps"]  # both from the same run
    for name, record in (("expert", expert), ("medium", medium)):
        assert (behaviour.BEHAVIOUR_DIR / record["file"]).stat().st_size <= 1 << 20
        policy = behaviour.stepped(behaviour.shipped_policy(task, name, seed=1))
        returns = evaluate(policy, task, episodes=3, seed=record["eval_seed"]).returns
        # 3 episodes against the 100-episode record: within 4 standard errors.
        assert abs(returns.mean() - record["mean_return"]) <= 4 * record["std_return"] / np.sqrt(3) + 1.0
