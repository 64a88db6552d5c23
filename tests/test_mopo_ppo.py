"""MOPO-PPO through the one training program: its epoch is one PPO iteration, and its penalty keeps the imagined
trajectories where the heads agree. (Its run with the default RWM-U, killed and resumed, exported and deployed:
tests/test_end_to_end.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from mbrl import config as config_io
from mbrl import datasets
from mbrl.core.errors import ConfigError
from mbrl.imagination import OnPolicyImagination
from mbrl.population import train_population
from mbrl.train import run
from mbrl.trainer import trainer_for
from mbrl.world_models.base import MarkovModel, StepOutput
from mbrl.world_models.model import Normalizer
from mbrl.world_models.recurrent import RecurrentConfig, RecurrentWorldModel, init_params

TINY = {
    "ppo": {"hidden_sizes": [16, 16], "learning_epochs": 2, "minibatches": 4, "bc_init_iterations": 0,
            "bc_coef": 0.0},
    "imagination": {"rollouts_per_epoch": 64, "horizon": 8},
    "schedule": {"epochs": 2, "eval_every": 2, "eval_episodes": 1},
    "logging": {"progress": False},
}


def tiny(dataset, **overrides):
    return config_io.build("mopo-ppo", str(dataset), "quick", {**TINY, **overrides})


@struct.dataclass
class ActionCostModel(MarkovModel):
    """Hopper-sized dynamics whose epistemic uncertainty is exactly ‖action‖² (the heads disagree the more, the
    harder the policy pushes), with a constant reward: only the penalty tells actions apart."""

    info: Any = struct.field(pytree_node=False, default=None)

    @property
    def num_members(self):
        return 2

    @property
    def elites(self):
        return jnp.arange(2)

    def step(self, key, obs, action, member=None, *, carry=(), deterministic=False, uncertainty="epistemic_sum"):
        next_obs = obs + 0.01 * jnp.tanh(jnp.sum(action, axis=-1, keepdims=True))
        batch = obs.shape[0]
        return StepOutput(next_obs=next_obs, reward=jnp.ones(batch), terminal=jnp.zeros(batch, bool),
                          uncertainty=jnp.sum(action**2, axis=-1))


def test_a_large_penalty_keeps_the_rollouts_where_the_heads_agree(hopper_tiny_path):
    """Two members in one program, λ = 0 and λ = 5: after a few iterations the penalised member's imagined steps
    have a lower mean uncertainty, the free one's stays where it started (the direction of the penalty)."""
    config = tiny(hopper_tiny_path, ppo={**TINY["ppo"], "learning_epochs": 5},
                  schedule={"epochs": 10, "eval_every": 10, "eval_episodes": 1})
    result = train_population(config, [{"mopo_ppo": {"penalty_coef": 0.0}}, {"mopo_ppo": {"penalty_coef": 5.0}}],
                              [0, 0], dataset=datasets.load(hopper_tiny_path), world_model=ActionCostModel(),
                              evaluate=False)
    u = np.asarray([r["train"]["model_uncertainty"] for r in result.records])  # (epochs, members)
    np.testing.assert_allclose(u[0, 0], u[0, 1], rtol=1e-5)  # the same seed: the same first rollout
    free, penalised = u[-1]
    assert penalised < 0.8 * free and penalised < 0.85 * u[0, 1] and free > 0.9 * u[0, 0], u


def test_an_epoch_is_one_ppo_iteration(hopper_tiny_path):
    config = tiny(hopper_tiny_path, ppo={**TINY["ppo"], "learning_epochs": 3}, schedule={**TINY["schedule"], "epochs": 2})
    assert config.schedule.updates_per_epoch == 12
    result = train_population(config, [{}], [0], dataset=datasets.load(hopper_tiny_path), world_model=ActionCostModel(),
                              evaluate=False)
    # Each epoch: one fresh rollout, then learning_epochs 3 x minibatches 4 gradient steps on it.
    assert [r["updates"] for r in result.records] == [12, 24]
    np.testing.assert_array_equal(np.asarray(result.state.agent.steps), [24])
    assert all(np.isfinite(r["train"]["model_uncertainty"][0]) for r in result.records)
    with pytest.raises(ConfigError, match=r"schedule\.updates_per_epoch: an epoch of mopo-ppo is one PPO iteration "
                                          r"of ppo\.learning_epochs 2 x ppo\.minibatches 4 = 8 updates; found 10"):
        tiny(hopper_tiny_path, schedule={**TINY["schedule"], "updates_per_epoch": 10})


def test_the_bc_phase_clones_the_datasets_actions_through_the_training_program(hopper_tiny_path):
    """`ppo.bc_init_iterations`: the collects hand the dataset's rows to the first iterations, which fit the actor
    to the dataset's actions: its greedy actions on the dataset's observations come nearer those actions."""
    config = tiny(hopper_tiny_path, ppo={**TINY["ppo"], "bc_init_iterations": 8, "learning_rate": 3e-3},
                  schedule={**TINY["schedule"], "epochs": 8, "eval_every": 8})
    dataset = datasets.load(hopper_tiny_path)
    # The tiny file's actions are uniform noise: give it a demonstrator to clone, a fixed map of the observation.
    demonstrator = np.tanh(dataset.transitions.obs[:, :3] - dataset.transitions.obs[:, 3:6]).astype(np.float32)
    dataset = dataclasses.replace(dataset, transitions=dataset.transitions.replace(action=demonstrator))
    result = train_population(config, [{}], [0], dataset=dataset, world_model=ActionCostModel(), evaluate=False)
    agent = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim).agent
    obs, action = jnp.asarray(dataset.transitions.obs), np.asarray(dataset.transitions.action)

    def greedy_error(state):
        mean = agent.actor.apply(state.actor, state.obs_norm.normalize(obs))
        return float(np.mean((np.tanh(np.asarray(mean)) - action) ** 2))

    losses = [r["train"]["bc_loss"][0] for r in result.records]
    assert losses[-1] < losses[0], losses
    trained = jax.tree.map(lambda x: x[0], result.state.agent)
    # The data's actions against the cloned policy's, and against always acting 0 (about where a fresh actor acts).
    assert greedy_error(trained) < 0.2 * float(np.mean(action ** 2)), greedy_error(trained)


@struct.dataclass
class HistoryProbe:
    """A recurrent model whose memory is the history it read: what `OnPolicyImagination` warms it up on."""

    history: int = struct.field(pytree_node=False, default=3)

    def warm_up(self, obs, action):
        return obs  # (B, L, obs_dim)


def test_imagination_starts_after_a_whole_history_of_one_episode(hopper_tiny_path):
    config = tiny(hopper_tiny_path)
    dataset = datasets.load(hopper_tiny_path)
    part = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim).part
    assert isinstance(part, OnPolicyImagination)
    real = part.real_data(dataset)
    model = HistoryProbe()
    t, starts = dataset.transitions, np.asarray(dataset.episode_starts)
    episode_of = np.searchsorted(starts, np.arange(len(t)), side="right") - 1
    ends = np.flatnonzero(((np.arange(len(t)) - starts[episode_of]) >= model.history - 1) & ~t.terminal)
    picked = jnp.asarray(ends[::5])
    read = np.asarray(part._warm_up(model, real, picked, model.history, last=model.history))
    for row, window in zip(np.asarray(picked), read):
        first = row - model.history + 1
        assert episode_of[first] == episode_of[row]  # the history lies in the start's own episode
        np.testing.assert_array_equal(window, t.obs[first:row + 1])  # and ends at the start's row
        # Imagination continues from that row's next observation, which is the episode's next row.
        if row + 1 < len(t) and episode_of[row + 1] == episode_of[row]:
            np.testing.assert_array_equal(np.asarray(real.next_obs)[row], t.obs[row + 1])


def test_an_algorithm_that_imagines_from_single_states_refuses_a_recurrent_model(hopper_tiny_path, tmp_path):
    config = RecurrentConfig(num_heads=2, gru_layers=1, gru_hidden=4, head_hidden=(4,), history=2, forecast=2)
    model = RecurrentWorldModel(params=init_params(jax.random.PRNGKey(0), config, 14, 12),
                                input_norm=Normalizer(jnp.zeros(14), jnp.ones(14)),
                                target_norm=Normalizer(jnp.zeros(12), jnp.ones(12)), elites=jnp.arange(2),
                                config=config, obs_dim=11, act_dim=3)
    path = model.save(tmp_path / "rwm")
    mopo = config_io.build("mopo", str(hopper_tiny_path), "quick", {"logging": {"progress": False}})
    with pytest.raises(ConfigError, match=r"rwm: a recurrent world model \(RWM-U\) reads a history before it "
                                          r"predicts, and mopo imagines from single states"):
        run(mopo, tmp_path / "run", world_model_dir=path)
