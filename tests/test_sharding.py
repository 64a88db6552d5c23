"""A population sharded over 4 (forced host) devices on the `population` mesh axis trains as the unsharded one.

The XLA flag only takes effect before jax starts, so the training runs in a child process: MOPO members
with different lambdas through `train_population`, sharded and not, and `mbrl train --seeds 4` (`run`)
stopped by SIGTERM after epoch 1 and resumed from its checkpoint. This (one-device) process then loads
that run's checkpoint, as `mbrl eval` on a smaller machine would. The world model has fresh weights (a fit
would only cost time here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np

from mbrl.train import load_run

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    import jax, jax.numpy as jnp, numpy as np
    from mbrl.envs.tasks import TASKS
    from mbrl import config as config_io, datasets
    from mbrl.population import train_population
    from mbrl.train import run
    from mbrl.trainer import population_mesh_of, population_sharding, trainer_for
    from mbrl.world_models.ensemble import GaussianEnsemble, init_params
    from mbrl.world_models.model import Normalizer, WorldModel

    data_path, out = sys.argv[1], sys.argv[2]
    assert jax.local_device_count() == 4, jax.devices()
    assert population_sharding(6).mesh.size == 3 and population_sharding(5) is None
    dataset = datasets.load(data_path)
    config = config_io.build("mopo", data_path, "quick", json.loads(sys.argv[3]))
    obs, act = dataset.info.obs_dim, dataset.info.act_dim
    model = WorldModel(params=init_params(GaussianEnsemble(config.ensemble, obs + 1), jax.random.PRNGKey(0), obs + act),
                       input_norm=Normalizer(jnp.zeros(obs + act), jnp.ones(obs + act)),
                       target_norm=Normalizer(jnp.zeros(obs + 1), jnp.full(obs + 1, 0.1)),
                       elites=jnp.arange(config.ensemble.num_elites, dtype=jnp.int32), config=config.ensemble,
                       obs_dim=obs, act_dim=act, termination_fn=TASKS["hopper"].termination_fn)
    model.save(f"{out}/world_model")

    hypers = [{"mopo": {"penalty_coef": c}} for c in (0.5, 1.0, 1.5, 2.0)]
    sharded = train_population(config, hypers, [0, 1, 2, 3], dataset=dataset, world_model=model)
    assert population_mesh_of(sharded.state) is not None
    plain = train_population(config, hypers, [0, 1, 2, 3], dataset=dataset, world_model=model, evaluate=False,
                             shard=False)
    trainer = trainer_for(config, obs, act)

    def actor(result):
        leaves = jax.tree.leaves(trainer.agent.actor_params(result.state.agent))
        return {str(i): np.asarray(x) for i, x in enumerate(leaves)}

    np.savez(f"{out}/sharded.npz", **actor(sharded))
    np.savez(f"{out}/plain.npz", **actor(plain))

    def stop_after_epoch_1(report):
        if report.epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # handled between epochs: checkpoint, then stop

    stopped = run(config_io.override(config, {"seeds": 4}), f"{out}/run", world_model_dir=f"{out}/world_model",
                  dataset=dataset, on_epoch=stop_after_epoch_1)
    assert stopped.epochs_done == 1 and stopped.interrupted == signal.SIGTERM
    resumed = run(None, f"{out}/run", resume=True, dataset=dataset)
    with open(f"{out}/summary.json", "w") as f:
        json.dump({
            "sharded_devices": sorted({len(x.sharding.device_set) for x in jax.tree.leaves(sharded.state)}),
            "plain_devices": sorted({len(x.sharding.device_set) for x in jax.tree.leaves(plain.state)}),
            "sharded": sharded.records, "plain": plain.records, "run": resumed.records,
        }, f)
""")

TINY = {
    "sac": {"num_critics": 2, "hidden_sizes": [16, 16], "batch_size": 16},
    "mopo": {"penalty_coef": 1.0},  # the run's members: member 1 of the population
    "imagination": {"rollouts_per_epoch": 32, "horizon": 2, "retain_epochs": 2},
    "ensemble": {"num_members": 3, "num_elites": 2, "hidden_dims": [16, 16]},
    "schedule": {"epochs": 2, "updates_per_epoch": 10, "eval_every": 2, "eval_episodes": 2, "checkpoint_every": 1},
    "logging": {"progress": False},
}


def close(a, b, what, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)


def test_a_sharded_population_trains_as_the_unsharded_one(hopper_tiny_path, tmp_path):
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(hopper_tiny_path), str(tmp_path), json.dumps(TINY)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["sharded_devices"] == [4] and summary["plain_devices"] == [1]

    # Each device runs the per-member program of the unsharded vmap: equal up to rounding.
    sharded, plain = np.load(tmp_path / "sharded.npz"), np.load(tmp_path / "plain.npz")
    assert sharded.files == plain.files and all(sharded[k].shape[0] == 4 for k in sharded.files)
    for k in sharded.files:
        close(sharded[k], plain[k], f"actor leaf {k}")
    epochs = TINY["schedule"]["epochs"]
    assert [r["epoch"] for r in summary["sharded"]] == [r["epoch"] for r in summary["plain"]] == list(range(1, epochs + 1))
    for a, b in zip(summary["sharded"], summary["plain"]):
        assert a["train"].keys() == b["train"].keys()
        for name in a["train"]:
            close(a["train"][name], b["train"][name], f"epoch {a['epoch']} {name}")
    assert len(set(summary["sharded"][-1]["train"]["model_reward"])) == 4  # the lambdas differ per member
    final_eval = summary["sharded"][-1]["eval"]  # evaluated in MuJoCo from the sharded actor params
    assert len(final_eval["return_mean"]) == 4 and all(np.isfinite(final_eval["return_mean"]))

    # `run` with --seeds 4, resumed from a host checkpoint and resharded: its members are seeds 0-3 with
    # lambda 1.0, so member 1 is the population's member 1.
    records = summary["run"]
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
    for a, b in zip(records, summary["sharded"]):
        for name in b["train"]:
            close(a["train"][name][1], b["train"][name][1], f"run epoch {a['epoch']} {name}")
    close(records[-1]["eval"]["return_mean"][1], final_eval["return_mean"][1], "run eval", rtol=1e-4, atol=1e-3)

    # The 4-device run's checkpoint loads in this one-device process.
    loaded = load_run(tmp_path / "run")
    assert loaded.record["epoch"] == epochs
    for k, leaf in zip(sharded.files, jax.tree.leaves(loaded.actor_params(1))):
        close(leaf, sharded[k][1], f"restored actor leaf {k}")
