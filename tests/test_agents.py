"""The agents on the SAC-N core (RAVL, MOPO) and BC: losses against a direct computation, one update each.

The direct computation below re-implements the critic forward pass and its action-gradient in numpy,
member by member and pair by pair, so it shares no code with the batched JAX version it checks.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import presets
from agents.bc import BC, BCConfig
from agents.mopo import MOPO, MOPOConfig, penalized_reward
from agents.ravl import DEFAULT_SAC, RAVL
from agents.sac_n import SACNConfig
from mbrl import config as config_io
from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions

OBS_DIM, ACT_DIM, BATCH = 5, 2, 7


def small_batch(seed: int = 0, batch: int = BATCH) -> Transitions:
    rng = np.random.default_rng(seed)
    return Transitions(
        obs=jnp.asarray(rng.normal(size=(batch, OBS_DIM)), jnp.float32),
        action=jnp.asarray(rng.uniform(-1, 1, size=(batch, ACT_DIM)), jnp.float32),
        reward=jnp.asarray(rng.normal(size=batch), jnp.float32),
        next_obs=jnp.asarray(rng.normal(size=(batch, OBS_DIM)), jnp.float32),
        terminal=jnp.asarray(np.arange(batch) % 3 == 0),
        timeout=jnp.zeros(batch, bool),
    )


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


@pytest.fixture(scope="module")
def ravl_small():
    sac = dataclasses.replace(DEFAULT_SAC, num_critics=4, hidden_sizes=(16, 16), batch_size=BATCH, eta=1.0)
    agent = RAVL(sac, OBS_DIM, ACT_DIM)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    # Targets that differ from the online critics, so the loss reads the right ones.
    state = state.replace(target_critic_params=jax.tree.map(lambda x: x * 0.9 + 0.01, state.critic_params))
    return agent, state


def test_critic_loss_and_edac_term_equal_a_direct_computation(ravl_small):
    agent, state = ravl_small
    core, cfg = agent.core, agent.core.config
    batch, key = small_batch(), jax.random.PRNGKey(3)
    loss, metrics = jax.jit(core.critic_loss)(state.critic_params, state, batch, key)

    next_action, next_logp = core.sample(state.actor_params, batch.next_obs, key)  # the same draw as the loss
    obs, action = np.asarray(batch.obs), np.asarray(batch.action)
    next_obs, next_action = np.asarray(batch.next_obs), np.asarray(next_action)
    n = cfg.num_critics
    target_q = np.stack([numpy_q_and_action_grad(member_layers(state.target_critic_params, i), next_obs, next_action)[0] for i in range(n)])
    alpha = float(np.exp(state.log_alpha))
    not_done = 1.0 - np.asarray(batch.terminal, np.float64)
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


def _changed(before, after) -> bool:
    return any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


def _all_finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("algo", ["ravl", "mopo", "bc"])
def test_one_update_of_each_agent_is_finite_and_changes_the_parameters(algo):
    sac = SACNConfig(num_critics=3, hidden_sizes=(16, 16), batch_size=BATCH, eta=1.0 if algo == "ravl" else 0.0)
    agent = {
        "ravl": lambda: RAVL(sac, OBS_DIM, ACT_DIM),
        "mopo": lambda: MOPO(sac, MOPOConfig(penalty_coef=1.0), OBS_DIM, ACT_DIM),
        "bc": lambda: BC(BCConfig(hidden_sizes=(16, 16), batch_size=BATCH), OBS_DIM, ACT_DIM),
    }[algo]()
    state = jax.jit(agent.init)(jax.random.PRNGKey(1))
    new_state, metrics = jax.jit(agent.update)(state, small_batch(2), jax.random.PRNGKey(2))
    assert metrics and _all_finite(metrics) and _all_finite(new_state)
    assert _changed(agent.actor_params(state), agent.actor_params(new_state))
    if algo != "bc":
        assert _changed(state.critic_params, new_state.critic_params)
        assert _changed(state.target_critic_params, new_state.target_critic_params)
        assert float(new_state.log_alpha) != float(state.log_alpha)
        assert ("edac_diversity" in metrics) == (algo == "ravl")
    actions = agent.act(agent.actor_params(new_state), small_batch(3).obs, jax.random.PRNGKey(0), True)
    assert actions.shape == (BATCH, ACT_DIM) and bool(jnp.all(jnp.abs(actions) <= 1.0))


def test_mopo_reward_is_penalised_and_ravl_reward_is_not():
    reward, u = jnp.array([1.0, -0.5, 2.0]), jnp.array([0.1, 0.4, 0.0])
    mopo = MOPO(SACNConfig(hidden_sizes=(8,)), MOPOConfig(penalty_coef=2.5), OBS_DIM, ACT_DIM)
    np.testing.assert_allclose(mopo.model_reward(reward, u), [0.75, -1.5, 2.0], rtol=1e-6)
    np.testing.assert_allclose(penalized_reward(reward, u, 0.0), reward)
    np.testing.assert_allclose(RAVL(SACNConfig(hidden_sizes=(8,)), OBS_DIM, ACT_DIM).model_reward(reward, u), reward)
    with pytest.raises(ConfigError, match="penalty_coef"):
        MOPOConfig(penalty_coef=-1.0)


def test_presets_follow_the_published_configs():
    hopper = config_io.build("mopo", "hopper-medium", "paper")
    assert (hopper.imagination.horizon, hopper.mopo.penalty_coef) == (5, 5.0)
    walker = config_io.build("mopo", "walker2d-medium-replay", "paper")
    assert (walker.imagination.horizon, walker.mopo.penalty_coef) == (1, 1.0)
    cheetah = config_io.build("mopo", "/data/halfcheetah-medium-v2.hdf5", "quick")  # keyed by the file's name
    assert (cheetah.imagination.horizon, cheetah.mopo.penalty_coef) == (1, 1.0)
    ravl = config_io.build("ravl", "hopper-medium", "paper")
    assert (ravl.sac.num_critics, tuple(ravl.sac.hidden_sizes), ravl.sac.eta) == (10, (256, 256, 256), 1.0)
    assert (ravl.imagination.rollouts_per_epoch, ravl.imagination.retain_epochs, ravl.imagination.real_ratio) == (50_000, 5, 0.05)
    assert (ravl.sac.gamma, ravl.sac.tau, ravl.sac.batch_size, ravl.sac.critic_lr) == (0.99, 5e-3, 256, 3e-4)
    for algo, weight in (("mopo", 2.5), ("ravl", 1.0)):  # the papers have no BC anchor; the CPU-budget presets do
        paper, quick = (config_io.build(algo, "hopper-medium", name) for name in ("paper", "quick"))
        assert (paper.sac.actor_bc_coef, paper.imagination.real_ratio) == (0.0, 0.05)
        assert (quick.sac.actor_bc_coef, quick.imagination.real_ratio) == (weight, 0.5)
    for algo in presets.ALGOS:
        for name in presets.PRESETS:
            config = config_io.build(algo, "hopper-medium", name)
            assert config_io.from_dict(config_io.to_dict(config)) == config  # config.json round trip


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"sac": {"num_critics": 0}}, "sac.num_critics"),
        ({"sac": {"eta": 1.0, "num_critics": 1}}, "sac.eta"),
        ({"sac": {"hidden_sizes": "big"}}, "sac.hidden_sizes"),
        ({"schedule": {"epochs": -3}}, "schedule.epochs"),
        ({"imagination": {"real_ratio": 1.5}}, "imagination.real_ratio"),
        ({"sac": {"critic_learning_rate": 1e-3}}, "sac.critic_learning_rate"),
        ({"seeds": 0}, "seeds"),
        ({"sac": {"actor_bc_coef": -0.1}}, "sac.actor_bc_coef"),
        ({"sac": {"actor_bc_coef": 0.4}, "imagination": {"real_ratio": 0.0}}, "sac.actor_bc_coef"),
    ],
)
def test_bad_config_values_raise_config_errors_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config_io.build("ravl", "hopper-medium", "quick", overrides)
