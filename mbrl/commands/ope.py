"""`mbrl ope POLICY --dataset SOURCE`: estimate a policy's value from the data alone (off-policy evaluation)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Literal

import tyro

from mbrl import datasets
from mbrl.core.errors import ConfigError
from mbrl.ope import estimates as methods_
from mbrl.ope.fqe import FQEConfig

METHODS = ("fqe", "critic", "model")


@dataclasses.dataclass(frozen=True)
class OpeArgs:
    policy: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="POLICY")]
    """A run directory written by `mbrl train` or an export written by `mbrl export`."""
    dataset: str
    """The dataset SOURCE that judges the policy (`mbrl data list`)."""
    task: str | None = None
    """The dataset's task, where the dataset does not name it."""
    method: Literal["fqe", "critic", "model", "all"] = "all"
    """fqe: Fitted Q Evaluation; critic: the run's own critics at the initial states (SAC-N runs); model: the
    greedy return in the run's world model (the sweep's offline objective); all: each that applies."""
    holdout: float = 0.1
    """The fraction of episodes FQE holds out for its early stopping, where the dataset has no -val file."""
    seed_index: int = 0
    """Which of a run's training seeds to judge."""
    world_model: Path | None = None
    """For the model method: a fitted world model (default: the run's own)."""
    starts: int = 256
    """For the model method: imagined episodes per elite, from the dataset's initial states."""
    horizon: int | None = None
    """For the model method: steps per imagined episode (default: the dataset's longest episode)."""
    json: bool = False
    """Print the estimates as one JSON object."""
    fqe: FQEConfig = FQEConfig()


def ope(args: OpeArgs) -> int:
    from mbrl import config as config_io  # lazy: 0.3 s more for `mbrl ope --help` (measured)
    from mbrl.ope.policy import load_policy  # lazy: importing it here adds 1.0 s to `mbrl ope --help` (measured)

    args = config_io.from_options(OpeArgs, args)  # the options checked as every command's are (finite numbers)
    if not 0.0 < args.holdout < 1.0:
        raise ConfigError(f"--holdout: expected a fraction in (0, 1), found {args.holdout}")
    policy = load_policy(args.policy, args.seed_index)
    dataset = datasets.load(args.dataset, task=args.task)
    if (policy.obs_dim, policy.act_dim) != (dataset.info.obs_dim, dataset.info.act_dim):
        raise ConfigError(f"{args.policy}: the policy takes {policy.obs_dim} observations and gives {policy.act_dim} "
                          f"actions; {dataset.info.source} has {dataset.info.obs_dim} and {dataset.info.act_dim}")
    initial = dataset.transitions.obs[dataset.episode_starts]
    methods = METHODS if args.method == "all" else (args.method,)
    estimates = []
    for method in methods:
        if method == "fqe":
            estimate = methods_.fqe_estimate(policy, dataset, initial, args.holdout, args.fqe)
        elif method == "critic":
            estimate = methods_.critic_estimate(policy, initial)
        else:
            estimate = methods_.model_estimate(policy, dataset, args.world_model, args.starts, args.horizon)
        if estimate is None and args.method != "all":
            raise ConfigError(f"--method {method}: {methods_.UNAVAILABLE[method]}")
        if estimate is not None:
            estimates.append(estimate)
    report = {"policy": str(args.policy), "dataset": dataset.info.source or args.dataset,
              "initial_states": int(len(initial)), "estimates": estimates}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['policy']} on {report['dataset']} ({report['initial_states']} initial states):")
    for e in estimates:
        normalized = f", normalized {e['normalized']:.1f}" if e.get("normalized") is not None else ""
        print(f"  {e['method']:<7} {e['kind']} {e['value']:.4g} [{e['low']:.4g}, {e['high']:.4g}]{normalized}  ({e['detail']})")
    return 0


