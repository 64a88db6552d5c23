"""Making D4RL-style datasets: what to run for a level, collecting it in lockstep envs, writing Minari.

The behaviour policies (`mbrl.envs.behaviour`) act in [-1, 1] through the one lockstep loop (`mbrl.envs.lockstep`),
one jitted call per step for the whole batch of envs. Everything is seeded: env slot i resets its j-th
episode with a seed derived from (seed, i, j), and a behaviour policy gets the step index to derive its
own key, so a dataset is a pure function of its seed and its sizes. Names and places of made datasets
are `mbrl.core.dataset_registry`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
from minari.data_collector.episode_buffer import EpisodeBuffer

from mbrl.envs import behaviour, lockstep
from mbrl.envs.lockstep import Episode
from mbrl.core import dataset_registry as registry
from mbrl.core.score import normalized_score
from mbrl.core.types import TASK_SPECS


def make_env(task: str) -> gym.Env:
    return gym.make(TASK_SPECS[task].env_id)


def episode_seed(seed: int, slot: int, episode: int) -> int:
    return int(np.random.SeedSequence([seed, slot, episode]).generate_state(1)[0])


DEFAULT_TRANSITIONS = 1_000_000  # D4RL's size

# The normalized score that each level's data is expected to have (the README's dataset table shows these
# bands next to the measured scores, and the tests check made data against them). medium follows the
# definition of a policy at about a third of the expert's return; medium-replay is mostly the early,
# short episodes of the run; medium-expert averages over episodes, most of which are medium's shorter ones.
SCORE_BANDS: dict[str, tuple[float, float]] = {
    "random": (-5.0, 5.0),
    "medium": (20.0, 70.0),
    "medium-replay": (0.0, 40.0),
    "expert": (80.0, 120.0),
    "medium-expert": (30.0, 100.0),
}


def data_score(episode_returns, complete, ref_min: float, ref_max: float) -> float:
    """The data's mean normalized score over its complete episodes (terminated, or at the time limit).

    Episodes cut short by the collection quota are left out: keeping them would bias the score low.
    """
    returns = np.asarray(episode_returns, np.float64)[np.asarray(complete, bool)]
    if returns.size == 0:
        raise ValueError("no complete episode in the data: collect more transitions")
    return float(normalized_score(returns.mean(), ref_min, ref_max))


@dataclasses.dataclass(frozen=True)
class Segment:
    """`steps` env steps collected with `policy` (a part of a dataset: one level, or one snapshot)."""

    policy: behaviour.StepPolicy
    steps: int
    label: str


def plan_segments(task: str, level: str, transitions: int | None, seed: int) -> list[Segment]:
    """What to run for a level (D4RL's definitions, Fu et al. 2020):

    random         uniform actions
    medium         the shipped medium policy (a checkpoint of the SAC run at about 1/3 of expert return)
    expert         the shipped expert policy (the end of that run)
    medium-expert  medium then expert, half of the transitions each
    medium-replay  the SAC run's experience up to the medium checkpoint, regenerated from its recorded
                   segments (uniform warm-up, then each shipped actor snapshot for the env steps it
                   covered), scaled to `transitions` when given (default: the recorded run's length)
    Actors sample from their stochastic policy, as D4RL did.
    """
    registry.task_level(registry.dataset_name(task, level))  # a ConfigError naming the tasks and levels
    act_dim = TASK_SPECS[task].act_dim
    total = DEFAULT_TRANSITIONS if transitions is None else transitions
    if level == "random":
        return [Segment(behaviour.uniform_policy(act_dim, seed), total, "random")]
    if level in ("medium", "expert"):
        return [Segment(behaviour.shipped_policy(task, level, seed), total, level)]
    if level == "medium-expert":
        half = total // 2
        return [
            Segment(behaviour.shipped_policy(task, "medium", seed), half, "medium"),
            Segment(behaviour.shipped_policy(task, "expert", seed + 1), total - half, "expert"),
        ]
    record = behaviour.read_record(task, "medium_replay")
    recorded = int(record["env_steps"])
    total = recorded if transitions is None else transitions
    actor, snapshots = behaviour.load_snapshots(task)
    bounds = np.round(np.cumsum([0] + [seg["steps"] for seg in record["segments"]]) * total / recorded).astype(int)
    segments = []
    for k, seg in enumerate(record["segments"]):
        steps = int(bounds[k + 1] - bounds[k])
        if steps == 0:
            continue
        if seg["snapshot"] < 0:
            policy = behaviour.uniform_policy(act_dim, seed + k)
        else:
            policy = behaviour.actor_policy(actor, snapshots[seg["snapshot"]], seed + k)
        segments.append(Segment(policy, steps, f"snapshot@{seg['start']}"))
    return segments


def collect_segments(
    task: str,
    segments: list[Segment],
    seed: int,
    num_envs: int = 16,
    on_steps: Callable[[int], None] | None = None,
    continuous: bool = False,
) -> list[Episode]:
    """Episodes of every segment in order, on `num_envs` lockstep envs.

    Separate (default): segment k runs on its own, with seed (seed, k), and its last episodes are cut at
    its quota (medium-expert: two datasets put together). `continuous`: one run with seed (seed, 0) in
    which every env switches to the next segment's policy at the segment's boundary, in the middle of an
    episode if need be. That is what a training run's replay buffer holds (medium-replay), and it keeps
    the episodes of tasks that never terminate (halfcheetah) whole.
    """
    envs = [make_env(task) for _ in range(num_envs)]
    try:
        if continuous:
            runs = [(_scheduled_policy(segments, num_envs), sum(s.steps for s in segments))]
        else:
            runs = [(segment.policy, segment.steps) for segment in segments]
        episodes: list[Episode] = []
        for k, (policy, steps) in enumerate(runs):
            quotas = [steps // num_envs + (i < steps % num_envs) for i in range(num_envs)]
            run_seed = int(np.random.SeedSequence([seed, k]).generate_state(1)[0])
            slots = lockstep.run(
                envs, behaviour.stepped(policy), functools.partial(episode_seed, run_seed), steps=quotas,
                record=True, unit_actions=True, on_step=on_steps,
            )
            for slot in slots:
                episodes.extend(slot)
    finally:
        for env in envs:
            env.close()
    return [ep for ep in episodes if len(ep)]


def _scheduled_policy(segments: list[Segment], num_envs: int) -> behaviour.StepPolicy:
    """The policy of the segment that lockstep step `step` falls in (each env's share of every segment)."""
    bounds = np.cumsum([0] + [s.steps for s in segments]) / num_envs

    def policy(obs: np.ndarray, step: int) -> np.ndarray:
        k = min(int(np.searchsorted(bounds, step, side="right")) - 1, len(segments) - 1)
        return segments[k].policy(obs, step - int(bounds[k]))

    return policy


@dataclasses.dataclass(frozen=True)
class MadeDataset:
    path: Path
    transitions: int
    episodes: int
    mean_return: float  # over all its episodes, the ones cut by the quota too
    normalized_score: float  # of that mean, against the shipped random and expert records


def make_dataset(
    task: str,
    level: str,
    segments: list[Segment],
    seed: int,
    num_envs: int = 16,
    on_steps: Callable[[int], None] | None = None,
    root: Path | None = None,
) -> MadeDataset:
    """Collect `segments` (from `plan_segments(task, level, ...)`) and write the Minari dataset
    `mbrl/<task>/<level>-v0` under `root` (default: the registry's data folder). Reference scores are the
    shipped random and expert records' mean returns."""
    ref_min = behaviour.read_record(task, "random")["mean_return"]
    ref_max = behaviour.read_record(task, "expert")["mean_return"]
    episodes = collect_segments(
        task, segments, seed, num_envs=num_envs, on_steps=on_steps, continuous=level == "medium-replay"
    )
    total = sum(s.steps for s in segments)
    extra = {
        "description": f"D4RL-style {level} data for {TASK_SPECS[task].env_id}, made by `mbrl data make`.",
        "algorithm_name": "SAC behaviour policy" if level != "random" else "uniform random policy",
        "mbrl_level": level,
        "mbrl_seed": int(seed),
        "mbrl_transitions": int(total),
    }
    path = write_minari(registry.data_dir() if root is None else Path(root), task, level, episodes, ref_min,
                        ref_max, extra)
    mean = float(np.mean([ep.episode_return for ep in episodes]))
    return MadeDataset(path, total, len(episodes), mean, float(normalized_score(mean, ref_min, ref_max)))


def write_minari(
    root: Path, task: str, level: str, episodes: list[Episode], ref_min: float, ref_max: float, extra: dict
) -> Path:
    """Write a Minari dataset `mbrl/<task>/<level>-v0` under `root`, atomically (`write_minari_folder`), with
    `mbrl/` and `mbrl/<task>/` as Minari namespaces."""
    ds_id = registry.minari_id(task, level)
    final = root / ds_id

    def place_namespaces(tmp_root: Path) -> None:
        namespace_file = tmp_root / registry.NAMESPACE / task / "namespace_metadata.json"
        final.parent.mkdir(parents=True, exist_ok=True)
        for ns in (final.parent.parent, final.parent):
            target = ns / "namespace_metadata.json"
            if not target.exists():
                src = tmp_root / ns.relative_to(root) / "namespace_metadata.json"
                shutil.copyfile(src if src.exists() else namespace_file, target)

    return write_minari_folder(
        final, ds_id, episodes, tmp_parent=root, env_id=TASK_SPECS[task].env_id, ref_scores=(ref_min, ref_max),
        algorithm_name=extra.get("algorithm_name", "SAC behaviour policy"), description=extra.get("description"),
        metadata={k: v for k, v in extra.items() if k.startswith("mbrl_")}, before_rename=place_namespaces)


def write_minari_folder(
    final: Path,
    dataset_id: str,
    episodes: list[Episode],
    *,
    tmp_parent: Path | None = None,
    env_id: str | None = None,
    spaces: tuple[gym.spaces.Box, gym.spaces.Box] | None = None,
    ref_scores: tuple[float | None, float | None] = (None, None),
    algorithm_name: str | None = None,
    description: str | None = None,
    metadata: dict | None = None,
    code_permalink: str = "https://github.com/offline-mbrl/offline-mbrl/blob/main/envs/collect.py",
    before_rename: Callable[[Path], None] | None = None,
) -> Path:
    """The project's one Minari writer: `episodes` as the dataset `dataset_id` in the folder `final` (which then
    holds `data/`), atomically.

    Built in a hidden temporary root in `tmp_parent` (default: beside `final`; Minari skips hidden folders), then
    renamed into place, so an interrupted write leaves nothing that looks like a dataset. Without `env_id`,
    `spaces` gives (observation space, action space), and the reference scores go into the metadata directly:
    Minari itself keeps them only for an env it can make. `before_rename(tmp_root)` runs just before the rename.
    """
    tmp_parent = final.parent if tmp_parent is None else tmp_parent
    tmp_parent.mkdir(parents=True, exist_ok=True)
    tmp_root = Path(tempfile.mkdtemp(prefix=".tmp-make-", dir=tmp_parent))
    previous = os.environ.get("MINARI_DATASETS_PATH")
    ref_min, ref_max = ref_scores
    extra_metadata = dict(metadata or {})
    if env_id is None and ref_min is not None and ref_max is not None:
        extra_metadata.update(ref_min_score=float(ref_min), ref_max_score=float(ref_max))
    try:
        os.environ["MINARI_DATASETS_PATH"] = str(tmp_root)

        buffers = [
            EpisodeBuffer(
                id=i,
                observations=ep.observations,
                actions=ep.actions,
                rewards=ep.rewards,
                terminations=ep.terminations,
                truncations=ep.truncations,
            )
            for i, ep in enumerate(episodes)
        ]
        observation_space, action_space = spaces if spaces is not None else (None, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dataset = minari.create_dataset_from_buffers(
                dataset_id=dataset_id,
                buffer=buffers,
                env=env_id,
                observation_space=observation_space,
                action_space=action_space,
                algorithm_name=algorithm_name,
                author="offline-mbrl",
                author_email="offline-mbrl@users.noreply.github.com",
                code_permalink=code_permalink,
                ref_min_score=None if env_id is None or ref_min is None else float(ref_min),
                ref_max_score=None if env_id is None or ref_max is None else float(ref_max),
                description=description,
            )
        if extra_metadata:
            dataset.storage.update_metadata(extra_metadata)
        del dataset
        if before_rename is not None:
            before_rename(tmp_root)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp_root / dataset_id, final)
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous
        shutil.rmtree(tmp_root, ignore_errors=True)
    return final
