"""COMBO (`mbrl.agents.combo`): its penalty recomputed in numpy over the rows it names (the soft maximum over the model
rows or every row, Q at the data's action over the real rows only), a few updates lowering the critic loss, its
presets and the combinations it refuses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl import config as config_io
from mbrl.agents import registry
from mbrl.agents.cql import CQLState
from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions
from batches import random_batch

OBS_DIM, ACT_DIM, BATCH, REAL = 3, 2, 8, 2  # real_ratio 0.25: 2 real rows, then 6 model rows


def mixed_batch(seed: int = 0, terminal: bool = False) -> Transitions:
    return random_batch(seed, BATCH, OBS_DIM, ACT_DIM, terminal)


def tiny(rho_s: str, **cql):
    """(agent, config, hypers, jitted update_many, initial state) of COMBO on tiny networks."""
    config = config_io.build("combo", "hopper-medium", "quick", {
        "sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": BATCH},
        "cql": {"num_samples": 3, **cql}, "combo": {"rho_s": rho_s}, "imagination": {"real_ratio": REAL / BATCH}})
    agent = registry.make(config, OBS_DIM, ACT_DIM)
    hypers = registry.entry("combo").hypers_of(config)
    return agent, config, hypers, jax.jit(agent.update_many), agent.init(jax.random.PRNGKey(1), hypers)


@pytest.fixture(scope="module", params=["model", "mix"])
def combo(request):
    return tiny(request.param)


def inner_hypers(hypers, cql_alpha=1.0):
    return dict(hypers["sac"], cql=dict(hypers["cql"], cql_alpha=jnp.float32(cql_alpha), bc_phase=jnp.asarray(False)))


def _logsumexp(x, temperature):
    return temperature * np.log(np.sum(np.exp(np.asarray(x, np.float64) / temperature)))


def test_the_penalty_pushes_down_on_rho_s_and_up_on_the_real_rows_only(combo):
    agent, config, hypers, _, state = combo
    core, batch, key = agent.core, mixed_batch(1), jax.random.PRNGKey(5)
    inner = inner_hypers(hypers)
    loss, metrics = core.critic_loss(state.critic_params, state, batch, key, inner)
    td_key, sample_key = jax.random.split(key)
    td, _ = core.td_loss(state.critic_params, state, batch, td_key, inner)

    pushed = np.arange(BATCH) if config.combo.rho_s == "mix" else np.arange(REAL, BATCH)
    rows = jax.tree.map(lambda x: x[pushed], batch)
    s = jax.tree.map(np.asarray, core.sample_actions(state.actor_params, rows, sample_key))
    assert s.uniform.shape == (len(pushed), 3, ACT_DIM)
    obs = np.asarray(rows.obs)

    def q_of(b, actions):  # every critic's Q at pushed row b for each action: (2, M)
        repeated = np.repeat(obs[b:b + 1], len(actions), axis=0)
        return np.asarray(agent.critic_values(state, jnp.asarray(repeated), jnp.asarray(actions)), np.float64)

    q_real = np.asarray(agent.critic_values(state, batch.obs[:REAL], batch.action[:REAL]), np.float64)
    gaps = []
    for i in range(2):
        soft_max = []
        for b in range(len(pushed)):
            values = list(q_of(b, s.uniform[b])[i] + ACT_DIM * np.log(2.0))  # less log 0.5^|A|
            values += list(q_of(b, s.policy[b])[i] - s.policy_logp[b])
            values += list(q_of(b, s.next_policy[b])[i] - s.next_policy_logp[b])
            soft_max.append(_logsumexp(values, config.cql.cql_temperature))
        gaps.append(np.mean(soft_max) - np.mean(q_real[i]))
    expected = config.cql.cql_weight * sum(gaps)
    np.testing.assert_allclose(float(loss - td), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(metrics["cql_gap"]), np.mean(gaps), rtol=1e-4, atol=1e-4)


def test_a_few_updates_on_one_batch_lower_the_critic_loss(combo):
    agent, _, hypers, update_many, state = combo
    batch = mixed_batch(4, terminal=True)
    inner, key = inner_hypers(hypers), jax.random.PRNGKey(0)

    @jax.jit
    def loss(critic_params):
        return agent.core.critic_loss(critic_params, state, batch, key, inner)[0]

    batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (10, *x.shape)), batch)
    before = float(loss(state.critic_params))
    new_state, metrics = update_many(state, batches, jax.random.PRNGKey(2), hypers)
    assert isinstance(new_state, CQLState)
    assert float(loss(new_state.critic_params)) < before
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((new_state, metrics)))


def test_the_presets_take_the_published_horizon_weight_and_rho_s():
    dmsd = config_io.build("combo", "dmsd", "quick", {})
    assert (dmsd.imagination.horizon, dmsd.cql.cql_weight, dmsd.combo.rho_s) == (1, 2.5, "mix")
    sim = config_io.build("combo", "simglucose", "quick", {})
    assert (sim.imagination.horizon, sim.cql.cql_weight, sim.combo.rho_s) == (5, 2.5, "model")
    hopper = config_io.build("combo", "hopper-medium", "paper", {})
    assert (hopper.imagination.horizon, hopper.cql.cql_weight, hopper.imagination.real_ratio) == (5, 5.0, 0.5)
    assert hopper.schedule.epochs * hopper.schedule.updates_per_epoch == 1_000_000


@pytest.mark.parametrize("overrides, field", [
    ({"imagination": {"real_ratio": 0.0}}, "imagination.real_ratio"),
    ({"imagination": {"real_ratio": 1.0}, "combo": {"rho_s": "model"}}, "combo.rho_s"),
    ({"cql": {"min_q_version": 2}}, "cql.min_q_version"),
    ({"cql": {"policy_bc_steps": 10}}, "cql.policy_bc_steps"),
    ({"combo": {"rho_s": "real"}}, "combo.rho_s"),
])
def test_combinations_it_cannot_run_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config_io.build("combo", "hopper-medium", "quick", overrides)
