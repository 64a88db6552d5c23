"""A population of configurations in one compiled program against the same configurations in turn.

`population8`: 8 configurations of MOPO's quick preset (halfcheetah-medium's h and real ratio, its BC
anchor), each with its own lambda and learning rates (traced hyperparameters, `mbrl.train.train_population`'s
members), trained for whole epochs (rollouts, then updates) as one population of 8, and one after the
other as populations of 1 that share the compiled program. Both see the same machine in one run. The
ratio is population updates/s over in-turn updates/s: it says whether batching configurations costs
anything over running them alone, the ground a sweep (one trial per member) stands on.
"""

from __future__ import annotations

import os

MEMBERS = 8


def population8(quick: bool) -> dict:
    import jax

    from benchmarks.agents import ACT_DIM, OBS_DIM, _buffers
    from benchmarks.rollout import _workload
    from mbrl import config as config_io
    from mbrl.train import Trainer, hypers_of, member_config, time_epochs

    updates, rollouts = (100, 2_000) if quick else (500, 10_000)
    base = config_io.build("mopo", "halfcheetah-medium", "quick",
                           {"imagination": {"rollouts_per_epoch": rollouts}, "schedule": {"updates_per_epoch": updates}})
    members = [member_config(base, {"mopo": {"penalty_coef": 0.25 * (i + 1)},
                                    "sac": {"actor_lr": 1e-4 * (1 + i % 4), "critic_lr": 3e-4 * (1 + i % 2)}})
               for i in range(MEMBERS)]
    trainer = Trainer(base, OBS_DIM, ACT_DIM)
    model = _workload()[0]
    real, _ = _buffers(trainer, 100_000 if quick else 1_000_000, 1)
    epochs = 1 if quick else 2
    hypers = [hypers_of(c) for c in members]

    together = trainer.initial_state([0] * MEMBERS, hypers)
    _, population_seconds = time_epochs(trainer, together, real, model, epochs)
    in_turn_seconds = 0.0
    for h in hypers:
        _, seconds = time_epochs(trainer, trainer.initial_state([0], [h]), real, model, epochs)
        in_turn_seconds += seconds
    jax.clear_caches()
    total = MEMBERS * epochs * updates
    return {
        "value": round(in_turn_seconds / population_seconds, 3),
        "unit": "x throughput (8 configurations in one program / the same 8 in turn)",
        "target": 0.9,
        "population_updates_per_s": round(total / population_seconds, 1),
        "in_turn_updates_per_s": round(total / in_turn_seconds, 1),
        "updates_per_epoch": updates,
        "rollouts_per_epoch": rollouts,
        "horizon": base.imagination.horizon,
        "epochs_timed": epochs,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


FIGURES = {"population8": population8}
