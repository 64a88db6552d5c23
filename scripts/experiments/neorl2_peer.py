"""Side by side with polixir's OfflineRL (the library NeoRL-2 trained its published table with): BC, MOPO and CQL on
NeoRL-2's DMSD, on the same data, the same number of gradient steps and the same evaluation.

Usage (run by hand from the project's root; the peer is not a dependency of the project):

    python3 -m venv /work/peer-venv
    /work/peer-venv/bin/pip install torch==2.13.0 offlinerl tensorboard
    # offlinerl 0.0.2 on PyPI does not import: its wheel and sdist lack offlinerl/outside_utils (that folder has no
    # __init__.py, so setup.py's find_packages() skips it). Install the same source from git instead, editable:
    /work/peer-venv/bin/pip uninstall -y offlinerl
    /work/peer-venv/bin/pip install --no-deps -e PATH/OfflineRL      # polixir/OfflineRL at ea1a446 (2024-11-26)
    # (CQL, and BC at three seeds with --peer-val, were run against a7db458, 2023-12-05, the stored mirror's head:
    # its BC needs a val file, its MOPO is an earlier one the harness cannot run. Its offlinerl/utils/env.py imports
    # NeoRL v1's `neorl` package at import time, for environments the harness never makes: an empty module stands
    # in for it. Its BaseAlgo logs through aim 2's `aim.Session`, which the aim 3 that pip resolves lacks: a logger
    # that records nothing stands in for it; training is untouched.)
    .venv/bin/python scripts/experiments/neorl2_peer.py --steps 10000 --seeds 0 --episodes 100

The driver runs under the project's venv. For each (side, algo, seed) it trains in a subprocess:

- peer: this file again under `--peer-python` (`_peer` subcommand), which imports offlinerl unmodified, builds the
  buffers with its own loader (`offlinerl.data.neorl.load_neorl_buffer`, as its `load_data_from_neorl2` does),
  and runs its own `algo_select` / `algo_init` / `AlgoTrainer.train`. Two things stand in for the neorl2 package,
  which is not installed: the obs / action shapes are given in the config (BC's `algo_init` reads them from
  there), and MOPO's `get_env_obs_act_spaces` returns DMSD's boxes (stored by the trainer, never used in
  training). The per-epoch online evaluation callback is replaced by one that returns nothing. CQL's BC warm start
  (`policy_bc_steps`, 40,000 of NeoRL-2's 1M updates) is scaled to the same 4% of `--steps` on both sides. The trained
  actor's layers are written to an .npz together with the torch actions on a probe of dataset observations.
- ours: `mbrl train --algo bc|mopo|cql --preset paper` with the same budget and, where the two correspond, the peer's
  values (see OURS_MATCHED).

Then both sides are scored by `mbrl.evaluate.evaluate` on the project's DMSD simulator (`mbrl.envs.neorl2.dmsd`) with the
same reset seeds (episode i of training seed s resets with eval_seed + s * episodes + i, as `mbrl train` and
`mbrl eval` do). The peer's deterministic action (OfflineRL's `policy.get_action`: BC's Gaussian mean, MOPO's
tanh of the mean) is recomputed in numpy from the exported layers; the driver checks it against torch's on the
probe before evaluating. One JSON line per (side, algo, seed) is printed and appended to `--out`/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "neorl2" / "DMSD-high-100000-train.npz"
TASK = "DMSD"
# NeoRL2 neorl2/envs/info.py: DMSD's reference scores (min, max) for the normalized score.
REF_SCORES = (30.60, 849.51)
STEPS_PER_EPOCH = 1000  # OfflineRL bc_config.py / mopo_config.py `steps_per_epoch`; ours: updates per epoch
PROBE_ROWS = 512

# The peer's NeoRL-2 settings for DMSD. Everything not listed is OfflineRL's config default
# (offlinerl/config/algo/bc_config.py, mopo_config.py), which NeoRL-2's launch_task.py leaves as is.
# The grid-searched values are the best configuration on DMSD by the mean over 3 seeds, as NeoRL2's
# benchmark/report_result.py picks it, from benchmark/results/DMSD-bc/log.csv and DMSD-mopo/log.csv.
PEER_HYPERS = {
    # bc_config.py: actor_features 256, batch_size 256; grid_tune actor_lr x actor_layers; DMSD best: 1e-3, 2 layers
    "bc": {"actor_lr": 1e-3, "actor_layers": 2},
    # mopo_config.py: hidden 2x256, actor lr 1e-4 (cosine over max_epoch), critic lr 3e-4, alpha lr 1e-4, learnable
    # alpha, gamma 0.99, tau 5e-3, batch 256, real_data_ratio 0.05, rollout_batch_size 5e4 every 1,000 steps,
    # 5 epochs retained, dynamics 7 members / 5 elites of 4x200; grid_tune horizon x penalty_coef x uncertainty_mode;
    # DMSD best: horizon 1, penalty 0.5, aleatoric
    "mopo": {"horizon": 1, "penalty_coef": 0.5, "uncertainty_mode": "aleatoric"},
    # cql_config.py: 3x256 networks (layer_num 2), actor lr 1e-4 (the temperature's too), critic lr 3e-4 (the Lagrange
    # multiplier's too), batch 256, num_random 10, temp 1, type_q_backup "min" (entropy kept in the target); grid_tune
    # min_q_version x min_q_weight x lagrange_thresh; DMSD best (benchmark/results/DMSD-cql/log.csv): v3, 5, 10
    "cql": {"min_q_version": 3, "min_q_weight": 5.0, "lagrange_thresh": 10.0},
}
BC_WARM_START_SHARE = 40_000 / 1_000_000  # cql_config.py policy_bc_steps of NeoRL-2's 1,000 epochs x 1,000 steps


def bc_warm_start(steps: int) -> int:
    return int(steps * BC_WARM_START_SHARE)

# Our side: the `paper` preset, with the peer's values where a setting means the same on both sides.
OURS_MATCHED = {
    "bc": ["--bc.hidden-sizes", "256", "256", "--bc.learning-rate", "1e-3", "--bc.batch-size", "256"],
    "mopo": ["--imagination.horizon", "1", "--mopo.penalty-coef", "0.5", "--mopo.uncertainty", "aleatoric_max",
             "--imagination.rollouts-per-epoch", "50000", "--imagination.retain-epochs", "5",
             "--imagination.real-ratio", "0.05", "--sac.num-critics", "2", "--sac.hidden-sizes", "256", "256",
             "--sac.actor-lr", "1e-4", "--sac.critic-lr", "3e-4", "--sac.alpha-lr", "1e-4", "--sac.batch-size", "256",
             "--sac.gamma", "0.99", "--sac.tau", "5e-3", "--sac.alpha-max", "1.0", "--sac.actor-bc-coef", "0",
             "--sac.init", "torch", "--sac.logp-epsilon", "1e-6", "--sac.update-order", "critic_actor_alpha"],
    # the paper preset with NeoRL-2's DMSD values (agents/cql.py per_dataset: Lagrange 10, v3, weight 5, soft backup)
    # is the peer's configuration; the initialisation and log-probability as torch's, the warm start added per run
    "cql": ["--sac.init", "torch", "--sac.logp-epsilon", "1e-6"],
}


def normalized(ret: float) -> float:
    lo, hi = REF_SCORES
    return 100.0 * (ret - lo) / (hi - lo)


# ------------------------------------------------------------------------------------------ the peer's side
# Runs under the peer's venv (torch + offlinerl); imports nothing of the project.

def _npz_buffer(path: str):
    from offlinerl.data.neorl import load_neorl_buffer

    d = np.load(path)
    return load_neorl_buffer({  # as offlinerl.data.load_data_from_neorl2 builds it
        "obs": d["obs"].astype(np.float32),
        "action": d["action"].astype(np.float32),
        "next_obs": d["next_obs"].astype(np.float32),
        "reward": d["reward"].astype(np.float32).reshape(-1, 1),
        "done": np.bool_(d["done"]).reshape(-1, 1),
    })


def _layers(seq) -> list:
    """The ops of a torch nn.Sequential as (kind, params): linear, relu, leaky_relu, identity."""
    import torch.nn as nn

    ops = []
    for m in seq:
        if isinstance(m, nn.Linear):
            ops.append(("linear", m.weight.detach().cpu().numpy(), m.bias.detach().cpu().numpy()))
        elif isinstance(m, nn.ReLU):
            ops.append(("relu",))
        elif isinstance(m, nn.LeakyReLU):
            ops.append(("leaky_relu", m.negative_slope))
        elif isinstance(m, nn.Identity):
            ops.append(("identity",))
        else:
            raise SystemExit(f"neorl2_peer: cannot export layer {m!r}")
    return ops


USAGE_EXIT = 2  # a peer run refused for how it was asked (a missing option, a peer version that lacks a part)


def usage_error(message: str):
    """One line on stderr and exit status 2 (the driver passes both on)."""
    print(message, file=sys.stderr)
    sys.exit(USAGE_EXIT)


def peer_train(a) -> None:
    import torch

    # One intra-op thread: on 2 cores shared with other processes, torch's OpenMP pool of 2 spin-waits and was
    # measured 30x slower per dynamics-fit batch (700 ms against 24 ms) than one thread.
    torch.set_num_threads(int(os.environ.get("PEER_THREADS", "1")))
    import types

    from gym.spaces import Box

    sys.modules.setdefault("neorl", types.ModuleType("neorl"))  # see the module docstring: never used

    from offlinerl.algo import algo_select

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train_buffer = _npz_buffer(a.data)
    val_buffer = _npz_buffer(a.val) if a.val else None
    obs_dim, act_dim = train_buffer.obs.shape[1], train_buffer.act.shape[1]
    if a.algo == "mopo":
        try:
            import offlinerl.algo.modelbase.model_base as model_base
        except ModuleNotFoundError:
            usage_error("neorl2_peer: this OfflineRL has no offlinerl.algo.modelbase.model_base: its MOPO is an "
                        "earlier implementation than ea1a446's, which the MOPO side needs")

        model_base.get_env_obs_act_spaces = lambda task: (  # neorl2's DMSD boxes, stored and never used in training
            Box(-np.inf, np.inf, (obs_dim,), np.float32), Box(-1.0, 1.0, (act_dim,), np.float32))

    (out / "aim").mkdir(exist_ok=True)  # a7db458's BaseAlgo logs there only if it exists
    import inspect

    import offlinerl.algo.base as algo_base
    import offlinerl.utils.exp as peer_exp

    # a7db458 logs through aim 2's Session, which the aim 3 that pip resolves lacks (ea1a446 ran under aim 3 as is)
    if "aim.Session" in inspect.getsource(peer_exp) and not hasattr(__import__("aim"), "Session"):

        class MetricsLogger:  # stands in for the experiment logger only: its records are not read here
            def __init__(self, **kwargs):
                self.repo = types.SimpleNamespace(index_path=str(out / "aim"))

            def set_params(self, *args, **kwargs):
                pass

            def track(self, *args, **kwargs):
                pass

        algo_base.init_exp_logger = MetricsLogger
    kwargs = {"algo_name": a.algo, "task": TASK, "seed": a.seed, "exp_name": f"{TASK}-{a.algo}",
              "aim_path": str(out / "aim")}
    algo_init_fn, trainer_cls, config = algo_select(kwargs)
    if a.algo == "bc" and val_buffer is None and "len(val_buffer)" in inspect.getsource(trainer_cls.train):
        usage_error("neorl2_peer: this OfflineRL's BC keeps its best epoch on a val file: give --peer-val")
    config.update(PEER_HYPERS[a.algo])
    if a.algo == "cql":
        config["policy_bc_steps"] = bc_warm_start(a.steps)
    config.update({"device": "cpu", "obs_shape": obs_dim, "action_shape": act_dim,
                   "steps_per_epoch": STEPS_PER_EPOCH, "max_epoch": a.steps // STEPS_PER_EPOCH})
    if a.algo == "mopo":
        config["transition_max_epochs"] = a.fit_epochs  # None (the default) stops on patience only
    init = algo_init_fn(config)
    trainer = trainer_cls(init, config)

    updates = {"n": 0}
    actor_optim = trainer.actor_opt if a.algo == "cql" else trainer.actor_optim
    step = actor_optim.step

    def counted_step(*args, **kwargs):
        updates["n"] += 1
        return step(*args, **kwargs)

    actor_optim.step = counted_step
    fit = {"seconds": 0.0}
    if a.algo == "mopo":
        train_transition = trainer.train_transition

        def timed_fit(data):
            t0 = time.perf_counter()
            train_transition(data)
            fit["seconds"] = time.perf_counter() - t0

        trainer.train_transition = timed_fit

    t0 = time.perf_counter()
    trainer.train(train_buffer, val_buffer, callback_fn=lambda policy: {})
    seconds = time.perf_counter() - t0
    run_logger = getattr(trainer, "exp_run", None) or getattr(trainer, "exp_logger", None)  # ea1a446 / a7db458
    if hasattr(run_logger, "close"):
        run_logger.close()

    policy = trainer.get_policy().to("cpu")
    policy.eval()
    if a.algo == "bc":  # GaussianActor: mean = first act_dim outputs of backbone.net, unbounded
        ops, head = _layers(policy.backbone.net), "first_half"
    elif a.algo == "cql":  # TanhGaussianPolicy: mode = tanh(mu(preprocess))
        ops, head = _layers(policy.preprocess.model) + _layers([policy.mu]), "tanh"
    else:  # ActorProb + TanhDiagGaussian(unbounded, conditioned sigma): mode = tanh(mu(backbone))
        ops, head = _layers(policy.backbone.model) + _layers([policy.dist_net.mu]), "tanh"
    rng = np.random.default_rng(2024)
    probe = train_buffer.obs[rng.choice(len(train_buffer.obs), PROBE_ROWS, replace=False)].astype(np.float32)
    with torch.no_grad():
        probe_actions = np.asarray(policy.get_action(probe), np.float32)  # the peer's own evaluation call
    arrays = {"probe_obs": probe, "probe_actions": probe_actions}
    spec = []
    for i, op in enumerate(ops):
        if op[0] == "linear":
            arrays[f"W{i}"], arrays[f"b{i}"] = op[1], op[2]
            spec.append(["linear", i])
        else:
            spec.append(list(op))
    np.savez(out / "policy.npz", **arrays)
    import offlinerl

    commit = subprocess.run(["git", "-C", str(Path(offlinerl.__file__).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    meta = {"ops": spec, "head": head, "act_dim": int(act_dim), "grad_steps": updates["n"], "commit": commit,
            "train_seconds": seconds, "fit_seconds": fit["seconds"] if a.algo == "mopo" else None,
            "hypers": {k: config[k] for k in sorted(config) if k not in ("grid_tune", "params_tune")
                       and isinstance(config[k], (int, float, str, bool, list, tuple, type(None)))}}
    if a.algo == "mopo":
        meta["elites"] = [int(i) for i in trainer.dynamics.model.elites.data.cpu().numpy()]
    (out / "policy.json").write_text(json.dumps(meta, indent=1, default=str))


# ------------------------------------------------------------------------------------------ the driver

class NumpyPolicy:
    """The peer's deterministic action from its exported layers (float32, as torch computes it)."""

    def __init__(self, directory: Path):
        self.meta = json.loads((directory / "policy.json").read_text())
        self.arrays = dict(np.load(directory / "policy.npz"))

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float32)
        for op in self.meta["ops"]:
            if op[0] == "linear":
                x = x @ self.arrays[f"W{op[1]}"].T + self.arrays[f"b{op[1]}"]
            elif op[0] == "relu":
                x = np.maximum(x, 0.0)
            elif op[0] == "leaky_relu":
                x = np.where(x >= 0.0, x, x * np.float32(op[1]))
        act_dim = self.meta["act_dim"]
        return x[:, :act_dim] if self.meta["head"] == "first_half" else np.tanh(x)

    def check(self) -> float:
        err = float(np.max(np.abs(self(self.arrays["probe_obs"]) - self.arrays["probe_actions"])))
        if err > 1e-4:
            raise SystemExit(f"neorl2_peer: the numpy copy of the peer's policy differs from torch's by {err:.2e}")
        return err


def run_peer(a, algo: str, seed: int, out: Path) -> dict:
    from mbrl.envs import lockstep
    from mbrl.envs.tasks import get_task
    from mbrl.evaluate import evaluate, member_reset_seeds

    directory = out / "runs" / f"peer-{algo}-s{seed}"
    if directory.exists():
        shutil.rmtree(directory)
    cmd = [a.peer_python, str(Path(__file__).resolve()), "_peer", "--algo", algo, "--steps", str(a.steps),
           "--seed", str(seed), "--data", str(a.dataset), "--out", str(directory), "--fit-epochs", str(a.peer_fit_epochs)]
    if a.peer_val:
        cmd += ["--val", str(a.peer_val)]
    env = dict(os.environ, PATH=f"{Path(a.peer_python).parent}:{os.environ.get('PATH', '')}")  # `aim init`
    t0 = time.perf_counter()
    log_path = out / "logs" / f"peer-{algo}-s{seed}.log"
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        last = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()][-1:] or ["no output"]
        print(f"neorl2_peer: the peer's {algo} failed (exit {rc}): {last[0]} (log: {log_path})", file=sys.stderr)
        sys.exit(2 if rc == USAGE_EXIT else 1)
    policy = NumpyPolicy(directory)
    probe_err = policy.check()
    t1 = time.perf_counter()
    result = evaluate(lockstep.markov(policy), get_task(TASK), episodes=a.episodes,
                      seed=member_reset_seeds([seed], a.episodes, a.eval_seed))
    meta = policy.meta
    return {"side": "peer", "impl": f"polixir/OfflineRL {meta.get('commit', 'ea1a446')} (torch, CPU)", "algo": algo, "seed": seed,
            "normalized_score": normalized(result.mean), "return_mean": result.mean, "return_std": result.std,
            "episodes": a.episodes, "grad_steps": meta["grad_steps"], "wall_seconds": wall,
            "train_seconds": meta["train_seconds"], "fit_seconds": meta["fit_seconds"],
            "eval_seconds": time.perf_counter() - t1, "probe_max_abs_err": probe_err,
            "hypers": meta["hypers"], "command": " ".join(cmd)}


def run_ours(a, algo: str, seed: int, out: Path) -> dict:
    import jax.numpy as jnp  # noqa: F401  (the project's runtime)
    from mbrl.envs.tasks import get_task
    from mbrl.train import load_run

    directory = out / "runs" / f"ours-{algo}-s{seed}"
    if directory.exists():
        shutil.rmtree(directory)
    epochs = a.steps // STEPS_PER_EPOCH
    cmd = [str(ROOT / ".venv" / "bin" / "mbrl"), "train", "--algo", algo, "--dataset", str(a.dataset), "--task", TASK,
           "--preset", "paper", "--seed", str(seed), "--seeds", "1", "--run-dir", str(directory),
           "--schedule.epochs", str(epochs), "--schedule.updates-per-epoch", str(STEPS_PER_EPOCH),
           "--schedule.eval-every", str(epochs), "--schedule.eval-episodes", "1", "--logging.progress", "False"]
    if algo == "mopo":
        cmd += ["--world-model", str(a.world_model)]
    if not a.ours_preset_only:
        cmd += OURS_MATCHED[algo]
    if algo == "cql":
        cmd += ["--cql.policy-bc-steps", str(bc_warm_start(a.steps))]
    t0 = time.perf_counter()
    with open(out / "logs" / f"ours-{algo}-s{seed}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"neorl2_peer: our {algo} failed (exit {rc}); see {out / 'logs' / f'ours-{algo}-s{seed}.log'}")
    loaded = load_run(directory)
    t1 = time.perf_counter()
    res = loaded.trainer.evaluate(loaded.state, get_task(TASK), loaded.seeds, REF_SCORES, episodes=a.episodes,
                                  eval_seed=a.eval_seed)  # mbrl.evaluate.evaluate, the same member_reset_seeds
    ret = float(res["return_mean"][0])
    fit = None
    if algo == "mopo":  # what model.json records of the world model's fit (seconds, epochs, stop reason)
        def find(node):
            if isinstance(node, dict):
                if "fit_seconds" in node:
                    return node
                node = list(node.values())
            if isinstance(node, list):
                for child in node:
                    found = find(child)
                    if found is not None:
                        return found
            return None

        found = find(json.loads((Path(a.world_model) / "model.json").read_text())) or {}
        fit = {k: found.get(k) for k in ("fit_seconds", "epochs", "stop_reason", "elites")}
    cfg = json.loads((directory / "config.json").read_text())
    hypers = {k: cfg.get(k) for k in {"bc": ("bc",), "cql": ("sac", "cql")}.get(algo, ("sac", "mopo", "imagination"))}
    return {"side": "ours", "impl": "offline-mbrl (JAX, CPU)", "algo": algo, "seed": seed,
            "normalized_score": normalized(ret), "return_mean": ret, "return_std": float(res["return_std"][0]),
            "episodes": a.episodes, "grad_steps": int(loaded.record["updates"]), "wall_seconds": wall,
            "fit_seconds": None if fit is None else fit["fit_seconds"], "world_model_fit": fit, "eval_seconds": time.perf_counter() - t1, "hypers": hypers,
            "command": " ".join(cmd)}


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_peer"]:
        p = argparse.ArgumentParser(prog="neorl2_peer.py _peer")
        p.add_argument("--algo", choices=("bc", "mopo", "cql"), required=True)
        p.add_argument("--steps", type=int, required=True)
        p.add_argument("--seed", type=int, required=True)
        p.add_argument("--data", required=True)
        p.add_argument("--val", default=None)
        p.add_argument("--out", required=True)
        p.add_argument("--fit-epochs", type=int, default=None)
        peer_train(p.parse_args(argv[1:]))
        return 0

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10_000, help="gradient steps (actor updates) per run; a multiple of 1,000")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--algos", nargs="+", choices=("bc", "mopo", "cql"), default=["bc", "mopo"])
    p.add_argument("--sides", nargs="+", choices=("peer", "ours"), default=["peer", "ours"])
    p.add_argument("--episodes", type=int, default=1000,
                   help="evaluation episodes per run (NeoRL-2's launch_task.py: number_of_runs=1000)")
    p.add_argument("--eval-seed", type=int, default=0)
    p.add_argument("--dataset", type=Path, default=DEFAULT_DATA)
    p.add_argument("--world-model", type=Path, default=ROOT / "results" / "neorl2" / "wm-DMSD",
                   help="our MOPO's world model (mbrl model fit)")
    p.add_argument("--peer-python", default="/work/peer-venv/bin/python")
    p.add_argument("--peer-fit-epochs", type=int, default=20,
                   help="cap on the peer's dynamics-fit epochs (its own default: none, patience 5 only)")
    p.add_argument("--peer-val", type=Path, default=None,
                   help="give the peer this val file, as NeoRL-2's launch_task.py does (MOPO then trains its model and "
                        "policy on train+val; BC selects its epoch on it). Default: none, the train file only, as ours")
    p.add_argument("--ours-preset-only", action="store_true", help="our paper preset without the peer's matched values")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "neorl2" / "peer")
    a = p.parse_args(argv)
    if a.steps < STEPS_PER_EPOCH or a.steps % STEPS_PER_EPOCH:
        p.error(f"--steps: expected a positive multiple of {STEPS_PER_EPOCH}, found {a.steps}")
    if not a.dataset.is_file():
        p.error(f"--dataset: no file {a.dataset}")

    sys.path.insert(0, str(ROOT))
    from mbrl.envs.tasks import get_task
    from mbrl import datasets

    task = get_task(TASK)
    if (task.ref_min_score, task.ref_max_score) != REF_SCORES:
        raise SystemExit(f"neorl2_peer: the project's DMSD reference scores {task.ref_min_score, task.ref_max_score} "
                         f"differ from NeoRL-2's {REF_SCORES}")
    rows = len(np.asarray(datasets.load(str(a.dataset)).transitions.obs))
    if rows != len(np.load(a.dataset)["obs"]):
        raise SystemExit(f"neorl2_peer: mbrl.datasets.load gives {rows} rows of {a.dataset}, the file has "
                         f"{len(np.load(a.dataset)['obs'])}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "logs").mkdir(exist_ok=True)
    for algo in a.algos:
        for seed in a.seeds:
            for side in a.sides:
                row = (run_peer if side == "peer" else run_ours)(a, algo, seed, a.out)
                row.update(task=TASK, dataset=str(a.dataset), steps=a.steps, eval_seed=a.eval_seed, rows=rows,
                           time=time.strftime("%Y-%m-%dT%H:%M:%S"))
                line = json.dumps(row, default=str)
                print(line, flush=True)
                with open(a.out / "results.jsonl", "a") as f:
                    f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
