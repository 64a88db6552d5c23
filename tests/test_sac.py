"""The SAC-N core (critic loss, EDAC term, update) and online SAC on a real MuJoCo env."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.networks import sample_tanh_gaussian
from agents.sac import HostLoop, OnlineSAC, SACConfig
from agents.sac_n import SACN, SACNConfig
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
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
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
    loss, metrics = jax.jit(agent.critic_loss)(state.critic_params, state, batch, key)

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
    new_state, metrics = update(state, random_batch(2), jax.random.PRNGKey(1))
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
    new_state, metrics = update(state, random_batch(3), jax.random.PRNGKey(2))
    assert float(metrics["entropy"]) > agent.target_entropy  # a fresh policy is nearly uniform
    assert float(new_state.log_alpha) < float(state.log_alpha)


def test_update_many_equals_sequential_updates(edac, jitted_update):
    agent, state = edac
    update, update_many = jitted_update
    batches = [random_batch(10 + k) for k in range(3)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
    key = jax.random.PRNGKey(5)
    scanned, _ = update_many(state, stacked, key)
    sequential = state
    for batch, k in zip(batches, jax.random.split(key, 3)):
        sequential, _ = update(sequential, batch, k)
    for a, b in zip(jax.tree.leaves(scanned), jax.tree.leaves(sequential)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_edac_needs_two_critics():
    with pytest.raises(ConfigError, match=r"^sac\.eta: the EDAC term \(eta=1\.0\) needs sac\.num_critics >= 2"):
        SACNConfig(num_critics=1, eta=1.0)


def _online_run(sac: OnlineSAC, seed: int):
    env = gym.make("Hopper-v5")
    state = sac.init(jax.random.PRNGKey(seed))
    initial_actor = jax.tree.map(np.asarray, state.agent.actor_params)
    loop = HostLoop(sac, env, seed, env.action_space.low, env.action_space.high)
    metrics = None
    for _ in range(4):
        state, m = loop.run_chunk(state)
        metrics = m if m is not None else metrics
    return state, loop, metrics, initial_actor


@pytest.fixture(scope="module")
def online_sac():
    cfg = SACConfig(
        sacn=SACNConfig(hidden_sizes=(16, 16), batch_size=32), buffer_capacity=400, warmup_steps=100, chunk_steps=50
    )
    return OnlineSAC(cfg, 11, 3)  # one instance: its compiled chunk is shared by every run below


@pytest.fixture(scope="module")
def two_online_runs(online_sac):
    return _online_run(online_sac, 0), _online_run(online_sac, 0)


def test_online_sac_runs_chunks_and_learns_from_its_buffer(two_online_runs):
    (state, loop, metrics, initial_actor), _ = two_online_runs
    assert loop.env_steps == 200 and int(state.buffer.size) == 200
    assert int(state.agent.step) == 100  # updates start after the 100 warm-up steps, one per env step
    assert all(np.isfinite(float(v)) for v in metrics.values())
    changed = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(initial_actor), jax.tree.leaves(state.agent.actor_params))]
    assert any(changed)
    # The buffer holds real consecutive transitions: next_obs of a non-final step is the next obs.
    data = jax.tree.map(np.asarray, state.buffer.data)
    ends = data.terminal[:199] | data.timeout[:199]
    cont = np.flatnonzero(~ends)
    np.testing.assert_array_equal(data.next_obs[cont], data.obs[cont + 1])


def test_online_sac_is_deterministic_for_a_seed(two_online_runs):
    (a, loop_a, _, _), (b, loop_b, _, _) = two_online_runs
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert loop_a.log.returns == loop_b.log.returns


def test_behaviour_training_resumes_exactly_mid_episode(tmp_path, online_sac, two_online_runs):
    """A checkpoint taken mid-episode and restored continues bit for bit (scripts/train_behaviour.py)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "train_behaviour.py"
    spec = importlib.util.spec_from_file_location("train_behaviour", path)
    tb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tb)
    sac = online_sac
    (state_a, loop_a, _, _), _ = two_online_runs  # 4 chunks uninterrupted, seed 0

    def fresh():
        env = gym.make("Hopper-v5")
        return sac.init(jax.random.PRNGKey(0)), HostLoop(sac, env, 0, env.action_space.low, env.action_space.high)

    state_b, loop_b = fresh()
    for _ in range(3):
        state_b, _ = loop_b.run_chunk(state_b)
    assert loop_b.episode_in_progress() is not None  # the checkpoint falls inside an episode
    ckpt = tmp_path / "checkpoint.npz"
    tb.save_checkpoint(ckpt, state_b, loop_b, {"seed": 0})
    state_c, loop_c = fresh()
    state_c, progress = tb.load_checkpoint(ckpt, sac, state_c, loop_c)
    assert progress["env_steps"] == 150
    state_c, _ = loop_c.run_chunk(state_c)

    for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_c)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert loop_a.log.returns == loop_c.log.returns and loop_a.env_steps == loop_c.env_steps


def test_layer_norm_critic_stays_bounded_far_from_the_data():
    """LayerNorm makes Q scale-invariant in the input far out, where a plain ReLU critic grows linearly."""
    obs, action = random_batch(5).obs, random_batch(5).action
    far = {}
    for layer_norm in (False, True):
        core = SACN(SACNConfig(hidden_sizes=(16, 16), critic_layer_norm=layer_norm), OBS, ACT)
        params = core.init(jax.random.PRNGKey(1)).critic_params
        far[layer_norm] = [np.asarray(core.critic.apply(params, c * obs, c * action)) for c in (1e3, 1e5)]
    plain, normed = far[False], far[True]
    np.testing.assert_allclose(plain[1], 100.0 * plain[0], rtol=1e-2)  # linear growth: 100x the input, 100x Q
    np.testing.assert_allclose(normed[1], normed[0], rtol=1e-3, atol=1e-4)  # bounded
    assert np.max(np.abs(normed[1])) < 10.0


def test_actor_bc_term_equals_a_direct_computation_on_the_real_rows():
    bc_rows, coef = 3, 0.4
    core = SACN(SACNConfig(hidden_sizes=(16, 16), actor_bc_coef=coef, batch_size=BATCH), OBS, ACT, bc_rows)
    state = core.init(jax.random.PRNGKey(2))
    batch, key = random_batch(6), jax.random.PRNGKey(7)
    loss, (logp, metrics) = core.actor_loss(state.actor_params, state.critic_params, jnp.log(0.3), batch, key)

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
        state, _ = jax.jit(core.update_many)(core.init(jax.random.PRNGKey(0)), batches, jax.random.PRNGKey(1))
        mean_action = np.asarray(core.act(state.actor_params, batch.obs[:bc_rows], None, deterministic=True))
        gaps[coef] = float(np.mean(np.abs(mean_action - np.asarray(batch.action[:bc_rows]))))
    assert gaps[20.0] < 0.1 < gaps[0.0]


def test_an_anchor_actor_holds_the_policy_to_its_own_actions_on_every_row():
    """Fine-tuning's anchor: the BC term imitates a frozen actor's deterministic actions (not the batch's) on all
    rows. Updates with a large weight keep the policy on the anchor's actions; without the term it drifts."""
    batch = random_batch(8)
    core = SACN(SACNConfig(hidden_sizes=(32, 32), actor_bc_coef=20.0, batch_size=BATCH), OBS, ACT)
    start = core.init(jax.random.PRNGKey(0))
    anchor = jax.tree.map(jnp.copy, start.actor_params)
    _, (_, metrics) = core.actor_loss(start.actor_params, start.critic_params, jnp.log(0.3), batch, jax.random.PRNGKey(3),
                                      anchor_params=anchor)
    assert float(metrics["actor_bc"]) == 0.0  # the policy is its own anchor
    batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (300, *x.shape)), batch)
    anchored_action = np.asarray(core.act(anchor, batch.obs, None, deterministic=True))
    anchored, _ = jax.jit(core.update_many)(start, batches, jax.random.PRNGKey(1), None, anchor)
    free_core = SACN(SACNConfig(hidden_sizes=(32, 32), batch_size=BATCH), OBS, ACT)  # the same SAC, no BC term
    free, _ = jax.jit(free_core.update_many)(start, batches, jax.random.PRNGKey(1))
    gap = {name: float(np.mean(np.abs(np.asarray(core.act(s.actor_params, batch.obs, None, True)) - anchored_action)))
           for name, s in (("anchored", anchored), ("free", free))}
    assert gap["anchored"] < 0.05 < gap["free"]
