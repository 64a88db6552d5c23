"""The shipped behaviour policies that `mbrl data make` collects with, and loading them.

Each task ships JSON records (`<task>_<name>.json`: how a policy was made and what it returns) and the
actors' flax msgpack parameters (`expert`, `medium`, and the `medium_replay` snapshots), all written by
scripts/train_behaviour.py. The actors are SAC's tanh-Gaussian actors, the one network and sampler of
`mbrl.core.tanh_gaussian` that the agents train.

A behaviour policy is a `StepPolicy`, `policy(obs (N, obs_dim), step) -> actions in [-1, 1]`: a pure
function of its seed and the lockstep step, so a dataset is a pure function of its seed. `stepped`
makes one a lockstep policy (`mbrl.envs.lockstep`).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from mbrl.envs.lockstep import Policy
from mbrl.core.errors import ConfigError
from mbrl.core.tanh_gaussian import TanhGaussianActor, sample_tanh_gaussian
from mbrl.core.types import TASK_SPECS

# The shipped policies; MBRL_BEHAVIOUR_DIR points elsewhere (development of new ones).
BEHAVIOUR_DIR = Path(os.environ.get("MBRL_BEHAVIOUR_DIR") or Path(__file__).resolve().parent)
# The least mean return (stochastic, 100 episodes) of a shipped expert: 80% of D4RL's expert reference
# return (d4rl/infos.py REF_MAX_SCORE).
EXPERT_BAR = {"hopper": 2590.0, "halfcheetah": 9700.0, "walker2d": 3670.0}

StepPolicy = Callable[[np.ndarray, int], np.ndarray]


def stepped(policy: StepPolicy) -> Policy:
    """A behaviour policy as a lockstep policy: the loop calls it once per step, so its calls count the
    steps (make a fresh one per run)."""
    step = itertools.count()
    return lambda inputs: policy(inputs.obs, next(step))


def uniform_policy(act_dim: int, seed: int) -> StepPolicy:
    """Uniform random actions in [-1, 1]; deterministic for (seed, step)."""

    def policy(obs: np.ndarray, step: int) -> np.ndarray:
        rng = np.random.default_rng([seed, step])
        return rng.uniform(-1.0, 1.0, (obs.shape[0], act_dim)).astype(np.float32)

    return policy


def read_record(task: str, name: str) -> dict:
    """The JSON record of a shipped behaviour policy (`random`, `medium`, `expert`, `medium_replay`)."""
    path = BEHAVIOUR_DIR / f"{task}_{name}.json"
    if not path.exists():
        shipped = sorted(p.stem for p in BEHAVIOUR_DIR.glob("*.json"))
        raise ConfigError(
            f"no shipped behaviour record {path.name} in {BEHAVIOUR_DIR} for task '{task}'; "
            f"shipped: {', '.join(shipped) or 'none'} (train it with scripts/train_behaviour.py)"
        )
    return json.loads(path.read_text())


def _restore(task: str, record: dict, count: int | None):
    """(actor, params) from the record's msgpack file, cast to float32; `count` snapshots stored as
    {"0": params, "1": ...} when given."""
    spec = TASK_SPECS[task]
    if "file" not in record:
        raise ConfigError(f"{task} {record.get('level')}: this behaviour policy has no actor (expected medium or expert)")
    path = BEHAVIOUR_DIR / record["file"]
    if not path.is_file():
        raise ConfigError(f"{path}: the behaviour policy's parameters are missing (its record names this file)")
    actor = TanhGaussianActor(tuple(record["hidden_sizes"]), spec.act_dim)
    one = actor.init(jax.random.PRNGKey(0), jnp.zeros((1, spec.obs_dim)))
    template = one if count is None else {str(i): one for i in range(count)}
    try:
        restored = serialization.from_bytes(template, path.read_bytes())
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path}: not the parameters of a {task} actor with hidden sizes {record['hidden_sizes']}: {exc}"
        ) from None
    to_float32 = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)  # noqa: E731
    if count is None:
        return actor, to_float32(restored)
    return actor, [to_float32(restored[str(i)]) for i in range(count)]


def load_actor(task: str, name: str):
    """(actor module, float32 parameters) of a shipped actor (`medium`, `expert`)."""
    return _restore(task, read_record(task, name), None)


def load_snapshots(task: str):
    """(actor module, [parameters]) of the medium-replay run's actor snapshots, in the record's order
    (float16 on disk, float32 here)."""
    record = read_record(task, "medium_replay")
    return _restore(task, record, len(record["snapshot_steps"]))


@functools.partial(jax.jit, static_argnums=0)
def _sample(actor: TanhGaussianActor, params, key, obs, step):
    mean, log_std = actor.apply(params, obs)
    return sample_tanh_gaussian(mean, log_std, jax.random.fold_in(key, step))[0]


def actor_policy(actor: TanhGaussianActor, params, seed: int) -> StepPolicy:
    """The stochastic actor: a tanh-Gaussian sample with key fold_in(PRNGKey(seed), step), one jitted call
    per lockstep step (compiled once per actor shape, shared by every snapshot and seed)."""
    key = jax.random.PRNGKey(seed)
    return lambda obs, step: np.asarray(_sample(actor, params, key, obs, step))


def shipped_policy(task: str, name: str, seed: int) -> StepPolicy:
    """A shipped actor (`medium`, `expert`) as a stochastic behaviour policy."""
    actor, params = load_actor(task, name)
    return actor_policy(actor, params, seed)
