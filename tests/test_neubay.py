"""NEUBAY: the recurrent agent, the tape, and the collect of long rollouts in one member each.

One tiny agent (LRU memory, 10 critic heads) is shared by every test; its compiled pieces are built
once per module. Rollouts use a real `WorldModel` (a freshly initialised 5-member LayerNorm ensemble)
and, to read off which member produced each step, an analytic model whose reward is the member index.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl.core.tanh_gaussian import sample_tanh_gaussian
from mbrl.agents.neubay import Encoder, Neubay, NeubayConfig
from mbrl import config as config_io
from mbrl.core import sequence_replay
from mbrl.config import ScheduleConfig, TrainConfig
from mbrl.core.errors import ConfigError
from mbrl.imagination import ExploringPolicy, posterior_members, start_steps
from mbrl.trainer import Trainer, hypers_of
from mbrl.core.types import Transitions
from mbrl.core.types import PolicyInput
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble, init_params
from mbrl.world_models.model import Normalizer, WorldModel
from mbrl.world_models.rollout import warm_up

OBS, ACT, HORIZON = 4, 2, 24
EPISODE_LENGTHS = (24, 9, 17, 3)

TINY = NeubayConfig(
    d_model=16, d_hidden=8, memory_layers=1, head_hidden=16, head_layers=1, num_critics=10, sampled_critics=2,
    num_sequences=3, sequence_length=6, warmup_length=HORIZON, parallel_size=8, utd=0.05, tape_capacity=12,
    max_episode_steps=HORIZON, rollout_chunk=5, target_entropy_ratio=1.0, unc_quantile=0.9,
)


def _dataset(seed=0) -> tuple[Transitions, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = sum(EPISODE_LENGTHS)
    obs = rng.normal(size=(rows, OBS)).astype(np.float32)
    terminal = np.zeros(rows, bool)
    terminal[EPISODE_LENGTHS[0] + EPISODE_LENGTHS[1] - 1] = True  # episode 1 ends on a terminal
    starts = np.cumsum((0,) + EPISODE_LENGTHS[:-1])
    transitions = Transitions.from_arrays(obs, rng.uniform(-1, 1, (rows, ACT)), rng.normal(size=rows),
                                          obs + 0.1, terminal, np.zeros(rows))
    return transitions, starts


@pytest.fixture(scope="module")
def trainer():
    config = TrainConfig(algo="neubay", neubay=TINY, schedule=ScheduleConfig(epochs=1, updates_per_epoch=3))
    return Trainer(config, OBS, ACT)


@pytest.fixture(scope="module")
def real():
    return sequence_replay.from_episodes(*_dataset(), HORIZON)


@pytest.fixture(scope="module")
def agent_state(trainer):
    return jax.jit(trainer.agent.init)(jax.random.PRNGKey(0), hypers_of(trainer.config))


def _collect(trainer, agent_state, tape, real, model, key):
    """One collect of `trainer`'s sequence part: (tape, the collect's stats, the threshold)."""
    part = trainer.part
    hypers = hypers_of(trainer.config)
    sorted_u = part.prepare(model, real)
    collect = jax.jit(lambda a, t, k: part.collect(a, t, part.initial_counters(), real, model, sorted_u, hypers, k))
    tape, counters, _, _ = collect(agent_state, tape, key)
    return tape, counters.last, part.threshold(sorted_u, hypers)


def _world_model():
    """A real 5-member LayerNorm ensemble (fresh weights) whose reward is 0.01 x the member's index, so a
    rollout shows the member behind each step; its 4 elites are members 0, 1, 3, 4."""
    config = EnsembleConfig(num_members=5, num_elites=4, hidden_dims=(16, 16), layer_norm=True)
    params = init_params(GaussianEnsemble(config, OBS + 1), jax.random.PRNGKey(7), OBS + ACT)
    out = params["params"]["dense_2"]
    out["kernel"] = out["kernel"].at[:, :, OBS].set(0.0)  # reward mean: the bias alone ...
    out["bias"] = out["bias"].at[:, OBS].set(jnp.arange(5, dtype=jnp.float32) * 100.0)  # ... x 1e-4 below
    target_std = jnp.full(OBS + 1, 0.05).at[OBS].set(1e-4)
    return WorldModel(
        params=params,
        input_norm=Normalizer(jnp.zeros(OBS + ACT), jnp.ones(OBS + ACT)),
        target_norm=Normalizer(jnp.zeros(OBS + 1), target_std),
        elites=jnp.asarray([0, 1, 3, 4], jnp.int32),
        config=config,
        obs_dim=OBS,
        act_dim=ACT,
    )


@pytest.fixture(scope="module")
def collected(trainer, real, agent_state):
    """One collect of 8 trajectories from the dataset's prefixes, in the elites of the real ensemble."""
    model = _world_model()
    posterior = posterior_members(model)
    tape = sequence_replay.empty(TINY.tape_capacity, HORIZON, OBS, ACT)
    tape, stats, threshold = _collect(trainer, agent_state, tape, real, model, jax.random.PRNGKey(3))
    return model, posterior, threshold, tape, stats


def _imagined(tape):
    """Per stored row: boolean (T+1,) masks of its imagined and its real transitions."""
    length = np.asarray(tape.length)[: int(tape.size)]
    stored = np.arange(tape.max_len + 1)[None, :] < length[:, None]
    real = np.asarray(tape.real)[: int(tape.size)]
    return stored & ~real, stored & real


# ------------------------------------------------------------------------------------------ tests


def test_warm_up_on_the_real_prefix_reproduces_the_hidden_state_of_the_sequence(trainer, real, agent_state):
    agent = trainer.agent
    actor = agent_state.actor_params
    episode, steps = np.array([0, 0, 2, 3]), np.array([0, 7, 16, 3])  # empty, partial, long and whole prefixes
    batch = len(episode)
    at = steps[None, :] - HORIZON + np.arange(HORIZON)[:, None]
    mask = at >= 0
    at = np.clip(at, 0, HORIZON)
    take = lambda field: jnp.asarray(np.asarray(field)[episode[None, :], at])  # noqa: E731
    prefix = Transitions(take(real.obs), take(real.action), take(real.reward), take(real.obs), mask & False, mask & False)
    start = warm_up(jax.random.PRNGKey(1), ExploringPolicy(agent), actor, agent.initial_carry(batch), prefix, jnp.asarray(mask))
    # Acting from the warmed state at step p ...
    inputs = PolicyInput(real.obs[episode, steps], start.prev_action, start.prev_reward, start.first)
    step = jax.jit(lambda c, i: agent.act(actor, c, i, jax.random.PRNGKey(2), deterministic=True))
    action, carry = step(start.carry, inputs)
    # ... equals the sequence pass of training over the episode's steps 0..p (a window with full history).
    window = sequence_replay.window(real, jnp.asarray(episode), jnp.asarray(steps), length=1, warmup=HORIZON)
    features = jax.jit(agent.encode)(actor["encoder"], window)[:, HORIZON]
    mean, _ = jax.jit(agent.actor_head.apply)(actor["head"], features)
    np.testing.assert_allclose(np.asarray(action), np.tanh(np.asarray(mean)), atol=2e-5)
    np.testing.assert_array_equal(np.asarray(start.first), steps == 0)
    # The carry itself: the sequence pass over the window's rows (padding, then the episode from its start).
    x = agent._inputs(window.obs, window.prev_action, window.prev_reward)
    sequence = jax.jit(jax.vmap(lambda xs, fs, c: agent.encoder.apply(actor["encoder"], xs, fs, c)[1]))
    expected = sequence(x[:, : HORIZON + 1], window.first[:, : HORIZON + 1], agent.initial_carry(batch))
    np.testing.assert_allclose(np.asarray(carry[0]), np.asarray(expected[0]), atol=2e-5)
    # The log-depth form of the LRU (for accelerators) computes the same state with the same parameters.
    parallel = Encoder(dataclasses.replace(agent.memory, parallel_scan=True))
    run_parallel = jax.jit(jax.vmap(lambda xs, fs, c: parallel.apply(actor["encoder"], xs, fs, c)[1]))
    same = run_parallel(x[:, : HORIZON + 1], window.first[:, : HORIZON + 1], agent.initial_carry(batch))
    np.testing.assert_allclose(np.asarray(same[0]), np.asarray(expected[0]), atol=2e-5)


def test_each_imagined_trajectory_uses_one_member_throughout(collected):
    _, _, _, tape, stats = collected
    imagined, in_prefix = _imagined(tape)
    members = np.rint(np.asarray(tape.reward)[: int(tape.size)] * 100).astype(int)
    used = []
    for row in range(len(members)):
        mine = np.unique(members[row][imagined[row]])
        assert len(mine) <= 1, f"row {row} mixes members {mine}"
        used.extend(mine.tolist())
    assert set(used) <= {0, 1, 3, 4} and len(set(used)) > 1  # elites only
    length = np.asarray(tape.length)[: int(tape.size)]
    np.testing.assert_array_equal(imagined.sum(1) + in_prefix.sum(1), length)
    assert float(stats.imagined_length_max) > TINY.rollout_chunk  # a trajectory crossed chunk boundaries
    assert float(stats.transitions) == float(length.sum())


def test_truncation_never_lets_epistemic_std_exceed_the_threshold(collected):
    model, posterior, threshold, tape, stats = collected
    assert posterior.num_members == 4 and model.num_members == 5
    imagined, _ = _imagined(tape)
    obs = np.asarray(tape.obs)[: int(tape.size)][imagined]
    actions = np.asarray(tape.action)[: int(tape.size)][imagined]
    assert len(obs) > 0 and float(stats.cut_by_uncertainty) > 0  # steps were taken, and some were cut
    measure = jax.jit(lambda o, a: posterior.step(jax.random.PRNGKey(0), o, a, deterministic=True,
                                                   uncertainty="epistemic_std").uncertainty)
    u = measure(obs, actions)
    assert float(jnp.max(u)) <= float(threshold) * (1 + 1e-5)


def test_starts_are_uniform_over_the_observations_their_last_included(real):
    episode, step = jax.device_get(jax.jit(start_steps, static_argnums=2)(real, jax.random.PRNGKey(0), 4000))
    length = np.asarray(real.length)[episode]
    assert np.all(step >= 0) and np.all(step <= length) and np.all(episode < int(real.size))
    # Each observation (every step, and each episode's last next_obs) is equally likely: an episode is
    # drawn in proportion to its length + 1.
    observations = np.asarray(EPISODE_LENGTHS) + 1
    counts = np.bincount(episode, minlength=len(EPISODE_LENGTHS))
    np.testing.assert_allclose(counts / 4000, observations / observations.sum(), atol=0.03)
    assert np.all(np.bincount(episode[step == length], minlength=len(EPISODE_LENGTHS)) > 0)


def test_an_epoch_spends_its_budget_collecting_whenever_the_credit_runs_out(real):
    # A utd so small that every collect (8 trajectories of < 1,000 transitions) earns exactly one update:
    # the epoch's 3 updates take 3 collects, all of which fit on the tape.
    cfg = dataclasses.replace(TINY, utd=1e-4, tape_capacity=64)
    config = TrainConfig(algo="neubay", neubay=cfg, schedule=ScheduleConfig(epochs=1, updates_per_epoch=3))
    trainer = Trainer(config, OBS, ACT)
    model = _world_model()
    state, metrics = jax.jit(trainer.epoch)(trainer.init_state(jax.random.PRNGKey(4), hypers_of(config)), real, model,
                                            trainer.part.prepare(model, real))
    for name, value in metrics.items():
        assert np.isfinite(np.asarray(value)).all(), name
    assert int(state.agent.step) == 3 and int(state.credit) == 0
    assert float(metrics["collects"]) == 3 == int(state.counters.collects)
    # The epoch's mean imagined length is over every trajectory it collected (rows without any
    # transition are not stored, and count as 0), not only over the last collect's 8.
    imagined, _ = _imagined(state.store)
    assert 0 < int(state.store.size) <= 3 * cfg.parallel_size
    np.testing.assert_allclose(float(metrics["imagined_length_mean_epoch"]), imagined.sum() / (3 * cfg.parallel_size),
                               rtol=1e-6)


def test_without_model_noise_each_imagined_step_is_its_members_mean(real, agent_state):
    config = TrainConfig(algo="neubay", neubay=dataclasses.replace(TINY, model_noise=False),
                         schedule=ScheduleConfig(epochs=1, updates_per_epoch=3))
    trainer = Trainer(config, OBS, ACT)
    model = _world_model()
    tape = sequence_replay.empty(TINY.tape_capacity, HORIZON, OBS, ACT)
    tape, _, _ = _collect(trainer, agent_state, tape, real, model, jax.random.PRNGKey(3))
    imagined, _ = _imagined(tape)
    rows, steps = np.nonzero(imagined)
    assert len(rows) > 0
    obs, action = np.asarray(tape.obs)[rows, steps], np.asarray(tape.action)[rows, steps]
    reward, next_obs = np.asarray(tape.reward)[rows, steps], np.asarray(tape.obs)[rows, steps + 1]
    member = np.rint(reward * 100).astype(int)  # the member's mean reward is 0.01 x its index, exactly
    np.testing.assert_allclose(reward, member * 0.01, atol=1e-6)
    means, _ = model.member_predictions(jnp.asarray(obs), jnp.asarray(action))
    expected = obs + np.asarray(means)[member, np.arange(len(member)), :OBS]
    np.testing.assert_allclose(next_obs, expected, rtol=1e-5, atol=1e-5)


def test_one_update_gives_finite_values_and_changes_every_part(trainer, real, agent_state):
    batch = sequence_replay.sample(real, jax.random.PRNGKey(5), TINY.num_sequences, TINY.sequence_length,
                                   TINY.warmup_length)
    new, metrics = jax.jit(trainer.agent.update)(agent_state, batch, jax.random.PRNGKey(6), hypers_of(trainer.config))
    for name, value in metrics.items():
        assert np.isfinite(np.asarray(value)).all(), name
    assert float(metrics["train_steps"]) > 0
    for part in ("actor_params", "critic_params"):
        for group in getattr(new, part):
            before, after = getattr(agent_state, part)[group], getattr(new, part)[group]
            changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), before, after)
            assert any(jax.tree.leaves(changed)), f"{part}.{group} did not change"
    # The target moved by tau towards the updated critic.
    lhs = jax.tree.map(lambda t, c: t, new.target_critic_params, new.critic_params)
    rhs = jax.tree.map(lambda t0, c: (1 - TINY.tau) * t0 + TINY.tau * c, agent_state.target_critic_params, new.critic_params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6), lhs, rhs)
    assert float(new.log_alpha) != float(agent_state.log_alpha)


def test_actor_bc_term_equals_a_direct_computation_on_the_real_training_steps(trainer, real, agent_state):
    coef = 0.7
    anchored = Neubay(dataclasses.replace(TINY, actor_bc_coef=coef), OBS, ACT)
    batch = sequence_replay.sample(real, jax.random.PRNGKey(5), TINY.num_sequences, TINY.sequence_length,
                                   TINY.warmup_length)
    imagined = np.zeros(batch.real.shape, bool)
    imagined[:, ::2] = True  # every other step counts as imagined: the term must skip those
    batch = batch.replace(real=batch.real & ~jnp.asarray(imagined))
    params = agent_state.actor_params
    features = trainer.agent.encode(params["encoder"], batch)
    args = (params["head"], features, agent_state.critic_params, agent_state.log_alpha, batch, jax.random.PRNGKey(9))
    loss, (*_, extra) = anchored.actor_loss(*args, anchored.hypers()["neubay"])
    plain_loss, (*_, plain_extra) = trainer.agent.actor_loss(*args, trainer.agent.hypers()["neubay"])
    assert plain_extra == {}

    w, n = trainer.agent._split(batch)
    mean, log_std = trainer.agent.actor_head.apply(params["head"], features[:, w : w + n])
    error = np.sum((np.tanh(np.asarray(mean)) - np.asarray(batch.action)[:, w : w + n]) ** 2, axis=-1)
    mask = np.asarray(batch.loss_mask)[:, w : w + n]
    rows = mask & np.asarray(batch.real)[:, w : w + n]
    assert 0 < rows.sum() < mask.sum()
    np.testing.assert_allclose(float(extra["actor_bc"]), error[rows].mean(), rtol=1e-5)
    # Weighted by coef x the windows' mean |Q| (the mean over heads at the actor's sampled actions).
    action, _ = sample_tanh_gaussian(mean, log_std, jax.random.PRNGKey(9))
    critic_features = trainer.agent.encode(agent_state.critic_params["encoder"], batch)[:, w : w + n]
    q = np.asarray(trainer.agent.head_values(agent_state.critic_params["heads"], critic_features, action)).mean(axis=0)
    np.testing.assert_allclose(float(loss) - float(plain_loss), coef * np.abs(q)[mask].mean() * error[rows].mean(),
                               rtol=1e-3, atol=1e-6)
    with pytest.raises(ConfigError, match="neubay.actor_bc_coef"):
        dataclasses.replace(TINY, actor_bc_coef=-1.0)


def test_tape_ring_insert_and_windows(real):
    tape = sequence_replay.empty(3, HORIZON, OBS, ACT)
    rows = real.replace(length=real.length.at[1].set(0))  # a row without transitions is not stored
    tape = sequence_replay.insert(tape, rows)
    np.testing.assert_array_equal(np.asarray(tape.length), [int(real.length[0]), int(real.length[2]), int(real.length[3])])
    tape = sequence_replay.insert(tape, real)  # 4 more rows into 3 slots: the last 3 survive, ring order
    np.testing.assert_array_equal(np.asarray(tape.length), np.asarray(real.length[jnp.asarray([3, 1, 2])]))
    assert int(tape.size) == 3 and int(tape.insert_pos) == 1
    batch = sequence_replay.sample(tape, jax.random.PRNGKey(8), 64, 4, 3)
    first, mask = np.asarray(batch.first), np.asarray(batch.loss_mask)
    assert mask[:, :3].sum() == 0 and mask[:, -1].sum() == 0 and mask[:, 3].all()  # the first training step is stored
    # prev_action of a step is the action of the step before it, and zero at an episode's start.
    np.testing.assert_array_equal(np.asarray(batch.prev_action)[:, 1:][~first[:, 1:]],
                                  np.asarray(batch.action)[:, :-1][~first[:, 1:]])
    assert np.all(np.asarray(batch.prev_action)[first] == 0)


def test_presets_carry_the_papers_per_dataset_values():
    config = config_io.build("neubay", "hopper-medium", "paper")
    assert (config.ensemble.num_members, config.ensemble.num_elites, config.ensemble.layer_norm) == (128, 100, True)
    assert (config.neubay.real_weight, config.neubay.critic_encoder_lr, config.neubay.target_entropy_ratio) == (0.8, 1e-6, None)
    assert config.neubay.num_critics == 10 and config.neubay.unc_quantile == 1.0
    quick = config_io.build("neubay", "walker2d-medium", "quick")
    assert quick.neubay.target_entropy_ratio == 1.0 and quick.ensemble.num_members < 128
    # The quick preset anchors the actor to the data (not in the paper), like MOPO's and RAVL's.
    assert config.neubay.actor_bc_coef == 0.0 and quick.neubay.actor_bc_coef == 2.5


def test_simglucose_lowers_the_target_entropy_as_for_the_sac_based_agents():
    # Simglucose's insulin sits against the action's lower bound, where -|A| pulls the actor off the data.
    # At the paper's alpha lr, Adam moves log alpha by about 1e-4 an update: too slow to fall in a short run.
    for preset in ("quick", "paper"):
        simglucose = config_io.build("neubay", "neorl2:Simglucose", preset).neubay
        assert (simglucose.target_entropy, simglucose.alpha_lr) == (-5.0, 1e-3)
        for other in ("neorl2:DMSD", "hopper-medium"):
            section = config_io.build("neubay", other, preset).neubay
            assert (section.target_entropy, section.alpha_lr) == (None, 1e-4)
    # A Gaussian of std 0.03 has entropy 0.5 * ln(2 pi e 0.03^2) = -2.09 per dimension: -4.17 for two.
    narrow = np.random.default_rng(0).normal(-0.99, 0.03, size=(100_000, ACT))
    default = Neubay(TINY, OBS, ACT)
    assert default.target_entropy == -ACT  # -ratio * |A|
    notice = default.data_notice(narrow)
    assert notice is not None and "--neubay.target-entropy below -4.17" in notice
    lowered = Neubay(dataclasses.replace(TINY, target_entropy=-5.0), OBS, ACT)
    assert lowered.target_entropy == -5.0 and lowered.data_notice(narrow) is None
    fixed = Neubay(dataclasses.replace(TINY, target_entropy_ratio=None), OBS, ACT)
    assert fixed.target_entropy is None and fixed.data_notice(narrow) is None
