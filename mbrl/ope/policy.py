"""Where the policy an off-policy estimate judges comes from: a run directory written by `mbrl train` (its latest
checkpoint, one training seed; recurrent policies too) or an export (policy.jax and policy.json, Markov), as a
`mbrl.ope.judged.JudgedPolicy`.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np

from mbrl.core.errors import ConfigError
from mbrl.export import policy_function
from mbrl.export_run import run_policy_spec
from mbrl.ope.judged import JudgedPolicy
from mbrl.train import load_run


def load_policy(path: str | Path, seed_index: int = 0) -> JudgedPolicy:
    """The policy at `path`: a run directory written by `mbrl train`, or an export written by `mbrl export`."""
    path = Path(path)
    if (path / "config.json").is_file():
        return _from_run(path, seed_index)
    if (path / "policy.json").is_file():
        return _from_export(path)
    raise ConfigError(f"{path}: neither a run directory (config.json) nor an export (policy.json); expected what "
                      "`mbrl train` or `mbrl export` writes")


def _refuse_recurrent(source: str) -> None:
    raise ConfigError(f"{source}: an export of a recurrent policy; judge its run directory instead (off-policy "
                      "evaluation reads a recurrent policy's history from the run's own agent)")


def _from_run(run_dir: Path, seed_index: int) -> JudgedPolicy:
    run = load_run(run_dir)
    params = run.actor_params(seed_index)  # (checks the index)
    metadata = {"algo": run.config.algo, "train_seed": run.seeds[seed_index], "run_dir": str(run_dir)}
    return policy_of_run(run, params, str(run_dir), metadata, seed_index)


def policy_of_run(run, params, source: str, metadata: dict, member: int = 0) -> JudgedPolicy:
    """The deployed policy of a run's agent (`mbrl.train.LoadedRun`) with actor parameters `params` (its own, or any
    others of the same shapes)."""
    spec = run_policy_spec(run, params, Path(source).name, metadata)
    if spec.recurrent:
        carry = tuple(jax.tree.leaves(jax.tree.map(lambda x: np.stack([x.real, x.imag], axis=-1)
                                                   if np.iscomplexobj(x) else x, spec.initial_carry)))
        return JudgedPolicy(None, spec.obs_dim, spec.act_dim, source, run, member, policy_function(spec), carry)
    return JudgedPolicy(jax.vmap(policy_function(spec)), spec.obs_dim, spec.act_dim, source, run, member)


def _from_export(export_dir: Path) -> JudgedPolicy:
    try:
        facts = json.loads((export_dir / "policy.json").read_text())
        exported = jax.export.deserialize(bytearray((export_dir / "policy.jax").read_bytes()))
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"{export_dir}: cannot read the export's policy.json or policy.jax ({exc})") from None
    if facts.get("state") is not None:
        _refuse_recurrent(str(export_dir))
    try:
        obs_dim, act_dim = int(facts["observation"]["dim"]), int(facts["action"]["dim"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{export_dir / 'policy.json'}: no observation.dim and action.dim") from None
    return JudgedPolicy(exported.call, obs_dim, act_dim, str(export_dir))
