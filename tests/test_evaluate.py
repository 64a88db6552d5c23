"""Policy evaluation in the real MuJoCo env: lockstep batching, seeding, episode ends, normalized score."""

from __future__ import annotations

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl.envs.lockstep import markov
from mbrl.envs.tasks import TASKS
from mbrl.core.errors import ConfigError
from mbrl.core.types import PolicyInput
from mbrl.evaluate import EvalResult, evaluate, normalized_score

# A fixed linear-tanh hopper controller, written elementwise (no matmul) so each row's action is
# bit-identical whatever the batch size. Under it, hopper falls after 55-59 steps depending on the
# reset seed, so a limit of 57 steps ends some episodes by termination and others by truncation.
_W = np.array(
    [[0.9, 0.1, -0.7], [-0.9, -0.5, 0.2], [-1.0, -0.2, -0.2], [0.5, 0.2, 0.4]],
    dtype=np.float32,
)
LIMIT = 57
EPISODES = 8


def numpy_act(obs):
    obs = np.asarray(obs, np.float32)
    return np.tanh(obs[:, 2:5] * _W[0] + obs[:, 5:8] * _W[1] + obs[:, 8:11] * _W[2] + _W[3])


numpy_policy = markov(numpy_act)


def _single_env_episode(policy, env_id: str, seed: int, limit: int):
    """The plain loop evaluate() must reproduce: one env, one obs at a time."""
    env = gymnasium.make(env_id, max_episode_steps=limit)
    obs, _ = env.reset(seed=seed)
    total, steps = 0.0, 0
    while True:
        action = np.asarray(policy(np.asarray(obs, np.float32)[None]))[0]
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        steps += 1
        if terminated or truncated:
            env.close()
            return total, steps, bool(terminated)


@pytest.fixture(scope="module")
def reference():
    rows = [_single_env_episode(numpy_act, "Hopper-v5", 100 + i, LIMIT) for i in range(EPISODES)]
    returns, lengths, terminated = (np.asarray(col) for col in zip(*rows))
    return returns, lengths, terminated


def test_returns_and_lengths_match_a_single_env_loop(reference):
    returns, lengths, _ = reference
    result = evaluate(numpy_policy, "hopper", episodes=EPISODES, seed=100, env_kwargs={"max_episode_steps": LIMIT})
    assert isinstance(result, EvalResult)
    np.testing.assert_array_equal(result.returns, returns)
    np.testing.assert_array_equal(result.lengths, lengths)
    assert result.mean == pytest.approx(returns.mean(), rel=1e-12)
    assert result.std == pytest.approx(returns.std(), rel=1e-12)


def test_a_diverged_policys_episodes_return_nan_and_leave_the_others_as_in_a_plain_loop(reference):
    returns, _, _ = reference
    diverged = {1, 4}  # slots whose policy gives NaN from its first step, as a diverged population member's

    def act(obs):
        actions = numpy_act(obs)
        actions[sorted(diverged)] = np.nan
        return actions

    result = evaluate(markov(act), "hopper", episodes=EPISODES, seed=100, env_kwargs={"max_episode_steps": LIMIT})
    finite = [i for i in range(EPISODES) if i not in diverged]
    np.testing.assert_array_equal(result.returns[finite], returns[finite])
    assert np.isnan(result.returns[sorted(diverged)]).all() and np.isnan(result.mean)


def test_episode_lengths_stop_at_termination_or_truncation(reference):
    _, lengths, terminated = reference
    # the fixture's policy and seeds give both kinds of episode end
    assert terminated.any() and not terminated.all()
    assert np.all(lengths[terminated] <= LIMIT)
    assert np.all(lengths[~terminated] == LIMIT)
    assert (lengths[terminated] < LIMIT).any()

    calls = []

    def counting_policy(inputs):
        calls.append(np.asarray(inputs.obs).shape)
        return numpy_act(inputs.obs)

    result = evaluate(counting_policy, "Hopper-v5", episodes=EPISODES, seed=100, env_kwargs={"max_episode_steps": LIMIT})
    np.testing.assert_array_equal(result.lengths, lengths)
    # one batched call per time step until the longest episode ends, always the full padded batch
    assert len(calls) == lengths.max()
    assert set(calls) == {(EPISODES, TASKS["hopper"].obs_dim)}


@pytest.fixture(scope="module")
def jitted_policy():
    traces = []
    w = jnp.asarray(_W)

    @jax.jit
    def policy(obs):
        traces.append(obs.shape)  # runs only while tracing
        return jnp.tanh(obs[:, 2:5] * w[0] + obs[:, 5:8] * w[1] + obs[:, 8:11] * w[2] + w[3])

    return markov(policy), traces


def test_same_seed_gives_identical_results_and_a_jitted_policy_compiles_once(jitted_policy):
    policy, traces = jitted_policy
    kwargs = dict(episodes=6, env_kwargs={"max_episode_steps": LIMIT})
    first = evaluate(policy, TASKS["hopper"], seed=3, **kwargs)
    again = evaluate(policy, TASKS["hopper"], seed=3, **kwargs)
    other = evaluate(policy, TASKS["hopper"], seed=4, **kwargs)

    np.testing.assert_array_equal(first.returns, again.returns)
    np.testing.assert_array_equal(first.lengths, again.lengths)
    assert (first.mean, first.std, first.normalized_score) == (again.mean, again.std, again.normalized_score)
    assert not np.array_equal(first.returns, other.returns)
    # episodes of different lengths, yet one trace: finished rows are padded, the shape never changes
    assert len(set(first.lengths.tolist())) > 1
    assert traces == [(6, TASKS["hopper"].obs_dim)]
    # episode i is seeded with seed + i: seed 4's first episode is seed 3's second
    assert first.returns[1] == other.returns[0] and first.lengths[1] == other.lengths[0]


def test_normalized_score_formula():
    assert normalized_score(-20.272305, -20.272305, 3234.3) == pytest.approx(0.0)
    assert normalized_score(3234.3, -20.272305, 3234.3) == pytest.approx(100.0)
    np.testing.assert_allclose(normalized_score(np.array([0.0, 50.0]), -50.0, 150.0), [25.0, 50.0])


def test_normalized_score_uses_the_datasets_reference_then_d4rls():
    kwargs = dict(episodes=2, seed=0, env_kwargs={"max_episode_steps": 5})
    hopper = TASKS["hopper"]

    d4rl = evaluate(numpy_policy, "hopper", **kwargs)
    expected = 100.0 * (d4rl.mean - hopper.ref_min_score) / (hopper.ref_max_score - hopper.ref_min_score)
    assert d4rl.normalized_score == pytest.approx(expected, rel=1e-12)

    own = evaluate(numpy_policy, "hopper", ref_min_score=0.0, ref_max_score=2 * d4rl.mean, **kwargs)
    assert own.normalized_score == pytest.approx(50.0, rel=1e-12)


def test_an_env_outside_the_registry_has_no_normalized_score_unless_given_one():
    def pendulum_policy(inputs):
        return np.zeros((len(inputs.obs), 1), np.float32)

    kwargs = dict(episodes=3, seed=0, env_kwargs={"max_episode_steps": 7})
    plain = evaluate(pendulum_policy, "Pendulum-v1", **kwargs)
    assert plain.normalized_score is None
    np.testing.assert_array_equal(plain.lengths, [7, 7, 7])
    scored = evaluate(pendulum_policy, "Pendulum-v1", ref_min_score=-100.0, ref_max_score=0.0, **kwargs)
    assert scored.normalized_score == pytest.approx(100.0 * (plain.mean + 100.0) / 100.0)
    assert scored.to_dict()["returns"] == plain.returns.tolist()


@pytest.mark.parametrize(
    ("target", "kwargs", "fragment"),
    [
        ("hoper", {}, "unknown task 'hoper'"),
        ("NoSuchEnv-v0", {}, "NoSuchEnv-v0"),
        ("hopper", {"episodes": 0}, "episodes"),
        ("hopper", {"ref_min_score": 0.0}, "ref_max_score"),
        ("hopper", {"ref_min_score": 1.0, "ref_max_score": 1.0}, "must exceed"),
    ],
)
def test_bad_arguments_raise_config_errors(target, kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        evaluate(numpy_policy, target, **kwargs)


def test_a_policy_with_the_wrong_action_shape_is_refused():
    def wrong(inputs):
        return np.zeros((len(inputs.obs), 2), np.float32)

    with pytest.raises(ConfigError, match=r"shape \(2, 2\).*expected \(2, 3\)"):
        evaluate(wrong, "hopper", episodes=2, env_kwargs={"max_episode_steps": 3})


def test_a_recurrent_policy_sees_its_previous_action_and_reward_as_in_a_plain_loop():
    """A policy of (obs, previous action, previous reward, first step) scores what a single-env loop that
    feeds it those inputs scores: evaluate hands every row its own episode's history."""

    def recurrent(inputs: PolicyInput):
        base = numpy_act(inputs.obs)
        memory = np.where(inputs.first[:, None], 0.0, 0.5 * inputs.prev_action + 0.1 * inputs.prev_reward[:, None])
        return np.tanh(base + memory.astype(np.float32))

    returns, lengths = [], []
    for i in range(4):
        env = gymnasium.make("Hopper-v5", max_episode_steps=LIMIT)
        obs, _ = env.reset(seed=20 + i)
        prev_action, prev_reward, first, total, steps = np.zeros(3, np.float32), 0.0, True, 0.0, 0
        while True:
            inputs = PolicyInput(np.asarray(obs, np.float32)[None], prev_action[None],
                                 np.array([prev_reward], np.float32), np.array([first]))
            prev_action = recurrent(inputs)[0]
            obs, prev_reward, terminated, truncated, _ = env.step(prev_action)
            total, steps, first = total + float(prev_reward), steps + 1, False
            if terminated or truncated:
                break
        returns.append(total)
        lengths.append(steps)
    result = evaluate(recurrent, "hopper", episodes=4, seed=20, env_kwargs={"max_episode_steps": LIMIT})
    np.testing.assert_array_equal(result.returns, returns)
    np.testing.assert_array_equal(result.lengths, lengths)
    markov_only = evaluate(numpy_policy, "hopper", episodes=4, seed=20, env_kwargs={"max_episode_steps": LIMIT})
    assert not np.array_equal(markov_only.returns, result.returns)  # the memory changes what it does
