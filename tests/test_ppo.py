"""PPO (agents/ppo.py): learning on an analytic model, GAE, the adaptive learning rate, the tanh log-prob,
the observation normaliser and config errors. Tiny networks; the compiled functions are shared."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from mbrl.core.tanh_gaussian import sample_tanh_gaussian
from mbrl.agents.ppo import (
    LR_MAX,
    LR_MIN,
    PPO,
    ObsNormalizer,
    PPOBatch,
    PPOConfig,
    adapt_learning_rate,
    gae,
)
from mbrl.core.tanh_gaussian import tanh_gaussian_log_prob
from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions
from mbrl.imagination import ExploringPolicy, on_policy_rollout
from mbrl.world_models.base import MarkovModel, StepOutput
from mbrl.world_models.rollout import RolloutConfig, rollout

OBS = ACT = 2
ENVS, HORIZON, POPULATION = 64, 16, 2


@struct.dataclass
class PointModel(MarkovModel):
    """A 2-D point: next = x + 0.1 action, reward = -|next - target|^2, never terminal, no uncertainty."""

    target: jax.Array

    @property
    def num_members(self) -> int:
        return 1

    @property
    def elites(self) -> jax.Array:
        return jnp.zeros(1, jnp.int32)

    def step(self, key, obs, action, member=None, *, carry=(), deterministic=False, uncertainty="aleatoric_max"):
        next_obs = obs + 0.1 * action
        return StepOutput(
            next_obs=next_obs,
            reward=-jnp.sum((next_obs - self.target) ** 2, axis=-1),
            terminal=jnp.zeros(obs.shape[0], bool),
            uncertainty=jnp.zeros(obs.shape[0], jnp.float32),
        )


@pytest.fixture(scope="module")
def setup():
    """A population of POPULATION PPO learners on the point model; each function jitted (and vmapped) once
    and shared by the tests, which call them with the same shapes."""
    agent = PPO(PPOConfig(hidden_sizes=(32, 32)), OBS, ACT)
    model = PointModel(jnp.asarray([0.5, -0.5], jnp.float32))
    starts = jax.random.uniform(jax.random.PRNGKey(42), (ENVS, OBS), minval=-1.0, maxval=1.0)

    def imagine(key, state, deterministic):
        policy = ExploringPolicy(agent, deterministic)
        return rollout(key, model, policy, agent.actor_params(state), starts, HORIZON, RolloutConfig())

    def collect(key, state):
        imagined = on_policy_rollout(key, model, agent, agent.actor_params(state), starts, HORIZON, RolloutConfig())
        return imagined.transitions, imagined.valid, imagined.policy_carry

    hypers = jax.tree.map(lambda x: jnp.stack([x] * POPULATION), agent.hypers())
    return dict(
        agent=agent,
        model=model,
        starts=starts,
        hypers=hypers,
        states=jax.jit(jax.vmap(agent.init))(jax.random.split(jax.random.PRNGKey(0), POPULATION), hypers),
        collect=jax.jit(jax.vmap(collect)),
        evaluate=jax.jit(jax.vmap(lambda key, state: jnp.mean(imagine(key, state, True).stats.returns))),
        prepare=jax.jit(jax.vmap(agent.prepare)),
        minibatches=jax.jit(jax.vmap(agent.minibatches)),
        update_many=jax.jit(jax.vmap(agent.update_many)),
    )


def _keys(seed):
    return jax.random.split(jax.random.PRNGKey(seed), POPULATION)


def _assert_finite(states, metrics):
    """Every metric and every learned parameter (actor, critic, noise) of an update is finite."""
    for name, value in metrics.items():
        assert np.all(np.isfinite(value)), name
    for leaf in jax.tree.leaves((states.actor, states.critic, states.log_std)):
        assert np.all(np.isfinite(leaf))


ITERATIONS = 20


@pytest.fixture(scope="module")
def trained(setup):
    """ITERATIONS iterations of collect -> prepare -> minibatches -> update_many; returns before and after."""
    s = setup
    states, hypers = s["states"], s["hypers"]
    before = np.asarray(s["evaluate"](_keys(7), states))
    first = None
    for i in range(ITERATIONS):
        rows, valid, samples = s["collect"](_keys(100 + i), states)
        states, batch, prep_metrics = s["prepare"](states, rows, valid, hypers, samples)
        states, metrics = s["update_many"](states, s["minibatches"](batch, _keys(200 + i)), _keys(300 + i), hypers)
        first = (batch, prep_metrics) if first is None else first
    after = np.asarray(s["evaluate"](_keys(7), states))
    return dict(before=before, after=after, states=states, first=first, metrics=metrics)


def _greedy_return(starts, target):
    """The mean return of the controller that heads for the target at full speed (about the optimum)."""
    x, target, total = np.asarray(starts, np.float64), np.asarray(target, np.float64), 0.0
    for _ in range(HORIZON):
        x = x + 0.1 * np.clip((target - x) / 0.1, -1.0, 1.0)
        total = total - np.sum((x - target) ** 2, axis=-1)
    return float(np.mean(total))


def test_ppo_raises_the_return_on_an_analytic_model(setup, trained):
    before, after = trained["before"], trained["after"]
    best = _greedy_return(setup["starts"], setup["model"].target)
    # Every member of the population closes most of the gap between its initial policy and the optimum
    # (about -23 -> -3.5 here; PPO reaches about -4 in 20 iterations).
    assert np.all(after - before > 0.75 * (best - before)), (before, after, best)
    metrics = trained["metrics"]
    assert set(metrics) == {"surrogate_loss", "value_loss", "entropy", "kl", "learning_rate", "clip_fraction",
                            "policy_std"}
    assert all(m.shape == (POPULATION,) and np.all(np.isfinite(m)) for m in metrics.values())
    assert np.all(trained["states"].steps == ITERATIONS * setup["agent"].config.updates_per_iteration)
    batch, prep_metrics = trained["first"]
    assert batch.obs.shape == (POPULATION, HORIZON * ENVS, OBS)
    # Every row is valid here; the advantages are normalised over the batch.
    np.testing.assert_allclose(prep_metrics["valid_fraction"], 1.0)
    np.testing.assert_allclose(np.mean(batch.advantage, axis=1), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.std(batch.advantage, axis=1, ddof=1), 1.0, rtol=1e-4)


def _np_gae(reward, value, next_value, terminal, timeout, valid, gamma, lam):
    """The definition, one column and one step at a time, in float64."""
    horizon, batch = reward.shape
    out = np.zeros((horizon, batch))
    for b in range(batch):
        following = 0.0
        for t in reversed(range(horizon)):
            if not valid[t, b]:
                out[t, b] = following = 0.0
                continue
            end = terminal[t, b] or timeout[t, b] or t + 1 == horizon or not valid[t + 1, b]
            bootstrap = 0.0 if terminal[t, b] else next_value[t, b]
            delta = reward[t, b] + gamma * bootstrap - value[t, b]
            out[t, b] = following = delta + (0.0 if end else gamma * lam * following)
    return out


def test_gae_with_a_terminal_a_timeout_and_padding():
    # Column 0 terminates at t=1 (t=2 padding); column 1 times out at t=1 and a new trajectory runs at t=2;
    # column 2 is cut after t=0, its padding rows hold NaNs that must not leak.
    nan = np.nan
    reward = np.array([[1.0, 0.5, -1.0], [2.0, 1.0, nan], [7.0, 3.0, nan]], np.float32)
    value = np.array([[0.5, 0.2, 0.3], [1.0, 0.4, nan], [9.0, 0.1, nan]], np.float32)
    next_value = np.array([[1.0, 0.4, 0.6], [3.0, 2.0, nan], [9.0, 0.7, nan]], np.float32)
    terminal = np.array([[0, 0, 0], [1, 0, 0], [0, 0, 0]], bool)
    timeout = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
    valid = np.array([[1, 1, 1], [1, 1, 0], [0, 1, 0]], bool)
    gamma, lam = 0.9, 0.8
    got = np.asarray(gae(*map(jnp.asarray, (reward, value, next_value, terminal, timeout, valid)), gamma, lam))
    # By hand, column 0: A1 = 2 - 1 = 1 (terminal: no bootstrap); A0 = 1 + 0.9 * 1 - 0.5 + 0.72 * A1 = 2.12.
    np.testing.assert_allclose(got[:, 0], [2.12, 1.0, 0.0], atol=1e-6)
    # Column 1: A2 = 3 + 0.9 * 0.7 - 0.1 = 3.53 alone; A1 = 1 + 0.9 * 2 - 0.4 = 2.4 (timeout: bootstrap,
    # cut); A0 = 0.5 + 0.36 - 0.2 + 0.72 * 2.4 = 2.388.
    np.testing.assert_allclose(got[:, 1], [2.388, 2.4, 3.53], atol=1e-6)
    np.testing.assert_allclose(got[:, 2], [-1.0 + 0.54 - 0.3, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(got, _np_gae(reward, value, next_value, terminal, timeout, valid, gamma, lam), atol=1e-6)


def test_prepare_masks_padding_and_normalises_over_valid_rows(setup):
    """Rollouts of random lengths (terminal or timeout at their last valid step, NaNs in the padding):
    weights, GAE returns against the numpy reference, advantages normalised over the valid rows only."""
    s, agent = setup, setup["agent"]
    rng = np.random.default_rng(3)
    shape = (POPULATION, HORIZON, ENVS)
    lengths = rng.integers(0, HORIZON + 1, (POPULATION, 1, ENVS))
    steps = np.arange(HORIZON)[None, :, None]
    valid = steps < lengths
    last = steps == lengths - 1
    ends_terminal = rng.random((POPULATION, 1, ENVS)) < 0.5
    obs = (rng.normal(size=shape + (OBS,)) * 3.0 + 1.0).astype(np.float32)
    next_obs = obs + 0.1
    obs[~valid], next_obs[~valid] = np.nan, np.inf  # what a cut step may leave in the padding
    samples = rng.normal(size=shape + (ACT,)).astype(np.float32)
    rows = Transitions(obs=obs, action=np.tanh(samples), reward=np.where(valid, rng.normal(size=shape), np.nan).astype(np.float32),
                       next_obs=next_obs, terminal=last & ends_terminal, timeout=last & ~ends_terminal)
    rows = jax.tree.map(jnp.asarray, rows)
    states, batch, metrics = s["prepare"](s["states"], rows, jnp.asarray(valid), s["hypers"], jnp.asarray(samples))
    for leaf in jax.tree.leaves((states.obs_norm, batch, metrics)):
        assert np.all(np.isfinite(leaf))
    gamma, lam = agent.config.gamma, agent.config.lam
    value_of = jax.jit(jax.vmap(agent.value))
    value = np.asarray(value_of(states, jnp.nan_to_num(rows.obs).reshape(POPULATION, -1, OBS)))
    next_value = np.asarray(value_of(states, jnp.nan_to_num(rows.next_obs).reshape(POPULATION, -1, OBS)))
    for p in range(POPULATION):
        flat_valid = valid[p].reshape(-1)
        np.testing.assert_array_equal(batch.weight[p], flat_valid.astype(np.float32))
        np.testing.assert_allclose(states.obs_norm.mean[p], obs[p].reshape(-1, OBS)[flat_valid].mean(0), rtol=1e-4)
        adv = np.asarray(batch.advantage[p])
        np.testing.assert_array_equal(adv[~flat_valid], 0.0)
        np.testing.assert_allclose(adv[flat_valid].mean(), 0.0, atol=1e-5)
        np.testing.assert_allclose(adv[flat_valid].std(ddof=1), 1.0, rtol=1e-4)
        # returns = raw GAE + V(obs), with the values of the updated normaliser.
        v, nv = value[p].reshape(HORIZON, ENVS), next_value[p].reshape(HORIZON, ENVS)
        raw = _np_gae(np.asarray(rows.reward[p]), v, nv, np.asarray(rows.terminal[p]), np.asarray(rows.timeout[p]),
                      valid[p], gamma, lam)
        np.testing.assert_allclose(np.asarray(batch.returns[p])[flat_valid], (raw + v).reshape(-1)[flat_valid],
                                   rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(metrics["valid_fraction"], valid.reshape(POPULATION, -1).mean(1))


def test_padding_stays_harmless_beside_a_constant_observation(setup):
    """NeoRL-2 Simglucose's failure: nearly every imagined trajectory cut after its first step, and an observation
    dimension that is constant over the valid rows (a patient parameter, 339) so its normalised scale is 1/eps.
    Its variance must stay 0, and the padding rows must not reach the networks as far-off inputs: one iteration's
    updates stay finite."""
    s = setup
    rng = np.random.default_rng(5)
    shape = (POPULATION, HORIZON, ENVS)
    valid = np.zeros(shape, bool)
    valid[:, 0, rng.choice(ENVS, 40, replace=False)] = True  # as few as in the imagined Simglucose batches
    obs = np.stack([rng.normal(size=shape), np.full(shape, 339.0)], axis=-1).astype(np.float32)
    obs[~valid] = np.nan
    samples = rng.normal(size=shape + (ACT,)).astype(np.float32)
    rows = Transitions(obs=obs, action=np.tanh(samples), reward=np.where(valid, rng.normal(size=shape), np.nan).astype(np.float32),
                       next_obs=obs + 0.1, terminal=np.zeros(shape, bool), timeout=valid.copy())
    states, batch, _ = s["prepare"](s["states"], jax.tree.map(jnp.asarray, rows), jnp.asarray(valid), s["hypers"],
                                    jnp.asarray(samples))
    # The constant dimension's variance is 0 (rsl_rl's merge, computed as written, left up to ±2e-3 here: its
    # square root was NaN on Simglucose).
    np.testing.assert_allclose(states.obs_norm.var[:, 1], 0.0, atol=1e-6)
    states, metrics = s["update_many"](states, s["minibatches"](batch, _keys(11)), _keys(12), s["hypers"])
    _assert_finite(states, metrics)


def test_adaptive_learning_rate_follows_the_kl(setup, trained):
    """A population of two on a batch whose old means are moved off the policy's: by 3 (KL = 9) -> lr / 1.5 at
    every minibatch, down to 1e-5; by 1e-3 (0 < KL << desired / 2) from 1e-5 -> lr * 1.5 at every minibatch
    while the KL stays small."""
    s, config = setup, setup["agent"].config
    batch, _ = trained["first"]
    states = trained["states"]
    # The current policy's Gaussians on the batch's rows.
    norm_obs = jax.vmap(lambda state, obs: state.obs_norm.normalize(obs))(states, batch.obs)
    mean = jax.vmap(s["agent"].actor.apply)(states.actor, norm_obs)
    shift = jnp.asarray([3.0, 1e-3])[:, None, None]
    batch = batch.replace(old_mean=mean + shift, old_log_std=jnp.broadcast_to(states.log_std[:, None], mean.shape),
                          obs_norm=states.obs_norm)
    start = jnp.asarray([1e-3, 1e-5], jnp.float32)
    minibatches = s["minibatches"](batch, _keys(5))
    new_states, metrics = s["update_many"](states.replace(learning_rate=start), minibatches, _keys(6), s["hypers"])
    # Adapted before each step: step k reports (and uses) the rate after k adaptations.
    down = np.maximum(LR_MIN, 1e-3 / 1.5 ** np.arange(1, config.updates_per_iteration + 1))
    np.testing.assert_allclose(metrics["learning_rate"][0], down.mean(), rtol=1e-4)
    np.testing.assert_allclose(new_states.learning_rate[0], LR_MIN, rtol=1e-6)
    assert metrics["kl"][0] > 2 * config.desired_kl
    # Its own steps then move the policy until the KL passes twice the desired one and the rate falls back: at which
    # step depends on float32 rounding, so the rate's mean over the steps and its net rise are what is checked.
    assert metrics["learning_rate"][1] > 10 * start[1] and new_states.learning_rate[1] > start[1]
    # The clamps of the schedule: [1e-5, 1e-2].
    adapt = jax.jit(adapt_learning_rate)
    np.testing.assert_allclose(adapt(1.2e-5, 1.0, 0.01), LR_MIN)
    np.testing.assert_allclose(adapt(8e-3, 1e-4, 0.01), LR_MAX)
    np.testing.assert_allclose(adapt(8e-3, 0.0, 0.01), 8e-3)  # KL exactly 0: unchanged, as rsl_rl


def test_a_huge_probability_ratio_leaves_the_update_finite(setup, trained):
    """Stored actions that the policy now finds e^200 times likelier than it did overflow exp in float32; the update
    must stay finite and move nothing to NaN."""
    s = setup
    batch, _ = trained["first"]
    states = trained["states"]
    shift = jnp.where(jnp.arange(batch.old_log_prob.shape[-1]) % 2 == 0, 200.0, -200.0)
    batch = batch.replace(old_log_prob=batch.old_log_prob - shift, obs_norm=states.obs_norm)
    new_states, metrics = s["update_many"](states, s["minibatches"](batch, _keys(21)), _keys(22), s["hypers"])
    _assert_finite(new_states, metrics)


def test_fixed_schedule_keeps_the_learning_rate(setup, trained):
    config = dataclasses.replace(setup["agent"].config, schedule="fixed", learning_epochs=2, minibatches=1)
    agent = PPO(config, OBS, ACT)
    state = jax.tree.map(lambda x: x[0], trained["states"]).replace(learning_rate=jnp.float32(1e-3))
    batch = jax.tree.map(lambda x: x[0, :8], trained["first"][0].replace(obs_norm=None)).replace(obs_norm=state.obs_norm)
    batch = batch.replace(old_mean=batch.old_mean + 3.0)  # a KL the adaptive schedule would answer
    new_state, metrics = jax.jit(agent.update_many)(state, agent.minibatches(batch, jax.random.PRNGKey(0)), None,
                                                    agent.hypers())
    assert metrics["kl"] > 2 * config.desired_kl
    np.testing.assert_allclose(metrics["learning_rate"], 1e-3)
    np.testing.assert_allclose(new_state.learning_rate, 1e-3)


def test_log_prob_of_saturated_actions_is_finite_and_matches_sampling():
    mean, log_std = jnp.asarray([0.3, -2.0]), jnp.asarray([0.0, -1.0])
    saturated = jnp.asarray([[1.0, -1.0], [1.0, 1.0]])

    @jax.jit
    def check(mean):
        logp, grad = jax.value_and_grad(lambda m: jnp.sum(tanh_gaussian_log_prob(m, log_std, saturated)))(mean)
        # Interior actions: the same log-prob as the sampler's reparameterised one.
        means = jnp.tile(mean, (256, 1))
        action, sampled = sample_tanh_gaussian(means, jnp.tile(log_std - 1.0, (256, 1)), jax.random.PRNGKey(0))
        return logp, grad, tanh_gaussian_log_prob(means, log_std - 1.0, action), sampled

    logp, grad, recomputed, sampled = check(mean)
    assert np.isfinite(logp) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(recomputed, sampled, rtol=1e-4, atol=1e-3)


SATURATED_MEAN = (28.0, -0.5)  # the pre-tanh mean of dimension 0 sits far past tanh's float32 range


def _np_tanh_gaussian_log_prob(mean, log_std, sample):
    """log N(u; mean, exp(log_std)) - log(1 - tanh(u)^2), summed over the last axis, in float64."""
    u, mean, log_std = (np.asarray(x, np.float64) for x in (sample, mean, log_std))
    gaussian = -0.5 * ((u - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
    log_det = 2.0 * (np.log(2.0) - np.abs(u) - np.log1p(np.exp(-2.0 * np.abs(u))))
    return np.sum(gaussian - log_det, axis=-1)


def test_a_saturated_action_is_scored_by_the_sample_it_came_from(setup):
    """MOPO-PPO's blow-up on DMSD: the actor's pre-tanh mean had run to 28, where every sampled action is 1 in float32
    and an inverted action reads as u = 7.25, 17 standard deviations below the mean: a row with a negative advantage
    pushed the mean further out, and the log-ratios reached -384. Scored by its sample, a row's old log-prob is the
    closed form at u, and the surrogate's gradient moves the mean towards a positive-advantage sample above it."""
    s, agent = setup, setup["agent"]
    states = s["states"].replace(actor=jax.tree_util.tree_map_with_path(
        lambda path, x: _constant_mean_leaf(path, x), s["states"].actor))
    rng = np.random.default_rng(8)
    shape = (POPULATION, HORIZON, ENVS)
    std = np.exp(np.asarray(states.log_std[0]))
    samples = (np.asarray(SATURATED_MEAN) + std * rng.normal(size=shape + (ACT,))).astype(np.float32)
    assert np.mean(np.tanh(samples[..., 0]) == 1.0) > 0.99  # what the tanh leaves of them
    obs = rng.normal(size=shape + (OBS,)).astype(np.float32)
    valid = np.ones(shape, bool)
    rows = Transitions(obs=obs, action=np.tanh(samples), reward=rng.normal(size=shape).astype(np.float32),
                       next_obs=obs + 0.1, terminal=np.zeros(shape, bool), timeout=np.zeros(shape, bool))
    _, batch, _ = s["prepare"](states, jax.tree.map(jnp.asarray, rows), jnp.asarray(valid), s["hypers"],
                               jnp.asarray(samples))
    expected = _np_tanh_gaussian_log_prob(SATURATED_MEAN, np.asarray(states.log_std)[:, None],
                                          samples.reshape(POPULATION, -1, ACT))
    np.testing.assert_allclose(batch.old_log_prob, expected, rtol=1e-5)

    # One valid row, advantage +1, sample 0.5 above the mean in dimension 0 (the policy unchanged: ratio 1).
    state = jax.tree.map(lambda x: x[0], states)
    one = jax.tree.map(lambda x: x[0, :2], batch.replace(obs_norm=None))
    one = one.replace(sample=one.sample.at[0, 0].set(SATURATED_MEAN[0] + 0.5), advantage=jnp.asarray([1.0, 0.0]),
                      weight=jnp.asarray([1.0, 0.0]))
    one = one.replace(old_log_prob=jnp.asarray(_np_tanh_gaussian_log_prob(SATURATED_MEAN, state.log_std, one.sample),
                                               jnp.float32))
    params = {"actor": state.actor, "critic": state.critic, "log_std": state.log_std}
    grads = jax.grad(lambda p: agent.loss(p, one.obs, one, agent.hypers()["ppo"])[0])(params)
    bias_grad = grads["actor"]["params"]["Dense_2"]["bias"]
    # d(-A log pi)/d mean_0 = -A (u - mean) / sigma^2: the step raises the mean towards the sample.
    np.testing.assert_allclose(bias_grad[0], -0.5 / std[0] ** 2, rtol=1e-4)


def _constant_mean_leaf(path, leaf):
    """The actor's output layer (Dense_2) set to give SATURATED_MEAN at every observation."""
    names = [getattr(p, "key", None) for p in path]
    if "Dense_2" not in names:
        return leaf
    if names[-1] == "kernel":
        return jnp.zeros_like(leaf)
    return jnp.broadcast_to(jnp.asarray(SATURATED_MEAN, leaf.dtype), leaf.shape)


def test_normalizer_matches_the_union_of_weighted_rows():
    rng = np.random.default_rng(0)
    first, second = rng.normal(2.0, 3.0, (50, 3)), rng.normal(-1.0, 0.5, (30, 3))
    w1, w2 = rng.random(50) < 0.7, rng.random(30) < 0.4
    first[~w1] = np.nan  # rows of weight 0 may hold anything
    update = jax.jit(ObsNormalizer.update)
    norm = ObsNormalizer.create(3)
    norm = update(norm, jnp.asarray(first, jnp.float32), jnp.asarray(w1, jnp.float32))
    norm = update(norm, jnp.asarray(second, jnp.float32), jnp.asarray(w2, jnp.float32))
    union = np.concatenate([first[w1], second[w2]])
    np.testing.assert_allclose(norm.mean, union.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(norm.var, union.var(0), rtol=1e-4)
    np.testing.assert_allclose(norm.count, len(union))
    np.testing.assert_allclose(norm.normalize(jnp.asarray(union[:1], jnp.float32)),
                               (union[:1] - union.mean(0)) / (union.std(0) + 1e-2), rtol=1e-4)


@pytest.mark.parametrize("field, value", [
    ("hidden_sizes", ()), ("activation", "swishy"), ("learning_rate", 0.0), ("learning_epochs", 0),
    ("minibatches", 2.5), ("clip", -0.1), ("clip_value_loss", 1), ("value_loss_coef", -1.0),
    ("entropy_coef", float("nan")), ("gamma", 1.5), ("lam", -0.1), ("desired_kl", 0.0), ("schedule", "cosine"),
    ("max_grad_norm", 0.0), ("init_noise_std", -1.0), ("normalize_obs", "yes"), ("bc_init_iterations", -1),
    ("bc_coef", -1.0),
])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=f"ppo.{field}: expected"):
        PPOConfig(**{field: value})


BC_ITERATIONS = 80
DEMO_STD = 0.2


def _demo_mean(obs):
    """The demonstrator's Gaussian mean before the tanh: a fixed linear map (a closed form to compare with)."""
    return 0.8 * obs[..., ::-1] - 0.3


def _bc_error_bound(agent, state, rows, learning_rate):
    """The bound on the root-mean-square error of the cloned mean, 3 * sqrt(floor + sigma^2 p / n) (see the test)."""
    sigma, batch = DEMO_STD, rows // agent.config.minibatches
    demo_obs = jax.random.uniform(jax.random.PRNGKey(5), (rows, OBS), minval=-1.0, maxval=1.0)

    def mean(params, obs):
        return agent.actor.apply(params, obs[None])[0]

    jacobian = jax.jit(jax.vmap(jax.jacrev(mean), (None, 0)))(state.actor, state.obs_norm.normalize(demo_obs))
    # S_j = sum_k E_s (d mu_k / d theta_j)^2 per weight j; G = sum_j sqrt(S_j)
    g = sum(float(jnp.sum(jnp.sqrt(jnp.sum(jnp.mean(leaf ** 2, axis=0), axis=0)))) for leaf in jax.tree.leaves(jacobian))
    floor = learning_rate * sigma * g / (2.0 * np.sqrt(batch) * ACT)
    sampling = sigma ** 2 * (OBS + 1) / rows
    return 3.0 * np.sqrt(floor + sampling)


def test_bc_init_fits_the_dataset_policy_then_hands_over_to_ppo(setup):
    """With `bc_init_iterations`, the first iterations fit the actor to demonstrations a = tanh(W s + b + sigma e)
    (sigma = DEMO_STD = 0.2) by maximum likelihood: its mean reaches W s + b and its noise sigma (the demonstrator's,
    in closed form), while the adaptive schedule leaves the rate alone; the iteration after the phase is PPO's again.

    The bound on the mean, derived rather than fitted to one machine's run. The cloning phase is BC_ITERATIONS = 80
    iterations of 5 epochs x 4 minibatches: 1,600 Adam steps at the constant rate eta = 3e-3, each on B = 256 of the
    iteration's n = 1,024 fresh demonstrations. In u = atanh(a) the loss is Gaussian, (mu(s) - u)^2 / (2 sigma^2) per
    action dim, so at its optimum the gradient noise's covariance C equals the Hessian H (the Fisher information).
    1) Sampling: the ML estimate of a linear map with p = OBS + 1 = 3 parameters per action dim from n rows has
       E[(mu_hat - mu)^2] = sigma^2 p / n = 1.2e-4 averaged over s (rms 0.011).
    2) Optimisation: Adam at a constant rate does not converge; it jitters about the optimum. Linearised
       (Ornstein-Uhlenbeck), its preconditioner P = diag(1 / sqrt(v)) with v = diag(C) / B, the stationary
       covariance solves P H S + S H P = eta P C P / B, so S = eta P / (2 B) (C = H): weight j jitters with variance
       eta sigma / (2 sqrt(B) sqrt(S_j)), S_j = sum_k E_s (d mu_k / d theta_j)^2. Through the network's Jacobian the
       mean-square error of mu over s and the K = ACT dims is floor = eta sigma G / (2 sqrt(B) K), G = sum_j
       sqrt(S_j), computed below from the trained actor (G is 70-85 for this 32x32 actor: floor ~ 7e-4, rms 0.026).
       Heavy-ball momentum (beta1 = 0.9, EMA form) leaves the leading order unchanged; after 1,600 steps Adam's bias
       correction is gone; the transient from the initial actor (rms 0.48) is over well before: the same run with
       sigma = 0 ends at rms 0.009, a third of the floor.
    The error field is smooth (nearly linear in s), so its mean square over the 1,000 probe elements is a sum of few
    chi-squares: taking it as chi^2 with d >= 2 degrees of freedom about its expectation, P(mse > 9 E) <= e^-9 ~
    1e-4. The bound is therefore rms(mu - W s - b) <= 3 sqrt(floor + sigma^2 p / n) (about 0.085), with 3 the
    stated margin. Over 13 PRNG streams on one machine (some of which fail the old fixed atol=0.05 on tanh: 141 of
    1,000 elements on an AVX2 EPYC) the rms was 0.014-0.047, 0.024 in quadrature, against the predicted 0.028.
    For a linear error e(s) = d0 + d . s over the probe box |s_i| <= 0.9 (E s_i^2 = 0.27), Cauchy-Schwarz gives
    |e(s)| <= sqrt(1 + 2 * 0.81 / 0.27) = sqrt(7) times that action dim's rms, itself <= sqrt(2) times the rms
    over both dims: the 99th percentile of |mu - W s - b| must be within sqrt(14) times the bound (a fit that is
    right on average and wrong in a corner fails). A broken cloning phase fails: the initial actor is at rms 0.48
    (bound 0.11), demonstrations left unnormalised end at 0.19 (bound 0.087); a phase of 4 iterations (80 steps)
    fits the mean already (0.053, bound 0.13) but leaves the noise at 0.8, which the check of the noise refuses.
    The noise: its ML estimate has relative standard error 1 / sqrt(2 n) = 2.2%, its jitter (the same formula,
    S = 2 / sigma^2 per log-std) 0.8%, and the mean's error inflates it by mse / (2 sigma^2) < 2.5%: rtol 0.15 is
    over 5 standard deviations plus that bias."""
    config = dataclasses.replace(setup["agent"].config, bc_init_iterations=BC_ITERATIONS, learning_rate=3e-3)
    agent = PPO(config, OBS, ACT)
    model, starts = setup["model"], setup["starts"]
    hypers = agent.hypers()
    rows = ENVS * HORIZON

    @jax.jit
    def iteration(state, key):
        rollout_key, demo_key, noise_key, batch_key = jax.random.split(key, 4)
        imagined = on_policy_rollout(rollout_key, model, agent, agent.actor_params(state), starts, HORIZON,
                                     RolloutConfig())
        demo_obs = jax.random.uniform(demo_key, (rows, OBS), minval=-1.0, maxval=1.0)
        demo_action = jnp.tanh(_demo_mean(demo_obs) + DEMO_STD * jax.random.normal(noise_key, (rows, ACT)))
        _, batch, _ = agent.prepare(state, imagined.transitions, imagined.valid, hypers, imagined.policy_carry,
                                    demonstrations=(demo_obs, demo_action))
        return agent.update_many(state, agent.minibatches(batch, batch_key), None, hypers)

    state = jax.jit(agent.init)(jax.random.PRNGKey(3), hypers)
    for i in range(BC_ITERATIONS):
        state, metrics = iteration(state, jax.random.PRNGKey(1000 + i))
        np.testing.assert_allclose(metrics["learning_rate"], 3e-3, rtol=1e-6)  # the schedule waits for PPO
    assert np.isfinite(metrics["bc_loss"])
    probe = np.random.default_rng(0).uniform(-0.9, 0.9, (500, OBS)).astype(np.float32)
    mean = agent.actor.apply(state.actor, state.obs_norm.normalize(jnp.asarray(probe)))
    error = np.abs(np.asarray(mean) - _demo_mean(probe))  # in u = atanh(a); tanh is 1-Lipschitz
    bound = _bc_error_bound(agent, state, rows, 3e-3)
    assert np.sqrt(np.mean(error ** 2)) <= bound, (np.sqrt(np.mean(error ** 2)), bound)
    assert np.quantile(error, 0.99) <= np.sqrt(14.0) * bound, (np.quantile(error, 0.99), bound)
    np.testing.assert_allclose(np.exp(state.log_std), DEMO_STD, rtol=0.15)
    _, metrics = iteration(state, jax.random.PRNGKey(9))
    assert not np.isclose(metrics["learning_rate"], 3e-3)  # PPO's adaptive schedule is back


def test_bc_coef_adds_the_weighted_likelihood_after_the_cloning_phase(setup, trained):
    """After the cloning phase, `bc_coef` c adds c times the demonstrations' negative log-likelihood to PPO's loss
    (the loss is linear in c); during the phase the actor's part is that likelihood alone, whatever c."""
    batch, _ = trained["first"]
    state = jax.tree.map(lambda x: x[0], trained["states"])
    rows = jax.tree.map(lambda x: x[0, :64], batch.replace(obs_norm=None))
    rng = np.random.default_rng(1)
    demo_obs = jnp.asarray(rng.uniform(-1, 1, (64, OBS)), jnp.float32)
    rows = rows.replace(demo_obs=demo_obs, demo_action=jnp.tanh(_demo_mean(demo_obs)))
    params = {"actor": state.actor, "critic": state.critic, "log_std": state.log_std}
    hypers = setup["agent"].hypers()["ppo"]

    def loss(coef, cloning):
        agent = PPO(dataclasses.replace(setup["agent"].config, bc_coef=coef), OBS, ACT)
        value, metrics = agent.loss(params, rows.obs, rows, hypers, demo_obs, jnp.asarray(cloning))
        return float(value), {k: float(v) for k, v in metrics.items()}

    base, metrics = loss(0.0, False)
    weighted, _ = loss(2.5, False)
    np.testing.assert_allclose(weighted - base, 2.5 * metrics["bc_loss"], rtol=1e-4)
    cloned, metrics = loss(2.5, True)
    np.testing.assert_allclose(cloned, metrics["bc_loss"] + hypers["value_loss_coef"] * metrics["value_loss"], rtol=1e-5)


def test_bc_init_needs_the_dataset_rows(setup):
    agent = PPO(dataclasses.replace(setup["agent"].config, bc_init_iterations=1), OBS, ACT)
    state = jax.tree.map(lambda x: x[0], setup["states"])
    rows = Transitions(*(jnp.zeros((HORIZON, ENVS) + shape) for shape in ((OBS,), (ACT,), (), (OBS,), (), ())))
    with pytest.raises(ConfigError, match="bc_init_iterations"):
        agent.prepare(state, rows, jnp.ones((HORIZON, ENVS), bool), agent.hypers(), jnp.zeros((HORIZON, ENVS, ACT)))


def test_minibatches_must_divide_the_rows():
    agent = PPO(PPOConfig(hidden_sizes=(8,), minibatches=4), OBS, ACT)
    rows = 10
    batch = PPOBatch(*(jnp.zeros((rows,)) for _ in range(9)))
    with pytest.raises(ConfigError, match="ppo.minibatches"):
        agent.minibatches(batch, jax.random.PRNGKey(0))
