"""The SAC-N core (critic loss, EDAC term, update) and online SAC on a real MuJoCo env."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mbrl.core.tanh_gaussian import sample_tanh_gaussian
from mbrl.agents.sac import OnlineSAC, SACConfig
from mbrl.agents.sac_n import SACN, SACNConfig, narrow_action_notice
from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions

OBS, ACT, BATCH = 5, 2, 8


def random_batch(seed: int, batch: int = BATCH) -> Transitions:
    rng = np.random.default_rng(seed)
    return Transitions(
        obs=jnp.asarray(rng.normal(size=(batch, OBS)), jnp.float32),
        action=jnp.asarray(rng.uniform(-0.9, 0.9, (batch, ACT)), jnp.float32),
        reward=jnp.asarray(rng.normal(size=batch), jnp.float32),
        next_obs=jnp.asarray(rng.normal(size=(batch, OBS)), jnp.float32),
        terminal=jnp.asarray(np.arange(batch) % 3 == 0),
        timeout=jnp.asarray(np.arange(batch) % 4 == 1),
    )


@pytest.fixture(scope="module")
def edac():
    agent = SACN(SACNConfig(num_critics=3, hidden_sizes=(16, 16), eta=0.7, batch_size=BATCH), OBS, ACT)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0), agent.hypers())
    # Distinct target critics and a non-unit temperature, so each term of the target matters.
    state = state.replace(
        target_critic_params=jax.tree.map(lambda x: 0.8 * x + 0.01, state.critic_params),
        log_alpha=jnp.log(jnp.float32(0.3)),
    )
    return agent, state


@pytest.fixture(scope="module")
def jitted_update(edac):
    agent, _ = edac
    return jax.jit(agent.update), jax.jit(agent.update_many)


def test_tanh_gaussian_log_prob_matches_change_of_variables():
    mean = jnp.array([[0.3, -1.2], [2.0, 0.1]])
    log_std = jnp.array([[-0.5, 0.2], [-1.0, 0.0]])
    key = jax.random.PRNGKey(3)
    action, logp = sample_tanh_gaussian(mean, log_std, key)
    noise = np.asarray(jax.random.normal(key, mean.shape))
    u = np.asarray(mean) + np.exp(np.asarray(log_std)) * noise
    std = np.exp(np.asarray(log_std))
    gaussian = -0.5 * ((u - np.asarray(mean)) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    expected = np.sum(gaussian - np.log(1 - np.tanh(u) ** 2), axis=-1)
    np.testing.assert_allclose(np.asarray(action), np.tanh(u), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(logp), expected, rtol=1e-4, atol=1e-4)


def member_layers(critic_params, member: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(kernel, bias) of each Dense layer of one critic member, in order."""
    dense = critic_params["params"]["MLP_0"]
    names = sorted(dense, key=lambda n: int(n.split("_")[1]))
    return [(np.asarray(dense[n]["kernel"][member], np.float64), np.asarray(dense[n]["bias"][member], np.float64)) for n in names]


def numpy_q_and_action_grad(layers, obs, action):
    """Q(s, a) of a ReLU MLP and dQ/da by hand-written backpropagation."""
    x = np.concatenate([obs, action], axis=1).astype(np.float64)
    masks, h = [], x
    for kernel, bias in layers[:-1]:
        pre = h @ kernel + bias
        masks.append(pre > 0)
        h = np.maximum(pre, 0.0)
    kernel, bias = layers[-1]
    q = (h @ kernel + bias)[:, 0]
    grad = np.broadcast_to(kernel[:, 0], h.shape)
    for (kernel, _), mask in zip(reversed(layers[:-1]), reversed(masks)):
        grad = (grad * mask) @ kernel.T
    return q, grad[:, obs.shape[1]:]


def test_critic_loss_and_edac_term_equal_a_direct_computation(edac):
    """The critics' forward pass and action-gradients re-done in numpy, member by member and pair by pair,
    so the check shares no code with the batched JAX version."""
    agent, state = edac
    cfg = agent.config
    batch, key = random_batch(1), jax.random.PRNGKey(7)
    loss, metrics = jax.jit(agent.critic_loss)(state.critic_params, state, batch, key, agent.hypers())

    next_action, next_logp = agent.sample(state.actor_params, batch.next_obs, key)  # the same draw as the loss
    obs, action = np.asarray(batch.obs), np.asarray(batch.action)
    next_obs, next_action = np.asarray(batch.next_obs), np.asarray(next_action)
    n = cfg.num_critics
    target_q = np.stack([numpy_q_and_action_grad(member_layers(state.target_critic_params, i), next_obs, next_action)[0]
                         for i in range(n)])
    alpha = float(np.exp(state.log_alpha))
    not_done = 1.0 - np.asarray(batch.terminal, np.float64)  # timeouts still bootstrap
    target = np.asarray(batch.reward) + cfg.gamma * not_done * (target_q.min(axis=0) - alpha * np.asarray(next_logp))
    td = 0.0
    grads = []
    for i in range(n):
        q, grad = numpy_q_and_action_grad(member_layers(state.critic_params, i), obs, action)
        td += np.mean((q - target) ** 2)
        grads.append(grad / (np.linalg.norm(grad, axis=1, keepdims=True) + 1e-10))
    diversity = 0.0
    for i in range(n):
        for j in range(n):
            if i != j:
                diversity += np.mean(np.sum(grads[i] * grads[j], axis=1))
    diversity /= n - 1

    np.testing.assert_allclose(float(metrics["critic_loss"]), td, rtol=1e-4)
    np.testing.assert_allclose(float(metrics["edac_diversity"]), diversity, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(loss), td + cfg.eta * diversity, rtol=1e-4)


def test_update_is_finite_and_changes_every_parameter_group(edac, jitted_update):
    agent, state = edac
    update, _ = jitted_update
    new_state, metrics = update(state, random_batch(2), jax.random.PRNGKey(1), agent.hypers())
    assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
    for name in ("actor_params", "critic_params", "target_critic_params"):
        before = jax.tree.leaves(getattr(state, name))
        after = jax.tree.leaves(getattr(new_state, name))
        assert any(not np.allclose(a, b) for a, b in zip(before, after)), name
        assert all(np.all(np.isfinite(np.asarray(a))) for a in after), name
    # Polyak averaging of the targets towards the freshly updated critics.
    tau = agent.config.tau
    expected = jax.tree.map(lambda c, t: tau * c + (1 - tau) * t, new_state.critic_params, state.target_critic_params)
    for a, b in zip(jax.tree.leaves(new_state.target_critic_params), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    assert int(new_state.step) == 1


def test_temperature_falls_when_entropy_is_above_target(edac, jitted_update):
    agent, state = edac
    update, _ = jitted_update
    new_state, metrics = update(state, random_batch(3), jax.random.PRNGKey(2), agent.hypers())
    assert float(metrics["entropy"]) > agent.target_entropy  # a fresh policy is nearly uniform
    assert float(new_state.log_alpha) < float(state.log_alpha)


def test_update_many_equals_sequential_updates(edac, jitted_update):
    agent, state = edac
    update, update_many = jitted_update
    batches = [random_batch(10 + k) for k in range(3)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
    key, hypers = jax.random.PRNGKey(5), agent.hypers()
    scanned, _ = update_many(state, stacked, key, hypers)
    sequential = state
    for batch, k in zip(batches, jax.random.split(key, 3)):
        sequential, _ = update(sequential, batch, k, hypers)
    for a, b in zip(jax.tree.leaves(scanned), jax.tree.leaves(sequential)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_edac_needs_two_critics():
    with pytest.raises(ConfigError, match=r"^sac\.eta: the EDAC term \(eta=1\.0\) needs sac\.num_critics >= 2"):
        SACNConfig(num_critics=1, eta=1.0)


@pytest.fixture(scope="module")
def behaviour_script(load_script):
    """scripts/train_behaviour.py, whose online run (the one env loop feeding `OnlineSAC.chunk`) these tests drive."""
    return load_script("train_behaviour")


def _online_run(tb, sac: OnlineSAC, seed: int, chunks: int = 4):
    state = sac.init(jax.random.PRNGKey(seed))
    initial_actor = jax.tree.map(np.asarray, state.agent.actor_params)
    run = tb.OnlineRun.start(sac, gym.make("Hopper-v5"), seed)
    metrics = None
    for _ in range(chunks):
        state, m = run.run_chunk(state)
        metrics = m if m is not None else metrics
    return state, run, metrics, initial_actor


@pytest.fixture(scope="module")
def online_sac():
    cfg = SACConfig(
        sacn=SACNConfig(hidden_sizes=(16, 16), batch_size=32), buffer_capacity=400, warmup_steps=100, chunk_steps=50
    )
    return OnlineSAC(cfg, 11, 3)  # one instance: its compiled chunk is shared by every run below


@pytest.fixture(scope="module")
def two_online_runs(behaviour_script, online_sac):
    return _online_run(behaviour_script, online_sac, 0), _online_run(behaviour_script, online_sac, 0)


def test_online_sac_runs_chunks_and_learns_from_its_buffer(two_online_runs):
    (state, run, metrics, initial_actor), _ = two_online_runs
    assert run.env_steps == 200 and int(state.buffer.size) == 200
    assert int(state.agent.step) == 100  # updates start after the 100 warm-up steps, one per env step
    assert all(np.isfinite(float(v)) for v in metrics.values())
    changed = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(initial_actor), jax.tree.leaves(state.agent.actor_params))]
    assert any(changed)
    # The buffer holds real consecutive transitions: next_obs of a non-final step is the next obs.
    data = jax.tree.map(np.asarray, state.buffer.data)
    ends = data.terminal[:199] | data.timeout[:199]
    cont = np.flatnonzero(~ends)
    np.testing.assert_array_equal(data.next_obs[cont], data.obs[cont + 1])
    # Every ended episode is logged where the buffer ends it, with its rewards' sum.
    end_rows = np.flatnonzero(data.terminal[:200] | data.timeout[:200])
    assert len(run.returns) == len(end_rows) > 0
    assert run.end_steps == [int(e) + 1 for e in end_rows]
    starts = np.concatenate([[0], end_rows[:-1] + 1])
    np.testing.assert_allclose(run.returns, [data.reward[a:b + 1].sum() for a, b in zip(starts, end_rows)], rtol=1e-5)


def test_online_sac_is_deterministic_for_a_seed(two_online_runs):
    (a, run_a, _, _), (b, run_b, _, _) = two_online_runs
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert run_a.returns == run_b.returns


def test_behaviour_training_resumes_exactly_mid_episode(tmp_path, behaviour_script, online_sac, two_online_runs):
    """A checkpoint taken mid-episode and restored continues bit for bit (scripts/train_behaviour.py)."""
    tb, sac = behaviour_script, online_sac
    (state_a, run_a, _, _), _ = two_online_runs  # 4 chunks uninterrupted, seed 0

    state_b, run_b, _, _ = _online_run(tb, sac, 0, chunks=3)
    assert run_b.loop.in_progress(0) is not None  # the checkpoint falls inside an episode
    ckpt = tmp_path / "checkpoint.npz"
    tb.save_checkpoint(ckpt, state_b, run_b, {"seed": 0})
    state_c, run_c = sac.init(jax.random.PRNGKey(0)), tb.OnlineRun.start(sac, gym.make("Hopper-v5"), 0)
    state_c, progress = tb.load_checkpoint(ckpt, sac, state_c, run_c)
    assert progress["env_steps"] == 150
    state_c, _ = run_c.run_chunk(state_c)

    for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_c)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert run_a.returns == run_c.returns and run_a.end_steps == run_c.end_steps and run_a.env_steps == run_c.env_steps


def test_layer_norm_critic_stays_bounded_far_from_the_data():
    """LayerNorm makes Q scale-invariant in the input far out, where a plain ReLU critic grows linearly."""
    obs, action = random_batch(5).obs, random_batch(5).action
    far = {}
    for layer_norm in (False, True):
        core = SACN(SACNConfig(hidden_sizes=(16, 16), critic_layer_norm=layer_norm), OBS, ACT)
        params = core.init(jax.random.PRNGKey(1), core.hypers()).critic_params
        far[layer_norm] = [np.asarray(core.critic.apply(params, c * obs, c * action)) for c in (1e3, 1e5)]
    plain, normed = far[False], far[True]
    np.testing.assert_allclose(plain[1], 100.0 * plain[0], rtol=1e-2)  # linear growth: 100x the input, 100x Q
    np.testing.assert_allclose(normed[1], normed[0], rtol=1e-3, atol=1e-4)  # bounded
    assert np.max(np.abs(normed[1])) < 10.0


def test_actor_bc_term_equals_a_direct_computation_on_the_real_rows():
    bc_rows, coef = 3, 0.4
    core = SACN(SACNConfig(hidden_sizes=(16, 16), actor_bc_coef=coef, batch_size=BATCH), OBS, ACT, bc_rows)
    state = core.init(jax.random.PRNGKey(2), core.hypers())
    batch, key = random_batch(6), jax.random.PRNGKey(7)
    loss, (logp, metrics) = core.actor_loss(state.actor_params, state.critic_params, jnp.log(0.3), batch, key,
                                            core.hypers())

    action, same_logp = core.sample(state.actor_params, batch.obs, key)
    q = np.asarray(core.critic.apply(state.critic_params, batch.obs, action)).min(axis=0)
    mean_action = np.asarray(core.act(state.actor_params, batch.obs, key, deterministic=True), np.float64)
    data_action = np.asarray(batch.action, np.float64)
    bc = np.mean(np.sum((mean_action[:bc_rows] - data_action[:bc_rows]) ** 2, axis=1))
    expected = np.mean(0.3 * np.asarray(same_logp) - q) + coef * np.mean(np.abs(q)) * bc
    np.testing.assert_allclose(float(metrics["actor_bc"]), bc, rtol=1e-5)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-4)


def test_actor_bc_term_pulls_the_policy_to_the_data_actions():
    """With a large BC weight, a few hundred updates on one batch bring the policy's mean action to the
    data's actions on the real rows; without it they stay apart."""
    bc_rows = 4
    batch = random_batch(8)
    gaps = {}
    for coef in (0.0, 20.0):
        core = SACN(SACNConfig(hidden_sizes=(32, 32), actor_bc_coef=coef, batch_size=BATCH), OBS, ACT, bc_rows)
        batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (300, *x.shape)), batch)
        state, _ = jax.jit(core.update_many)(core.init(jax.random.PRNGKey(0), core.hypers()), batches, jax.random.PRNGKey(1),
                                             core.hypers())
        mean_action = np.asarray(core.act(state.actor_params, batch.obs[:bc_rows], None, deterministic=True))
        gaps[coef] = float(np.mean(np.abs(mean_action - np.asarray(batch.action[:bc_rows]))))
    assert gaps[20.0] < 0.1 < gaps[0.0]


def test_an_anchor_actor_holds_the_policy_to_its_own_actions_on_every_row():
    """Fine-tuning's anchor: the BC term imitates a frozen actor's deterministic actions (not the batch's) on all
    rows. Updates with a large weight keep the policy on the anchor's actions; without the term it drifts."""
    batch = random_batch(8)
    core = SACN(SACNConfig(hidden_sizes=(32, 32), actor_bc_coef=20.0, batch_size=BATCH), OBS, ACT)
    start = core.init(jax.random.PRNGKey(0), core.hypers())
    anchor = jax.tree.map(jnp.copy, start.actor_params)
    _, (_, metrics) = core.actor_loss(start.actor_params, start.critic_params, jnp.log(0.3), batch, jax.random.PRNGKey(3),
                                      core.hypers(), anchor_params=anchor)
    assert float(metrics["actor_bc"]) == 0.0  # the policy is its own anchor
    batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (300, *x.shape)), batch)
    anchored_action = np.asarray(core.act(anchor, batch.obs, None, deterministic=True))
    anchored, _ = jax.jit(core.update_many)(start, batches, jax.random.PRNGKey(1), core.hypers(), anchor)
    free_core = SACN(SACNConfig(hidden_sizes=(32, 32), batch_size=BATCH), OBS, ACT)  # the same SAC, no BC term
    free, _ = jax.jit(free_core.update_many)(start, batches, jax.random.PRNGKey(1), free_core.hypers())
    gap = {name: float(np.mean(np.abs(np.asarray(core.act(s.actor_params, batch.obs, None, True)) - anchored_action)))
           for name, s in (("anchored", anchored), ("free", free))}
    assert gap["anchored"] < 0.05 < gap["free"]


# ----------------------------------------------------------------- reference options (edge-of-reach, OfflineRL-Kit)


def dense_layers(params) -> list[tuple[np.ndarray, np.ndarray]]:
    """(kernel, bias) of each Dense layer of an actor or critic ensemble (member axis kept), in order."""
    dense = params["params"]["MLP_0"]
    names = sorted((n for n in dense if n.startswith("Dense_")), key=lambda n: int(n.split("_")[1]))
    return [(np.asarray(dense[n]["kernel"]), np.asarray(dense[n]["bias"])) for n in names]


def test_edac_and_torch_inits_have_the_reference_statistics():
    hidden = (64, 64)
    params = {}
    for init in ("flax", "edac", "torch"):
        core = SACN(SACNConfig(num_critics=3, hidden_sizes=hidden, init=init), OBS, ACT)
        state = core.init(jax.random.PRNGKey(0), core.hypers())
        params[init] = (state.actor_params, state.critic_params)
    # The parameter structure (and so checkpoints and exported policies) does not depend on the init.
    for init in ("edac", "torch"):
        assert jax.tree.structure(params[init]) == jax.tree.structure(params["flax"])
        assert [x.shape for x in jax.tree.leaves(params[init])] == [x.shape for x in jax.tree.leaves(params["flax"])]

    # The actor's fan is its input width; the critics' is their output width, as edge-of-reach's VectorizedLinear.
    for net, out_bound, fan_axis in zip(params["edac"], (1e-3, 3e-3), (-2, -1)):  # actor, critics
        layers = dense_layers(net)
        for kernel, bias in layers[:-1]:
            bound = 1.0 / np.sqrt(kernel.shape[fan_axis])
            np.testing.assert_array_equal(bias, np.float32(0.1))
            assert np.max(np.abs(kernel)) <= bound
            np.testing.assert_allclose(np.std(kernel), bound / np.sqrt(3.0), rtol=0.1)
        kernel, bias = layers[-1]
        assert np.max(np.abs(bias)) <= out_bound
        assert out_bound >= np.max(np.abs(kernel)) > 0.9 * out_bound  # drawn from the whole range
    members = dense_layers(params["edac"][1])[0][0]
    assert not np.allclose(members[0], members[1])  # each critic its own draw

    for net in params["torch"]:
        scaled_biases = []
        for kernel, bias in dense_layers(net):
            bound = 1.0 / np.sqrt(kernel.shape[-2])
            assert np.max(np.abs(kernel)) <= bound and np.max(np.abs(bias)) <= bound
            np.testing.assert_allclose(np.std(kernel), bound / np.sqrt(3.0), rtol=0.2)
            scaled_biases.append(bias.ravel() / bound)
        # Drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), not constant (pooled: the output layers hold few).
        np.testing.assert_allclose(np.std(np.concatenate(scaled_biases)), 1.0 / np.sqrt(3.0), rtol=0.2)


def reference_update(core: SACN, state, batch, key, order: str):
    """One update composed step by step from the core's losses and optax, in `order` (edge-of-reach's
    agent.py Agent.update for "alpha_actor_critic"), with the keys `SACN.update` draws."""
    cfg, hypers = core.config, core.hypers()
    adam = optax.scale_by_adam()

    def step(params, grads, opt_state, lr):
        direction, opt_state = adam.update(grads, opt_state)
        return optax.apply_updates(params, jax.tree.map(lambda d: -lr * d, direction)), opt_state

    def critic(actor_params, log_alpha, key):
        grads = jax.grad(lambda p: core.critic_loss(p, state.replace(actor_params=actor_params, log_alpha=log_alpha),
                                                    batch, key, hypers)[0])(state.critic_params)
        return step(state.critic_params, grads, state.critic_opt_state, cfg.critic_lr)

    def actor(critic_params, log_alpha, key):
        grads = jax.grad(lambda p: core.actor_loss(p, critic_params, log_alpha, batch, key, hypers)[0])(state.actor_params)
        logp = core.actor_loss(state.actor_params, critic_params, log_alpha, batch, key, hypers)[1][0]
        return (*step(state.actor_params, grads, state.actor_opt_state, cfg.actor_lr), logp)

    def temperature(logp):
        grad = jax.grad(lambda a: -a * (jnp.mean(logp) + core.target_entropy))(state.log_alpha)
        return step(state.log_alpha, grad, state.alpha_opt_state, cfg.alpha_lr)

    if order == "critic_actor_alpha":
        critic_key, actor_key = jax.random.split(key)
        critic_params, critic_opt = critic(state.actor_params, state.log_alpha, critic_key)
        actor_params, actor_opt, logp = actor(critic_params, state.log_alpha, actor_key)
        log_alpha, alpha_opt = temperature(logp)
    else:
        critic_key, actor_key, alpha_key = jax.random.split(key, 3)
        mean, log_std = core.actor.apply(state.actor_params, batch.obs)  # the pre-update actor
        log_alpha, alpha_opt = temperature(sample_tanh_gaussian(mean, log_std, alpha_key, cfg.logp_epsilon)[1])
        actor_params, actor_opt, logp = actor(state.critic_params, log_alpha, actor_key)
        critic_params, critic_opt = critic(actor_params, log_alpha, critic_key)
    target = jax.tree.map(lambda c, t: hypers["tau"] * c + (1 - hypers["tau"]) * t, critic_params,
                          state.target_critic_params)
    new_state = state.replace(actor_params=actor_params, critic_params=critic_params, target_critic_params=target,
                              log_alpha=log_alpha, actor_opt_state=actor_opt, critic_opt_state=critic_opt,
                              alpha_opt_state=alpha_opt, step=state.step + 1)
    return new_state, -jnp.mean(logp)


def _max_gap(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("order", ["critic_actor_alpha", "alpha_actor_critic"])
def test_update_equals_a_step_by_step_composition_in_its_order(order):
    """Large learning rates and a state a few updates in (Adam's moments no longer zero), so that using the old
    temperature, actor or critics where the order wants the new ones moves the result well beyond the tolerance."""
    other = "alpha_actor_critic" if order == "critic_actor_alpha" else "critic_actor_alpha"
    cfg = SACNConfig(num_critics=3, hidden_sizes=(16, 16), eta=0.7, batch_size=BATCH, actor_lr=3e-2, critic_lr=3e-2,
                     alpha_lr=0.3, logp_epsilon=1e-6 if order == "alpha_actor_critic" else 0.0, update_order=order)
    core = SACN(cfg, OBS, ACT)
    warm = jax.tree.map(lambda *xs: jnp.stack(xs), *[random_batch(20 + k) for k in range(3)])
    hypers = core.hypers()
    state, _ = jax.jit(core.update_many)(core.init(jax.random.PRNGKey(0), hypers), warm, jax.random.PRNGKey(4), hypers)
    batch, key = random_batch(30), jax.random.PRNGKey(6)

    new_state, metrics = jax.jit(core.update)(state, batch, key, hypers)
    expected, entropy = reference_update(core, state, batch, key, order)
    for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(metrics["entropy"]), float(entropy), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["alpha"]), float(np.exp(expected.log_alpha)), rtol=1e-6)

    wrong, _ = reference_update(core, state, batch, key, other)
    for name in ("actor_params", "critic_params"):
        assert _max_gap(getattr(new_state, name), getattr(wrong, name)) > 1e-3, name


def test_saturated_log_prob_with_the_references_epsilon():
    mean = jnp.array([[30.0, -30.0], [30.0, 30.0]])
    log_std = jnp.full_like(mean, -5.0)
    key = jax.random.PRNGKey(0)
    noise = np.asarray(jax.random.normal(key, mean.shape), np.float64)
    u = np.asarray(mean, np.float64) + np.exp(-5.0) * noise
    gaussian = np.sum(-0.5 * noise**2 + 5.0 - 0.5 * np.log(2 * np.pi), axis=-1)
    _, logp_eps = sample_tanh_gaussian(mean, log_std, key, 1e-6)
    _, logp_exact = sample_tanh_gaussian(mean, log_std, key)
    # float32 tanh(30) is 1 (XLA's older CPU tanh reaches 1 only from |u| = 20): each dimension's correction is
    # log(1e-6); the exact form is 2 (log 2 - |u|).
    np.testing.assert_allclose(gaussian - np.asarray(logp_eps), ACT * np.log(1e-6), rtol=1e-5)
    np.testing.assert_allclose(gaussian - np.asarray(logp_exact), np.sum(2 * (np.log(2) - np.abs(u)), axis=-1), rtol=1e-5)

    mean = jnp.array([[0.5, -1.0], [2.0, -2.0], [0.0, 1.5], [-2.3, 2.3]])
    log_std = jnp.full_like(mean, -2.0)
    _, logp_eps = sample_tanh_gaussian(mean, log_std, key, 1e-6)
    _, logp_exact = sample_tanh_gaussian(mean, log_std, key)
    u = np.asarray(mean) + np.exp(-2.0) * np.asarray(jax.random.normal(key, mean.shape))
    assert np.max(np.abs(u)) < 3.0
    np.testing.assert_allclose(np.asarray(logp_eps), np.asarray(logp_exact), atol=1e-3)


def test_logp_epsilon_reaches_every_log_prob_of_the_core():
    """An actor scaled up until tanh saturates: the actor loss's and the TD target's log-probs (and the temperature's,
    via the order test) are the epsilon form's, which differs there from the exact form by far."""
    core = SACN(SACNConfig(hidden_sizes=(16, 16), batch_size=BATCH, logp_epsilon=1e-6), OBS, ACT)
    hypers = core.hypers()
    state = core.init(jax.random.PRNGKey(3), hypers)
    state = state.replace(actor_params=jax.tree.map(lambda x: 30.0 * x, state.actor_params), log_alpha=jnp.log(0.5))
    batch, key = random_batch(9), jax.random.PRNGKey(8)
    mean, log_std = core.actor.apply(state.actor_params, batch.obs)
    eps_logp = np.asarray(sample_tanh_gaussian(mean, log_std, key, 1e-6)[1])
    exact_logp = np.asarray(sample_tanh_gaussian(mean, log_std, key)[1])
    assert np.max(np.abs(eps_logp - exact_logp)) > 1.0

    _, (logp, _) = core.actor_loss(state.actor_params, state.critic_params, state.log_alpha, batch, key, hypers)
    np.testing.assert_allclose(np.asarray(logp), eps_logp, rtol=1e-6)

    _, metrics = core.critic_loss(state.critic_params, state, batch, key, hypers)
    next_mean, next_log_std = core.actor.apply(state.actor_params, batch.next_obs)
    next_action, next_logp = sample_tanh_gaussian(next_mean, next_log_std, key, 1e-6)
    next_q = np.asarray(core.critic.apply(state.target_critic_params, batch.next_obs, next_action)).min(axis=0)
    not_done = 1.0 - np.asarray(batch.terminal, np.float32)
    target = np.asarray(batch.reward) + core.config.gamma * not_done * (next_q - 0.5 * np.asarray(next_logp))
    np.testing.assert_allclose(float(metrics["target_mean"]), float(np.mean(target)), rtol=1e-5)

    # The temperature's sample ("alpha_actor_critic" draws it from the pre-update actor with the third key): an
    # entropy target between the two forms' mean log-probs makes Adam's first step lower log_alpha only if the
    # step sees the epsilon form.
    alpha_key = jax.random.split(key, 3)[2]
    eps_mean = float(np.mean(sample_tanh_gaussian(mean, log_std, alpha_key, 1e-6)[1]))
    exact_mean = float(np.mean(sample_tanh_gaussian(mean, log_std, alpha_key)[1]))
    assert exact_mean - eps_mean > 1.0
    ordered = SACN(SACNConfig(hidden_sizes=(16, 16), batch_size=BATCH, logp_epsilon=1e-6, update_order="alpha_actor_critic",
                              target_entropy=-(eps_mean + exact_mean) / 2), OBS, ACT)
    new_state, _ = ordered.update(state, batch, key, ordered.hypers())
    assert float(new_state.log_alpha) < float(state.log_alpha)


def test_alpha_max_clamps_the_temperature_but_not_log_alpha():
    clamped = SACN(SACNConfig(hidden_sizes=(16, 16), batch_size=BATCH, alpha_max=1.0), OBS, ACT)
    free = SACN(SACNConfig(hidden_sizes=(16, 16), batch_size=BATCH), OBS, ACT)
    state = clamped.init(jax.random.PRNGKey(2), clamped.hypers()).replace(log_alpha=jnp.log(jnp.float32(3.0)))
    batch, key = random_batch(4), jax.random.PRNGKey(5)
    action, logp = clamped.sample(state.actor_params, batch.obs, key)
    q = np.asarray(clamped.critic.apply(state.critic_params, batch.obs, action)).min(axis=0)
    losses = {}
    for name, core in (("clamped", clamped), ("free", free)):
        losses[name] = float(core.actor_loss(state.actor_params, state.critic_params, state.log_alpha, batch, key,
                                             core.hypers())[0])
    np.testing.assert_allclose(losses["clamped"], np.mean(1.0 * np.asarray(logp) - q), rtol=1e-5)
    np.testing.assert_allclose(losses["free"], np.mean(3.0 * np.asarray(logp) - q), rtol=1e-5)

    new_state, metrics = jax.jit(clamped.update)(state, batch, key, clamped.hypers())
    assert float(metrics["alpha"]) == 1.0
    assert abs(float(new_state.log_alpha) - np.log(3.0)) < 1e-2  # one small Adam step from log 3, unclamped


@pytest.mark.parametrize("field, value", [("update_order", "actor_first"), ("init", "xavier"),
                                          ("logp_epsilon", -1e-6), ("alpha_max", 0.0)])
def test_bad_reference_options_raise_a_config_error_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"^sac\.{field}: expected"):
        SACNConfig(**{field: value})


def test_the_narrow_action_notice_compares_the_data_entropy_with_the_target():
    # A Gaussian of std s has entropy 0.5 * ln(2 pi e s^2) per dimension: 2 * (-2.0876) = -4.18 for s = 0.03.
    rng = np.random.default_rng(0)
    narrow = rng.normal(-0.5, 0.03, size=(200_000, 2))
    notice = narrow_action_notice(-2.0, narrow)  # SAC's default target, -|A|
    assert notice is not None and "target entropy -2;" in notice
    stated = float(notice.split("have entropy ")[1].split(" ")[0])
    assert abs(stated - 2 * (0.5 * np.log(2 * np.pi * np.e) + np.log(0.03))) < 0.01
    assert narrow_action_notice(-5.0, narrow) is None
    assert narrow_action_notice(-2.0, rng.uniform(-1, 1, size=(1000, 2))) is None
