"""Compiled rollouts against an analytic system whose dynamics, reward, termination and uncertainty
are exact functions, compared with plain Python loops that apply the documented step rules."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from mbrl.core import replay
from mbrl.core.errors import ConfigError
from mbrl.core.types import Transitions
from mbrl.world_models.base import MarkovModel, StepOutput
from mbrl.world_models.ensemble import EnsembleConfig, GaussianEnsemble, init_params
from mbrl.world_models.model import Normalizer, WorldModel
from mbrl.world_models.rollout import (
    MarkovPolicy,
    RecurrentStart,
    RolloutConfig,
    rollout,
    rollout_chunked,
    uncertainty_threshold,
    warm_up,
)

OBS, ACT, HIDDEN, MEMBERS = 3, 2, 4, 5
ELITES = (0, 2, 3)
TERMINAL_BOUND = 1.0


@struct.dataclass
class LinearSystem(MarkovModel):
    """next = A obs + B action + offset[member] (+ noise), reward = obs0 + 0.1 sum(action),
    terminal when |next0| > TERMINAL_BOUND, u = |obs|_1 + |action|_1 (the same for every measure)."""

    a: jax.Array
    b: jax.Array
    offsets: jax.Array  # (members, obs): makes the member used at each step recoverable
    elite_index: jax.Array
    noise: float = struct.field(pytree_node=False, default=0.0)

    @property
    def num_members(self) -> int:
        return self.offsets.shape[0]

    @property
    def elites(self) -> jax.Array:
        return self.elite_index

    def step(self, key, obs, action, member=None, *, carry=(), deterministic=False, uncertainty="aleatoric_max"):
        member_key, noise_key = jax.random.split(key)
        if member is None:
            member = self.elite_index[jax.random.randint(member_key, obs.shape[:1], 0, self.elite_index.shape[0])]
        next_obs = obs @ self.a.T + action @ self.b.T + self.offsets[member]
        if not deterministic and self.noise:
            next_obs = next_obs + self.noise * jax.random.normal(noise_key, next_obs.shape)
        return StepOutput(
            next_obs=next_obs,
            reward=obs[:, 0] + 0.1 * action.sum(-1),
            terminal=jnp.abs(next_obs[:, 0]) > TERMINAL_BOUND,
            uncertainty=jnp.abs(obs).sum(-1) + jnp.abs(action).sum(-1),
        )


def _system(noise=0.0) -> LinearSystem:
    rng = np.random.default_rng(0)
    a = (1.08 * np.eye(OBS) + 0.05 * rng.standard_normal((OBS, OBS))).astype(np.float32)  # slowly unstable
    b = (0.3 * rng.standard_normal((OBS, ACT))).astype(np.float32)
    offsets = (0.02 * rng.standard_normal((MEMBERS, OBS))).astype(np.float32)
    offsets[:, 2] = 0.01 * np.arange(MEMBERS)  # distinct per member
    return LinearSystem(jnp.asarray(a), jnp.asarray(b), jnp.asarray(offsets), jnp.asarray(ELITES, jnp.int32), noise)


@struct.dataclass
class RecurrentParams:
    k: jax.Array  # (act, obs)
    k_h: jax.Array  # (act, hidden)
    w_obs: jax.Array  # (hidden, obs)
    w_act: jax.Array  # (hidden, act)
    w_rew: jax.Array  # (hidden,)
    u: jax.Array  # (hidden, hidden)
    sigma: float = struct.field(pytree_node=False, default=0.0)


def _recurrent_params(sigma=0.0) -> RecurrentParams:
    rng = np.random.default_rng(1)

    def f(*shape):
        return jnp.asarray(0.4 * rng.standard_normal(shape), jnp.float32)

    return RecurrentParams(
        f(ACT, OBS), f(ACT, HIDDEN), f(HIDDEN, OBS), f(HIDDEN, ACT), f(HIDDEN), f(HIDDEN, HIDDEN), sigma
    )


def recurrent_policy(params: RecurrentParams, carry, inputs, key):
    """h' = tanh(W_o obs + W_a prev_action + w_r prev_reward + U h), h reset at an episode's start;
    action = tanh(K obs + L h') (+ noise when sigma > 0)."""
    h = jnp.where(inputs.first[:, None], 0.0, carry)
    h = jnp.tanh(
        inputs.obs @ params.w_obs.T
        + inputs.prev_action @ params.w_act.T
        + inputs.prev_reward[:, None] * params.w_rew
        + h @ params.u.T
    )
    action = jnp.tanh(inputs.obs @ params.k.T + h @ params.k_h.T)
    if params.sigma:
        action = jnp.clip(action + params.sigma * jax.random.normal(key, action.shape), -1, 1)
    return action, h


def _markov_act(params, obs, key):
    return jnp.tanh(obs @ params.k.T) + params.sigma * jax.random.normal(key, (obs.shape[0], ACT))


MARKOV = MarkovPolicy(_markov_act)


def _np_recurrent_step(p, h, obs, prev_a, prev_r, first):
    def f64(x):
        return np.asarray(x, np.float64)

    h = np.zeros(HIDDEN) if first else h
    h = np.tanh(f64(p.w_obs) @ obs + f64(p.w_act) @ prev_a + f64(p.w_rew) * prev_r + f64(p.u) @ h)
    return np.tanh(f64(p.k) @ obs + f64(p.k_h) @ h), h


def _python_rollout(system, params, obs0, h0, member, horizon, threshold, max_length, lam):
    """One trajectory by the documented rules, in float64."""
    a, b, off = (np.asarray(x, np.float64) for x in (system.a, system.b, system.offsets))
    obs, h, prev_a, prev_r, first = np.asarray(obs0, np.float64), np.asarray(h0, np.float64), np.zeros(ACT), 0.0, False
    rows = []
    for _ in range(horizon):
        if len(rows) >= max_length:
            break
        action, h_new = _np_recurrent_step(params, h, obs, prev_a, prev_r, first)
        u = np.abs(obs).sum() + np.abs(action).sum()
        if u > threshold:
            break  # cut before using this step
        next_obs = a @ obs + b @ action + off[member]
        reward = obs[0] + 0.1 * action.sum()
        terminal = abs(next_obs[0]) > TERMINAL_BOUND
        rows.append(
            dict(obs=obs, action=action, reward=reward - lam * u, raw=reward, next_obs=next_obs, terminal=terminal, u=u,
                 carry=h_new)
        )
        if terminal:
            break
        obs, h, prev_a, prev_r = next_obs, h_new, action, reward
    return rows


@pytest.fixture(scope="module")
def system():
    return _system()


@pytest.fixture(scope="module")
def start_obs():
    return jnp.asarray(np.random.default_rng(2).uniform(-0.6, 0.6, (16, OBS)), jnp.float32)


HORIZON = 40
EXACT = RolloutConfig(member_mode="per_trajectory", deterministic=True)


@pytest.fixture(scope="module")
def exact_run(system, start_obs):
    """A deterministic recurrent rollout that hits terminals, threshold cuts, max lengths and the horizon."""
    batch = start_obs.shape[0]
    params = _recurrent_params()
    h0 = jnp.asarray(np.random.default_rng(3).uniform(-0.5, 0.5, (batch, HIDDEN)), jnp.float32)
    start = RecurrentStart(h0, jnp.zeros((batch, ACT)), jnp.zeros(batch), jnp.zeros(batch, bool))
    members = jnp.arange(batch, dtype=jnp.int32) % MEMBERS
    max_length = jnp.asarray(np.where(np.arange(batch) % 4 == 0, 7, 1000), jnp.int32)
    out = rollout(jax.random.PRNGKey(0), system, recurrent_policy, params, start_obs, HORIZON, EXACT, start=start,
                  members=members, max_length=max_length, threshold=4.0)
    return out, params, h0, members, max_length


def test_rollout_reproduces_the_true_trajectories(system, start_obs, exact_run):
    out, params, h0, members, max_length = exact_run
    valid = np.asarray(out.valid)
    tr = jax.tree.map(np.asarray, out.transitions)
    reasons = set()
    for b in range(start_obs.shape[0]):
        rows = _python_rollout(
            system, params, start_obs[b], h0[b], int(members[b]), HORIZON, 4.0, int(max_length[b]), 0.0
        )
        n = len(rows)
        assert int(out.stats.lengths[b]) == n
        assert valid[:n, b].all() and not valid[n:, b].any()
        for t, row in enumerate(rows):
            for name in ("obs", "action", "reward", "next_obs"):
                np.testing.assert_allclose(getattr(tr, name)[t, b], row[name], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(out.raw_reward[t, b], row["raw"], rtol=1e-4, atol=1e-4)
            assert tr.terminal[t, b] == row["terminal"]
            # timeout: the last valid step of a trajectory that did not terminate
            assert tr.timeout[t, b] == (t == n - 1 and not row["terminal"])
        reasons.add(
            "terminal"
            if rows and rows[-1]["terminal"]
            else "max_length"
            if n == max_length[b]
            else "horizon"
            if n == HORIZON
            else "threshold"
        )
        assert bool(out.stats.terminated[b]) == bool(rows and rows[-1]["terminal"])
    assert reasons == {"terminal", "max_length", "horizon", "threshold"}, reasons  # every way to end is exercised


def test_truncation_happens_exactly_where_u_crosses_the_threshold(exact_run):
    out = exact_run[0]
    valid, u = np.asarray(out.valid), np.asarray(out.uncertainty)
    assert (u[valid] <= 4.0).all()
    lengths, cut = np.asarray(out.stats.lengths), np.asarray(out.stats.cut_by_uncertainty)
    assert cut.any()
    for b in np.flatnonzero(cut):
        assert u[lengths[b], b] > 4.0  # the first invalid step is the one that crossed
        assert out.transitions.timeout[lengths[b] - 1, b] or lengths[b] == 0


def test_the_stored_reward_is_the_models(exact_run):
    out = exact_run[0]  # a penalty is the algorithm's (MOPO's model_reward), not the rollout's
    np.testing.assert_array_equal(out.transitions.reward, out.raw_reward)


@pytest.fixture(scope="module")
def noisy_runs(start_obs):
    """Stochastic model and policy, a member per trajectory among the elites, no threshold:
    the same key twice, then another key."""
    noisy = _system(noise=0.3)
    cfg = RolloutConfig(member_mode="per_trajectory", uncertainty="epistemic_std")
    params = _recurrent_params(sigma=0.3)
    keys = [jax.random.PRNGKey(7), jax.random.PRNGKey(7), jax.random.PRNGKey(8)]
    return noisy, [rollout(k, noisy, MARKOV, params, start_obs, HORIZON, cfg) for k in keys]


def test_no_valid_transition_after_a_terminal(noisy_runs):
    _, runs = noisy_runs
    for out in runs:
        valid, terminal = np.asarray(out.valid), np.asarray(out.transitions.terminal)
        assert terminal.any() and not terminal[~valid].any()
        after_terminal = np.cumsum(terminal, axis=0) - terminal > 0
        assert not (valid & after_terminal).any()
        # validity is a prefix in time: once invalid, never valid again
        assert (np.diff(valid.astype(int), axis=0) <= 0).all()
        np.testing.assert_array_equal(valid.sum(0), out.stats.lengths)


def test_same_key_same_rollout_and_another_key_differs(noisy_runs):
    _, (first, second, other) = noisy_runs
    for x, y in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.allclose(first.transitions.next_obs, other.transitions.next_obs)


def _members_used(system, tr):
    """Recover the member of each step from next_obs - A obs - B action (offsets are distinct)."""
    residual = (
        np.asarray(tr.next_obs)
        - np.asarray(tr.obs) @ np.asarray(system.a).T
        - np.asarray(tr.action) @ np.asarray(system.b).T
    )
    return np.abs(residual[..., None, :] - np.asarray(system.offsets)).sum(-1).argmin(-1)


def test_members_per_trajectory_stay_fixed_and_per_sample_vary(system, start_obs):
    params = _recurrent_params(sigma=0.3)
    cfg = RolloutConfig(member_mode="per_trajectory", member_pool="all", deterministic=True)
    out = rollout(jax.random.PRNGKey(3), system, MARKOV, params, start_obs, 6, cfg)
    used, valid, members = _members_used(system, out.transitions), np.asarray(out.valid), np.asarray(out.stats.members)
    assert ((used == members[None]) | ~valid).all()
    assert len(set(members) - set(ELITES)) > 0 and set(members) <= set(range(MEMBERS))
    per_sample = rollout(jax.random.PRNGKey(3), system, MARKOV, params, start_obs, 6, RolloutConfig(deterministic=True))
    used = _members_used(system, per_sample.transitions)[np.asarray(per_sample.valid)]
    assert set(used) <= set(ELITES) and len(set(used)) == len(ELITES)
    assert (np.asarray(per_sample.stats.members) == -1).all()


def test_warm_up_carry_equals_running_the_policy_on_the_prefix():
    params = _recurrent_params()
    length, batch = 6, 5
    rng = np.random.default_rng(4)
    prefix = Transitions(
        obs=rng.standard_normal((length, batch, OBS)).astype(np.float32),
        action=rng.uniform(-1, 1, (length, batch, ACT)).astype(np.float32),
        reward=rng.standard_normal((length, batch)).astype(np.float32),
        next_obs=rng.standard_normal((length, batch, OBS)).astype(np.float32),
        terminal=np.zeros((length, batch), bool),
        timeout=np.zeros((length, batch), bool),
    )
    real_rows = np.array([6, 3, 1, 0, 4])  # left padded: trajectory b's real rows are the last real_rows[b]
    mask = np.arange(length)[:, None] >= length - real_rows[None]
    h0 = jnp.full((batch, HIDDEN), 0.3)
    start = warm_up(
        jax.random.PRNGKey(0), recurrent_policy, params, h0, jax.tree.map(jnp.asarray, prefix), jnp.asarray(mask)
    )
    for b in range(batch):
        h, prev_a, prev_r, first = np.full(HIDDEN, 0.3), np.zeros(ACT), 0.0, True
        for t in np.flatnonzero(mask[:, b]):
            _, h = _np_recurrent_step(params, h, prefix.obs[t, b], prev_a, prev_r, first)
            prev_a, prev_r, first = prefix.action[t, b], prefix.reward[t, b], False
        np.testing.assert_allclose(start.carry[b], h, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(start.prev_action[b], prev_a)
        np.testing.assert_allclose(start.prev_reward[b], prev_r)
        assert bool(start.first[b]) == (real_rows[b] == 0)


def test_chunked_rollout_inserts_the_same_transitions_as_one_rollout(system, start_obs, exact_run):
    out, params, h0, members, max_length = exact_run
    batch = start_obs.shape[0]
    start = RecurrentStart(h0, jnp.zeros((batch, ACT)), jnp.zeros(batch), jnp.zeros(batch, bool))
    capacity = HORIZON * batch
    whole = replay.insert(replay.empty(capacity, OBS, ACT), *out.flat())

    def consume(buffer, batch):
        return replay.insert(buffer, *batch.flat())

    # 40 steps in chunks of 7: the last chunk runs past the horizon, its extra steps invalid.
    chunked, stats = rollout_chunked(jax.random.PRNGKey(0), system, recurrent_policy, params, start_obs, HORIZON, EXACT,
                                     chunk=7, consume=consume, consume_state=replay.empty(capacity, OBS, ACT),
                                     start=start, members=members, max_length=max_length, threshold=4.0)
    assert int(chunked.size) == int(whole.size) == int(out.valid.sum())
    for x, y in zip(jax.tree.leaves(chunked.data), jax.tree.leaves(whole.data), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(stats.lengths, out.stats.lengths)


def test_record_carry_keeps_the_policys_carry_of_every_step(system, start_obs, exact_run):
    """`record_carry`: the carry each step's policy call returned (the recurrent policy's new hidden state), against
    the float64 loop; the transitions are those of the rollout without it."""
    out, params, h0, members, max_length = exact_run
    batch = start_obs.shape[0]
    start = RecurrentStart(h0, jnp.zeros((batch, ACT)), jnp.zeros(batch), jnp.zeros(batch, bool))
    recorded = rollout(jax.random.PRNGKey(0), system, recurrent_policy, params, start_obs, HORIZON,
                       dataclasses.replace(EXACT, record_carry=True), start=start, members=members,
                       max_length=max_length, threshold=4.0)
    assert out.policy_carry is None and recorded.policy_carry.shape == (HORIZON, batch, HIDDEN)
    np.testing.assert_array_equal(recorded.valid, out.valid)
    for name in ("obs", "action", "next_obs"):
        np.testing.assert_array_equal(getattr(recorded.transitions, name), getattr(out.transitions, name))
    for b in range(batch):
        rows = _python_rollout(system, params, start_obs[b], h0[b], int(members[b]), HORIZON, 4.0, int(max_length[b]),
                               0.0)
        for t, row in enumerate(rows):
            np.testing.assert_allclose(recorded.policy_carry[t, b], row["carry"], atol=1e-5)


def test_batch_slices_and_stats_outputs_keep_the_rollout(system, start_obs, exact_run):
    out, params, h0, members, max_length = exact_run
    batch = start_obs.shape[0]
    start = RecurrentStart(h0, jnp.zeros((batch, ACT)), jnp.zeros(batch), jnp.zeros(batch, bool))
    cfg = RolloutConfig(
        member_mode="per_trajectory", deterministic=True, batch_chunk=4, outputs="stats"
    )
    sliced = rollout(
        jax.random.PRNGKey(0),
        system,
        recurrent_policy,
        params,
        start_obs,
        HORIZON,
        cfg,
        start=start,
        members=members,
        max_length=max_length,
        threshold=4.0,
    )
    assert sliced.transitions is None
    np.testing.assert_array_equal(sliced.valid, out.valid)
    # A batch slice compiles to other matmul shapes, which may round differently by an ulp or two.
    np.testing.assert_allclose(sliced.uncertainty, out.uncertainty, rtol=1e-5)
    np.testing.assert_allclose(sliced.stats.returns, out.stats.returns, rtol=1e-5)
    with pytest.raises(ConfigError, match="batch_chunk"):
        rollout(jax.random.PRNGKey(0), system, MARKOV, params, start_obs, 2, RolloutConfig(batch_chunk=5))


def test_rollout_vmaps_over_seeds(noisy_runs, start_obs):
    noisy, (first, *_) = noisy_runs
    cfg = RolloutConfig(member_mode="per_trajectory", uncertainty="epistemic_std")
    keys = jnp.stack([jax.random.PRNGKey(9), jax.random.PRNGKey(7)])
    many = jax.vmap(lambda k: rollout(k, noisy, MARKOV, _recurrent_params(sigma=0.3), start_obs, HORIZON, cfg))(keys)
    for x, y in zip(jax.tree.leaves(many), jax.tree.leaves(first), strict=True):
        np.testing.assert_allclose(x[1], y, rtol=1e-5, atol=1e-5)
    assert set(np.asarray(many.stats.members).ravel()) <= set(ELITES)  # the default pool


def test_uncertainty_threshold_is_the_quantile_over_the_data(system):
    rng = np.random.default_rng(5)
    obs, actions = (
        rng.standard_normal((1003, OBS)).astype(np.float32),
        rng.uniform(-1, 1, (1003, ACT)).astype(np.float32),
    )
    u = np.abs(obs).sum(-1) + np.abs(actions).sum(-1)
    for q in (0.9, 1.0):
        got = uncertainty_threshold(system, jnp.asarray(obs), jnp.asarray(actions), q, batch_size=256)
        np.testing.assert_allclose(got, np.quantile(u, q), rtol=1e-5)
    with pytest.raises(ConfigError, match="quantile"):
        uncertainty_threshold(system, jnp.asarray(obs), jnp.asarray(actions), 1.5)


def test_bad_options_raise_config_errors(system, start_obs):
    with pytest.raises(ConfigError, match="member_mode"):
        RolloutConfig(member_mode="per_member")
    with pytest.raises(ConfigError, match="members"):
        rollout(
            jax.random.PRNGKey(0),
            system,
            MARKOV,
            _recurrent_params(),
            start_obs,
            2,
            RolloutConfig(),
            members=jnp.zeros(16, jnp.int32),
        )


def test_the_fitted_model_class_rolls_out_under_a_data_quantile_threshold():
    """Protocol check against the real `WorldModel` (tiny, untrained): NEUBAY's configuration."""
    config = EnsembleConfig(num_members=4, num_elites=2, hidden_dims=(8, 8))
    model = WorldModel(
        params=init_params(GaussianEnsemble(config, OBS + 1), jax.random.PRNGKey(0), OBS + ACT),
        input_norm=Normalizer(jnp.zeros(OBS + ACT), jnp.ones(OBS + ACT)),
        target_norm=Normalizer(jnp.zeros(OBS + 1), jnp.ones(OBS + 1)),
        elites=jnp.asarray([1, 3], jnp.int32),
        config=config,
        obs_dim=OBS,
        act_dim=ACT,
    )
    rng = np.random.default_rng(6)
    data_obs, data_act = rng.standard_normal((300, OBS)), rng.uniform(-1, 1, (300, ACT))
    threshold = uncertainty_threshold(model, jnp.asarray(data_obs), jnp.asarray(data_act), 0.5, batch_size=128)
    cfg = RolloutConfig(member_mode="per_trajectory", uncertainty="epistemic_std")
    start_obs = jnp.asarray(data_obs[:16], jnp.float32)
    out = rollout(jax.random.PRNGKey(0), model, MARKOV, _recurrent_params(0.3), start_obs, 8, cfg, threshold=threshold)
    valid = np.asarray(out.valid)
    assert out.transitions.next_obs.shape == (8, 16, OBS)
    assert (np.asarray(out.uncertainty)[valid] <= float(threshold)).all()
    assert 0 < valid.sum() < valid.size  # the median cuts some trajectories, not all
    assert set(np.asarray(out.stats.members)) <= {1, 3}
