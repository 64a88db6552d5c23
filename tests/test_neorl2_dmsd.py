"""DMSD (mbrl.envs.neorl2.dmsd) against NeoRL-2's released DMSD files: reward, termination, dynamics, seeding."""

from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np
import pytest

from mbrl.envs.neorl2 import dmsd
from neorl2_checks import arrays_fixture, assert_any_batch_axes, assert_numpy_twin_reproduces_file

FILES = ("DMSD-high-100000-train.npz", "DMSD-high-20000-val.npz")
EPISODE = dmsd.EPISODE_STEPS


arrays = arrays_fixture(FILES)


def test_reward_reproduces_file(arrays):
    got = np.asarray(jax.jit(dmsd.reward)(arrays["obs"], arrays["action"], arrays["next_obs"]))
    # The file holds NeoRL-2's float32 numpy reward. XLA's float32 log differs from numpy's by an ulp
    # (up to ~1e-6 on terms of size ~4.6), so where the two masses' terms nearly cancel (|reward| < 1e-4)
    # the relative error exceeds 1e-4; the absolute error stays under 2e-6.
    np.testing.assert_allclose(got, arrays["reward"], rtol=1e-4, atol=2e-6)
    # The env's numpy twin computes as NeoRL-2 does and agrees exactly on a sample.
    assert_numpy_twin_reproduces_file(dmsd, arrays)


def test_reward_and_termination_take_any_batch_axes(arrays):
    assert_any_batch_axes(dmsd, arrays)


def test_terminated_reproduces_file(arrays):
    got = np.asarray(jax.jit(dmsd.terminated)(arrays["obs"], arrays["action"], arrays["next_obs"]))
    np.testing.assert_array_equal(got, arrays["done"].astype(bool))
    # Every episode is truncated at the limit, none terminates.
    ends = np.flatnonzero(arrays["truncated"])
    np.testing.assert_array_equal(ends % EPISODE, EPISODE - 1)


def test_step_from_file_state_reproduces_next_obs(arrays):
    rows = np.random.default_rng(0).choice(len(arrays["obs"]), 300, replace=False)
    env = dmsd.DMSDEnv()
    env.reset(seed=0)
    for i in rows:
        env.set_state_from_obs(arrays["obs"][i])
        next_obs, r, term, trunc, _ = env.step(arrays["action"][i])
        # Deterministic dynamics, no noise: only float32 storage of obs and next_obs separates us (measured
        # at most 2.4e-7 over every row of both files).
        np.testing.assert_allclose(next_obs[:4], arrays["next_obs"][i, :4], rtol=0, atol=5e-7)
        # The targets carry over, except on the row where a second target takes over (step 50).
        if np.array_equal(arrays["obs"][i, 4:], arrays["next_obs"][i, 4:]):
            np.testing.assert_array_equal(next_obs[4:], arrays["next_obs"][i, 4:])
        assert not term and not trunc


def test_seeded_reset_replays_the_files_episodes(arrays):
    # NeoRL-2 collected episode i with reset(seed=i): the start, the target schedule (switch at step 50)
    # and the dynamics all come back. Over all 1,200 episodes of both files the largest next_obs error
    # measured is 4.8e-7 (float32 storage), reward 4.1e-5 (that error through the log near its target).
    env = dmsd.DMSDEnv()
    for ep in range(8):
        rows = slice(ep * EPISODE, (ep + 1) * EPISODE)
        obs, _ = env.reset(seed=ep)
        np.testing.assert_array_equal(obs, arrays["obs"][ep * EPISODE])
        for i, action in enumerate(arrays["action"][rows]):
            obs, r, *_ = env.step(action)
            np.testing.assert_allclose(obs, arrays["next_obs"][rows][i], rtol=0, atol=1e-6)
            np.testing.assert_allclose(r, arrays["reward"][rows][i], rtol=0, atol=1e-4)


def test_env_runs_truncates_and_seeds():
    env = dmsd.make_env()
    obs, info = env.reset(seed=3)
    assert obs.shape == (6,) and obs.dtype == np.float32
    assert env.observation_space.contains(obs)
    assert env.action_space.shape == (2,) and np.all(env.action_space.high == 1.0)
    env.action_space.seed(3)
    steps, truncated = 0, False
    while not truncated:
        obs, r, terminated, truncated, _ = env.step(env.action_space.sample())
        assert obs.shape == (6,) and obs.dtype == np.float32 and isinstance(r, float)
        assert not terminated
        r_jax = float(dmsd.reward(None, None, obs))
        assert abs(r - r_jax) < 2e-6
        steps += 1
    assert steps == EPISODE
    again = dmsd.make_env()
    np.testing.assert_array_equal(again.reset(seed=3)[0], env.reset(seed=3)[0])
    first = env.reset(seed=11)[0]
    assert not np.array_equal(first, env.reset()[0])  # an unseeded reset moves on


def test_test_mode_has_heavier_masses():
    # Same start, same push: the 30 kg masses of test mode accelerate less than the 20 kg of train mode.
    obs = np.float32([0.1, -0.1, 0.0, 0.0, 1.0, -1.0])
    moved = {}
    for mode in ("train", "test"):
        env = dmsd.make_env(mode=mode)
        env.reset(seed=0)
        env.unwrapped.set_state_from_obs(obs)
        moved[mode] = env.step(np.float32([1.0, 1.0]))[0][2:4]
    assert np.all(moved["test"] < moved["train"])
    # The draws do not depend on the mode.
    np.testing.assert_array_equal(dmsd.make_env("test").reset(seed=4)[0], dmsd.make_env().reset(seed=4)[0])
    with pytest.raises(ValueError):
        dmsd.make_env(mode="eval")


def test_is_a_gymnasium_env():
    assert isinstance(dmsd.make_env(), gym.wrappers.TimeLimit)
    assert len(dmsd.OBS_NAMES) == 6 and len(dmsd.ACT_NAMES) == 2 and dmsd.CONTROL_HZ == 5.0
