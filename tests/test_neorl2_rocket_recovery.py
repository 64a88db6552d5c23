"""RocketRecovery (mbrl.envs.neorl2.rocket_recovery) against NeoRL-2's released val file: reward, termination,
dynamics (exact replay of the file's episodes, and one step from a row's state), seeding."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import jax
import numpy as np
import pytest

from mbrl.envs.neorl2 import rocket_recovery as rr
from neorl2_checks import arrays_fixture, assert_any_batch_axes

FILES = ("RocketRecovery-high-20000-val.npz",)  # the train file is not released here
# The env's physics is Box2D's (PyPI `box2d`); reward and termination need only jax.
needs_box2d = pytest.mark.skipif(importlib.util.find_spec("Box2D") is None,
                                 reason="the box2d package (the env's Box2D physics) is not installed")


arrays = arrays_fixture(FILES)


def _episodes(arrays):
    ends = np.flatnonzero((arrays["done"] > 0) | (arrays["truncated"] > 0))
    return np.r_[0, ends[:-1] + 1], ends


def _wind_index(winds: np.ndarray) -> int:
    """The wind index of an episode's reset step: the one whose wind sequence is the episode's (unique)."""
    grid = np.arange(rr.WIND_INDEX_RANGE[0], rr.WIND_INDEX_RANGE[1] + 1)
    table = rr._wind(np.arange(grid[0], grid[-1] + len(winds)), 10.0).astype(np.float32)
    found = [i for i in np.flatnonzero(np.abs(table[:len(grid)] - winds[0]) < 1e-5)
             if np.abs(table[i:i + len(winds)] - winds).max() < 1e-5]
    assert len(found) == 1
    return int(grid[found[0]])


def test_reward_reproduces_file(arrays):
    args = (arrays["obs"], arrays["action"], arrays["next_obs"])
    got = np.asarray(jax.jit(rr.reward)(*args))
    # Eager jnp and the env's numpy twin round as NeoRL-2's float32 numpy did: exact on every row.
    np.testing.assert_array_equal(np.asarray(rr.reward(*args)), arrays["reward"])
    np.testing.assert_array_equal(np.asarray(rr._reward(np, *args), np.float32), arrays["reward"])
    # Under jit XLA fuses the float32 shaping terms (~100 each, which cancel to a reward of ~1) and rounds
    # them differently: measured at most 4.6e-5 absolute (a few ulps of 100), so only near-zero rewards
    # miss 1e-4 relative.
    np.testing.assert_allclose(got, arrays["reward"], rtol=1e-4, atol=1e-4)


def test_reward_and_termination_take_any_batch_axes(arrays):
    assert_any_batch_axes(rr, arrays)


def test_terminated_reproduces_file(arrays):
    got = np.asarray(jax.jit(rr.terminated)(arrays["obs"], arrays["action"], arrays["next_obs"]))
    np.testing.assert_array_equal(got, arrays["done"].astype(bool))
    assert not arrays["truncated"].any()  # every episode of the file lands before step 500


@needs_box2d
def test_seeded_reset_replays_the_files_episodes(arrays):
    # NeoRL-2 collected episode k with reset(seed=k); the wind's phase (unseeded there) is found from the
    # episode's own winds. Then every observation, reward and termination of all 146 episodes comes back
    # exactly (measured: 0 error). The tolerance leaves room for another Box2D build's float rounding,
    # which a chaotic flight grows along an episode.
    env = rr.RocketRecoveryEnv()
    starts, ends = _episodes(arrays)
    for k, (s, e) in enumerate(zip(starts, ends)):
        obs, _ = env.reset(seed=k, options={"wind_index": _wind_index(arrays["obs"][s:e + 1, 6])})
        np.testing.assert_array_equal(obs, arrays["obs"][s])
        for i in range(s, e + 1):
            obs, r, term, trunc, _ = env.step(arrays["action"][i])
            np.testing.assert_allclose(obs, arrays["next_obs"][i], rtol=0, atol=1e-3)
            np.testing.assert_allclose(r, arrays["reward"][i], rtol=0, atol=0.2)
            assert term == bool(arrays["done"][i]) and not trunc


@needs_box2d
def test_step_from_file_state_reproduces_next_obs(arrays):
    # Rows in free flight (the legs reach the ground near y = 0.05, and contact is not in the obs).
    free = np.flatnonzero(arrays["obs"][:, 1] >= 0.1)
    rows = np.random.default_rng(0).choice(free, 300, replace=False)
    env = rr.RocketRecoveryEnv()
    env.reset(seed=0)
    err = np.empty((len(rows), 7))
    for j, i in enumerate(rows):
        env.set_state_from_obs(arrays["obs"][i])
        next_obs, r, term, trunc, _ = env.step(arrays["action"][i])
        err[j] = np.abs(next_obs - arrays["next_obs"][i])
    # The step itself is random: each firing engine's impulse acts at a point moved by up to 1/SCALE and
    # the main engine's is scaled by 0.5..1.5 ("dispersion"). Over all 18,739 free-flight rows the largest
    # errors measured are x 4.2e-4, y 1.0e-3, vx 0.041, vy 0.045, angle 1.7e-3, angular velocity 0.034.
    # The leg state and the wind's phase are not in the obs: legs are put at rest, and the wind index is
    # the nearest match, which can pick a phase on the other slope (wind error up to 0.154).
    bound = np.array([1e-3, 2e-3, 0.06, 0.07, 3e-3, 0.05, 0.25])
    assert np.all(err.max(axis=0) <= bound), err.max(axis=0)
    # Engines off: no dispersion, so only the hidden leg state and float32 storage remain (measured up to
    # 3.6e-3, on the angular velocity, over all 4,386 such free-flight rows).
    off = (arrays["action"][rows, 0] <= 0) & (np.abs(arrays["action"][rows, 1]) <= 0.5)
    if off.any():
        assert err[off][:, :6].max() <= 5e-3, err[off].max(axis=0)


@needs_box2d
def test_env_runs_truncates_and_seeds():
    env = rr.make_env(max_episode_steps=5)
    assert isinstance(env, gym.wrappers.TimeLimit)
    obs, _ = env.reset(seed=3)
    assert obs.shape == (7,) and obs.dtype == np.float32
    assert env.observation_space.shape == (7,) and env.action_space.shape == (2,)
    assert len(rr.OBS_NAMES) == len(rr.OBS_LOW) == len(rr.OBS_HIGH) == 7 and len(rr.ACT_NAMES) == 2
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(5)]
    trace = []
    for t, a in enumerate(actions):
        obs, r, term, trunc, _ = env.step(a)
        assert obs.shape == (7,) and obs.dtype == np.float32 and isinstance(r, float)
        assert not term and trunc == (t == 4)  # starts ~1.4 high: no landing in 5 steps
        trace.append(obs)
    again = rr.make_env(max_episode_steps=5)
    np.testing.assert_array_equal(again.reset(seed=3)[0], env.reset(seed=3)[0])
    for a, expected in zip(actions, trace):
        np.testing.assert_array_equal(again.step(a)[0], expected)
    # Full limit, modes.
    assert rr.make_env()._max_episode_steps == rr.EPISODE_STEPS == 500
    test_env = rr.RocketRecoveryEnv(mode="test")
    assert test_env.wind_power == 12.0 and rr.RocketRecoveryEnv().wind_power == 10.0
    with pytest.raises(ValueError):
        rr.RocketRecoveryEnv(mode="eval")
