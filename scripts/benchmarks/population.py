"""A population of configurations in one compiled program against the same configurations in turn.

`population8`: 8 configurations of MOPO's quick preset (halfcheetah-medium's h and real ratio, its BC
anchor), each with its own lambda and learning rates (traced hyperparameters, `mbrl.population.train_population`'s
members), trained for whole epochs (rollouts, then updates) as one population of 8, and one after the
other as populations of 1 that share the compiled program. Both see the same machine in one run. The
ratio is population updates/s over in-turn updates/s: it says whether batching configurations costs
anything over running them alone, the ground a sweep (one trial per member) stands on.

`sweep_population`: what a sweep gets out of it, in trials per hour. A trial is one run of MOPO's quick
preset on hopper-medium (40 epochs of 500 updates on 10,000 rollouts of h 5, an evaluation of 5 episodes
in the real env every 10 epochs). 8 trials (their own lambda, BC weight and learning rates) as one
population of 8, against the same 8 one after the other as populations of 1 that share the compiled
program. Both arms time their first epoch (the compile), E more epochs (the synthetic model and buffers of
population8), and their evaluations through `Trainer.evaluate` (all members' episodes batched) of fresh
policies in Hopper-v5 made never to terminate, so that every episode has the same length; the figures
are extrapolated to a whole trial: one compile per program (the population's, the in-turn trials' shared
one), 40 epochs and 4 evaluations of 1,000-step episodes (the env's limit: the most an evaluation costs).
Fitting the world model and loading the dataset, shared by every trial of a sweep, are left out. The
value is population trials/hour over in-turn trials/hour; the raw seconds come with it.
"""

from __future__ import annotations

import dataclasses
import os
import time

import gymnasium
import jax
import numpy as np
from benchmarks.agents import ACT_DIM, OBS_DIM, _buffers
from benchmarks.rollout import _workload

from mbrl import config as config_io, evaluate as evaluate_module
from mbrl.envs.tasks import TASKS
from mbrl.population import member_config
from mbrl.trainer import Trainer, hypers_of, time_epochs

MEMBERS = 8


def population8(quick: bool) -> dict:
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
    # The layout the training program chooses here (measured on this machine, `Trainer.choose_layout`), and
    # both layouts timed beside the members in turn.
    chosen, rule = trainer.choose_layout(together, real, model)
    layout_seconds = {layout: time_epochs(trainer, trainer.initial_state([0] * MEMBERS, hypers), real, model, epochs,
                                          layout)[1] for layout in ("vmap", "map")}
    population_seconds = layout_seconds[chosen]
    in_turn_seconds = 0.0
    for h in hypers:
        _, seconds = time_epochs(trainer, trainer.initial_state([0], [h]), real, model, epochs)
        in_turn_seconds += seconds
    jax.clear_caches()
    total = MEMBERS * epochs * updates
    return {
        "value": round(in_turn_seconds / population_seconds, 3),
        "unit": "x throughput (8 configurations in one program, in the layout it chose / the same 8 in turn)",
        "target": 0.95,
        "layout": chosen,
        "layout_probe_epoch_s": rule.get("epoch_seconds"),
        "population_updates_per_s": round(total / population_seconds, 1),
        "vmap_updates_per_s": round(total / layout_seconds["vmap"], 1),
        "map_updates_per_s": round(total / layout_seconds["map"], 1),
        "in_turn_updates_per_s": round(total / in_turn_seconds, 1),
        "updates_per_epoch": updates,
        "rollouts_per_epoch": rollouts,
        "horizon": base.imagination.horizon,
        "epochs_timed": epochs,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


# ---------------------------------------------------------------------------------------------------
# sweep_population: whole sweep trials (updates, the real-env evaluations, the compile) per hour


def _fixed_length_task(task, steps: int):
    """`task` with an env that never terminates and is cut at `steps` steps: every episode has `steps` steps,
    so an evaluation's cost does not hang on how long a policy happens to stay up."""
    base = gymnasium.spec(task.env_id)
    env_id = f"BenchFixed{base.name}{steps}-v{base.version}"
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=base.entry_point, max_episode_steps=steps,
                           kwargs={**base.kwargs, "terminate_when_unhealthy": False})
    return dataclasses.replace(task, env_id=env_id)


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, time.perf_counter() - start


def _epochs(trainer, state, real, model, epochs: int, layout: str = "vmap"):
    """(first epoch's seconds, compile included; the mean seconds of the `epochs` after it)."""
    (state, _), first = _timed(trainer.run_epoch, state, real, model, layout)
    seconds = 0.0
    for _ in range(epochs):
        (state, _), s = _timed(trainer.run_epoch, state, real, model, layout)
        seconds += s
    return first, seconds / epochs


def _evaluation(trainer, hypers, seeds, task, steps: int, episodes: int, full_steps: int) -> dict:
    """One evaluation of `len(seeds)` fresh members (`episodes` each, batched through `Trainer.evaluate`):
    the first 1-step one (the policy's compile), a second 1-step one (making and resetting the envs),
    one of `steps` steps; the seconds extrapolated to episodes of `full_steps` steps."""
    state = trainer.initial_state(seeds, hypers)
    run = lambda t: trainer.evaluate(state, t, seeds, None, episodes=episodes)  # noqa: E731
    one = _fixed_length_task(task, 1)
    _, compile_seconds = _timed(run, one)
    _, fixed = _timed(run, one)
    result, seconds = _timed(run, _fixed_length_task(task, steps))
    per_step = max(seconds - fixed, 0.0) / max(steps - 1, 1)
    return {"compile": max(compile_seconds - fixed, 0.0), "seconds": seconds, "full": fixed + per_step * (full_steps - 1),
            "length": float(np.mean(result["length_mean"]))}


def sweep_population(quick: bool) -> dict:
    updates, rollouts = (100, 2_000) if quick else (500, 10_000)
    epochs_timed = 1 if quick else 2
    quick_preset = config_io.build("mopo", "hopper-medium", "quick")
    base = config_io.build("mopo", "hopper-medium", "quick",
                           {"imagination": {"rollouts_per_epoch": rollouts}, "schedule": {"updates_per_epoch": updates}})
    schedule = quick_preset.schedule
    trial_epochs = schedule.epochs
    evaluations = trial_epochs // schedule.eval_every + (trial_epochs % schedule.eval_every != 0)
    episodes = schedule.eval_episodes
    task = TASKS["hopper"]
    full_steps = task.max_episode_steps
    eval_steps = 100 if quick else full_steps
    members = [member_config(base, {"mopo": {"penalty_coef": 1.0 + i},
                                    "sac": {"actor_bc_coef": 1.0 + 0.5 * (i % 4),
                                            "actor_lr": 1e-4 * (1 + i % 4), "critic_lr": 3e-4 * (1 + i % 2)}})
               for i in range(MEMBERS)]
    hypers = [hypers_of(c) for c in members]
    seeds = list(range(MEMBERS))

    # The update epochs, on the synthetic world model and buffers (halfcheetah's sizes, as population8).
    model = _workload()[0]
    population_trainer = Trainer(base, OBS_DIM, ACT_DIM)
    real, _ = _buffers(population_trainer, 100_000 if quick else 1_000_000, 1)
    # The population's layout is measured once per process (`Trainer.choose_layout`): a cost it pays up front.
    (layout, _), probe_seconds = _timed(population_trainer.choose_layout, population_trainer.initial_state(seeds, hypers),
                                        real, model)
    first, population_epoch = _epochs(population_trainer, population_trainer.initial_state(seeds, hypers), real, model,
                                      epochs_timed, layout)
    population_compile = max(first - population_epoch, 0.0) + probe_seconds
    in_turn_trainer = Trainer(base, OBS_DIM, ACT_DIM)  # its own compile cache: trial 0 pays, the others share it
    in_turn_epochs, in_turn_compile = [], 0.0
    for i, h in enumerate(hypers):
        first, epoch = _epochs(in_turn_trainer, in_turn_trainer.initial_state([seeds[i]], [h]), real, model,
                               epochs_timed)
        in_turn_epochs.append(epoch)
        if i == 0:
            in_turn_compile = max(first - epoch, 0.0)
        else:
            in_turn_epochs.append(first)  # a trial after the first compiles nothing: its first epoch is one more

    # The evaluations, on the real Hopper (its own dims): fixed-length episodes, extrapolated to the limit.
    # Importing MuJoCo and making the first env are paid once per process, by neither arm.
    evaluate_module.evaluate(lambda i: np.zeros((1, task.act_dim), np.float32), _fixed_length_task(task, 1), 1)
    eval_trainer = Trainer(base, task.obs_dim, task.act_dim)
    population_eval = _evaluation(eval_trainer, hypers, seeds, task, eval_steps, episodes, full_steps)
    in_turn_eval_trainer = Trainer(base, task.obs_dim, task.act_dim)
    in_turn_evals = [_evaluation(in_turn_eval_trainer, [h], [s], task, eval_steps, episodes, full_steps)
                     for s, h in zip(seeds, hypers, strict=True)]
    fresh = eval_trainer.evaluate(eval_trainer.initial_state(seeds, hypers), task, seeds, None, episodes=episodes)
    jax.clear_caches()

    in_turn_epoch = float(np.mean(in_turn_epochs))
    in_turn_eval_full = float(np.mean([e["full"] for e in in_turn_evals]))
    population_seconds = (population_compile + population_eval["compile"]
                          + trial_epochs * population_epoch + evaluations * population_eval["full"])
    in_turn_seconds = (in_turn_compile + in_turn_evals[0]["compile"]
                       + MEMBERS * (trial_epochs * in_turn_epoch + evaluations * in_turn_eval_full))
    population_rate = MEMBERS * 3600.0 / population_seconds
    in_turn_rate = MEMBERS * 3600.0 / in_turn_seconds
    r = lambda x: round(float(x), 3)  # noqa: E731
    return {
        "value": r(population_rate / in_turn_rate),
        "unit": "x trials per hour (population of 8 / 8 in turn)",
        "population_trials_per_hour": round(population_rate, 1),
        "in_turn_trials_per_hour": round(in_turn_rate, 1),
        "population_sweep_seconds": round(population_seconds, 1),
        "in_turn_sweep_seconds": round(in_turn_seconds, 1),
        "members": MEMBERS,
        "layout": layout,
        "layout_probe_seconds": r(probe_seconds),
        "trial_epochs": trial_epochs,
        "trial_evaluations": evaluations,
        "eval_episodes": episodes,
        "updates_per_epoch": updates,
        "rollouts_per_epoch": rollouts,
        "horizon": base.imagination.horizon,
        "epochs_timed": epochs_timed,
        "population_epoch_seconds": r(population_epoch),
        "in_turn_epoch_seconds": r(in_turn_epoch),
        "population_compile_seconds": r(population_compile),
        "in_turn_compile_seconds": r(in_turn_compile),
        "population_eval_compile_seconds": r(population_eval["compile"]),
        "in_turn_eval_compile_seconds": r(in_turn_evals[0]["compile"]),
        "eval_task": task.env_id,
        "eval_steps_timed": eval_steps,
        "eval_episode_length_timed": population_eval["length"],
        "eval_episode_length_extrapolated": full_steps,
        "population_eval_seconds": r(population_eval["seconds"]),
        "in_turn_eval_seconds": r(sum(e["seconds"] for e in in_turn_evals)),
        "population_eval_seconds_full": r(population_eval["full"]),
        "in_turn_eval_seconds_full": r(MEMBERS * in_turn_eval_full),
        "fresh_policy_episode_length_mean": r(np.mean(fresh["length_mean"])),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


FIGURES = {"population8": population8, "sweep_population": sweep_population}
