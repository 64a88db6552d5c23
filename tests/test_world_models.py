"""The dynamics ensemble: accuracy and calibration on a known system, early stopping, elites,
uncertainty measures, `WorldModel.step`, orbax round trip, and the `mbrl model` commands.

Compiles are the cost here, so one small ensemble is fitted once per module and every test that
fits again keeps the same shapes (the compiled epoch is then reused).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from mbrl.cli import main
from mbrl.core.errors import ConfigError, DatasetError, UserError
from mbrl.core.types import DatasetInfo, OfflineDataset, Transitions
from mbrl.datasets import SAMPLE_PATH
from mbrl.world_models.base import MarkovModel
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble
from mbrl.world_models.fit import EnsembleFit, FitConfig, RowSplit, fit_world_model, member_holdout_mse
from mbrl.world_models.fitting import choose_eval_episodes, train_split
from mbrl.world_models.metrics import holdout_metrics, open_loop_errors
from mbrl.world_models.model import Normalizer, WorldModel
from mbrl.world_models.uncertainty import MEASURES

OBS_DIM, ACT_DIM, NOISE = 3, 2, 0.05
N = 3000  # -> 2400 train + 600 holdout with the split below
# With a learned termination head, so that one compile covers it too.
CONFIG = EnsembleConfig(num_members=5, num_elites=3, hidden_dims=(64, 64), learned_termination=True)
TERMINAL_ABOVE = 0.3  # the system "terminates" when next_obs[0] > 0.3 (about a third of the rows)
FIT = FitConfig(max_epochs=60, batch_size=128, max_holdout=600, eval_episodes=0, seed=0)


def linear_system(n: int, seed: int = 0, scale: float = 1.0) -> Transitions:
    """s' = s A + a B + noise, r = s·c + noise: a known system with noise std NOISE on every target."""
    rng = np.random.default_rng(1234)  # the system itself is fixed
    a = np.eye(OBS_DIM) + 0.3 * rng.normal(size=(OBS_DIM, OBS_DIM))
    b = 0.5 * rng.normal(size=(ACT_DIM, OBS_DIM))
    c = rng.normal(size=OBS_DIM)
    rng = np.random.default_rng(seed)
    obs = scale * rng.uniform(-1, 1, (n, OBS_DIM))
    act = scale * rng.uniform(-1, 1, (n, ACT_DIM))
    next_obs = obs @ a + act @ b + NOISE * rng.normal(size=(n, OBS_DIM))
    reward = obs @ c + NOISE * rng.normal(size=n)
    terminal = next_obs[:, 0] > TERMINAL_ABOVE
    return Transitions.from_arrays(obs, act, reward, next_obs, terminal, np.zeros(n))


def targets_of(t: Transitions) -> np.ndarray:
    return np.concatenate([t.next_obs - t.obs, t.reward[:, None]], axis=1)


@pytest.fixture(scope="module")
def data() -> Transitions:
    return linear_system(N)


@pytest.fixture(scope="module")
def fitted(data):
    return fit_world_model(data, config=CONFIG, fit_config=FIT, progress=False)


@pytest.fixture(scope="module")
def holdout(fitted, data) -> Transitions:
    return data.slice(np.asarray(fitted.model.info.holdout_rows))


_member_predictions = jax.jit(WorldModel.member_predictions)
_step = jax.jit(WorldModel.step, static_argnames=("deterministic", "uncertainty"))


def predictions(model, t: Transitions):
    means, stds = _member_predictions(model, jnp.asarray(t.obs), jnp.asarray(t.action))
    return np.asarray(means, np.float64), np.asarray(stds, np.float64)


# -------------------------------------------------------------------------------------------------
# Accuracy, calibration, epistemic uncertainty on a known system


def test_holdout_mse_approaches_noise_floor(fitted, holdout):
    model = fitted.model
    assert len(holdout) == 600 and model.info.num_transitions == N
    means, _ = predictions(model, holdout)
    elites = np.asarray(model.elites)
    mse = np.mean(np.square(means - targets_of(holdout)[None]), axis=(1, 2))
    floor = NOISE**2
    assert np.all(mse[elites] < 1.3 * floor), (mse, floor)
    assert np.all(mse[elites] > 0.7 * floor)  # not fitting the holdout noise: it never saw it


def test_two_sigma_coverage_is_calibrated(fitted, holdout):
    means, stds = predictions(fitted.model, holdout)
    z = np.abs(means - targets_of(holdout)[None]) / stds
    elites = np.asarray(fitted.model.elites)
    coverage_2 = np.mean(z[elites] <= 2.0)
    coverage_1 = np.mean(z[elites] <= 1.0)
    assert 0.85 <= coverage_2 <= 0.99, coverage_2
    assert 0.55 <= coverage_1 <= 0.8, coverage_1


# -------------------------------------------------------------------------------------------------
# mbrl.world_models.metrics (what `mbrl model eval` reports)


def test_holdout_metrics_equal_direct_numpy_and_the_fits_own_holdout_mse(fitted, holdout):
    model = fitted.model
    metrics = holdout_metrics(model, holdout)
    means, stds = predictions(model, holdout)
    error = means - targets_of(holdout)[None]
    z = np.abs(error) / stds
    np.testing.assert_allclose(metrics["mse_raw"], np.mean(error**2, axis=(1, 2)), rtol=1e-6)
    np.testing.assert_allclose(metrics["coverage_1sigma"], np.mean(z <= 1.0, axis=(1, 2)))
    np.testing.assert_allclose(metrics["coverage_2sigma"], np.mean(z <= 2.0, axis=(1, 2)))
    # Standardised units are those the fit ranks its elites by.
    np.testing.assert_allclose(metrics["mse"], model.info.holdout_mse, rtol=1e-3)


def test_open_loop_errors_follow_the_elites_mean_and_count_the_starts_that_fit(fitted, data):
    model = fitted.model
    rows = data.slice(slice(0, 120))
    starts = np.array([0, 30, 80])  # episodes of 30, 50 and 40 steps; 0 and 2 are held out
    errors = open_loop_errors(model, rows, starts, [0, 2], horizons=(1, 2, 5, 100))
    assert {k: n for k, (_, n) in errors.items()} == {1: 70, 2: 68, 5: 62, 100: 0}
    assert errors[100][0] is None

    # Directly: from every start, two steps of obs + the elites' mean predicted delta, fed the real actions.
    elites = np.asarray(model.elites)
    begin = np.concatenate([np.arange(0, 30), np.arange(80, 120)])
    first, _ = predictions(model, rows.slice(begin))
    one = rows.obs[begin] + first[elites].mean(axis=0)[:, :OBS_DIM]
    np.testing.assert_allclose(errors[1][0], np.mean((one - rows.next_obs[begin]) ** 2), rtol=1e-4)
    keep = np.isin(begin + 1, np.concatenate([np.arange(1, 30), np.arange(81, 120)]))  # a second real step left
    second = np.asarray(_member_predictions(model, jnp.asarray(one[keep], jnp.float32), jnp.asarray(rows.action[begin[keep] + 1]))[0])
    two = one[keep] + second[elites].mean(axis=0)[:, :OBS_DIM]
    np.testing.assert_allclose(errors[2][0], np.mean((two - rows.next_obs[begin[keep] + 1]) ** 2), rtol=1e-4)

    thinned = open_loop_errors(model, rows, starts, [0, 2], horizons=(1, 2, 5, 100), max_starts=10)
    assert thinned[1][1] == 10 and thinned[100] == (None, 0)
    assert open_loop_errors(model, rows, starts, [], horizons=(1, 5)) == {1: (None, 0), 5: (None, 0)}


def test_epistemic_std_grows_far_from_data(fitted, holdout):
    far = linear_system(len(holdout), seed=7, scale=10.0)  # inputs 10x outside the data's [-1, 1] box
    on_data = MEASURES["epistemic_std"](*map(jnp.asarray, predictions(fitted.model, holdout)))
    off_data = MEASURES["epistemic_std"](*map(jnp.asarray, predictions(fitted.model, far)))
    ratio = float(jnp.mean(off_data) / jnp.mean(on_data))
    assert ratio >= 5.0, ratio


def test_elites_are_the_lowest_holdout_mse_members(fitted, holdout):
    model = fitted.model
    recorded = np.asarray(model.info.holdout_mse)
    x = model.input_norm.normalize(jnp.asarray(np.concatenate([holdout.obs, holdout.action], 1)))
    y = model.target_norm.normalize(jnp.asarray(targets_of(holdout), jnp.float32))
    direct = np.asarray(member_holdout_mse(model.network, model.params, x, y))
    np.testing.assert_allclose(direct, recorded, rtol=1e-4)
    lowest = set(np.argsort(direct)[: CONFIG.num_elites].tolist())
    assert set(np.asarray(model.elites).tolist()) == lowest
    assert model.elites.shape == (CONFIG.num_elites,)


# -------------------------------------------------------------------------------------------------
# Early stopping and best weights


def test_early_stopping_keeps_each_members_best_weights(data):
    """A holdout whose targets are the negated truth: the better the model fits the training data,
    the worse its holdout loss, so early stopping must fire and the kept weights must be early ones."""
    train, real_holdout = data.slice(slice(0, 2400)), data.slice(slice(2400, N))
    flipped = Transitions.from_arrays(
        real_holdout.obs,
        real_holdout.action,
        -real_holdout.reward,
        real_holdout.obs - (real_holdout.next_obs - real_holdout.obs),
        real_holdout.terminal,
        real_holdout.timeout,
    )
    trained = train_split(EnsembleFit(CONFIG, FIT), RowSplit(train, flipped))
    params, (input_norm, target_norm), elites, best_mse = trained.params, trained.norms, trained.elites, trained.best_mse
    history, reason = trained.history, trained.stop_reason
    assert reason == "early_stopping"
    epochs = len(history)
    assert epochs < FIT.max_epochs
    per_epoch = np.array([h["holdout_mse"] for h in history])  # (epochs, M)
    # Patience: the last epoch with a >1% gain is exactly `patience` epochs before the end.
    reference, last_gain = np.full(CONFIG.num_members, np.inf), 0
    for epoch, mse in enumerate(per_epoch, start=1):
        gain = mse < reference * (1 - FIT.min_improvement)
        reference = np.where(gain, mse, reference)
        last_gain = epoch if gain.any() else last_gain
    assert epochs == last_gain + FIT.patience
    # Each member keeps the weights of its own best epoch, not the last one.
    np.testing.assert_allclose(best_mse, per_epoch.min(axis=0), rtol=1e-6)
    assert np.all(per_epoch[-1] > best_mse)
    x = input_norm.normalize(jnp.asarray(np.concatenate([flipped.obs, flipped.action], 1)))
    y = target_norm.normalize(jnp.asarray(targets_of(flipped), jnp.float32))
    kept = np.asarray(member_holdout_mse(GaussianEnsemble(CONFIG, OBS_DIM + 1), params, x, y))
    np.testing.assert_allclose(kept, best_mse, rtol=1e-4)
    assert set(elites.tolist()) == set(np.argsort(best_mse)[: CONFIG.num_elites].tolist())


def test_time_budget_stops_fitting(data):
    result = fit_world_model(data, config=CONFIG, fit_config=FitConfig(**{**FIT.__dict__, "max_seconds": 0.0}), progress=False)
    assert result.stop_reason == "time_budget" and len(result.history) == 1


# -------------------------------------------------------------------------------------------------
# Uncertainty measures


def test_uncertainty_measures_equal_direct_numpy():
    rng = np.random.default_rng(3)
    m, b, d = 5, 7, 4
    means = rng.normal(size=(m, b, d)) * 3 + 10  # an offset, to catch precision loss
    stds = rng.uniform(0.1, 2.0, size=(m, b, d))
    expected = {
        "aleatoric_max": [max(np.linalg.norm(stds[i, s]) for i in range(m)) for s in range(b)],
        "epistemic_std": [np.sqrt(np.mean(np.var(means[:, s], axis=0))) for s in range(b)],
        "epistemic_sum": [np.sum(np.std(means[:, s], axis=0, ddof=1)) for s in range(b)],
        "pairwise_max": [
            max(np.linalg.norm(means[i, s] - means[j, s]) for i in range(m) for j in range(m)) for s in range(b)
        ],
        "ensemble_std": [
            np.linalg.norm(np.sqrt(np.mean(stds[:, s] ** 2 + means[:, s] ** 2, axis=0) - np.mean(means[:, s], 0) ** 2))
            for s in range(b)
        ],
    }
    assert set(MEASURES) == set(expected)
    for name, fn in MEASURES.items():
        got = np.asarray(fn(jnp.asarray(means, jnp.float32), jnp.asarray(stds, jnp.float32)))
        assert got.shape == (b,)
        np.testing.assert_allclose(got, expected[name], rtol=1e-4, err_msg=name)


# -------------------------------------------------------------------------------------------------
# WorldModel.step


def test_step_uses_the_given_members(fitted, holdout):
    model = fitted.model
    b = len(holdout)
    obs, act = jnp.asarray(holdout.obs), jnp.asarray(holdout.action)
    means, stds = predictions(model, holdout)
    member = jnp.asarray(np.arange(b) % CONFIG.num_members, jnp.int32)
    step = _step
    out = step(model, jax.random.PRNGKey(0), obs, act, member, deterministic=True, uncertainty="epistemic_std")
    chosen = means[np.asarray(member), np.arange(b)]
    np.testing.assert_allclose(out.next_obs, holdout.obs + chosen[:, :OBS_DIM], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.reward, chosen[:, OBS_DIM], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.uncertainty, MEASURES["epistemic_std"](jnp.asarray(means), jnp.asarray(stds)), rtol=1e-4)
    assert out.terminal.dtype == jnp.bool_ and out.terminal.shape == (b,)

    # Sampled: Gaussian noise around the same member's mean, with its std.
    sampled = step(model, jax.random.PRNGKey(1), obs, act, member)
    z = (np.asarray(sampled.next_obs) - np.asarray(out.next_obs)) / stds[np.asarray(member), np.arange(b), :OBS_DIM]
    assert 0.5 < np.std(z) < 1.5 and np.abs(z).max() < 6.0

    # No member given: every sample follows one of the elites, and the elites all get used.
    free = step(model, jax.random.PRNGKey(2), obs, act, None, deterministic=True)
    distance = np.abs(np.asarray(free.next_obs)[None] - (holdout.obs[None] + means[:, :, :OBS_DIM])).max(-1)
    nearest = distance.argmin(axis=0)
    assert np.all(distance.min(axis=0) < 1e-5)
    assert set(nearest.tolist()) == set(np.asarray(model.elites).tolist())


def test_step_terminal_comes_from_the_termination_fn(fitted, holdout):
    model = fitted.model.with_termination_fn(lambda obs, action, next_obs: next_obs[:, 0] > 0.0)
    out = _step(model, jax.random.PRNGKey(0), jnp.asarray(holdout.obs), jnp.asarray(holdout.action))
    np.testing.assert_array_equal(out.terminal, np.asarray(out.next_obs)[:, 0] > 0.0)
    assert 0 < int(out.terminal.sum()) < len(holdout)


def test_step_reward_comes_from_the_task_reward_fn(fitted, holdout):
    model = fitted.model.with_reward_fn(lambda obs, action, next_obs: -jnp.sum((next_obs - obs) ** 2, -1) + action[:, 0])
    obs, act = jnp.asarray(holdout.obs), jnp.asarray(holdout.action)
    out = _step(model, jax.random.PRNGKey(0), obs, act)
    expected = -np.sum((np.asarray(out.next_obs) - holdout.obs) ** 2, -1) + holdout.action[:, 0]
    np.testing.assert_allclose(out.reward, expected, rtol=1e-5, atol=1e-6)
    # Same key: the same next obs (another program, so equal up to float32 rounding), the learned reward.
    learned = _step(fitted.model, jax.random.PRNGKey(0), obs, act)
    np.testing.assert_allclose(learned.next_obs, out.next_obs, rtol=1e-6, atol=1e-6)
    assert not np.allclose(learned.reward, out.reward)


def test_held_out_data_is_the_holdout_and_every_training_row_is_fitted(data):
    """A dataset with a -val file (NeoRL-2) is not cut: the holdout and eval episodes come from the val data."""
    def dataset(t: Transitions, name: str) -> OfflineDataset:
        info = DatasetInfo(name=name, source=name, format="neorl2-npz", task=None, obs_dim=OBS_DIM, act_dim=ACT_DIM)
        return OfflineDataset(transitions=t, episode_starts=np.arange(0, len(t), 100), info=info)

    val = linear_system(1000, seed=9)
    train = dataset(data.slice(np.arange(2000)), "train")
    train.heldout = dataset(val, "val")
    config = FitConfig(max_epochs=2, batch_size=256, max_holdout=300, eval_episodes=2, seed=0)
    model = fit_world_model(train, config=CONFIG, fit_config=config, progress=False).model
    assert model.info.holdout_from == "heldout" and len(model.info.holdout_rows) == 160  # 20% of the val rows outside the eval episodes
    assert max(model.info.holdout_rows) < len(val) and len(model.info.eval_episodes) == 2  # the 2 wanted: the val file is never trained on
    held = val.slice(np.asarray(model.info.holdout_rows))
    recomputed = member_holdout_mse(model.network, model.params, model.input_norm.normalize(
        jnp.concatenate([held.obs, held.action], -1)), model.target_norm.normalize(jnp.asarray(targets_of(held))))
    np.testing.assert_allclose(recomputed, model.info.holdout_mse, rtol=1e-4)


def test_eval_episodes_keep_a_tenth_of_a_training_file_and_all_but_one_of_a_val_file():
    """SafetyHalfCheetah's val file holds 2 episodes: one is kept out whole for `mbrl model eval`, the other gives
    the holdout rows; a training file gives up at most a tenth of its episodes."""
    rng = np.random.default_rng(0)
    assert len(choose_eval_episodes(18, 2, rng)) == 1 and len(choose_eval_episodes(9, 2, rng)) == 0
    assert len(choose_eval_episodes(2, 2, rng, from_heldout_file=True)) == 1
    assert len(choose_eval_episodes(1, 2, rng, from_heldout_file=True)) == 0
    assert len(choose_eval_episodes(200, 2, rng, from_heldout_file=True)) == 2


# -------------------------------------------------------------------------------------------------
# Persistence


def test_orbax_round_trip_is_bit_identical(fitted, holdout, tmp_path):
    model = fitted.model
    path = tmp_path / "model"
    model.save(path)
    model.save(path)  # replacing an existing model works and leaves no temporary folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    fn = lambda obs, action, next_obs: next_obs[:, 0] > 0.0  # noqa: E731
    loaded = WorldModel.load(path, termination_fn=fn)
    assert loaded.info == model.info and loaded.config == model.config and loaded.termination_fn is fn
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(loaded)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    obs, act = jnp.asarray(holdout.obs), jnp.asarray(holdout.action)
    key = jax.random.PRNGKey(5)
    before = _step(model.with_termination_fn(fn), key, obs, act)
    after = _step(loaded, key, obs, act)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_load_refuses_what_is_not_a_model(tmp_path):
    with pytest.raises(UserError, match="model.json"):
        WorldModel.load(tmp_path)
    (tmp_path / "model.json").write_text("{not json")
    with pytest.raises(UserError, match="model.json"):
        WorldModel.load(tmp_path)


# -------------------------------------------------------------------------------------------------
# Bad input


def test_fit_refuses_non_finite_data(data):
    bad_obs = data.obs.copy()
    bad_obs[17, 1] = np.nan
    bad = Transitions.from_arrays(bad_obs, data.action, data.reward, data.next_obs, data.terminal, data.timeout)
    with pytest.raises(DatasetError, match=r"'obs'.*NaN.*row 17"):
        fit_world_model(bad, config=CONFIG, fit_config=FIT, source="bad.hdf5", progress=False)
    bad_reward = data.reward.copy()
    bad_reward[5] = np.inf
    bad = Transitions.from_arrays(data.obs, data.action, bad_reward, data.next_obs, data.terminal, data.timeout)
    with pytest.raises(DatasetError, match=r"'reward'.*Inf.*row 5"):
        fit_world_model(bad, config=CONFIG, fit_config=FIT, progress=False)
    short = Transitions.from_arrays(data.obs, data.action, data.reward, data.next_obs[:, :2], data.terminal, data.timeout)
    with pytest.raises(DatasetError, match="next_obs"):
        fit_world_model(short, config=CONFIG, fit_config=FIT, progress=False)


def test_configs_refuse_bad_options():
    with pytest.raises(ConfigError, match=r"ensemble\.num_elites: .*\[1, num_members=3\], found 4"):
        EnsembleConfig(num_members=3, num_elites=4)
    with pytest.raises(ConfigError, match=r"ensemble\.weight_decays: expected one value per dense layer \(3"):
        EnsembleConfig(hidden_dims=(8, 8), weight_decays=(1e-5,))
    with pytest.raises(ConfigError, match=r"fit\.sampling: .*'jackknife'"):
        FitConfig(sampling="jackknife")
    with pytest.raises(ConfigError, match=r"fit\.learning_rate: expected a value > 0, found 0"):
        FitConfig(learning_rate=0.0)
    with pytest.raises(ConfigError, match="uncertainty measure"):
        WorldModel.step(
            WorldModel(
                params=None,
                input_norm=Normalizer(jnp.zeros(1), jnp.ones(1)),
                target_norm=Normalizer(jnp.zeros(1), jnp.ones(1)),
                elites=jnp.zeros(1, jnp.int32),
                config=EnsembleConfig(),
                obs_dim=1,
                act_dim=1,
            ),
            jax.random.PRNGKey(0),
            jnp.zeros((1, 1)),
            jnp.zeros((1, 1)),
            uncertainty="vibes",
        )


# -------------------------------------------------------------------------------------------------
# Learned termination head (for tasks with no known termination function)


def test_learned_termination_head_predicts_terminals(fitted, holdout):
    model = fitted.model
    assert model.termination_fn is None and model.config.learned_termination
    out = _step(model, jax.random.PRNGKey(2), jnp.asarray(holdout.obs), jnp.asarray(holdout.action), None, deterministic=True)
    predicted, actual = np.asarray(out.terminal), holdout.terminal
    assert 0.15 < actual.mean() < 0.5
    recall, specificity = predicted[actual].mean(), (~predicted[~actual]).mean()
    assert recall > 0.85 and specificity > 0.85, (recall, specificity)


# -------------------------------------------------------------------------------------------------
# The commands, on the real Hopper-v5 sample dataset shipped with the package


def test_model_fit_and_eval_commands(tmp_path, capsys):
    out = tmp_path / "hopper-model"
    code = main(
        ["model", "fit", "--dataset", str(SAMPLE_PATH), "--out", str(out), "--fit.max-epochs", "3",
         "--ensemble.num-members", "3", "--ensemble.num-elites", "2", "--ensemble.hidden-dims", "16",
         "--ensemble.layer-norm", "True", "--no-progress"]
    )  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["epochs"] == 3 and summary["stop_reason"] == "max_epochs" and len(summary["elites"]) == 2
    assert (out / "model.json").is_file() and (out / "arrays").is_dir()
    model = WorldModel.load(out)
    assert model.info.task == "hopper" and len(model.info.eval_episodes) == 1
    # NEUBAY's variant: LayerNorm blocks and log σ softly inside [-5, 0.25] (standardised units), even far out.
    assert model.config.layer_norm and "norm_0" in model.params["params"] and "max_logvar" not in model.params["params"]
    far = 100.0 * jax.random.normal(jax.random.PRNGKey(0), (64, model.obs_dim + model.act_dim))
    _, stds = _member_predictions(model, far[:, : model.obs_dim], far[:, model.obs_dim :])
    log_std = np.log(np.asarray(stds) / np.asarray(model.target_norm.std))
    assert log_std.min() >= -5.0 - 1e-4 and log_std.max() <= 0.25 + 1e-4

    assert main(["model", "eval", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(report["members"]) == 3 and report["holdout_rows"] == len(model.info.holdout_rows)
    for row in report["members"]:
        assert row["holdout_mse"] > 0 and 0 <= row["coverage_1sigma"] <= row["coverage_2sigma"] <= 1
    assert set(report["open_loop_mse"]) == {"1", "5", "20", "100"}
    assert report["open_loop_starts"]["1"] > 0 and report["open_loop_mse"]["1"] > 0

    assert main(["model", "eval", str(out), "--json", "--plot"]) == 0
    plots = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["plots"]
    episode = model.info.eval_episodes[0]
    assert plots == [str(out / "plots" / f"open_loop_episode{episode}.png")]
    assert (out / "plots" / f"open_loop_episode{episode}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert main(["model", "eval", str(tmp_path / "missing")]) == 2
    assert "model.json" in capsys.readouterr().err


@struct.dataclass
class DriftingMembers(MarkovModel):
    """Member m predicts next = A obs + B action + offsets[m], with a constant std stds[m] per dimension, and the
    reward obs0: known paths for `mbrl.model_plots`."""

    a: jax.Array
    b: jax.Array
    offsets: jax.Array  # (members, obs)
    stds: jax.Array  # (members,)
    elite_index: jax.Array

    @property
    def obs_dim(self) -> int:
        return self.a.shape[0]

    @property
    def elites(self) -> jax.Array:
        return self.elite_index

    def member_predictions(self, obs, action):
        next_obs = obs @ self.a.T + action @ self.b.T  # (B, obs)
        delta = next_obs[None] + self.offsets[:, None, :] - obs[None]
        means = jnp.concatenate([delta, jnp.broadcast_to(obs[None, :, :1], delta.shape[:2] + (1,))], axis=-1)
        return means, jnp.broadcast_to(self.stds[:, None, None], means.shape)


def test_open_loop_plot_curves_follow_each_elite_on_its_own_path():
    from mbrl.model_plots import open_loop_episode

    rng = np.random.default_rng(3)
    obs_dim, act_dim, steps = 3, 2, 12
    a = np.eye(obs_dim) + 0.05 * rng.standard_normal((obs_dim, obs_dim))
    b = 0.2 * rng.standard_normal((obs_dim, act_dim))
    offsets, stds, elites = 0.03 * rng.standard_normal((4, obs_dim)), np.array([0.1, 0.2, 0.3, 0.4]), [0, 2, 3]
    model = DriftingMembers(*(jnp.asarray(x, jnp.float32) for x in (a, b, offsets, stds)), jnp.asarray(elites))
    obs = rng.standard_normal((steps, obs_dim)).astype(np.float32)
    action = rng.uniform(-1, 1, (steps, act_dim)).astype(np.float32)
    data = Transitions(obs=obs, action=action, reward=np.zeros(steps, np.float32), next_obs=np.roll(obs, -1, 0),
                       terminal=np.zeros(steps, bool), timeout=np.zeros(steps, bool))
    curves = open_loop_episode(model, data, 2, 10)  # the episode of rows 2..9

    paths = np.zeros((len(elites), 8, obs_dim))  # the oracle: each elite's recursion in float64
    for i, member in enumerate(elites):
        x = obs[2].astype(np.float64)
        for t in range(8):
            x = a @ x + b @ action[2 + t] + offsets[member]
            paths[i, t] = x
    np.testing.assert_allclose(curves["mean"], paths.mean(axis=0), atol=1e-4)
    expected_std = np.sqrt(paths.var(axis=0) + np.mean(np.square(stds[elites])))
    np.testing.assert_allclose(curves["std"], expected_std, atol=1e-4)
    np.testing.assert_allclose(curves["epistemic"], np.sqrt(paths.var(axis=0).sum(axis=1)), atol=1e-4)
    np.testing.assert_allclose(curves["aleatoric"], np.sqrt(obs_dim * np.mean(np.square(stds[elites]))), atol=1e-5)
    np.testing.assert_array_equal(curves["truth"], np.roll(obs, -1, 0)[2:10])
    assert list(curves["steps"]) == list(range(1, 9))


def test_a_diverging_model_leaves_a_frame_drawn_around_the_truth():
    """Simglucose's open-loop prediction reaches 1e35 by step 50: framed on the truth, its panels stay readable."""
    import matplotlib.pyplot as plt

    from mbrl.model_plots import _frame_to_truth

    steps = np.arange(1, 7)
    truth = np.array([1.0, 2.0, 3.0, 2.0, 1.0, 2.0])
    figure, axis = plt.subplots()
    assert _frame_to_truth(axis, steps, truth, truth + 0.5) == ""
    assert axis.get_ylim() == (-1.0, 5.0)  # the range [1, 3] widened by 2 each side
    diverging = np.array([1.0, 2.0, 3.0, 6.0, 1e35, np.nan])
    assert _frame_to_truth(axis, steps, truth, diverging) == " (model leaves the frame at step 4)"
    plt.close(figure)


def test_a_column_that_never_changes_is_predicted_as_its_constant():
    """Simglucose's patient parameters: constant within an episode, different across them. The model keeps each
    one where it is (its change is 0 on every row), however little it was fitted."""
    base = linear_system(600, seed=5)
    rng = np.random.default_rng(0)
    parameter = np.repeat(rng.uniform(0.001, 0.003, 6), 100)[:, None]  # six episodes' values, spread 0.002
    data = Transitions.from_arrays(np.concatenate([base.obs, parameter], 1), base.action, base.reward,
                                   np.concatenate([base.next_obs, parameter], 1), base.terminal, np.zeros(600))
    config = EnsembleConfig(num_members=3, num_elites=2, hidden_dims=(16, 16))
    model = fit_world_model(data, config=config, fit_config=FitConfig(max_epochs=2, batch_size=128, max_holdout=100,
                                                                      eval_episodes=0, seed=0), progress=False).model
    means, stds = predictions(model, data)  # each member's predicted change and its std
    assert np.abs(means[..., OBS_DIM]).max() < 1e-5  # a two-hundredth of the parameter's spread
    assert stds[..., OBS_DIM].max() < 1e-5
    assert np.abs(means[..., 0] - targets_of(data)[:, 0]).mean() > 1e-3  # the other columns: a 2-epoch fit's error


def test_an_invariant_dimension_never_reaches_the_members_and_survives_a_save(tmp_path):
    """A robot's absolute position (NeoRL-2 SafetyHalfCheetah's rootx): the dynamics do not depend on it, and the
    data's episodes tie it to the time step. With it declared invariant, every member's prediction is the same
    wherever the robot stands, before and after a save; its change is still predicted."""
    base = linear_system(600, seed=6)
    rng = np.random.default_rng(1)
    position = np.cumsum(0.1 + 0.05 * base.obs[:, :1], axis=0)  # moves on with the first state
    data = Transitions.from_arrays(np.concatenate([base.obs, position], 1), base.action, base.reward,
                                   np.concatenate([base.next_obs, position + 0.1 + 0.05 * base.obs[:, :1]], 1),
                                   base.terminal, np.zeros(600))
    config = EnsembleConfig(num_members=3, num_elites=2, hidden_dims=(16, 16), invariant_obs_dims=(OBS_DIM,))
    fit = FitConfig(max_epochs=2, batch_size=128, max_holdout=100, eval_episodes=0, seed=0)
    model = fit_world_model(data, config=config, fit_config=fit, progress=False).model
    elsewhere = data.replace(obs=data.obs.copy())
    elsewhere.obs[:, OBS_DIM] = rng.uniform(-1e3, 1e3, 600)
    for m in (model, WorldModel.load(model.save(tmp_path / "m"))):
        here, there = predictions(m, data), predictions(m, elsewhere)
        np.testing.assert_array_equal(here[0], there[0])
        np.testing.assert_array_equal(here[1], there[1])
    assert np.abs(here[0][..., OBS_DIM]).mean() > 0.01  # the position's change is predicted, not dropped
    with pytest.raises(ConfigError, match=r"ensemble\.invariant_obs_dims: \(4,\) names a dimension outside the 4"):
        fit_world_model(data, config=dataclasses.replace(config, invariant_obs_dims=(4,)), fit_config=fit, progress=False)
    with pytest.raises(ConfigError, match=r"ensemble\.invariant_obs_dims: expected distinct observation indices"):
        EnsembleConfig(invariant_obs_dims=(1, 1))


RESUMABLE_FITS = {
    "mlp": ["--ensemble.num-members", "3", "--ensemble.num-elites", "2", "--ensemble.hidden-dims", "16",
            "--fit.max-epochs", "60", "--fit.patience", "60"],
    "rwm": ["--model", "rwm", "--rwm.num-heads", "2", "--rwm.gru-hidden", "8", "--rwm.head-hidden", "8",
            "--rwm.history", "3", "--rwm.forecast", "3", "--rwm-fit.batch-size", "16", "--rwm-fit.steps-per-epoch", "4",
            "--rwm-fit.max-epochs", "60", "--rwm-fit.patience", "60"],
}


@pytest.mark.parametrize("kind", sorted(RESUMABLE_FITS))
def test_a_fit_stopped_by_sigterm_resumes_to_the_uninterrupted_model(kind, tmp_path, capsys):
    """`mbrl model fit` in a second process, SIGTERM once it has saved a checkpoint: it saves again after the running
    epoch and exits 143; `--resume` then ends with the very weights and holdout errors of a fit never stopped."""
    import signal
    import subprocess
    import sys
    import time

    from mbrl.world_models.registry import load_model

    options = ["--dataset", str(SAMPLE_PATH), *RESUMABLE_FITS[kind]]
    stopped = tmp_path / "stopped"
    process = subprocess.Popen([sys.executable, "-m", "mbrl.cli", "model", "fit", *options, "--out", str(stopped),
                                "--checkpoint-seconds", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not any(p.name.isdigit() for p in (stopped / "fit-checkpoint").glob("*")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].endswith(f"Continue with: mbrl model fit --resume {stopped}")
    assert not (stopped / "model.json").exists()
    capsys.readouterr()

    # A new fit into it, or a resume that changes the options, is refused in one line.
    assert main(["model", "fit", *options, "--out", str(stopped)]) == 2
    assert "holds an interrupted fit" in capsys.readouterr().err
    assert main(["model", "fit", "--resume", str(stopped), "--fit.max-epochs", "3"]) == 2
    assert "drop --fit.max-epochs" in capsys.readouterr().err
    assert main(["model", "fit", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no interrupted fit here" in capsys.readouterr().err

    assert main(["model", "fit", "--resume", str(stopped), "--checkpoint-seconds", "1e9", "--no-progress"]) == 0
    whole = tmp_path / "whole"
    assert main(["model", "fit", *options, "--out", str(whole), "--checkpoint-seconds", "1e9", "--no-progress"]) == 0
    assert sorted(p.name for p in stopped.iterdir()) == sorted(p.name for p in whole.iterdir())  # no checkpoint left
    resumed, uninterrupted = load_model(stopped), load_model(whole)
    assert resumed.info.epochs == uninterrupted.info.epochs == 60
    assert resumed.info.task == "hopper"  # RWM-U's fit once recorded its progress bar's task id here
    assert resumed.info.holdout_mse == uninterrupted.info.holdout_mse
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(uninterrupted.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
