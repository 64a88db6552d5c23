"""TD3+BC through the registry, against oracles written here in numpy: the networks' forward passes, λ = α / mean|Q|,
the actor loss, the smoothed and clipped target of the critics, the delayed updates' count, a few updates on one batch
lowering the losses they step on, the critic judge, and the presets' sources.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl import config as config_io
from mbrl import imagination
from mbrl.agents import registry
from mbrl.agents.networks import ObsScale
from mbrl.agents.td3_bc import smoothed_target_action
from mbrl.core.types import Transitions

OBS_DIM, ACT_DIM, BATCH = 5, 2, 8


def fixed_batch(seed: int = 0, terminal: bool = False) -> Transitions:
    rng = np.random.default_rng(seed)
    return Transitions(
        obs=jnp.asarray(rng.normal(3.0, 2.0, size=(BATCH, OBS_DIM)), jnp.float32),
        action=jnp.asarray(rng.uniform(-0.9, 0.9, size=(BATCH, ACT_DIM)), jnp.float32),
        reward=jnp.asarray(rng.normal(size=BATCH), jnp.float32),
        next_obs=jnp.asarray(rng.normal(3.0, 2.0, size=(BATCH, OBS_DIM)), jnp.float32),
        terminal=jnp.full(BATCH, terminal) if terminal else jnp.asarray(np.arange(BATCH) % 3 == 0),
        timeout=jnp.zeros(BATCH, bool),
    )


# A standardisation the networks apply inside, as the run's `normalize_obs` gives them.
SCALE = ObsScale(mean=(3.0, 2.5, 3.5, 3.0, 2.0), std=(2.0, 1.5, 2.5, 2.0, 1.0))


def build(overrides=None):
    own = {"hidden_sizes": [16, 16], "batch_size": BATCH, **(overrides or {})}
    config = config_io.build("td3-bc", "hopper-medium", "quick", {"td3_bc": own})
    entry = registry.entry("td3-bc")
    agent = registry.make(config, OBS_DIM, ACT_DIM, SCALE)
    return agent, config, entry.hypers_of(config), jax.jit(agent.update_many)


@pytest.fixture(scope="module")
def tiny():
    return build()


@pytest.fixture(scope="module")
def noisy():
    """Large smoothing noise (σ 3, clip 0.4): most draws are clipped."""
    return build({"policy_noise": 3.0, "noise_clip": 0.4})


# ----------------------------------------------------------------- numpy oracles


def dense_layers(tree) -> list[tuple[np.ndarray, np.ndarray]]:
    names = sorted((n for n in tree if n.startswith("Dense_")), key=lambda n: int(n.split("_")[1]))
    return [(np.asarray(tree[n]["kernel"], np.float64), np.asarray(tree[n]["bias"], np.float64)) for n in names]


def mlp(layers, x):
    for i, (kernel, bias) in enumerate(layers):
        x = x @ kernel + bias
        x = np.maximum(x, 0.0) if i < len(layers) - 1 else x
    return x


def standardise(obs):
    return (np.asarray(obs, np.float64) - np.asarray(SCALE.mean)) / np.asarray(SCALE.std)


def np_actor(params, obs):
    return np.tanh(mlp(dense_layers(params["params"]), standardise(obs)))


def np_critics(params, obs, action):
    """Q of each critic, (2, batch)."""
    layers = dense_layers(params["params"]["MLP_0"])
    x = np.concatenate([standardise(obs), np.asarray(action, np.float64)], axis=-1)
    return np.stack([mlp([(k[m], b[m]) for k, b in layers], x)[:, 0] for m in range(2)])


def batch_of(state_batch):
    return jax.tree.map(lambda x: x[None], state_batch)


# ----------------------------------------------------------------- tests


def test_td3_bc_learns_from_real_data_only_and_standardises_states():
    entry = registry.entry("td3-bc")
    assert entry.uses_model is False and entry.reads == ("td3_bc",)
    config = config_io.build("td3-bc", "hopper-medium", "quick")
    assert config.normalize_obs  # the paper's state normalisation is the run's
    assert not config_io.build("td3-bc", "hopper-medium", "quick", {"td3_bc": {"normalize_states": False}}).normalize_obs
    agent = registry.make(config, OBS_DIM, ACT_DIM)
    assert imagination.make(agent, config).uses_model is False


def test_lambda_and_the_actor_loss_match_a_numpy_oracle(tiny):
    agent, config, hypers, _ = tiny
    state = agent.init(jax.random.PRNGKey(0), hypers)
    batch = fixed_batch(1)
    loss, metrics = agent.actor_loss(state.actor_params, state.critic_params, batch, hypers["td3_bc"])

    pi = np_actor(state.actor_params, batch.obs)
    q1 = np_critics(state.critic_params, batch.obs, pi)[0]
    lmbda = config.td3_bc.alpha / np.mean(np.abs(q1))
    bc = np.mean((pi - np.asarray(batch.action)) ** 2)
    np.testing.assert_allclose(float(metrics["lambda"]), lmbda, rtol=1e-4)
    np.testing.assert_allclose(float(metrics["bc_loss"]), bc, rtol=1e-4)
    np.testing.assert_allclose(float(loss), -lmbda * np.mean(q1) + bc, rtol=1e-4, atol=1e-6)

    # λ is held constant: the gradient is that of -λ0 mean Q1 + BC with λ0 fixed, not of -α sign(Q).
    grads = jax.grad(lambda p: agent.actor_loss(p, state.critic_params, batch, hypers["td3_bc"])[0])(state.actor_params)
    lmbda0 = jnp.float32(lmbda)

    def fixed(p):
        action = agent.deterministic_action(p, batch.obs)
        q1 = agent.critic_values(state, batch.obs, action)[0]
        return -lmbda0 * jnp.mean(q1) + jnp.mean((action - batch.action) ** 2)

    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(jax.grad(fixed)(state.actor_params))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_the_target_policy_noise_is_clipped(noisy):
    target = jnp.array([[0.9, -0.2], [0.0, -0.95], [0.3, 0.3]])
    noise = jnp.array([[2.0, -0.01], [-5.0, 0.1], [0.05, -1.0]])
    got = np.asarray(smoothed_target_action(target, noise, 3.0, 0.4))
    want = np.clip(np.asarray(target) + np.clip(3.0 * np.asarray(noise), -0.4, 0.4), -1.0, 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.all(np.abs(got - np.asarray(target)) <= 0.4 + 1e-6) and np.all(np.abs(got) <= 1.0)

    # The critics' target: r + γ (1 - terminal) min_i Q'_i(s', clip(π'(s') + clip(σ ε, -c, c), -1, 1)), with ε the
    # normal draw of the update's key.
    agent, config, hypers, _ = noisy
    state = agent.init(jax.random.PRNGKey(2), hypers)
    batch, key = fixed_batch(3), jax.random.PRNGKey(7)
    _, metrics = agent.critic_loss(state.critic_params, state, batch, key, hypers["td3_bc"])
    eps = np.asarray(jax.random.normal(key, batch.action.shape), np.float64)
    assert np.mean(np.abs(3.0 * eps) > 0.4) > 0.5  # the clip is active on most draws
    next_action = np.clip(np_actor(state.target_actor_params, batch.next_obs) + np.clip(3.0 * eps, -0.4, 0.4), -1, 1)
    next_q = np_critics(state.target_critic_params, batch.next_obs, next_action).min(axis=0)
    y = np.asarray(batch.reward) + config.td3_bc.gamma * (1.0 - np.asarray(batch.terminal)) * next_q
    np.testing.assert_allclose(float(metrics["target_mean"]), np.mean(y), rtol=1e-4, atol=1e-6)
    q = np_critics(state.critic_params, batch.obs, batch.action)
    np.testing.assert_allclose(float(metrics["critic_loss"]), np.sum(np.mean((q - y) ** 2, axis=1)), rtol=1e-4)


def _changed(before, after) -> bool:
    return any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


def test_the_actor_and_targets_update_every_policy_freq_updates(tiny):
    agent, config, hypers, update_many = tiny
    assert config.td3_bc.policy_freq == 2
    state = agent.init(jax.random.PRNGKey(4), hypers)
    batch = batch_of(fixed_batch(4))
    moved = []
    for k in range(1, 7):  # one update per call: what moved at update k
        new, _ = update_many(state, batch, jax.random.PRNGKey(10 + k), hypers)
        moved.append((k, *(_changed(getattr(state, name), getattr(new, name)) for name in
                           ("critic_params", "actor_params", "target_actor_params", "target_critic_params"))))
        state = new
    # The critics every update; the actor and both targets on the 2nd, 4th and 6th only (sfujim's total_it % 2).
    assert moved == [(k, True, k % 2 == 0, k % 2 == 0, k % 2 == 0) for k in range(1, 7)]

    # Inside one compiled scan of K updates, with policy_freq 3: the optimizers' own step counts.
    agent3, _, hypers3, update3 = build({"policy_freq": 3})
    state3 = agent3.init(jax.random.PRNGKey(5), hypers3)
    batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (7, *x.shape)), fixed_batch(5))
    after, _ = update3(state3, batches, jax.random.PRNGKey(6), hypers3)
    assert (int(after.step), int(after.critic_opt_state.count), int(after.actor_opt_state.count)) == (7, 7, 7 // 3)


def test_a_few_updates_on_one_batch_lower_the_losses_they_step_on(tiny):
    agent, config, hypers, update_many = tiny
    h = hypers["td3_bc"]
    batch = fixed_batch(6, terminal=True)  # the TD target is the reward: the critic loss depends on the critics alone
    state = agent.init(jax.random.PRNGKey(8), hypers)
    batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (20, *x.shape)), batch)
    new, metrics = update_many(state, batches, jax.random.PRNGKey(9), hypers)
    critic = jax.jit(lambda p: agent.critic_loss(p, state, batch, jax.random.PRNGKey(0), h)[0])
    assert float(critic(new.critic_params)) < 0.9 * float(critic(state.critic_params))

    # The actor's objective with λ held at its value before (what its steps descend), on the critics it stepped
    # against: the first actor step (update 2) lowers it by about lr·‖g‖₁, Adam's first step.
    two, _ = update_many(state, jax.tree.map(lambda x: x[:2], batches), jax.random.PRNGKey(9), hypers)
    pi0 = agent.deterministic_action(state.actor_params, batch.obs)
    lmbda0 = h["alpha"] / jnp.mean(jnp.abs(agent.critic_values(two, batch.obs, pi0)[0]))

    def surrogate(p):
        action = agent.deterministic_action(p, batch.obs)
        q1 = agent.critic_values(two, batch.obs, action)[0]
        return -lmbda0 * jnp.mean(q1) + jnp.mean((action - batch.action) ** 2)

    grads = jax.grad(surrogate)(state.actor_params)
    gain = float(h["actor_lr"]) * sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(grads))
    drop = float(surrogate(state.actor_params)) - float(surrogate(two.actor_params))
    assert 0.5 * gain < drop < 1.5 * gain, (drop, gain)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((new, metrics)))


def test_the_critic_judge_and_acting(tiny):
    agent, config, hypers, _ = tiny
    state = agent.init(jax.random.PRNGKey(11), hypers)
    batch = fixed_batch(7)
    np.testing.assert_allclose(np.asarray(agent.critic_values(state, batch.obs, batch.action)),
                               np_critics(state.critic_params, batch.obs, batch.action), rtol=1e-4, atol=1e-6)
    assert agent.critic_gamma() == config.td3_bc.gamma
    _, metrics = agent.critic_loss(state.critic_params, state, batch, jax.random.PRNGKey(1), hypers["td3_bc"])
    np.testing.assert_allclose(float(agent.heldout_td_error(state, batch, jax.random.PRNGKey(1), hypers)),
                               float(metrics["critic_loss"]) / 2, rtol=1e-6)
    from mbrl.core.types import PolicyInput

    inputs = PolicyInput(batch.obs, jnp.zeros((BATCH, ACT_DIM)), jnp.zeros(BATCH), jnp.ones(BATCH, bool))
    action, carry = agent.act(agent.actor_params(state), (), inputs, jax.random.PRNGKey(0), False)
    np.testing.assert_allclose(np.asarray(action), np_actor(state.actor_params, batch.obs), rtol=1e-4, atol=1e-6)
    assert carry == ()


def test_presets_follow_their_sources():
    paper = config_io.build("td3-bc", "hopper-medium", "paper")
    t = paper.td3_bc  # sfujim/TD3_BC main.py defaults
    assert (tuple(t.hidden_sizes), t.actor_lr, t.critic_lr, t.batch_size) == ((256, 256), 3e-4, 3e-4, 256)
    assert (t.gamma, t.tau) == (0.99, 5e-3)
    assert (t.policy_noise, t.noise_clip, t.policy_freq, t.alpha, paper.normalize_obs) == (0.2, 0.5, 2, 2.5, True)
    assert paper.schedule.epochs * paper.schedule.updates_per_epoch == 1_000_000
    # NeoRL-2's grid optima (benchmark/results/<Task>-td3bc/log.csv), keyed by task.
    for source, expected in (("neorl2:DMSD", (0.2, 0.5)),
                             ("/data/SafetyHalfCheetah-high-100000-train.npz", (0.05, 2.5))):
        config = config_io.build("td3-bc", source, "quick")
        assert (config.td3_bc.alpha, config.td3_bc.policy_noise, config.td3_bc.noise_clip) == (*expected, 0.5)
    quick = config_io.build("td3-bc", "hopper-medium", "quick")
    assert (quick.schedule.epochs, quick.schedule.updates_per_epoch) == (20, 1000)
    assert config_io.from_dict(config_io.to_dict(quick)) == quick
    assert set(registry.entry("td3-bc").hyper_fields["td3_bc"]) == {"actor_lr", "critic_lr", "gamma", "tau", "alpha",
                                                                     "policy_noise", "noise_clip"}
