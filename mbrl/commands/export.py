"""`mbrl export RUN_DIR [--out DIR]`: write a deployable policy (policy.onnx, policy.jax, policy.json)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import tyro


@dataclasses.dataclass(frozen=True)
class ExportArgs:
    run_dir: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="RUN_DIR")]
    """A run directory written by `mbrl train`."""
    out: Path | None = None
    """Where to write the export (default: RUN_DIR/export); replaced as a whole if it exists."""
    seed_index: int = 0
    """Which of the run's training seeds to export (0: the first), for runs with --seeds N."""


def export(args: ExportArgs) -> int:
    # lazy: at the top these add 1.0 s (export) and 2.2 s (export_run) to `mbrl export --help` (0.2 s) (measured)
    from mbrl.export import carry_leaves, export_policy, verify_export
    from mbrl.export_run import load_policy_from_run

    spec = load_policy_from_run(args.run_dir, seed_index=args.seed_index)
    out = Path(args.out) if args.out is not None else Path(args.run_dir) / "export"
    out = export_policy(spec, out)
    worst = verify_export(spec, out)
    print(f"wrote {out}: policy.onnx, policy.jax, policy.json ({spec.metadata.get('algo')} on {spec.dataset}, "
          f"obs {spec.obs_dim}, action {spec.act_dim}, {spec.control_rate_hz or 'unknown'} Hz)")
    if spec.recurrent:
        print(f"recurrent policy: {len(carry_leaves(spec))} carry array(s); the graph also takes prev_action, prev_reward, first")
        print(f"onnxruntime vs JAX: max |Δaction| {worst:.1e} over episodes of random and out-of-range observations")
    else:
        print(f"onnxruntime vs JAX: max |Δaction| {worst:.1e} on random and out-of-range observations")
    from mbrl.envs.tasks import task_for_env_id  # lazy: 1.4 s more for `mbrl export --help` (measured)

    task = task_for_env_id(spec.env_id) if spec.env_id else None
    robot = f"sim:{task.name}" if task is not None else f"mujoco:{spec.env_id or 'ENV_ID'}"
    print(f"deploy it: mbrl deploy {out} --robot {robot}   (or udp://HOST:PORT, ros2:PREFIX)")
    return 0
