"""Collecting episodes from MuJoCo envs with a behaviour policy, many envs stepped in lockstep.

The policy is called once per step for the whole batch of envs (one jitted call), the envs step on
the host. Everything is seeded: env slot i resets its j-th episode with a seed derived from
(seed, i, j), and the policy gets the step index to derive its own key, so a collection is a pure
function of its seed and its sizes.

`envs` may import only `mbrl` lower modules: the behaviour policy arrives as a callable
`policy(obs_batch, step) -> actions in [-1, 1]`, built by the caller (see mbrl/commands/data_make.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np

from mbrl.core.errors import ConfigError
from mbrl.core.score import normalized_score
from mbrl.core.types import TASK_SPECS

Policy = Callable[[np.ndarray, int], np.ndarray]


def make_env(task: str) -> gym.Env:
    return gym.make(TASK_SPECS[task].env_id)


def episode_seed(seed: int, slot: int, episode: int) -> int:
    return int(np.random.SeedSequence([seed, slot, episode]).generate_state(1)[0])


def uniform_policy(act_dim: int, seed: int) -> Policy:
    """Uniform random actions in [-1, 1]; deterministic for (seed, step)."""

    def policy(obs: np.ndarray, step: int) -> np.ndarray:
        rng = np.random.default_rng([seed, step])
        return rng.uniform(-1.0, 1.0, (obs.shape[0], act_dim)).astype(np.float32)

    return policy


@dataclasses.dataclass
class Episode:
    observations: np.ndarray  # (T+1, obs_dim), Minari's layout
    actions: np.ndarray  # (T, act_dim)
    rewards: np.ndarray  # (T,)
    terminations: np.ndarray  # (T,) bool
    truncations: np.ndarray  # (T,) bool; also True on the last step of an episode cut by the quota

    @property
    def episode_return(self) -> float:
        return float(np.sum(self.rewards, dtype=np.float64))

    def __len__(self) -> int:
        return int(self.rewards.shape[0])


class _Recorder:
    def __init__(self, max_len: int, obs_dim: int, act_dim: int, record: bool):
        self.record = record
        self.obs = np.zeros((max_len + 1, obs_dim), np.float64) if record else None
        self.act = np.zeros((max_len, act_dim), np.float32) if record else None
        self.rew = np.zeros(max_len, np.float64)
        self.term = np.zeros(max_len, bool)
        self.trunc = np.zeros(max_len, bool)
        self.t = 0

    def start(self, obs):
        self.t = 0
        if self.record:
            self.obs[0] = obs

    def add(self, action, next_obs, reward, terminated, truncated):
        t = self.t
        if self.record:
            self.act[t] = action
            self.obs[t + 1] = next_obs
        self.rew[t], self.term[t], self.trunc[t] = reward, terminated, truncated
        self.t += 1

    def finish(self, cut: bool) -> Episode:
        t = self.t
        trunc = self.trunc[:t].copy()
        if cut and t:
            trunc[-1] = True
        return Episode(
            observations=self.obs[: t + 1].astype(np.float32) if self.record else None,
            actions=self.act[:t].copy() if self.record else None,
            rewards=self.rew[:t].astype(np.float32),
            terminations=self.term[:t].copy(),
            truncations=trunc,
        )


def run_lockstep(
    envs: list[gym.Env],
    policy: Policy,
    seed: int,
    steps_per_env: list[int] | None = None,
    episodes_per_env: list[int] | None = None,
    record: bool = True,
    on_steps: Callable[[int], None] | None = None,
) -> list[list[Episode]]:
    """Step all envs together until each meets its quota (env steps, or whole episodes).

    Returns the episodes of each env slot in order. With a step quota, a slot's last episode is cut
    at the quota and marked truncated. `on_steps(n)` reports progress (n new env steps).
    """
    n = len(envs)
    if (steps_per_env is None) == (episodes_per_env is None):
        raise ValueError("give exactly one of steps_per_env and episodes_per_env")
    spec = envs[0].unwrapped.spec
    max_len = spec.max_episode_steps if spec and spec.max_episode_steps else 1000
    obs_dim = envs[0].observation_space.shape[0]
    act_dim = envs[0].action_space.shape[0]
    low = envs[0].action_space.low.astype(np.float32)
    high = envs[0].action_space.high.astype(np.float32)
    recorders = [_Recorder(max_len, obs_dim, act_dim, record) for _ in range(n)]
    episodes: list[list[Episode]] = [[] for _ in range(n)]
    steps_done = [0] * n
    active = [True] * n
    current = np.zeros((n, obs_dim), np.float32)

    def quota_met(i: int) -> bool:
        if steps_per_env is not None:
            return steps_done[i] >= steps_per_env[i]
        return len(episodes[i]) >= episodes_per_env[i]

    for i, env in enumerate(envs):
        if quota_met(i):
            active[i] = False
            continue
        obs, _ = env.reset(seed=episode_seed(seed, i, 0))
        current[i] = obs
        recorders[i].start(obs)

    step = 0
    while any(active):
        actions = np.clip(np.asarray(policy(current, step), np.float32), -1.0, 1.0)
        env_actions = low + (actions + 1.0) * 0.5 * (high - low)
        new_steps = 0
        for i, env in enumerate(envs):
            if not active[i]:
                continue
            next_obs, reward, terminated, truncated, _ = env.step(env_actions[i])
            recorders[i].add(actions[i], next_obs, reward, terminated, truncated)
            steps_done[i] += 1
            new_steps += 1
            if terminated or truncated:
                episodes[i].append(recorders[i].finish(cut=False))
                if quota_met(i):
                    active[i] = False
                    continue
                obs, _ = env.reset(seed=episode_seed(seed, i, len(episodes[i])))
                current[i] = obs
                recorders[i].start(obs)
            elif steps_per_env is not None and quota_met(i):
                episodes[i].append(recorders[i].finish(cut=True))
                active[i] = False
            else:
                current[i] = next_obs
        step += 1
        if on_steps is not None:
            on_steps(new_steps)
    return episodes


def evaluate_returns(
    task: str, policy: Policy, num_episodes: int, seed: int, num_envs: int = 10, envs: list[gym.Env] | None = None
) -> np.ndarray:
    """Returns of `num_episodes` whole episodes, spread over `num_envs` lockstep envs."""
    num_envs = min(num_envs, num_episodes)
    envs = envs if envs is not None else [make_env(task) for _ in range(num_envs)]
    quotas = [num_episodes // num_envs + (i < num_episodes % num_envs) for i in range(num_envs)]
    result = run_lockstep(envs[:num_envs], policy, seed, episodes_per_env=quotas, record=False)
    return np.array([ep.episode_return for slot in result for ep in slot])


# ---------------------------------------------------------------------------- datasets

# The shipped behaviour policies; MBRL_BEHAVIOUR_DIR points elsewhere (development of new ones).
BEHAVIOUR_DIR = Path(os.environ.get("MBRL_BEHAVIOUR_DIR") or Path(__file__).resolve().parent / "behaviour")
LEVELS = ("random", "medium", "medium-replay", "expert", "medium-expert")
DEFAULT_TRANSITIONS = 1_000_000  # D4RL's size
# The least mean return (stochastic, 100 episodes) of a shipped expert: 80% of D4RL's expert reference
# return (d4rl/infos.py REF_MAX_SCORE).
EXPERT_BAR = {"hopper": 2590.0, "halfcheetah": 9700.0, "walker2d": 3670.0}

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


def dataset_id(task: str, level: str) -> str:
    return f"mbrl/{task}/{level}-v0"


def data_root() -> Path:
    return Path(os.environ.get("MBRL_DATA_DIR") or Path.home() / ".mbrl" / "datasets").expanduser()


def parse_name(name: str) -> tuple[str, str]:
    """'hopper-medium-replay' -> ('hopper', 'medium-replay'); ConfigError listing the valid names."""
    task, _, level = name.partition("-")
    tasks = sorted(t for t in TASK_SPECS if (BEHAVIOUR_DIR / f"{t}_random.json").exists()) or sorted(TASK_SPECS)
    if task not in TASK_SPECS or level not in LEVELS:
        raise ConfigError(
            f"unknown dataset '{name}': expected TASK-LEVEL with TASK one of {', '.join(tasks)} "
            f"and LEVEL one of {', '.join(LEVELS)} (e.g. hopper-medium)"
        )
    return task, level


def read_record(task: str, policy: str) -> dict:
    """The JSON record of a shipped behaviour policy (`random`, `medium`, `expert`, `medium_replay`)."""
    path = BEHAVIOUR_DIR / f"{task}_{policy}.json"
    if not path.exists():
        shipped = sorted(p.stem for p in BEHAVIOUR_DIR.glob("*.json"))
        raise ConfigError(
            f"no shipped behaviour record {path.name} in {BEHAVIOUR_DIR} for task '{task}'; "
            f"shipped: {', '.join(shipped) or 'none'} (train it with scripts/train_behaviour.py)"
        )
    return json.loads(path.read_text())


@dataclasses.dataclass(frozen=True)
class Segment:
    """`steps` env steps collected with `policy` (a part of a dataset: one level, or one snapshot)."""

    policy: Policy
    steps: int
    label: str


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
            for slot in run_lockstep(envs, policy, run_seed, steps_per_env=quotas, on_steps=on_steps):
                episodes.extend(slot)
    finally:
        for env in envs:
            env.close()
    return [ep for ep in episodes if len(ep)]


def _scheduled_policy(segments: list[Segment], num_envs: int) -> Policy:
    """The policy of the segment that lockstep step `step` falls in (each env's share of every segment)."""
    bounds = np.cumsum([0] + [s.steps for s in segments]) / num_envs

    def policy(obs: np.ndarray, step: int) -> np.ndarray:
        k = min(int(np.searchsorted(bounds, step, side="right")) - 1, len(segments) - 1)
        return segments[k].policy(obs, step - int(bounds[k]))

    return policy


def write_minari(
    root: Path, task: str, level: str, episodes: list[Episode], ref_min: float, ref_max: float, extra: dict
) -> Path:
    """Write a Minari dataset `mbrl/<task>/<level>-v0` under `root`, atomically.

    Built in a hidden temporary root (Minari skips hidden folders), then renamed into place, so an
    interrupted write leaves nothing that looks like a dataset.
    """
    import minari  # noqa: PLC0415 (slow import)

    ds_id = dataset_id(task, level)
    final = root / ds_id
    root.mkdir(parents=True, exist_ok=True)
    tmp_root = Path(tempfile.mkdtemp(prefix=".tmp-make-", dir=root))
    previous = os.environ.get("MINARI_DATASETS_PATH")
    try:
        os.environ["MINARI_DATASETS_PATH"] = str(tmp_root)
        from minari.data_collector.episode_buffer import EpisodeBuffer  # noqa: PLC0415

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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dataset = minari.create_dataset_from_buffers(
                dataset_id=ds_id,
                buffer=buffers,
                env=TASK_SPECS[task].env_id,
                algorithm_name=extra.get("algorithm_name", "SAC behaviour policy"),
                author="offline-mbrl",
                author_email="offline-mbrl@users.noreply.github.com",
                code_permalink="https://github.com/offline-mbrl/offline-mbrl/blob/main/envs/collect.py",
                ref_min_score=float(ref_min),
                ref_max_score=float(ref_max),
                description=extra.get("description"),
            )
        dataset.storage.update_metadata({k: v for k, v in extra.items() if k.startswith("mbrl_")})
        del dataset
        namespace_file = tmp_root / "mbrl" / task / "namespace_metadata.json"
        final.parent.mkdir(parents=True, exist_ok=True)
        for ns in (final.parent.parent, final.parent):  # mbrl/ and mbrl/<task>/ as Minari namespaces
            target = ns / "namespace_metadata.json"
            if not target.exists():
                src = tmp_root / ns.relative_to(root) / "namespace_metadata.json"
                shutil.copyfile(src if src.exists() else namespace_file, target)
        os.replace(tmp_root / ds_id, final)
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous
        shutil.rmtree(tmp_root, ignore_errors=True)
    return final


def is_complete(root: Path, task: str, level: str) -> bool:
    path = root / dataset_id(task, level)
    return (path / "data" / "metadata.json").exists() or (path / "metadata.json").exists()
