"""The agents through `mbrl.agents.registry` (RAVL, MOPO, BC): one update lowers the loss it steps on, the hypers
given are the ones used, acting, MOPO's penalty, and the presets' published values.

The SAC-N core's critic and EDAC losses against a direct computation: tests/test_sac.py.
"""

from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl.agents import presets, registry
from mbrl.agents.base import CAPABILITIES, capability
from mbrl.agents.mopo import penalized_reward
from mbrl import config as config_io
from mbrl.core.errors import ConfigError
from mbrl.core.types import PolicyInput, Transitions

OBS_DIM, ACT_DIM, BATCH = 5, 2, 7
ROOT = Path(__file__).resolve().parents[1]


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


@functools.lru_cache(maxsize=None)
def tiny(algo: str):
    """(agent, its config, its hypers, jitted update_many) of `algo` through the registry, on tiny networks."""
    small = {"sac": {"num_critics": 3, "hidden_sizes": [16, 16], "batch_size": BATCH},
             "bc": {"hidden_sizes": [16, 16], "batch_size": BATCH}, "mopo": {"penalty_coef": 2.5}}
    own = {section: values for section, values in small.items() if section in registry.entry(algo).sections}
    config = config_io.build(algo, "hopper-medium", "quick", own)
    agent = registry.make(config, OBS_DIM, ACT_DIM)
    return agent, config, registry.entry(algo).hypers_of(config), jax.jit(agent.update_many)


def one_update(algo: str, batch: Transitions, hypers=None):
    agent, _, default_hypers, update_many = tiny(algo)
    state = agent.init(jax.random.PRNGKey(1), default_hypers)
    batches = jax.tree.map(lambda x: x[None], batch)  # K = 1
    new_state, metrics = update_many(state, batches, jax.random.PRNGKey(2), default_hypers if hypers is None else hypers)
    return agent, state, new_state, metrics


def adam_first_step_gain(loss, params, lr) -> float:
    """Adam's first step moves each parameter by lr * sign(gradient): to first order the loss falls by
    lr * ||gradient||_1."""
    grads = jax.jit(jax.grad(loss))(params)
    return float(lr) * sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(grads))


def _changed(before, after) -> bool:
    return any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


def _all_finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("algo", ["ravl", "mopo"])
def test_one_update_lowers_the_critic_loss_on_its_batch(algo):
    # Every row terminal: the TD target is the reward, so the loss depends on the critics alone.
    batch = small_batch(2).replace(terminal=jnp.ones(BATCH, bool))
    agent, state, new_state, metrics = one_update(algo, batch)
    core, key, hypers = agent.core, jax.random.PRNGKey(0), tiny(algo)[2]["sac"]

    @jax.jit
    def loss(critic_params):
        return core.critic_loss(critic_params, state, batch, key, hypers)[0]

    before, after = float(loss(state.critic_params)), float(loss(new_state.critic_params))
    expected = adam_first_step_gain(loss, state.critic_params, tiny(algo)[1].sac.critic_lr)
    assert 0.5 * expected < before - after < 1.5 * expected, (before, after, expected)
    assert ("edac_diversity" in metrics) == (algo == "ravl")  # RAVL's loss includes the EDAC term, MOPO's not
    assert _all_finite(metrics) and _all_finite(new_state)
    assert _changed(agent.actor_params(state), agent.actor_params(new_state))
    assert float(new_state.log_alpha) != float(state.log_alpha)


def test_one_update_lowers_the_bc_loss_on_its_batch():
    batch = small_batch(2)
    agent, state, new_state, metrics = one_update("bc", batch)

    @jax.jit
    def loss(params):
        return agent.loss(params, batch)

    before, after = float(loss(state.actor_params)), float(loss(new_state.actor_params))
    expected = adam_first_step_gain(loss, state.actor_params, tiny("bc")[1].bc.learning_rate)
    assert 0.5 * expected < before - after < 1.5 * expected, (before, after, expected)
    np.testing.assert_allclose(float(metrics["bc_loss"]), before, rtol=1e-5)  # the metric is the loss before the step


@pytest.mark.parametrize("algo, section, rate", [("mopo", "sac", "critic_lr"), ("bc", "bc", "learning_rate")])
def test_the_hypers_given_to_an_update_are_the_ones_it_uses(algo, section, rate):
    """A learning rate of 0 passed as data (no recompile) leaves those parameters where they were."""
    _, _, hypers, _ = tiny(algo)
    frozen = {**hypers, section: {**hypers[section], rate: jnp.float32(0.0)}}
    agent, state, new_state, _ = one_update(algo, small_batch(2), frozen)
    params = (lambda s: s.critic_params) if algo == "mopo" else agent.actor_params
    assert not _changed(params(state), params(new_state))


@pytest.mark.parametrize("algo", ["ravl", "mopo", "bc"])
def test_act_gives_actions_in_the_unit_box_and_hands_a_markov_carry_back(algo):
    agent, _, hypers, _ = tiny(algo)
    state = agent.init(jax.random.PRNGKey(1), hypers)
    obs = small_batch(3).obs
    inputs = PolicyInput(obs=obs, prev_action=jnp.zeros((BATCH, ACT_DIM)), prev_reward=jnp.zeros(BATCH),
                         first=jnp.ones(BATCH, bool))
    carry = agent.initial_carry(BATCH)
    action, next_carry = agent.act(agent.actor_params(state), carry, inputs, jax.random.PRNGKey(0), False)
    assert action.shape == (BATCH, ACT_DIM) and bool(jnp.all(jnp.abs(action) <= 1.0)) and next_carry == carry
    deterministic = [agent.act(agent.actor_params(state), carry, inputs, jax.random.PRNGKey(k), True)[0] for k in (0, 1)]
    np.testing.assert_array_equal(deterministic[0], deterministic[1])


def test_mopo_reward_is_penalised_and_ravl_reward_is_not():
    reward, u = jnp.array([1.0, -0.5, 2.0]), jnp.array([0.1, 0.4, 0.0])
    mopo, _, hypers, _ = tiny("mopo")  # penalty_coef 2.5
    np.testing.assert_allclose(mopo.model_reward(hypers, reward, u), [0.75, -1.5, 2.0], rtol=1e-6)
    np.testing.assert_allclose(penalized_reward(reward, u, 0.0), reward)
    ravl, _, ravl_hypers, _ = tiny("ravl")
    np.testing.assert_allclose(ravl.model_reward(ravl_hypers, reward, u), reward)


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
    # RAVL paper runs edge-of-reach's update order, EDAC init and log-probability; quick keeps the defaults.
    reference = ("alpha_actor_critic", "edac", 1e-6)
    ravl_quick = config_io.build("ravl", "hopper-medium", "quick")
    assert (ravl.sac.update_order, ravl.sac.init, ravl.sac.logp_epsilon) == reference
    assert (ravl_quick.sac.update_order, ravl_quick.sac.init, ravl_quick.sac.logp_epsilon) == ("critic_actor_alpha", "flax", 0.0)
    for algo in registry.ALGORITHMS:
        for name in presets.PRESETS:
            config = config_io.build(algo, "hopper-medium", name)
            assert config_io.from_dict(config_io.to_dict(config)) == config  # config.json round trip


def test_a_capability_is_declared_and_asked_for_by_one_lookup():
    """`capability` gives an algorithm's declared capability or None; with the feature that needs it, a missing one is
    a `ConfigError` naming the run and the algorithm; an undeclared name (a typo) is refused loudly."""
    for name, protocol in CAPABILITIES.items():  # each name is declared by its protocol
        assert name in vars(protocol) or name in protocol.__annotations__, (name, protocol.__name__)
    mopo, bc = tiny("mopo")[0], tiny("bc")[0]
    assert capability(mopo, "critic_gamma")() == 0.99 and capability(mopo, "reads_model") is None
    assert capability(bc, "critic_values") is None
    with pytest.raises(ConfigError, match=r"^runs/a: fine-tuning needs an algorithm with online_learner\(\); bc has none$"):
        capability(bc, "online_learner", "fine-tuning", "runs/a", "bc")
    for name in ("critic_value", "reads_models"):
        with pytest.raises(ValueError, match="not a declared capability"):
            capability(mopo, name)


def _positional(function) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD and p.name != "self"]


@pytest.mark.parametrize("algo", sorted(registry.ALGORITHMS))
def test_what_an_algorithm_has_under_a_capability_name_is_that_capability(algo):
    """A method under a capability's name takes the protocol's arguments, by name: a helper that only shares the name (NEUBAY's
    per-head values once sat under `critic_values`) would be called with the wrong ones by `mbrl ope`."""
    config = config_io.build(algo, "hopper-medium", "quick", registry.entry(algo).smoke)
    agent = registry.make(config, OBS_DIM, ACT_DIM)
    for name, protocol in CAPABILITIES.items():
        value = capability(agent, name)
        if callable(value) and inspect.isfunction(getattr(protocol, name, None)):
            assert _positional(value) == _positional(getattr(protocol, name)), (algo, name)


def test_mbrl_asks_for_a_capability_only_through_the_lookup():
    """No `getattr`/`hasattr` of a capability's name in `mbrl/` (`capability` is the one lookup), and every name asked
    for is declared."""
    found = []
    for path in sorted((ROOT / "mbrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if node.func.id in ("getattr", "hasattr") and node.args[1].value in CAPABILITIES:
                found.append(f"{where}: {node.func.id}(..., {node.args[1].value!r})")
            if node.func.id == "capability" and node.args[1].value not in CAPABILITIES:
                found.append(f"{where}: capability(..., {node.args[1].value!r}) is not declared")
    assert not found, "\n".join(found)
