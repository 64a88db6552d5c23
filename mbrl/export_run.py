"""The policy of a run directory written by `mbrl train` (config.json, run.json, checkpoints/), as a PolicySpec.

This is the only place export touches the training code: it reads the run through the training loop's
public `mbrl.train.load_run`, the way `mbrl eval` does, and acts through the agent's own `act`.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mbrl import datasets
from mbrl.core.types import PolicyInput
from mbrl.envs.robots.mujoco import env_facts
from mbrl.envs.tasks import get_task
from mbrl.export import ExportError, PolicySpec, observation_envelope
from mbrl.selection import selected_epoch
from mbrl.train import load_run


def policy_of(agent) -> dict:
    """`apply_fn` (and `initial_carry`) of a PolicySpec for an `mbrl.agents.base.Algorithm`'s deterministic policy:
    its `act` on a batch of one, the carry handed through for a recurrent agent."""
    key = jax.random.PRNGKey(0)  # unused by a deterministic policy
    one = lambda tree: jax.tree.map(lambda x: jnp.asarray(x)[None], tree)  # noqa: E731
    if not agent.recurrent:
        def apply_fn(params, obs):
            inputs = PolicyInput(obs[None], jnp.zeros((1, agent.act_dim)), jnp.zeros(1), jnp.ones(1, bool))
            return agent.act(params, (), inputs, key, True)[0][0]

        return {"apply_fn": apply_fn}

    def recurrent(params, carry, inputs):
        action, carry = agent.act(params, one(carry), one(inputs), key, True)
        return action[0], jax.tree.map(lambda x: x[0], carry)

    initial = jax.tree.map(lambda x: np.asarray(x[0]), agent.initial_carry(1))
    return {"apply_fn": recurrent, "initial_carry": initial}


def load_policy_from_run(run_dir: str | Path, seed_index: int = 0) -> PolicySpec:
    """The deterministic policy of training seed number `seed_index` at the run's latest checkpoint.

    Reads the run through `mbrl.train.load_run` (config, run.json, the latest checkpoint, the agent), as
    `mbrl eval` does; the rest is `run_policy_spec`.
    """
    run_dir = Path(run_dir).absolute()
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir}: no such run directory; expected a directory written by `mbrl train`")

    run = load_run(run_dir, epoch=selected_epoch(run_dir, seed_index))  # the latest, unless a choice was made
    record = run.record
    metadata = {"algo": run.config.algo, "train_seed": run.seeds[seed_index], "epoch": int(record.get("epoch", 0)),
                "updates": int(record.get("updates", 0)), "run_dir": str(run_dir)}
    return run_policy_spec(run, run.actor_params(seed_index), run_dir.name, metadata)


def run_policy_spec(run, params, run_id: str, metadata: dict) -> PolicySpec:
    """The PolicySpec of a run's agent (`mbrl.train.LoadedRun`) with actor parameters `params` (the run's own,
    or fine-tuned ones). It reads the run's dataset for the observation envelope (mean ± 10 std of its
    observations). The agents have no observation normalizer and act in
    the dataset's action units (tanh output in [-1, 1]), so the export clips to the dataset's (else the
    task's) action bounds without rescaling. A recurrent agent (NEUBAY) exports with its carry.
    """
    config, facts = run.config, run.facts
    agent = run.trainer.agent
    obs_dim, act_dim = agent.obs_dim, agent.act_dim
    task_name = facts.get("task")
    dataset = datasets.load(config.dataset, task=task_name)
    obs_low, obs_high = observation_envelope(np.concatenate([dataset.transitions.obs, dataset.transitions.next_obs]))
    low, high, names, rate = -np.ones(act_dim), np.ones(act_dim), {}, None
    env_id = None
    if task_name:
        task = get_task(task_name)
        env_id = task.env_id
        low, high = task.action_bounds()
        if dataset.info.action_low is not None and dataset.info.action_high is not None:
            low, high = np.asarray(dataset.info.action_low), np.asarray(dataset.info.action_high)
        if env_id is not None:
            env = env_facts(env_id)
            if env["obs_dim"] == obs_dim and env["act_dim"] == act_dim:
                names = {"obs_names": env["obs_names"], "action_names": env["action_names"]}
            rate = env["control_rate_hz"]
        if task.obs_names is not None and task.act_names is not None:  # the task's own names come first
            names = {"obs_names": tuple(task.obs_names), "action_names": tuple(task.act_names)}
        if task.obs_units is not None and task.act_units is not None:
            names.update(obs_units=tuple(task.obs_units), action_units=tuple(task.act_units))
        names.update(task=task.name, task_declared=task.declaration is not None)
        rate = task.control_hz if task.control_hz is not None else rate
    return PolicySpec(
        **policy_of(agent),
        params=params,
        obs_dim=obs_dim,
        act_dim=act_dim,
        action_low=low,
        action_high=high,
        obs_low=obs_low,
        obs_high=obs_high,
        rescale_actions=False,
        control_rate_hz=rate,
        env_id=env_id,
        dataset=config.dataset,
        run_id=run_id,
        metadata=metadata,
        **names,
    )
