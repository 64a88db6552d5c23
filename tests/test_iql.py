"""IQL (`mbrl.agents.iql`): the expectile loss and the advantage weights against their closed forms, the value and
actor losses on real networks against numpy, the actor's cosine, a few updates lowering each loss on one batch, the
held-out TD error in the data's reward units, and acting."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl import config as config_io
from mbrl.agents import registry
from mbrl.agents.iql import IQLState, advantage_weights, expectile_loss
from mbrl.core.types import PolicyInput, Transitions
from batches import random_batch

OBS_DIM, ACT_DIM, BATCH = 4, 2, 8
UPDATES = 40  # the run's updates: the cosine's length


def small_batch(seed: int = 0, terminal: bool = False) -> Transitions:
    return random_batch(seed, BATCH, OBS_DIM, ACT_DIM, terminal, action_bound=1.0)


@pytest.fixture(scope="module")
def tiny():
    """(agent, config, hypers, jitted update_many, initial state) of IQL on tiny networks, rewards scaled by 2."""
    config = config_io.build("iql", "hopper-medium", "quick", {
        "iql": {"hidden_sizes": [16, 16], "batch_size": BATCH, "reward_scale": 2.0},
        "schedule": {"epochs": 4, "updates_per_epoch": UPDATES // 4}})
    agent = registry.make(config, OBS_DIM, ACT_DIM)
    hypers = registry.entry("iql").hypers_of(config)
    return agent, config, hypers, jax.jit(agent.update_many), agent.init(jax.random.PRNGKey(1), hypers)


def updates(tiny, batch, count, state=None):
    agent, _, hypers, update_many, initial = tiny
    batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (count, *x.shape)), batch)
    return update_many(initial if state is None else state, batches, jax.random.PRNGKey(2), hypers)


# -------------------------------------------------------------------------------------------------
# Closed forms


@pytest.mark.parametrize("expectile", [0.5, 0.7, 0.9])
def test_the_expectile_loss_is_its_closed_form(expectile):
    u = np.array([-2.0, -0.5, -1e-3, 0.0, 0.3, 1.5, 4.0])
    expected = np.mean(np.abs(expectile - (u < 0)) * u**2)
    np.testing.assert_allclose(float(jnp.mean(expectile_loss(jnp.asarray(u, jnp.float32), expectile))), expected,
                               rtol=1e-6)


def test_the_advantage_weights_are_exp_beta_advantage_clipped_at_the_maximum():
    q, v = np.array([0.0, 1.0, 2.0, 10.0, -3.0]), np.array([0.5, 1.0, 0.0, 0.0, -1.0])
    expected = np.minimum(np.exp(3.0 * (q - v)), 100.0)
    np.testing.assert_allclose(np.asarray(advantage_weights(jnp.asarray(q), jnp.asarray(v), 3.0, 100.0)), expected,
                               rtol=1e-6)
    assert expected[3] == 100.0  # the clip is exercised


# -------------------------------------------------------------------------------------------------
# The losses on real networks against numpy


def test_the_value_loss_is_the_expectile_of_the_target_critics_min_over_v(tiny):
    agent, config, hypers, _, state = tiny
    batch = small_batch(1)
    q = np.min(np.asarray(agent.critic.apply(state.target_critic_params, batch.obs, batch.action), np.float64), axis=0)
    v = np.asarray(agent.value.apply(state.value_params, batch.obs), np.float64)
    u, tau = q - v, config.iql.expectile
    expected = np.mean(np.where(u < 0, 1 - tau, tau) * u**2)
    loss, _ = agent.value_loss(state.value_params, state.target_critic_params, batch, hypers["iql"])
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_the_actor_loss_is_the_advantage_weighted_gaussian_log_likelihood(tiny):
    agent, config, hypers, _, state = tiny
    batch = small_batch(2)
    q = np.min(np.asarray(agent.critic.apply(state.target_critic_params, batch.obs, batch.action), np.float64), axis=0)
    v = np.asarray(agent.value.apply(state.value_params, batch.obs), np.float64)
    weights = np.minimum(np.exp(config.iql.beta * (q - v)), config.iql.max_weight)
    mean, log_std = (np.asarray(x, np.float64) for x in agent.actor.apply(state.actor_params, batch.obs))
    a = np.asarray(batch.action, np.float64)
    log_likelihood = np.sum(-0.5 * ((a - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)
    loss, _ = agent.actor_loss(state.actor_params, state.target_critic_params, state.value_params, batch, hypers["iql"])
    np.testing.assert_allclose(float(loss), -np.mean(weights * log_likelihood), rtol=1e-5)


def test_the_heldout_td_error_is_measured_in_the_datas_reward_units(tiny):
    agent, _, hypers, _, state = tiny
    batch = small_batch(3, terminal=True)  # the target is the reward
    q = np.asarray(agent.critic_values(state, batch.obs, batch.action), np.float64)  # Q / reward_scale
    expected = np.mean((q - np.asarray(batch.reward)[None]) ** 2)
    np.testing.assert_allclose(float(agent.heldout_td_error(state, batch, jax.random.PRNGKey(0), hypers)), expected,
                               rtol=1e-5)


# -------------------------------------------------------------------------------------------------
# The updates


def test_a_few_updates_on_one_batch_lower_each_loss(tiny):
    # Each loss as a function of its own network, the others held at the initial state's; every row terminal, so the
    # critics' target is the reward alone.
    agent, _, hypers, _, state = tiny
    batch, h = small_batch(4, terminal=True), hypers["iql"]
    losses = {
        "value": (jax.jit(lambda p: agent.value_loss(p, state.target_critic_params, batch, h)[0]), "value_params"),
        "actor": (jax.jit(lambda p: agent.actor_loss(p, state.target_critic_params, state.value_params, batch, h)[0]),
                  "actor_params"),
        "critic": (jax.jit(lambda p: agent.critic_loss(p, state.value_params, batch, h)[0]), "critic_params"),
    }
    new_state, metrics = updates(tiny, batch, 10)
    assert isinstance(new_state, IQLState) and int(new_state.step) == 10
    for name, (loss, field) in losses.items():
        before, after = float(loss(getattr(state, field))), float(loss(getattr(new_state, field)))
        assert after < before, (name, before, after)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((new_state, metrics)))


def test_the_actor_learning_rate_follows_a_cosine_to_zero_over_the_run(tiny):
    agent, config, _, _, state = tiny
    steps = np.array([0, 5, 10, 20, 30, 40, 55])
    expected = 0.5 * (1 + np.cos(np.pi * np.minimum(steps, UPDATES) / UPDATES))
    np.testing.assert_allclose([float(agent.actor_lr_factor(jnp.asarray(s))) for s in steps], expected, atol=1e-6)
    # At the cosine's end the actor no longer moves; the critics and V still do.
    late = state.replace(step=jnp.asarray(UPDATES, jnp.int32))
    new_state, _ = updates(tiny, small_batch(5), 1, late)
    unchanged = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))  # noqa: E731
    assert unchanged(state.actor_params, new_state.actor_params)
    assert not unchanged(state.critic_params, new_state.critic_params)
    assert not unchanged(state.value_params, new_state.value_params)


def test_act_gives_the_mean_or_a_clipped_sample_in_the_unit_box(tiny):
    agent, _, _, _, state = tiny
    obs = small_batch(6).obs
    inputs = PolicyInput(obs=obs, prev_action=jnp.zeros((BATCH, ACT_DIM)), prev_reward=jnp.zeros(BATCH),
                         first=jnp.ones(BATCH, bool))
    mean, _ = agent.actor.apply(state.actor_params, obs)
    deterministic, carry = agent.act(state.actor_params, (), inputs, jax.random.PRNGKey(0), True)
    np.testing.assert_array_equal(np.asarray(deterministic), np.asarray(mean))
    sampled, _ = agent.act(state.actor_params, (), inputs, jax.random.PRNGKey(0), False)
    assert carry == () and bool(jnp.all(jnp.abs(sampled) <= 1.0)) and not np.allclose(sampled, deterministic)
