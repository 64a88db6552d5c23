"""The policy an off-policy estimate judges, as the estimators see it: a batched function of observations in the
data's units, or a recurrent policy's per-sample step with its carry (`JudgedPolicy`); an algorithm's own greedy
policy as one (`agent_policy`); and FQE's fit of one (`fqe_of`). Where a judged policy comes from (a run directory, an
export) is `mbrl.ope.policy`'s.

A recurrent policy (NEUBAY's) acts on its history, which a dataset gives only as the logging policy's: its action at
a state is taken after reading the episode's logged observations, actions and rewards up to that state, its memory
reset at each episode's start (`next_actions`). That is an approximation where its own actions would have led
elsewhere, as every estimate from logged data is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mbrl.core.types import PolicyInput, Transitions
from mbrl.ope.fqe import check_sizes, fit_fqe_on_actions, policy_actions


@dataclasses.dataclass
class JudgedPolicy:
    act: Callable | None  # (batch, obs_dim) -> (batch, act_dim), jittable: the deployed deterministic Markov policy
    obs_dim: int
    act_dim: int
    source: str
    run: object | None = None  # the `mbrl.train.LoadedRun` behind a run directory (its critics, its world model)
    member: int = 0  # the run's training seed index
    # A recurrent policy instead: the export's per-sample step (obs, prev_action, prev_reward, first, *carry) ->
    # (action, policy_action, *carry) and its initial carry's leaves.
    step: Callable | None = None
    initial_carry: tuple = ()

    @property
    def recurrent(self) -> bool:
        return self.step is not None

    def initial_actions(self, obs: np.ndarray) -> np.ndarray:
        """Its actions at episode starts `obs` (states, obs_dim)."""
        obs = np.asarray(obs, np.float32)
        if not self.recurrent:
            return policy_actions(self.act, obs)
        n = len(obs)
        out = jax.jit(jax.vmap(lambda o: self.step(o, jnp.zeros(self.act_dim, jnp.float32), jnp.zeros((), jnp.float32),
                                                   jnp.ones((), bool), *self.initial_carry)[0]))(jnp.asarray(obs))
        return np.asarray(out, np.float32).reshape(n, self.act_dim)

    def next_actions(self, t: Transitions) -> np.ndarray:
        """Its action at each row's next observation; a recurrent policy reads the rows in order, an episode
        ending where a row is terminal or a timeout."""
        if not self.recurrent:
            return policy_actions(self.act, t.next_obs)
        ends = np.asarray(t.terminal, bool) | np.asarray(t.timeout, bool)
        first = np.concatenate([[True], ends[:-1]])
        prev_action = np.where(first[:, None], 0.0, np.concatenate([np.zeros((1, self.act_dim)), t.action[:-1]]))
        prev_reward = np.where(first, 0.0, np.concatenate([[0.0], t.reward[:-1]]))
        rows = tuple(jnp.asarray(x, dtype) for x, dtype in (
            (t.obs, jnp.float32), (prev_action, jnp.float32), (prev_reward, jnp.float32), (first, bool),
            (t.next_obs, jnp.float32), (t.action, jnp.float32), (t.reward, jnp.float32)))
        start = tuple(jnp.asarray(x) for x in self.initial_carry)

        def body(carry, row):
            obs, prev_a, prev_r, is_first, next_obs, action, reward = row
            carry = tuple(jnp.where(is_first, s, c) for s, c in zip(start, carry))
            _, _, *carry = self.step(obs, prev_a, prev_r, is_first, *carry)
            next_action = self.step(next_obs, action, reward, jnp.zeros((), bool), *carry)[0]
            return tuple(carry), next_action

        _, actions = jax.jit(lambda rows: jax.lax.scan(body, start, rows))(rows)
        actions = np.asarray(actions, np.float32)
        return actions


def agent_policy(agent, params, source: str) -> JudgedPolicy:
    """An algorithm's greedy policy with actor parameters `params` (one member), as the agent acts in training and
    in the world model: Markov, or recurrent with its own carry (the sweep's and the selection's FQE)."""
    key = jax.random.PRNGKey(0)  # greedy: the key is not drawn from
    if not agent.recurrent:
        def act(obs):
            n = obs.shape[0]
            inputs = PolicyInput(obs, jnp.zeros((n, agent.act_dim)), jnp.zeros(n), jnp.ones(n, bool))
            return agent.act(params, (), inputs, key, True)[0]

        return JudgedPolicy(act, agent.obs_dim, agent.act_dim, source)
    one = jax.tree.map(lambda x: x[0], agent.initial_carry(1))
    leaves, treedef = jax.tree.flatten(one)

    def step(obs, prev_action, prev_reward, first, *carry):
        batched = jax.tree.map(lambda x: x[None], jax.tree.unflatten(treedef, carry))
        inputs = PolicyInput(obs[None], prev_action[None], prev_reward[None], first[None])
        action, batched = agent.act(params, batched, inputs, key, True)
        return (action[0], action[0], *jax.tree.leaves(jax.tree.map(lambda x: x[0], batched)))

    return JudgedPolicy(None, agent.obs_dim, agent.act_dim, source, step=step, initial_carry=tuple(leaves))


def fqe_of(policy: JudgedPolicy, train: Transitions, heldout: Transitions, initial: np.ndarray, config):
    """FQE's fit (`mbrl.ope.fqe.FQEResult`) of `policy` on `train`, checked on `heldout`, valued at `initial`."""
    check_sizes(train, heldout, initial)
    return fit_fqe_on_actions(train, policy.next_actions(train), heldout, policy.next_actions(heldout), initial,
                              policy.initial_actions(initial), config)
