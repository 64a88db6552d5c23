"""CQL (`mbrl.agents.cql`): its penalty against a log-sum-exp computed by hand, the critic loss as TD plus that
penalty, the Lagrange multiplier's direction, the BC warm start, a few updates lowering the critic loss, the held-out
TD error without the penalty, and fine-tuning's learner on a CQL state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl import config as config_io
from mbrl.agents import registry
from mbrl.agents.base import OnlineSettings
from mbrl.agents.cql import ActionSamples, CQLState, conservative_gap
from mbrl.core.tanh_gaussian import sample_tanh_gaussian, tanh_gaussian_log_prob
from mbrl.core.types import Transitions
from batches import random_batch

OBS_DIM, ACT_DIM, BATCH = 4, 2, 6


def small_batch(seed: int = 0, terminal: bool = False) -> Transitions:
    return random_batch(seed, BATCH, OBS_DIM, ACT_DIM, terminal)


def tiny(**cql):
    """(agent, config, hypers, jitted update_many, initial state) of CQL on tiny networks, with `cql` overrides."""
    cql = {"num_samples": 3, "policy_bc_steps": 0, **cql}
    config = config_io.build("cql", "hopper-medium", "quick", {
        "sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": BATCH}, "cql": cql})
    agent = registry.make(config, OBS_DIM, ACT_DIM)
    hypers = registry.entry("cql").hypers_of(config)
    return agent, config, hypers, jax.jit(agent.update_many), agent.init(jax.random.PRNGKey(1), hypers)


@pytest.fixture(scope="module")
def plain():
    return tiny()


@pytest.fixture(scope="module")
def lagrange():
    return tiny(with_lagrange=True)


def inner_hypers(hypers, cql_alpha=1.0, bc_phase=False):
    """What the core's losses see: the `sac` values with `cql` beside them (`CQLCore.update`)."""
    return dict(hypers["sac"], cql=dict(hypers["cql"], cql_alpha=jnp.float32(cql_alpha), bc_phase=jnp.asarray(bc_phase)))


def updates(agent_fixture, batch, count, hypers=None, state=None):
    agent, _, default, update_many, initial = agent_fixture
    batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (count, *x.shape)), batch)
    return update_many(initial if state is None else state, batches, jax.random.PRNGKey(2),
                       default if hypers is None else hypers)


# -------------------------------------------------------------------------------------------------
# The penalty against a hand computation


def _logsumexp(x, temperature):
    return temperature * np.log(np.sum(np.exp(np.asarray(x, np.float64) / temperature)))


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_the_gap_is_the_log_sum_exp_over_the_sampled_actions_less_q_at_the_data(version, temperature):
    # One state, two critics whose Q is a known function of the action: Q_i(a) = c_i (a_0 + 2 a_1) + d_i.
    c, d = np.array([1.5, -0.5]), np.array([0.2, 1.0])

    def q(a):  # (M, 2) -> (2, M); one action (2,) -> (2,)
        a = np.asarray(a, np.float64)
        return np.multiply.outer(c, a[..., 0] + 2.0 * a[..., 1]) + d.reshape(2, *[1] * (a.ndim - 1))

    def q_at(actions):  # (1, M, 2) -> (2, 1, M)
        return jnp.asarray(q(np.asarray(actions)[0]), jnp.float32)[:, None, :]

    uniform = np.array([[0.5, -0.25], [-1.0, 0.75]])
    policy, policy_logp = np.array([[0.1, 0.2], [0.3, -0.4]]), np.array([-1.2, 0.4])
    next_policy, next_logp = np.array([[-0.6, 0.0], [0.9, 0.9]]), np.array([0.7, -2.0])
    data = np.array([0.25, -0.5])
    samples = ActionSamples(*(jnp.asarray(x, jnp.float32)[None] for x in (uniform, policy, policy_logp, next_policy,
                                                                           next_logp)))
    gap = conservative_gap(q_at, jnp.asarray(q(data[None]), jnp.float32), samples, temperature, version)

    for i in range(2):
        if version == 3:  # each sample less its log-density: U(-1, 1)^2 has density 1/4 everywhere
            values = [q(u)[i] - np.log(0.25) for u in uniform]
            values += [q(a)[i] - lp for a, lp in zip(policy, policy_logp)]
            values += [q(a)[i] - lp for a, lp in zip(next_policy, next_logp)]
        else:  # the raw values, Q at the data's action among them
            values = [q(a)[i] for a in (*uniform, data, *policy, *next_policy)]
        assert len(values) == (6 if version == 3 else 7)
        np.testing.assert_allclose(float(gap[i]), _logsumexp(values, temperature) - q(data)[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["plain", "lagrange"])
def test_the_critic_loss_is_the_td_loss_plus_the_weighted_penalty_of_every_critic(kind, request):
    agent, config, hypers, _, state = request.getfixturevalue(kind)
    core, batch, key = agent.core, small_batch(1), jax.random.PRNGKey(5)
    inner = inner_hypers(hypers, cql_alpha=1.7)
    loss, metrics = core.critic_loss(state.critic_params, state, batch, key, inner)
    td_key, sample_key = jax.random.split(key)
    td, _ = core.td_loss(state.critic_params, state, batch, td_key, inner)

    # The penalty recomputed in numpy from the critics' values (`critic_values`) at the sampler's actions.
    s = jax.tree.map(np.asarray, core.sample_actions(state.actor_params, batch, sample_key))
    obs = np.asarray(batch.obs)

    def q_of(b, actions):  # every critic's Q at state b for each action: (2, M)
        rows = np.repeat(obs[b:b + 1], len(actions), axis=0)
        return np.asarray(agent.critic_values(state, jnp.asarray(rows), jnp.asarray(actions)), np.float64)

    q_data = np.asarray(agent.critic_values(state, batch.obs, batch.action), np.float64)
    gaps = []
    for i in range(2):
        per_state = []
        for b in range(BATCH):
            values = list(q_of(b, s.uniform[b])[i] + ACT_DIM * np.log(2.0))  # less log 0.5^|A|
            values += list(q_of(b, s.policy[b])[i] - s.policy_logp[b])
            values += list(q_of(b, s.next_policy[b])[i] - s.next_policy_logp[b])
            per_state.append(_logsumexp(values, config.cql.cql_temperature))
        gaps.append(np.mean(per_state) - np.mean(q_data[i]))
    w, tau = config.cql.cql_weight, config.cql.lagrange_threshold
    expected = 1.7 * sum(w * g - tau for g in gaps) if config.cql.with_lagrange else w * sum(gaps)
    np.testing.assert_allclose(float(loss - td), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(metrics["cql_penalty"]), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(metrics["cql_gap"]), np.mean(gaps), rtol=1e-4, atol=1e-4)


def test_a_zero_weight_leaves_plain_sac_n():
    agent, _, hypers, _, state = tiny(cql_weight=0.0)
    batch, key = small_batch(1), jax.random.PRNGKey(5)
    loss, metrics = agent.core.critic_loss(state.critic_params, state, batch, key, inner_hypers(hypers))
    td, _ = agent.core.td_loss(state.critic_params, state, batch, jax.random.split(key)[0], inner_hypers(hypers))
    assert float(loss) == float(td) and "cql_penalty" not in metrics


# -------------------------------------------------------------------------------------------------
# The Lagrange multiplier


@pytest.mark.parametrize("threshold, direction", [(1e6, -1.0), (-1e6, 1.0)])
def test_the_multiplier_rises_while_the_weighted_gap_exceeds_the_threshold_and_falls_below_it(threshold, direction,
                                                                                              lagrange):
    fixture = lagrange
    _, config, hypers, _, state = fixture
    changed = {**hypers, "cql": {**hypers["cql"], "lagrange_threshold": jnp.float32(threshold)}}
    new_state, metrics = updates(fixture, small_batch(1), 1, changed)
    # Adam's first step moves log alpha' by its learning rate, against the sign of -(w * gap - tau).
    step = float(new_state.cql_log_alpha - state.cql_log_alpha)
    np.testing.assert_allclose(step, direction * config.cql.cql_alpha_lr, rtol=1e-3)
    assert float(metrics["cql_alpha"]) == 1.0  # the updates used alpha' = 1 (log alpha' = 0), as the references start


def test_without_lagrange_the_multiplier_stays_put(plain):
    new_state, metrics = updates(plain, small_batch(1), 3)
    assert float(new_state.cql_log_alpha) == 0.0 and "cql_alpha" not in metrics


# -------------------------------------------------------------------------------------------------
# The actor's warm start and the updates


def test_during_the_warm_start_the_actor_clones_the_data():
    agent, _, hypers, _, state = tiny(policy_bc_steps=5)
    core, batch, key = agent.core, small_batch(3), jax.random.PRNGKey(7)
    args = (state.actor_params, state.critic_params, state.log_alpha, batch, key)
    sac, _ = core.actor_loss(*args, inner_hypers(hypers, bc_phase=False))
    bc, (logp, _) = core.actor_loss(*args, inner_hypers(hypers, bc_phase=True))
    mean, log_std = core.actor.apply(state.actor_params, batch.obs)
    sampled_logp = sample_tanh_gaussian(mean, log_std, key)[1]
    alpha = float(jnp.exp(state.log_alpha))
    expected = np.mean(alpha * np.asarray(sampled_logp) - np.asarray(tanh_gaussian_log_prob(mean, log_std, batch.action)))
    np.testing.assert_allclose(float(bc), expected, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(sampled_logp), rtol=1e-6)
    assert abs(float(sac) - float(bc)) > 1e-3


@pytest.mark.parametrize("kind", ["plain", "lagrange"])
def test_a_few_updates_on_one_batch_lower_the_critic_loss(kind, request):
    # Every row terminal: the TD target is the reward; the penalty's samples are held fixed by the key and the initial
    # actor, so the loss is a function of the critics alone.
    fixture = request.getfixturevalue(kind)
    agent, _, hypers, _, state = fixture
    batch = small_batch(4, terminal=True)
    inner, key = inner_hypers(hypers), jax.random.PRNGKey(0)

    @jax.jit
    def loss(critic_params):
        return agent.core.critic_loss(critic_params, state, batch, key, inner)[0]

    new_state, metrics = updates(fixture, batch, 10)
    assert isinstance(new_state, CQLState)
    assert float(loss(new_state.critic_params)) < float(loss(state.critic_params))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((new_state, metrics)))


# -------------------------------------------------------------------------------------------------
# Capabilities


def test_the_heldout_td_error_is_the_critics_mean_squared_td_error_without_the_penalty(plain):
    agent, _, hypers, _, state = plain
    batch = small_batch(5, terminal=True)  # the target is the reward
    q = np.asarray(agent.critic_values(state, batch.obs, batch.action), np.float64)
    expected = np.mean((q - np.asarray(batch.reward)[None]) ** 2)
    heavier = {**hypers, "cql": {**hypers["cql"], "cql_weight": jnp.float32(50.0)}}
    for h in (hypers, heavier):
        np.testing.assert_allclose(float(agent.heldout_td_error(state, batch, jax.random.PRNGKey(0), h)), expected,
                                   rtol=1e-5)


def test_fine_tuning_runs_online_sac_on_a_cql_state(lagrange):
    agent = lagrange[0]
    offline, _ = updates(lagrange, small_batch(1), 2)
    log_alpha, step = float(offline.cql_log_alpha), int(offline.step)  # the state's buffers are donated to the chunk
    settings = OnlineSettings(anchor=0.0, capacity=20, warmup=0, chunk_steps=10, utd=1, retain_offline_ratio=0.0)
    learner = agent.online_learner(settings, None)
    state = learner.init(jax.random.PRNGKey(0)).replace(agent=offline)  # as mbrl.finetune puts the offline member in
    rows = small_batch(6)
    rows = jax.tree.map(lambda x: jnp.concatenate([x, x[:4]]), rows)  # 10 rows: one chunk
    new, metrics = learner.chunk(state, rows, 10, None, learner.core.hypers())
    assert isinstance(new.agent, CQLState) and metrics is not None and "cql_penalty" not in metrics
    assert float(new.agent.cql_log_alpha) == log_alpha != 0.0
    assert int(new.agent.step) == step + 10
