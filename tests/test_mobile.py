"""MOBILE (`mbrl.agents.mobile`): its penalty against a numpy loop over the next states sampled from each elite, the
critic loss as SAC-N's on rewards penalised on the model rows only, the clamped target, a few updates lowering the
loss, the world model reaching the updates in training, its presets and refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl import config as config_io
from mbrl.agents import registry
from mbrl.agents.mobile import bellman_spread
from mbrl.agents.sac_n import SACN
from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble, init_params
from mbrl.world_models.model import Normalizer, WorldModel
from batches import random_batch

OBS, ACT, BATCH, REAL, SAMPLES = 3, 2, 8, 2, 4


def world_model() -> WorldModel:
    """A real 4-member ensemble with fresh weights and wide stds; its elites are members 0, 2 and 3."""
    config = EnsembleConfig(num_members=4, num_elites=3, hidden_dims=(16, 16))
    params = init_params(GaussianEnsemble(config, OBS + 1), jax.random.PRNGKey(7), OBS + ACT)
    return WorldModel(params=params, input_norm=Normalizer(jnp.zeros(OBS + ACT), jnp.ones(OBS + ACT)),
                      target_norm=Normalizer(jnp.zeros(OBS + 1), jnp.full(OBS + 1, 0.5)),
                      elites=jnp.asarray([0, 2, 3], jnp.int32), config=config, obs_dim=OBS, act_dim=ACT)


def mixed_batch(seed: int = 0, terminal: bool = False, reward_shift: float = 0.0) -> Transitions:
    return random_batch(seed, BATCH, OBS, ACT, terminal, reward_shift=reward_shift)


@pytest.fixture(scope="module")
def mobile():
    config = config_io.build("mobile", "hopper-medium", "quick", {
        "sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": BATCH},
        "mobile": {"num_samples": SAMPLES, "penalty_coef": 2.0}, "imagination": {"real_ratio": REAL / BATCH}})
    agent = registry.make(config, OBS, ACT)
    hypers = registry.entry("mobile").hypers_of(config)
    return agent, config, hypers, agent.init(jax.random.PRNGKey(1), hypers)


def inner(hypers, model):
    return dict(hypers["sac"], mobile=hypers["mobile"], model=model)


def test_the_spread_is_the_unbiased_std_over_members_of_the_mean_over_samples():
    values = np.arange(24, dtype=np.float64).reshape(2, 3, 4) ** 1.5  # (samples, members, rows)
    expected = [np.std([values[:, m, b].mean() for m in range(3)], ddof=1) for b in range(4)]
    np.testing.assert_allclose(np.asarray(bellman_spread(jnp.asarray(values, jnp.float32))), expected, rtol=1e-5)


def test_the_penalty_is_the_spread_of_the_next_state_values_over_the_elites(mobile):
    agent, _, _, state = mobile
    core, model, batch, key = agent.core, world_model(), mixed_batch(1), jax.random.PRNGKey(4)
    values = np.asarray(core.next_state_values(state, model, batch.obs, batch.action, key), np.float64)
    assert values.shape == (SAMPLES, 3, BATCH)

    # The loop: each elite's Gaussian in raw units (mean Δobs + obs, std), the same standard-normal draws, the policy's
    # action at each next state, the min over the critics (equal to the targets at init), one (s', a') at a time.
    noise_key, action_key = jax.random.split(key)
    means, stds = (np.asarray(x, np.float64) for x in model.member_predictions(batch.obs, batch.action))
    noise = np.asarray(jax.random.normal(noise_key, (SAMPLES, 3, BATCH, OBS)), np.float64)
    obs = np.asarray(batch.obs, np.float64)
    next_obs = np.empty((SAMPLES, 3, BATCH, OBS))
    for j in range(SAMPLES):
        for i, m in enumerate((0, 2, 3)):
            for b in range(BATCH):
                next_obs[j, i, b] = obs[b] + means[m, b, :OBS] + noise[j, i, b] * stds[m, b, :OBS]
    actions = np.asarray(core.sample(state.actor_params, jnp.asarray(next_obs.reshape(-1, OBS), jnp.float32),
                                     action_key)[0]).reshape(SAMPLES, 3, BATCH, ACT)
    for j in range(SAMPLES):
        for i in range(3):
            for b in range(BATCH):
                q = agent.critic_values(state, jnp.asarray(next_obs[j, i, b][None], jnp.float32),
                                        jnp.asarray(actions[j, i, b][None], jnp.float32))
                np.testing.assert_allclose(values[j, i, b], float(jnp.min(q)), rtol=1e-4, atol=1e-4)
    spread = [np.std(values[:, :, b].mean(axis=0), ddof=1) for b in range(BATCH)]
    assert min(spread) > 1e-4  # the members disagree, so the penalty is not trivially 0


def test_the_critic_loss_is_sac_n_on_rewards_penalised_on_the_model_rows_only(mobile):
    agent, config, hypers, state = mobile
    core, model, batch, key = agent.core, world_model(), mixed_batch(2, reward_shift=5.0), jax.random.PRNGKey(6)
    loss, metrics = core.critic_loss(state.critic_params, state, batch, key, inner(hypers, model))
    penalty_key, td_key = jax.random.split(key)
    values = core.next_state_values(state, model, batch.obs[REAL:], batch.action[REAL:], penalty_key)
    penalty = np.std(np.asarray(values, np.float64).mean(axis=0), axis=0, ddof=1)
    reward = np.asarray(batch.reward, np.float64).copy()
    reward[REAL:] -= config.mobile.penalty_coef * penalty  # the real rows keep their reward
    expected, _ = SACN.critic_loss(core, state.critic_params, state,
                                   batch.replace(reward=jnp.asarray(reward, jnp.float32)), td_key, hypers["sac"])
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["mobile_penalty"]), penalty.mean(), rtol=1e-4)


def test_the_target_is_clamped_at_zero(mobile):
    agent, _, hypers, state = mobile
    batch = mixed_batch(3, terminal=True, reward_shift=-10.0)  # terminal: the target is the (negative) reward
    target = agent.core.td_target(state, batch, jax.random.PRNGKey(0), hypers["sac"])
    np.testing.assert_array_equal(np.asarray(target), np.zeros(BATCH))


def test_a_few_updates_on_one_batch_lower_the_critic_loss(mobile):
    agent, _, hypers, state = mobile
    model, batch = world_model(), mixed_batch(4, terminal=True, reward_shift=3.0)
    key = jax.random.PRNGKey(0)

    @jax.jit
    def loss(critic_params):
        return agent.core.critic_loss(critic_params, state, batch, key, inner(hypers, model))[0]

    batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (10, *x.shape)), batch)
    before = float(loss(state.critic_params))
    new_state, metrics = jax.jit(agent.update_many)(state, batches, jax.random.PRNGKey(2), hypers, model)
    assert float(loss(new_state.critic_params)) < before
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((new_state, metrics)))


def test_an_update_without_the_world_model_is_refused(mobile):
    agent, _, hypers, state = mobile
    batches = jax.tree.map(lambda x: x[None], mixed_batch(0))
    with pytest.raises(ConfigError, match="world model"):
        agent.update_many(state, batches, jax.random.PRNGKey(0), hypers)


def test_the_presets_take_the_published_horizon_and_penalty():
    dmsd = config_io.build("mobile", "dmsd", "quick", {})
    assert (dmsd.imagination.horizon, dmsd.mobile.penalty_coef, dmsd.imagination.real_ratio) == (1, 0.5, 0.05)
    cheetah = config_io.build("mobile", "safetyhalfcheetah", "paper", {})
    assert (cheetah.imagination.horizon, cheetah.mobile.penalty_coef) == (5, 0.5)
    assert cheetah.schedule.epochs * cheetah.schedule.updates_per_epoch == 3_000_000
    assert config_io.build("mobile", "walker2d-medium", "paper", {}).imagination.horizon == 5


@pytest.mark.parametrize("overrides, field", [
    ({"imagination": {"real_ratio": 1.0}}, "imagination.real_ratio"),
    ({"mobile": {"num_samples": 0}}, "mobile.num_samples"),
    ({"mobile": {"penalty_coef": -1.0}}, "mobile.penalty_coef"),
    ({"ensemble": {"num_elites": 1}}, "ensemble.num_elites"),
])
def test_combinations_it_cannot_run_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config_io.build("mobile", "hopper-medium", "quick", overrides)
