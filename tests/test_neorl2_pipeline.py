"""Pipeline (mbrl.envs.neorl2.pipeline) against the Pipeline files here: reward, termination, dynamics, seeding.

These two files are an earlier collection than NeoRL-2's released Pipeline files (other md5s): another
behaviour policy, and every episode starts at target 50. Their rewards and flows still follow the
released definitions exactly, which is what these tests hold the env to.
"""

from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np
import pytest

from mbrl.envs.neorl2 import pipeline
from neorl2_checks import arrays_fixture, assert_any_batch_axes, assert_numpy_twin_reproduces_file

FILES = ("Pipeline-high-100000-train.npz", "Pipeline-high-20000-val.npz")
EPISODE = pipeline.EPISODE_STEPS


arrays = arrays_fixture(FILES)


def test_reward_reproduces_file(arrays):
    got = np.asarray(jax.jit(pipeline.reward)(arrays["obs"], arrays["action"], arrays["next_obs"]))
    # Jitted XLA fuses the square and the -3 into one FMA, one rounding where numpy (the file) rounds twice:
    # at most one ulp of 3 (1.2e-7) apart, which is over 1e-4 relative only where the reward crosses 0.
    np.testing.assert_allclose(got, arrays["reward"], rtol=1e-4, atol=2.5e-7)
    assert_numpy_twin_reproduces_file(pipeline, arrays)


def test_reward_and_termination_take_any_batch_axes(arrays):
    assert_any_batch_axes(pipeline, arrays)


def test_terminated_reproduces_file(arrays):
    got = np.asarray(jax.jit(pipeline.terminated)(arrays["obs"], arrays["action"], arrays["next_obs"]))
    np.testing.assert_array_equal(got, arrays["done"].astype(bool))
    np.testing.assert_array_equal(np.flatnonzero(arrays["truncated"]) % EPISODE, EPISODE - 1)


def test_step_from_file_state_reproduces_next_obs(arrays):
    rows = np.random.default_rng(0).choice(len(arrays["obs"]), 300, replace=False)
    env = pipeline.PipelineEnv()
    env.reset(seed=0)
    for i in rows:
        env.set_state_from_obs(arrays["obs"][i])
        next_obs, r, term, trunc, _ = env.step(arrays["action"][i])
        # The flows are deterministic float32 arithmetic, as in NeoRL-2: bit for bit.
        np.testing.assert_array_equal(next_obs[2:], arrays["next_obs"][i, 2:])
        np.testing.assert_array_equal(next_obs[0], arrays["next_obs"][i, 0])
        # The target jumps at random (0.3% of steps); elsewhere it carries over.
        if arrays["obs"][i, 1] == arrays["next_obs"][i, 1] and next_obs[1] == arrays["obs"][i, 1]:
            assert r == arrays["reward"][i]
        assert not term and not trunc


def test_seeded_reset_replays_the_files_episodes(arrays):
    # NeoRL-2 collected episode i with reset(seed=i); given its first target, start flow, target jumps and
    # flows come back bit for bit (measured over all 120 episodes of both files).
    env = pipeline.PipelineEnv()
    for ep in range(3):
        rows = slice(ep * EPISODE, (ep + 1) * EPISODE)
        obs, _ = env.reset(seed=ep, options={"target": arrays["obs"][ep * EPISODE, 1]})
        np.testing.assert_array_equal(obs, arrays["obs"][ep * EPISODE])
        got = np.stack([env.step(a)[0] for a in arrays["action"][rows]])
        np.testing.assert_array_equal(got, arrays["next_obs"][rows])


def test_env_runs_truncates_and_seeds():
    env = pipeline.make_env(max_episode_steps=30)
    obs, _ = env.reset(seed=5)
    assert obs.shape == (52,) and obs.dtype == np.float32
    assert env.observation_space.contains(obs)
    assert obs[1] in pipeline.TARGETS and np.all(obs[27:] == 0)
    env.action_space.seed(5)
    steps, truncated = 0, False
    while not truncated:
        obs, r, terminated, truncated, _ = env.step(env.action_space.sample())
        assert obs.dtype == np.float32 and env.observation_space.contains(obs) and not terminated
        assert abs(r - float(pipeline.reward(None, None, obs))) <= 2.5e-7
        steps += 1
    assert steps == 30
    np.testing.assert_array_equal(pipeline.make_env().reset(seed=5)[0], env.reset(seed=5)[0])
    with pytest.raises(ValueError):
        pipeline.make_env(mode="eval")


def test_delay_and_clip():
    # A push at the gate reaches the outlet 19 steps later; the gate's flow stays in [0, 200].
    env = pipeline.PipelineEnv()
    obs, _ = env.reset(seed=1)
    start = obs[0]
    flows = [env.step(np.float32([1.0]))[0][0] for _ in range(21)]
    assert np.all(np.float32(flows[:19]) == start) and flows[19] == np.float32(start + 1)
    low = np.zeros(52, np.float32)
    low[0] = low[2:27] = 0.5
    env.set_state_from_obs(low)
    for _ in range(25):
        obs = env.step(np.float32([-1.0]))[0]
    assert obs[0] == 0.0


def test_is_a_gymnasium_env():
    assert isinstance(pipeline.make_env(), gym.wrappers.TimeLimit)
    assert len(pipeline.OBS_NAMES) == 52 == len(pipeline.OBS_LOW) == len(pipeline.OBS_HIGH)
    assert pipeline.ACT_NAMES == ("gate_change",) and pipeline.CONTROL_HZ is None
