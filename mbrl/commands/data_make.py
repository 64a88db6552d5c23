"""`mbrl data make TASK-LEVEL`: make a D4RL-style dataset locally from the shipped behaviour policies.

Levels (D4RL's definitions, Fu et al. 2020):
  random         uniform actions
  medium         the shipped medium policy (a checkpoint of the SAC run at about 1/3 of expert return)
  expert         the shipped expert policy (the end of that run)
  medium-expert  medium then expert, half of the transitions each
  medium-replay  the SAC run's experience up to the medium checkpoint, regenerated from its recorded
                 segments (uniform warm-up, then each shipped actor snapshot for the env steps it covered);
                 as in the run, an episode goes on when the acting snapshot changes
Medium and expert actions are sampled from the stochastic policy, as D4RL did, and clipped to the bounds.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from envs import collect
from mbrl.core.errors import ConfigError
from mbrl.core.score import normalized_score


@dataclasses.dataclass(frozen=True)
class MakeArgs:
    name: tyro.conf.Positional[str]
    """TASK-LEVEL, e.g. hopper-medium (levels: random, medium, medium-replay, expert, medium-expert)."""
    transitions: int | None = None
    """Number of transitions (default 1,000,000; for medium-replay the recorded run's length)."""
    seed: int = 0
    """Seed of the collection: the same seed gives the same dataset."""
    num_envs: Annotated[int, tyro.conf.arg(help="envs stepped in lockstep per policy call")] = 16
    force: bool = False
    """Rebuild even if a complete dataset with this id exists."""


def _actor_policy(actor_params, hidden_sizes, act_dim: int, seed: int) -> collect.Policy:
    """A stochastic tanh-Gaussian behaviour policy: one jitted call per lockstep step."""
    import jax  # noqa: PLC0415

    from agents.networks import TanhGaussianActor, sample_tanh_gaussian  # noqa: PLC0415

    actor = TanhGaussianActor(tuple(hidden_sizes), act_dim)
    key = jax.random.PRNGKey(seed)

    @jax.jit
    def sample(params, obs, step):
        mean, log_std = actor.apply(params, obs)
        action, _ = sample_tanh_gaussian(mean, log_std, jax.random.fold_in(key, step))
        return action

    return lambda obs, step: np.asarray(sample(actor_params, obs, step))


def load_actor(path: Path, hidden_sizes, obs_dim: int, act_dim: int):
    """Actor parameters from a flax msgpack file (float16 snapshots are cast to float32)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from flax import serialization  # noqa: PLC0415

    from agents.networks import TanhGaussianActor  # noqa: PLC0415

    template = TanhGaussianActor(tuple(hidden_sizes), act_dim).init(jax.random.PRNGKey(0), jnp.zeros((1, obs_dim)))
    params = serialization.from_bytes(template, path.read_bytes())
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)


def load_snapshots(path: Path, count: int, hidden_sizes, obs_dim: int, act_dim: int) -> list:
    """The medium-replay actor snapshots, stored together as {"0": params, "1": ...}."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from flax import serialization  # noqa: PLC0415

    from agents.networks import TanhGaussianActor  # noqa: PLC0415

    one = TanhGaussianActor(tuple(hidden_sizes), act_dim).init(jax.random.PRNGKey(0), jnp.zeros((1, obs_dim)))
    template = {str(i): one for i in range(count)}
    restored = serialization.from_bytes(template, path.read_bytes())
    return [jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), restored[str(i)]) for i in range(count)]


def _policy_record(task: str, policy: str) -> dict:
    return collect.read_record(task, policy)


def plan_segments(task: str, level: str, transitions: int | None, seed: int) -> list[collect.Segment]:
    """What to run for a level: a list of (policy, env steps)."""
    spec = collect.TASK_SPECS[task]
    total = collect.DEFAULT_TRANSITIONS if transitions is None else transitions

    def actor_segment(policy: str, steps: int, policy_seed: int) -> collect.Segment:
        record = _policy_record(task, policy)
        params = load_actor(collect.BEHAVIOUR_DIR / record["file"], record["hidden_sizes"], spec.obs_dim, spec.act_dim)
        return collect.Segment(_actor_policy(params, record["hidden_sizes"], spec.act_dim, policy_seed), steps, policy)

    if level == "random":
        return [collect.Segment(collect.uniform_policy(spec.act_dim, seed), total, "random")]
    if level in ("medium", "expert"):
        return [actor_segment(level, total, seed)]
    if level == "medium-expert":
        half = total // 2
        return [actor_segment("medium", half, seed), actor_segment("expert", total - half, seed + 1)]
    # medium-replay: the recorded segments, scaled to `transitions` when it is given.
    record = _policy_record(task, "medium_replay")
    recorded = int(record["env_steps"])
    total = recorded if transitions is None else transitions
    snapshots = load_snapshots(
        collect.BEHAVIOUR_DIR / record["file"], len(record["snapshot_steps"]), record["hidden_sizes"],
        spec.obs_dim, spec.act_dim,
    )
    bounds = np.round(np.cumsum([0] + [seg["steps"] for seg in record["segments"]]) * total / recorded).astype(int)
    segments = []
    for k, seg in enumerate(record["segments"]):
        steps = int(bounds[k + 1] - bounds[k])
        if steps == 0:
            continue
        if seg["snapshot"] < 0:
            policy = collect.uniform_policy(spec.act_dim, seed + k)
        else:
            policy = _actor_policy(snapshots[seg["snapshot"]], record["hidden_sizes"], spec.act_dim, seed + k)
        segments.append(collect.Segment(policy, steps, f"snapshot@{seg['start']}"))
    return segments


def make(args: MakeArgs) -> int:
    task, level = collect.parse_name(args.name)
    if args.transitions is not None and args.transitions < 1:
        raise ConfigError(f"--transitions must be a positive number of transitions, got {args.transitions}")
    if args.num_envs < 1:
        raise ConfigError(f"--num-envs must be >= 1, got {args.num_envs}")
    root = collect.data_root()
    ds_id = collect.dataset_id(task, level)
    if collect.is_complete(root, task, level) and not args.force:
        print(f"{ds_id}: already made at {root / ds_id} (pass --force to rebuild)")
        return 0
    random_record = _policy_record(task, "random")
    expert_record = _policy_record(task, "expert")
    segments = plan_segments(task, level, args.transitions, args.seed)
    total = sum(s.steps for s in segments)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn  # noqa: PLC0415,E501

    columns = (TextColumn(f"[bold]{ds_id}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, disable=os.environ.get("MBRL_NO_PROGRESS") == "1") as progress:
        bar = progress.add_task("collect", total=total)
        episodes = collect.collect_segments(
            task, segments, args.seed, num_envs=args.num_envs, on_steps=lambda n: progress.advance(bar, n),
            continuous=level == "medium-replay",
        )
    returns = np.array([ep.episode_return for ep in episodes])
    extra = {
        "description": f"D4RL-style {level} data for {collect.TASK_SPECS[task].env_id}, made by `mbrl data make`.",
        "algorithm_name": "SAC behaviour policy" if level != "random" else "uniform random policy",
        "mbrl_level": level,
        "mbrl_seed": int(args.seed),
        "mbrl_transitions": int(total),
    }
    path = collect.write_minari(
        root, task, level, episodes, random_record["mean_return"], expert_record["mean_return"], extra
    )
    ref_min, ref_max = random_record["mean_return"], expert_record["mean_return"]
    score = normalized_score(returns.mean(), ref_min, ref_max)
    print(
        f"{ds_id}: {total} transitions, {len(episodes)} episodes, mean return {returns.mean():.1f}, "
        f"normalized score {score:.1f} -> {path}"
    )
    return 0
