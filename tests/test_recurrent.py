"""RWM-U (`mbrl.world_models.recurrent`): on a system whose velocity the observation hides, the recurrent model reads
it from the history and forecasts far better than the MLP ensemble; its heads disagree off the data; it rolls
out through `mbrl.world_models.rollout` with its carry; it saves and loads; bad input is refused clearly."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl.core.errors import ConfigError, DatasetError, UserError
from mbrl.core.types import DatasetInfo, OfflineDataset, Transitions
from mbrl.world_models.ensemble import EnsembleConfig
from mbrl.world_models.fit import FitConfig, fit_world_model
from mbrl.world_models.fitting import model_inputs
from mbrl.world_models.metrics import history_holdout_metrics, open_loop_errors
from mbrl.world_models.recurrent import RecurrentConfig, RecurrentWorldModel
from mbrl.world_models.recurrent_fit import RecurrentFitConfig, fit_recurrent_model
from mbrl.world_models.registry import load_model
from mbrl.world_models.rollout import MarkovPolicy, RolloutConfig, rollout

EPISODES, LENGTH, FORECAST = 40, 50, 8
TINY_RWM = RecurrentConfig(num_heads=3, gru_layers=1, gru_hidden=24, head_hidden=(24,), history=4, forecast=FORECAST)
TINY_FIT = RecurrentFitConfig(batch_size=32, steps_per_epoch=100, max_epochs=5, patience=100, eval_episodes=4)


def oscillator(episodes=EPISODES, length=LENGTH, seed=0) -> OfflineDataset:
    """A 2-D linear oscillator driven by random forces, v' = v + 0.2 (a - x), x' = x + 0.2 v', observed through
    its position x only: the next position depends on a velocity that one observation does not show."""
    rng = np.random.default_rng(seed)
    obs, act, nxt = [], [], []
    for _ in range(episodes):
        x, v = rng.uniform(-1, 1, 2), rng.uniform(-1, 1, 2)
        for _ in range(length):
            a = rng.uniform(-1, 1, 2)
            v = v + 0.2 * (a - x)
            x_next = x + 0.2 * v
            obs.append(x)
            act.append(a)
            nxt.append(x_next)
            x = x_next
    obs, act, nxt = map(np.asarray, (obs, act, nxt))
    none = np.zeros(len(obs))
    transitions = Transitions.from_arrays(obs, act, -np.sum(nxt**2, axis=1), nxt, none, none)
    return OfflineDataset(transitions, np.arange(0, episodes * length, length), DatasetInfo("oscillator", "oscillator",
                                                                                              "d4rl-hdf5", None, 2, 2))


@pytest.fixture(scope="module")
def data():
    return oscillator()


@pytest.fixture(scope="module")
def rwm(data):
    return fit_recurrent_model(data, config=TINY_RWM, fit_config=TINY_FIT, progress=False).model


@pytest.fixture(scope="module")
def mlp(data):
    return fit_world_model(data, config=EnsembleConfig(num_members=3, num_elites=3, hidden_dims=(16, 16)),
                           fit_config=FitConfig(max_epochs=6, eval_episodes=4, batch_size=64), progress=False).model


def test_the_history_gives_a_forecast_three_times_better_than_the_mlp(data, rwm, mlp):
    episodes = rwm.info.eval_episodes
    assert episodes == mlp.info.eval_episodes and len(episodes) == 4  # the same episodes, unseen by both
    recurrent = open_loop_errors(rwm, data.transitions, data.episode_starts, episodes, horizons=(1, FORECAST))
    markov = open_loop_errors(mlp, data.transitions, data.episode_starts, episodes, horizons=(1, FORECAST),
                              history=TINY_RWM.history)
    (error, starts), (mlp_error, mlp_starts) = recurrent[FORECAST], markov[FORECAST]
    assert starts == mlp_starts == 4 * (LENGTH - TINY_RWM.history - FORECAST + 1)
    assert error * 3 <= mlp_error, (recurrent, markov)
    # The heads are fitted by NLL: their Gaussians cover the held-out steps about as a calibrated one would.
    metrics, count = history_holdout_metrics(rwm, data.transitions, data.episode_starts, rwm.info.holdout_episodes)
    assert count > 0 and np.all(metrics["coverage_2sigma"] > 0.8), metrics


def test_heads_disagree_more_off_the_data(data, rwm):
    t = data.transitions
    rows = np.arange(TINY_RWM.history, 400, 7)
    rows = rows[(rows % LENGTH) >= TINY_RWM.history]
    before = rows[:, None] - TINY_RWM.history + np.arange(TINY_RWM.history)[None, :]

    @jax.jit
    def uncertainty(obs_history, act_history, obs, act):
        carry = rwm.warm_up(obs_history, act_history)
        return rwm.step(jax.random.PRNGKey(0), obs, act, carry=carry, deterministic=True).uncertainty

    def u(scale):
        return uncertainty(jnp.asarray(t.obs[before] * scale), jnp.asarray(t.action[before]),
                           jnp.asarray(t.obs[rows] * scale), jnp.asarray(t.action[rows]))

    on_data, off_data = np.asarray(u(1.0)), np.asarray(u(8.0))
    assert np.all(np.isfinite(off_data))
    assert off_data.mean() > 2 * on_data.mean(), (on_data.mean(), off_data.mean())


def test_rollout_threads_the_carry_as_a_loop_of_steps(data, rwm):
    """`mbrl.world_models.rollout` with the model's warm-up carry equals stepping the model by hand."""
    t = data.transitions
    rows = np.asarray([10, 60, 130])
    before = rows[:, None] - TINY_RWM.history + np.arange(1, TINY_RWM.history + 1)[None, :]
    carry = rwm.warm_up(jnp.asarray(t.obs[before]), jnp.asarray(t.action[before]))
    start = jnp.asarray(t.next_obs[rows])
    policy = MarkovPolicy(lambda params, obs, key: jnp.tanh(obs @ params))
    params = jnp.asarray([[0.5, -0.2], [0.1, 0.3]], jnp.float32)
    cfg = RolloutConfig(member_mode="per_trajectory", uncertainty="epistemic_sum", deterministic=True)
    members = jnp.asarray([0, 2, 1])
    out = rollout(jax.random.PRNGKey(1), rwm, policy, params, start, 4, cfg, members=members, model_carry=carry)
    obs = start
    for step in range(4):
        action = jnp.tanh(obs @ params)
        result = rwm.step(jax.random.PRNGKey(0), obs, action, members, carry=carry, deterministic=True,
                          uncertainty="epistemic_sum")
        np.testing.assert_allclose(out.transitions.next_obs[step], result.next_obs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out.uncertainty[step], result.uncertainty, rtol=1e-5, atol=1e-6)
        obs, carry = result.next_obs, result.carry
    # Without the warm-up the model starts from an empty memory, and predicts otherwise.
    cold = rollout(jax.random.PRNGKey(1), rwm, policy, params, start, 4, cfg, members=members)
    assert not np.allclose(cold.transitions.next_obs[0], out.transitions.next_obs[0], atol=1e-4)


def test_save_and_load_give_the_same_predictions(data, rwm, tmp_path):
    path = rwm.save(tmp_path / "rwm")
    loaded = load_model(path)
    assert isinstance(loaded, RecurrentWorldModel) and loaded.config == rwm.config and loaded.info == rwm.info
    obs, act = jnp.asarray(data.transitions.obs[:5]), jnp.asarray(data.transitions.action[:5])
    a = rwm.member_predictions(obs, act, rwm.warm_up(obs[:, None], act[:, None]))
    b = loaded.member_predictions(obs, act, loaded.warm_up(obs[:, None], act[:, None]))
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a, b)

    meta = json.loads((path / "model.json").read_text())
    (path / "model.json").write_text(json.dumps({**meta, "format": "something-else"}))
    with pytest.raises(UserError, match=r"model\.json: field 'format' is 'something-else'; expected"):
        load_model(path)


def test_bad_input_is_refused_with_the_field(data):
    with pytest.raises(ConfigError, match=r"rwm\.history: expected a positive int, found 0"):
        RecurrentConfig(history=0)
    with pytest.raises(ConfigError, match=r"rwm_fit\.holdout_ratio: expected a value in \(0, 1\), found 1\.5"):
        RecurrentFitConfig(holdout_ratio=1.5)
    long_window = dataclasses.replace(TINY_RWM, history=40, forecast=20)
    with pytest.raises(DatasetError, match=r"oscillator: no training episode has 59 steps \(rwm\.history 40"):
        fit_recurrent_model(data, config=long_window, fit_config=TINY_FIT, progress=False)
    bad = data.transitions.slice(np.arange(len(data.transitions)))
    bad.obs[7, 1] = np.nan
    with pytest.raises(DatasetError, match="obs"):
        fit_recurrent_model(OfflineDataset(bad, data.episode_starts, data.info), config=TINY_RWM, fit_config=TINY_FIT,
                            progress=False)


def test_held_out_data_is_the_holdout_and_every_training_episode_is_fitted(data):
    """A dataset with a -val file (NeoRL-2): RWM-U fits every train episode; its holdout and eval episodes are the
    val file's."""
    train = dataclasses.replace(data, heldout=oscillator(episodes=20, seed=5))
    model = fit_recurrent_model(train, config=TINY_RWM, fit_config=dataclasses.replace(TINY_FIT, max_epochs=1),
                                progress=False).model
    info = model.info
    assert info.holdout_from == "heldout" and info.num_transitions == len(data.transitions)
    assert len(info.eval_episodes) == 2 and not set(info.eval_episodes) & set(info.holdout_episodes)  # a tenth of 20
    assert max(info.holdout_episodes + info.eval_episodes) < 20
    # The input normalizer is the train file's, every row of it: nothing was cut for the holdout.
    np.testing.assert_allclose(model.input_norm.mean, np.mean(model_inputs(data.transitions), axis=0), rtol=1e-5, atol=1e-6)
    held = train.heldout
    metrics, count = history_holdout_metrics(model, held.transitions, held.episode_starts, info.holdout_episodes)
    assert count > 0 and np.all(np.isfinite(metrics["mse"]))
