"""EDAC through the registry: real data only (no world model), its diversity term against a finite-difference
oracle in numpy, a few updates on one batch lowering the loss they step on, and its presets' sources.

The SAC-N core's losses themselves: tests/test_sac.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl import config as config_io
from mbrl import imagination
from mbrl.agents import registry
from mbrl.core.types import Transitions
from mbrl.agents.sac_n import edac_diversity
from batches import random_batch

OBS_DIM, ACT_DIM, BATCH, CRITICS = 5, 2, 8, 3


def fixed_batch(seed: int = 0, terminal: bool = False) -> Transitions:
    return random_batch(seed, BATCH, OBS_DIM, ACT_DIM, terminal)


@pytest.fixture(scope="module")
def tiny():
    """(agent, config, hypers, jitted update_many) on tiny networks, η from the preset."""
    config = config_io.build("edac", "hopper-medium", "quick",
                             {"sac": {"num_critics": CRITICS, "hidden_sizes": [16, 16], "batch_size": BATCH}})
    entry = registry.entry("edac")
    agent = registry.make(config, OBS_DIM, ACT_DIM)
    return agent, config, entry.hypers_of(config), jax.jit(agent.update_many)


def test_edac_learns_from_real_data_only():
    entry = registry.entry("edac")
    assert entry.uses_model is False and entry.model_kind is None and entry.imagination_fields == ()
    assert entry.reads == ("sac",)  # the shared SAC-N section, no model or imagination section
    config = config_io.build("edac", "hopper-medium", "quick")
    agent = registry.make(config, OBS_DIM, ACT_DIM)
    assert agent.imagination == "none"
    part = imagination.make(agent, config)
    assert part.uses_model is False and part.fixed_credit == config.schedule.updates_per_epoch
    assert agent.core.bc_rows is None  # every row of a batch is real


def numpy_diversity(critic_values, obs, action, eps=1e-3) -> float:
    """EDAC's term from central finite differences of each critic in its action: the mean over the batch of the
    summed off-diagonal cosines of the N action-gradients, over N - 1."""
    num, (batch, act_dim) = critic_values(obs, action).shape[0], action.shape
    grads = np.zeros((num, batch, act_dim))
    for j in range(act_dim):
        step = np.zeros((1, act_dim), np.float32)
        step[0, j] = eps
        grads[:, :, j] = (critic_values(obs, action + step) - critic_values(obs, action - step)) / (2 * eps)
    unit = grads / np.linalg.norm(grads, axis=-1, keepdims=True)
    total = 0.0
    for b in range(batch):
        cosine = unit[:, b] @ unit[:, b].T
        total += cosine.sum() - np.trace(cosine)
    return total / batch / (num - 1)


def test_the_diversity_term_is_in_the_loss_it_steps_on(tiny):
    agent, config, hypers, update_many = tiny
    assert config.sac.eta == 1.0 and agent.core.use_edac  # the preset's η: the term is compiled in
    batch = fixed_batch(1)
    state = agent.init(jax.random.PRNGKey(0), hypers)
    _, metrics = update_many(state, jax.tree.map(lambda x: x[None], batch), jax.random.PRNGKey(1), hypers)

    def critic_values(obs, action):
        return np.asarray(agent.critic_values(state, jnp.asarray(obs), jnp.asarray(action)), np.float64)

    expected = numpy_diversity(critic_values, np.asarray(batch.obs), np.asarray(batch.action))
    np.testing.assert_allclose(float(metrics["edac_diversity"]), expected, rtol=1e-3, atol=1e-4)

    # The loss is the TD part plus η times the term: η as data, no recompile.
    loss = jax.jit(lambda p, h: agent.core.critic_loss(p, state, batch, jax.random.PRNGKey(2), h)[0])
    doubled = {**hypers["sac"], "eta": jnp.float32(2.0)}
    _, parts = agent.core.critic_loss(state.critic_params, state, batch, jax.random.PRNGKey(2), hypers["sac"])
    td = float(parts["critic_loss"])
    diversity = float(metrics["edac_diversity"])  # the oracle's value, to its finite-difference error
    np.testing.assert_allclose(float(loss(state.critic_params, hypers["sac"])), td + diversity, rtol=1e-5)
    np.testing.assert_allclose(float(loss(state.critic_params, doubled)), td + 2 * diversity, rtol=1e-5)


def test_a_few_updates_on_one_batch_lower_the_critic_loss(tiny):
    agent, _, hypers, update_many = tiny
    batch = fixed_batch(2, terminal=True)  # the TD target is the reward: the loss depends on the critics alone
    state = agent.init(jax.random.PRNGKey(3), hypers)
    batches = jax.tree.map(lambda x: jnp.broadcast_to(x, (20, *x.shape)), batch)
    new_state, metrics = update_many(state, batches, jax.random.PRNGKey(4), hypers)
    loss = jax.jit(lambda p: agent.core.critic_loss(p, state, batch, jax.random.PRNGKey(5), hypers["sac"])[0])
    before, after = float(loss(state.critic_params)), float(loss(new_state.critic_params))
    assert after < 0.9 * before, (before, after)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((new_state, metrics)))
    assert int(new_state.step) == 20


def test_presets_follow_their_sources():
    # D4RL: OfflineRL-Kit run_edac.py / CORL configs; the official code's networks and learning rates.
    for dataset, expected in (("hopper-medium", (50, 1.0)), ("walker2d-medium-expert", (10, 5.0)),
                              ("halfcheetah-medium-replay", (10, 1.0))):
        paper = config_io.build("edac", dataset, "paper")
        assert (paper.sac.num_critics, paper.sac.eta) == expected
        assert tuple(paper.sac.hidden_sizes) == (256, 256, 256) and paper.sac.actor_lr == paper.sac.alpha_lr == 3e-4
        assert (paper.schedule.epochs, paper.schedule.updates_per_epoch) == (3000, 1000)
    # NeoRL-2's grid optimum on DMSD, with the learning rates those runs used; the task name keys the preset.
    for source in ("neorl2:DMSD", "/data/neorl2/DMSD-high-100000-train.npz"):
        dmsd = config_io.build("edac", source, "quick")
        assert (dmsd.sac.num_critics, dmsd.sac.eta, dmsd.sac.actor_lr, dmsd.sac.alpha_lr) == (10, 1.0, 1e-4, 1e-4)
    quick = config_io.build("edac", "hopper-medium", "quick")
    assert (quick.schedule.epochs, quick.schedule.updates_per_epoch) == (20, 1000)
    assert tuple(quick.sac.hidden_sizes) == (64, 64)
    assert config_io.from_dict(config_io.to_dict(quick)) == quick


def test_the_diversity_term_has_a_finite_gradient_when_a_members_action_gradient_is_zero():
    # A member whose ReLU paths from the action are all off has an action-gradient of exactly 0; its cosines count
    # as 0 (numpy below) and the loss's gradient must stay finite, or one such row turns every parameter into NaN.
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(3, 5, 2)).astype(np.float32)
    grads[1, 2] = 0.0
    unit = grads / np.maximum(np.linalg.norm(grads, axis=-1, keepdims=True), 1e-30)
    expected = np.mean([sum(unit[n, b] @ unit[m, b] for n in range(3) for m in range(3) if n != m)
                        for b in range(5)]) / 2
    np.testing.assert_allclose(float(edac_diversity(jnp.asarray(grads))), expected, rtol=1e-5)
    assert np.all(np.isfinite(np.asarray(jax.grad(edac_diversity)(jnp.asarray(grads)))))
