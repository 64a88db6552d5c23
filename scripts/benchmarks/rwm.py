"""RWM-U and MOPO-PPO throughput (issue 22), at the paper's sizes; the PyTorch peer's side is scripts/experiments/peer_rwm.py
(leggedrobotics/rsl_rl_rwm's own code), to be run right after this on the same machine.

`rwm_fit`: gradient steps per second of the real fitting code (`mbrl.world_models.recurrent_fit.run_epoch`): a batch
of 1,024 windows, the shared GRU (2x256) reading 32 real steps, then 8 forecast steps per head (5 heads of 128)
fed on their own samples, bootstrap-weighted NLL, global-norm clip, Adam; one compiled call is
`steps` steps and a holdout pass over 64 windows. rsl_rl_rwm's step on the same batch reads the history once per
head (its bootstrap resamples the minibatch per head); here the history is read once (see the module's docstring).

`mopo_ppo_iteration`: imagined environment steps per second of one whole MOPO-PPO epoch of the training program
(`mbrl.trainer.Trainer.run_epoch`): 4,096 real histories drawn, RWM-U warmed up on them, 100 imagined steps with
the policy (3x256 ELU), the λ·u penalty, values and GAE, then 5 epochs x 4 minibatches of PPO updates on the
409,600 rows. --quick: 1,024 environments. The model is randomly initialised (throughput does not depend on
its weights) and nothing is cut, so every step is valid.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from mbrl import config as config_io
from mbrl.core.types import DatasetInfo, OfflineDataset, Transitions
from mbrl.trainer import hypers_of, time_epochs, trainer_for
from mbrl.world_models.model import Normalizer
from mbrl.world_models.recurrent import RecurrentConfig, RecurrentWorldModel, init_params
from mbrl.world_models.recurrent_fit import RecurrentFitConfig, WindowData, make_optimizer, run_epoch

OBS_DIM, ACT_DIM, EPISODE = 11, 3, 200


def _random_model(config):
    params = init_params(jax.random.PRNGKey(0), config, OBS_DIM + ACT_DIM, OBS_DIM + 1)
    ones = lambda d: Normalizer(jnp.zeros(d), jnp.ones(d))  # noqa: E731
    return RecurrentWorldModel(params=params, input_norm=ones(OBS_DIM + ACT_DIM), target_norm=ones(OBS_DIM + 1),
                               elites=jnp.arange(config.num_heads, dtype=jnp.int32), config=config, obs_dim=OBS_DIM,
                               act_dim=ACT_DIM)


def rwm_fit(quick: bool) -> dict:
    config = RecurrentConfig()  # 5 heads, GRU 2x256, heads [128], history 32, forecast 8
    steps = 3 if quick else 10
    fit_config = RecurrentFitConfig(batch_size=1024, steps_per_epoch=steps)
    rows = 50_000
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    width = config.history + config.forecast - 1
    data = WindowData(obs=jax.random.normal(keys[0], (rows, OBS_DIM)), action=jax.random.uniform(keys[1], (rows, ACT_DIM)),
                      targets=jax.random.normal(keys[2], (rows, OBS_DIM + 1)), terminal=jnp.zeros(rows, bool),
                      train_starts=jnp.arange(rows - width, dtype=jnp.int32),
                      holdout_starts=jnp.arange(64, dtype=jnp.int32) * 100)
    norms = (Normalizer(jnp.zeros(OBS_DIM + ACT_DIM), jnp.ones(OBS_DIM + ACT_DIM)),
             Normalizer(jnp.zeros(OBS_DIM + 1), jnp.ones(OBS_DIM + 1)))
    params = init_params(keys[3], config, OBS_DIM + ACT_DIM, OBS_DIM + 1)
    opt_state = make_optimizer(fit_config).init(params)
    key = jax.random.PRNGKey(1)
    start = time.perf_counter()
    params, opt_state, loss, _ = run_epoch(params, opt_state, data, norms, key, config=config, fit_config=fit_config)
    jax.block_until_ready(loss)
    compile_seconds = time.perf_counter() - start
    best = float("inf")
    for repeat in range(1 if quick else 2):
        start = time.perf_counter()
        params, opt_state, loss, _ = run_epoch(params, opt_state, data, norms, jax.random.fold_in(key, repeat),
                                               config=config, fit_config=fit_config)
        jax.block_until_ready(loss)
        best = min(best, time.perf_counter() - start)
    return {
        "value": round(steps / best, 3),
        "unit": "gradient steps/s",
        "windows_per_s": round(steps * fit_config.batch_size / best, 1),
        "batch_windows": fit_config.batch_size,
        "history": config.history,
        "forecast": config.forecast,
        "heads": config.num_heads,
        "gru": [config.gru_layers, config.gru_hidden],
        "steps_per_call": steps,
        "compile_seconds": round(compile_seconds, 2),
        "backend": jax.default_backend(),
    }


def mopo_ppo_iteration(quick: bool) -> dict:
    envs = 1024 if quick else 4096
    config = config_io.build("mopo-ppo", "bench", "paper", {
        "imagination": {"rollouts_per_epoch": envs, "horizon": 100},
        "mopo_ppo": {"threshold_quantile": -1.0},  # no cut: every imagined step is valid work
    })
    model = _random_model(config.rwm)
    rng = np.random.default_rng(0)
    rows = 20_000
    none = np.zeros(rows)
    transitions = Transitions.from_arrays(rng.normal(size=(rows, OBS_DIM)), rng.uniform(-1, 1, (rows, ACT_DIM)),
                                          rng.normal(size=rows), rng.normal(size=(rows, OBS_DIM)), none, none)
    dataset = OfflineDataset(transitions, np.arange(0, rows, EPISODE),
                             DatasetInfo("bench", "bench", "d4rl-hdf5", None, OBS_DIM, ACT_DIM))
    trainer = trainer_for(config, OBS_DIM, ACT_DIM)
    real = trainer.real_data(dataset)
    state = trainer.initial_state([0], [hypers_of(config)])
    start = time.perf_counter()
    state, metrics = trainer.run_epoch(state, real, model)
    jax.block_until_ready(metrics)
    compile_seconds = time.perf_counter() - start
    epochs = 1 if quick else 2
    _, seconds = time_epochs(trainer, state, real, model, epochs)
    per_epoch = seconds / epochs
    steps = envs * config.imagination.horizon
    return {
        "value": round(steps / per_epoch, 1),
        "unit": "imagined env-steps/s",
        "envs": envs,
        "horizon": config.imagination.horizon,
        "ppo_updates": config.schedule.updates_per_epoch,
        "minibatch_rows": steps // config.ppo.minibatches,
        "seconds_per_iteration": round(per_epoch, 3),
        "compile_seconds": round(compile_seconds, 2),
        "backend": jax.default_backend(),
    }


FIGURES = {"rwm_fit": rwm_fit, "mopo_ppo_iteration": mopo_ppo_iteration}
