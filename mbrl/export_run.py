"""The policy of a run directory written by `mbrl train` (config.json, run.json, checkpoints/), as a PolicySpec.

This is the only place export touches the training code: it reads the run through the training loop's
public functions (`mbrl.config.load`, `mbrl.train.read_run_facts` / `trainer_for`,
`mbrl.checkpoint.Checkpointer`), the way `mbrl eval` does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mbrl.core.errors import ConfigError
from mbrl.export import ExportError, PolicySpec, observation_envelope


def load_policy_from_run(run_dir: str | Path, seed_index: int = 0) -> PolicySpec:
    """The deterministic policy of training seed number `seed_index` at the run's latest checkpoint.

    Reads the run through `mbrl.config.load`, `mbrl.train.read_run_facts` / `trainer_for` and
    `mbrl.checkpoint.Checkpointer`, as `mbrl eval` does, and the run's dataset for the observation
    envelope (mean ± 10 std of its observations). The agents have no observation normalizer and act in
    the dataset's action units (tanh output in [-1, 1]), so the export clips to the dataset's (else the
    task's) action bounds without rescaling.
    """
    import jax

    from mbrl import config as config_io
    from mbrl import datasets
    from mbrl.checkpoint import Checkpointer
    from mbrl.train import read_run_facts, trainer_for

    run_dir = Path(run_dir).absolute()
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir}: no such run directory; expected a directory written by `mbrl train`")
    if not (run_dir / "config.json").is_file():
        raise ExportError(f"{run_dir}: not a run directory (no config.json); expected a directory written by `mbrl train`")
    config = config_io.load(run_dir / "config.json")
    facts = read_run_facts(run_dir)
    if facts is None:
        raise ExportError(f"{run_dir / 'run.json'}: missing; the run did not start training")
    seeds = config.seed_list
    if not 0 <= seed_index < len(seeds):
        raise ConfigError(f"--seed-index: the run trained {len(seeds)} seed(s) {seeds}, found index {seed_index}")
    obs_dim, act_dim = int(facts["obs_dim"]), int(facts["act_dim"])
    trainer = trainer_for(config, obs_dim, act_dim)
    checkpointer = Checkpointer(run_dir / "checkpoints")
    try:
        if checkpointer.latest_epoch() is None:
            raise ExportError(f"{run_dir / 'checkpoints'}: no checkpoint; train the run for at least one checkpoint first")
        state, record = checkpointer.restore(jax.eval_shape(trainer.initial_state, seeds))
    finally:
        checkpointer.close()
    agent = trainer.agent
    params = jax.tree.map(lambda x: np.asarray(x[seed_index]), agent.actor_params(state.agent))
    key = jax.random.PRNGKey(0)  # unused by a deterministic policy

    def apply_fn(p, obs):
        return agent.act(p, obs[None], key, True)[0]

    task_name = facts.get("task")
    dataset = datasets.load(config.dataset, task=task_name)
    obs_low, obs_high = observation_envelope(np.concatenate([dataset.transitions.obs, dataset.transitions.next_obs]))
    low, high, names, rate = -np.ones(act_dim), np.ones(act_dim), {}, None
    env_id = None
    if task_name:
        from envs.robots.mujoco import env_facts
        from envs.tasks import get_task

        task = get_task(task_name)
        env_id = task.env_id
        low, high = np.full(act_dim, task.action_low), np.full(act_dim, task.action_high)
        if dataset.info.action_low is not None and dataset.info.action_high is not None:
            low, high = np.asarray(dataset.info.action_low), np.asarray(dataset.info.action_high)
        env = env_facts(env_id)
        if env["obs_dim"] == obs_dim and env["act_dim"] == act_dim:
            names = {"obs_names": env["obs_names"], "action_names": env["action_names"]}
        rate = env["control_rate_hz"]
    return PolicySpec(
        apply_fn=apply_fn,
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
        run_id=run_dir.name,
        metadata={
            "algo": config.algo,
            "train_seed": seeds[seed_index],
            "epoch": int(record.get("epoch", 0)),
            "updates": int(record.get("updates", 0)),
            "run_dir": str(run_dir),
        },
        **names,
    )
