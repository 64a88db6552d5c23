"""Train the behaviour policies (one online SAC run per task) that `mbrl data make` ships and uses.

    python scripts/train_behaviour.py train --task hopper        # start, or resume where it stopped
    python scripts/train_behaviour.py finalize --task hopper     # pick expert/medium, write envs/behaviour/

A resume is exact: the checkpoint holds the episode in progress with MuJoCo's integration state, so an
interrupted run continues bit for bit as if it had not stopped (checked by the tests).

`train` writes its working files under results/behaviour/<task>/ (git-ignored):
  checkpoint.npz   the whole training state (agent, replay buffer, progress), rewritten atomically
  snapshots/       the actor every `--snapshot-every` env steps (flax msgpack), the medium candidates
  evals.jsonl      the return of each snapshot (10 stochastic, 5 deterministic episodes)
It stops at `--max-steps`, or early once the stochastic return clears the expert bar (80% of D4RL's
expert return) with a margin at two evaluations in a row. SIGTERM/SIGINT save a checkpoint first.
One run uses one CPU core (XLA set single-threaded below).
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # run as a script, not imported (tests): the flags would leak to child processes
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import minari  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from flax import serialization  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mbrl.agents.sac import OnlineSAC, OnlineState, SACConfig, make_policy  # noqa: E402
from mbrl.commands.data_make import MakeArgs, make  # noqa: E402
from mbrl.envs import lockstep  # noqa: E402
from mbrl.envs.behaviour import BEHAVIOUR_DIR, EXPERT_BAR, read_record, stepped, uniform_policy  # noqa: E402
from mbrl.envs.collect import SCORE_BANDS, data_score, make_env  # noqa: E402
from mbrl.core.dataset_registry import LEVELS, data_dir, minari_id  # noqa: E402
from mbrl.core.types import TASK_SPECS, Transitions  # noqa: E402
from mbrl.evaluate import evaluate  # noqa: E402

RESULTS = REPO / "results" / "behaviour"
MAX_STEPS = {"hopper": 1_000_000, "halfcheetah": 2_000_000, "walker2d": 2_000_000}
# rl-zoo's SAC for MuJoCo uses 10k learning_starts; SpinningUp uses 10k start_steps.
WARMUP_STEPS = 10_000


def sac_config(task: str) -> SACConfig:
    # The buffer holds the whole run (never overwritten), so the rows up to the medium snapshot are
    # exactly D4RL's medium-replay. For runs <= 1M steps this is SAC's own 1M buffer.
    return SACConfig(buffer_capacity=MAX_STEPS[task], warmup_steps=WARMUP_STEPS, chunk_steps=50)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclasses.dataclass
class OnlineRun:
    """Behaviour training's host side around the one env loop (`mbrl.envs.lockstep.Lockstep`, one slot): the warm-up
    acts uniformly at random (a numpy stream of the seed), then the actor samples with key (seed ^ 0x5AC, env
    step); episode i resets with seed `seed + i`. Each chunk is K env steps, then one compiled `OnlineSAC.chunk`."""

    sac: OnlineSAC
    env: object
    loop: lockstep.Lockstep
    rng: np.random.Generator
    act_key: jax.Array
    returns: list = dataclasses.field(default_factory=list)
    lengths: list = dataclasses.field(default_factory=list)
    end_steps: list = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, sac: OnlineSAC, env, seed: int) -> "OnlineRun":
        loop = lockstep.Lockstep([env], lambda slot, episode: seed + episode, unit_actions=True, transitions=True)
        return cls(sac, env, loop, np.random.default_rng(seed), jax.random.PRNGKey(seed ^ 0x5AC))

    @property
    def env_steps(self) -> int:
        return self.loop.steps[0]

    def run_chunk(self, state: OnlineState) -> tuple[OnlineState, dict | None]:
        sac = self.sac
        start = self.env_steps
        warm = start < sac.config.warmup_steps
        actor = state.agent.actor_params

        def act(inputs):
            if warm:
                return self.rng.uniform(-1.0, 1.0, (1, sac.act_dim)).astype(np.float32)
            return np.asarray(sac.policy_step(actor, inputs.obs[0], self.act_key, self.env_steps))[None]

        self.loop.advance(act, steps=sac.config.chunk_steps)
        rows = Transitions(*self.loop.take_transitions(0))
        for episode, end in zip(self.loop.take_finished(0), np.flatnonzero(rows.terminal | rows.timeout)):
            self.returns.append(episode.episode_return)
            self.lengths.append(len(episode))
            self.end_steps.append(start + int(end) + 1)
        return sac.chunk(state, rows, self.env_steps, None, sac.core.hypers())


def simulator_state(run: OnlineRun) -> dict | None:
    """The episode in progress with MuJoCo's full integration state and the time-limit counter."""
    episode = run.loop.in_progress(0)
    if episode is None:
        return None
    raw = run.env.unwrapped
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    mj_state = np.empty(mujoco.mj_stateSize(raw.model, spec), np.float64)
    mujoco.mj_getState(raw.model, raw.data, mj_state, spec)
    return {**episode, "mj_state": mj_state.tolist(), "elapsed_steps": run.env._elapsed_steps}


def restore_simulator(run: OnlineRun, saved: dict) -> None:
    run.loop.resume(0, saved)
    raw = run.env.unwrapped
    mujoco.mj_setState(raw.model, raw.data, np.asarray(saved["mj_state"], np.float64), mujoco.mjtState.mjSTATE_INTEGRATION)
    run.env._elapsed_steps = saved["elapsed_steps"]


def save_checkpoint(path: Path, state: OnlineState, run: OnlineRun, extra: dict) -> None:
    size = int(state.buffer.size)
    arrays = {f"agent_{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(state.agent))}
    arrays["key"] = np.asarray(state.key)  # a raw uint32 PRNGKey
    for field in ("obs", "action", "reward", "next_obs", "terminal", "timeout"):
        arrays[f"buffer_{field}"] = np.asarray(getattr(state.buffer.data, field)[:size])
    progress = {
        "env_steps": run.env_steps,
        "episodes": len(run.returns),
        "returns": run.returns,
        "lengths": run.lengths,
        "end_steps": run.end_steps,
        "rng": run.rng.bit_generator.state,
        "episode_in_progress": simulator_state(run),
        **extra,
    }
    arrays["progress"] = np.frombuffer(json.dumps(progress).encode(), np.uint8)
    tmp = path.with_name(path.name + ".tmp.npz")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, sac: OnlineSAC, state: OnlineState, run: OnlineRun) -> tuple[OnlineState, dict]:
    with np.load(path) as z:
        treedef = jax.tree.structure(state.agent)
        leaves = [z[f"agent_{i}"] for i in range(treedef.num_leaves)]
        agent = jax.tree.unflatten(treedef, [jax.numpy.asarray(x) for x in leaves])
        rows = Transitions(**{f: z[f"buffer_{f}"] for f in ("obs", "action", "reward", "next_obs", "terminal", "timeout")})
        progress = json.loads(bytes(z["progress"]).decode())
        key = jax.numpy.asarray(z["key"])
    size = len(rows)
    buffer = state.buffer
    data = jax.tree.map(lambda store, new: store.at[:size].set(new), buffer.data, rows)
    capacity = buffer.data.reward.shape[0]
    buffer = buffer.replace(data=data, size=jax.numpy.asarray(size, jax.numpy.int32),
                            insert_pos=jax.numpy.asarray(size % capacity, jax.numpy.int32))
    run.loop.steps[0] = progress["env_steps"]
    run.loop.episodes[0] = progress["episodes"]
    run.returns, run.lengths, run.end_steps = progress["returns"], progress["lengths"], progress["end_steps"]
    run.rng.bit_generator.state = progress["rng"]
    if (progress.get("episode_in_progress") or {}).get("rewards") is not None:  # older checkpoints: a new episode
        restore_simulator(run, progress["episode_in_progress"])
    return OnlineState(agent=agent, buffer=buffer, key=key), progress


def train(args) -> None:
    spec = TASK_SPECS[args.task]
    run_dir = Path(args.out) / args.task
    (run_dir / "snapshots").mkdir(parents=True, exist_ok=True)
    ckpt_path = run_dir / "checkpoint.npz"
    cfg = sac_config(args.task)
    sac = OnlineSAC(cfg, spec.obs_dim, spec.act_dim)
    env = make_env(args.task)
    online = OnlineRun.start(sac, env, args.seed)
    state = sac.init(jax.random.PRNGKey(args.seed))
    extra = {"seed": args.seed, "task": args.task, "above_bar": 0, "done": False}
    if ckpt_path.exists():
        state, progress = load_checkpoint(ckpt_path, sac, state, online)
        extra.update({k: progress[k] for k in ("above_bar", "done") if k in progress})
        if progress.get("seed", args.seed) != args.seed:
            raise SystemExit(f"{ckpt_path} was trained with seed {progress['seed']}, not {args.seed}")
        print(f"resumed {args.task} at env step {online.env_steps}", flush=True)
    if extra["done"] or online.env_steps >= args.max_steps:
        print(f"{args.task}: already done at {online.env_steps} steps", flush=True)
        return

    stop = {"flag": False}

    def request_stop(signum, frame):
        stop["flag"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    stochastic = make_policy(sac.core, deterministic=False)
    deterministic = make_policy(sac.core, deterministic=True)
    eval_key = jax.random.PRNGKey(args.seed + 12345)
    t0, steps0, metrics = time.time(), online.env_steps, None
    while online.env_steps < args.max_steps and not stop["flag"]:
        state, m = online.run_chunk(state)
        metrics = m if m is not None else metrics
        fine = args.fine is not None and args.fine[0] <= online.env_steps <= args.fine[1]
        if online.env_steps % (args.fine[2] if fine else args.snapshot_every):
            continue
        actor = state.agent.actor_params
        step = online.env_steps
        atomic_write_bytes(run_dir / "snapshots" / f"actor_{step:08d}.msgpack", serialization.to_bytes(actor))
        eval_seed = 1_000_000 + step

        def pol(fn):
            return lambda obs, t: np.asarray(fn(actor, obs, jax.random.fold_in(eval_key, eval_seed * 1000 + t)))

        sto = evaluate(stepped(pol(stochastic)), args.task, 10, eval_seed).returns
        det = evaluate(stepped(pol(deterministic)), args.task, 5, eval_seed).returns
        record = {
            "step": step,
            "return_stochastic": float(sto.mean()),
            "return_stochastic_std": float(sto.std()),
            "return_deterministic": float(det.mean()),
            "train_return_last10": float(np.mean(online.returns[-10:])) if online.returns else None,
        }
        if metrics is not None:
            record.update({k: float(v) for k, v in metrics.items()})
        with open(run_dir / "evals.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        bar = EXPERT_BAR[args.task] * args.margin
        extra["above_bar"] = extra["above_bar"] + 1 if record["return_stochastic"] >= bar else 0
        extra["done"] = extra["above_bar"] >= 2
        save_checkpoint(ckpt_path, state, online, extra)
        now = time.time()
        rate = (online.env_steps - steps0) / max(now - t0, 1e-9)
        t0, steps0 = now, online.env_steps
        print(
            f"{time.strftime('%H:%M:%S')} {args.task} step {step} | stoch {record['return_stochastic']:.0f}"
            f" det {record['return_deterministic']:.0f} | {rate:.1f} env-steps/s over the last interval"
            f" (= updates/s after warm-up, incl. eval) | alpha {record.get('alpha', float('nan')):.3f}"
            f" | q {record.get('q_mean', float('nan')):.1f}",
            flush=True,
        )
        if extra["done"]:
            print(f"{args.task}: expert bar {bar:.0f} cleared twice; stopping", flush=True)
            break
    if stop["flag"] or online.env_steps >= args.max_steps:
        save_checkpoint(ckpt_path, state, online, extra)
        print(f"{args.task}: checkpoint saved at {online.env_steps} steps", flush=True)


def _actor_template(task: str):
    spec = TASK_SPECS[task]
    return OnlineSAC(sac_config(task), spec.obs_dim, spec.act_dim).core


def _stochastic_returns(task: str, core, actor, episodes: int, seed: int) -> np.ndarray:
    policy = make_policy(core, deterministic=False)
    key = jax.random.PRNGKey(seed)
    fn = lambda obs, t: np.asarray(policy(actor, obs, jax.random.fold_in(key, t)))  # noqa: E731
    return evaluate(stepped(fn), task, episodes, seed).returns


def finalize(args) -> None:
    """Choose the expert and medium snapshots, evaluate them on 100 episodes, write envs/behaviour/."""
    task, run_dir = args.task, Path(args.out) / args.task
    core = _actor_template(task)
    template = core.init(jax.random.PRNGKey(0), core.hypers()).actor_params
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    evals = {e["step"]: e for e in evals}  # a resumed run may repeat a step: keep the last
    steps = sorted(evals)
    with np.load(run_dir / "checkpoint.npz") as z:
        progress = json.loads(bytes(z["progress"]).decode())

    def load(step):
        return serialization.from_bytes(template, (run_dir / "snapshots" / f"actor_{step:08d}.msgpack").read_bytes())

    BEHAVIOUR_DIR.mkdir(parents=True, exist_ok=True)
    eval_seed = 2_000_000
    bar = EXPERT_BAR[task]
    # Expert: the best of the last 5 snapshots by their 10-episode return, confirmed on 100 episodes.
    expert = None
    for step in sorted(steps[-5:], key=lambda s: -evals[s]["return_stochastic"]):
        returns = _stochastic_returns(task, core, load(step), args.episodes, eval_seed)
        print(f"expert candidate {step}: {returns.mean():.1f} +- {returns.std():.1f} (bar {bar})", flush=True)
        if expert is None or returns.mean() > expert[1].mean():
            expert = (step, returns)
        if returns.mean() >= bar:
            break
    expert_step, expert_returns = expert
    if expert_returns.mean() < bar and not args.allow_below_bar:
        raise SystemExit(f"{task}: best expert return {expert_returns.mean():.1f} is below the bar {bar}; train longer")
    # Medium: about 1/3 of the expert's return (D4RL). The 3 earlier snapshots closest by their
    # 10-episode return are evaluated on 100 episodes; the closest wins.
    target = expert_returns.mean() / 3.0
    earlier = [s for s in steps if s < expert_step]
    candidates = sorted(earlier, key=lambda s: abs(evals[s]["return_stochastic"] - target))[:3]
    medium = None
    for step in candidates:
        returns = _stochastic_returns(task, core, load(step), args.episodes, eval_seed)
        print(f"medium candidate {step}: {returns.mean():.1f} (target {target:.1f})", flush=True)
        if medium is None or abs(returns.mean() - target) < abs(medium[1].mean() - target):
            medium = (step, returns)
    medium_step, medium_returns = medium
    random_returns = evaluate(stepped(uniform_policy(TASK_SPECS[task].act_dim, eval_seed)), task, 100, eval_seed).returns
    provisional = bool(expert_returns.mean() < bar)  # written only with --allow-below-bar

    hidden = list(core.config.hidden_sizes)
    common = {"task": task, "seed": progress["seed"], "hidden_sizes": hidden, "episodes": args.episodes,
              "provisional": provisional, "run_env_steps": progress["env_steps"],
              "eval_seed": eval_seed, "stochastic": True, "trained_by": "scripts/train_behaviour.py (online SAC)"}

    def write_record(name: str, record: dict) -> None:
        atomic_write_bytes(BEHAVIOUR_DIR / f"{task}_{name}.json", (json.dumps(record, indent=2) + "\n").encode())

    for name, step, returns in (("expert", expert_step, expert_returns), ("medium", medium_step, medium_returns)):
        atomic_write_bytes(BEHAVIOUR_DIR / f"{task}_{name}.msgpack", serialization.to_bytes(load(step)))
        write_record(name, {**common, "level": name, "file": f"{task}_{name}.msgpack", "env_steps": step,
                            "mean_return": float(returns.mean()), "std_return": float(returns.std())})
    write_record("random", {"task": task, "level": "random", "episodes": 100, "eval_seed": eval_seed,
                            "mean_return": float(random_returns.mean()), "std_return": float(random_returns.std())})
    # Medium-replay: uniform warm-up, then snapshot s acting for the env steps [s, next snapshot), up to
    # the medium step; at most `max_snapshots` float16 snapshots (adjacent intervals merged).
    snap_steps = [s for s in steps if WARMUP_STEPS <= s < medium_step]
    if len(snap_steps) > args.max_snapshots:
        # The latest snapshot at or before each of `max_snapshots` evenly spaced steps.
        points = np.linspace(WARMUP_STEPS, medium_step, args.max_snapshots + 1)[:-1]
        snap_steps = sorted({max(s for s in snap_steps if s <= p) for p in points})
    segments = [{"start": 0, "steps": min(WARMUP_STEPS, medium_step), "snapshot": -1}]
    bounds = snap_steps + [medium_step]
    for i, s in enumerate(snap_steps):
        segments.append({"start": s, "steps": bounds[i + 1] - s, "snapshot": i})
    half = {str(i): jax.tree.map(lambda x: np.asarray(x, np.float16), load(s)) for i, s in enumerate(snap_steps)}
    atomic_write_bytes(BEHAVIOUR_DIR / f"{task}_medium_replay.msgpack", serialization.to_bytes(half))
    # The run's own episodes up to the medium step: what the regenerated data should resemble.
    ended = [r for r, end in zip(progress["returns"], progress["end_steps"]) if end <= medium_step]
    write_record("medium_replay", {**common, "level": "medium-replay", "file": f"{task}_medium_replay.msgpack",
                                   "env_steps": medium_step, "snapshot_steps": snap_steps, "segments": segments,
                                   "dtype": "float16", "run_episodes": len(ended),
                                   "run_mean_return": float(np.mean(ended)) if ended else None})
    print(f"{task}: expert {expert_step} ({expert_returns.mean():.1f}), medium {medium_step} "
          f"({medium_returns.mean():.1f}), random {random_returns.mean():.1f} -> {BEHAVIOUR_DIR}", flush=True)


def table(args) -> None:
    """Make each level of each task (reusing existing datasets) and print a Markdown table of them."""
    os.environ.setdefault("MINARI_DATASETS_PATH", str(data_dir()))
    rows = ["| dataset | transitions | episodes | mean return | normalized score | expected band |",
            "|---|---:|---:|---:|---:|---|"]
    for task in args.tasks:
        ref_min, ref_max = read_record(task, "random")["mean_return"], read_record(task, "expert")["mean_return"]
        for level in LEVELS:
            start = time.perf_counter()
            make(MakeArgs(name=f"{task}-{level}", transitions=args.transitions, seed=args.seed))
            seconds = time.perf_counter() - start
            ds = minari.load_dataset(minari_id(task, level))
            max_len = TASK_SPECS[task].max_episode_steps
            episodes = list(ds.iterate_episodes())
            returns = [float(np.sum(ep.rewards)) for ep in episodes]
            complete = [bool(ep.terminations[-1]) or len(ep.rewards) == max_len for ep in episodes]
            score = data_score(returns, complete, ref_min, ref_max)
            mean = float(np.mean(np.asarray(returns)[complete]))
            low, high = SCORE_BANDS[level]
            rows.append(f"| {task}-{level} | {ds.total_steps:,} | {ds.total_episodes:,} | {mean:.1f} | {score:.1f} "
                        f"| {low:g} to {high:g} |")
            print(rows[-1], f"(made or reused in {seconds:.0f} s)", flush=True)
    text = "\n".join(rows) + f"\n\nseed {args.seed}; normalized over complete episodes.\n"
    (Path(args.out) if hasattr(args, "out") else RESULTS).mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(RESULTS / "datasets_table.md", text.encode())
    print(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train")
    p.add_argument("--task", required=True, choices=sorted(EXPERT_BAR))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--snapshot-every", type=int, default=10_000)
    p.add_argument("--fine", type=int, nargs=3, metavar=("START", "END", "EVERY"), default=None,
                   help="also snapshot every EVERY steps between START and END (a deterministic re-run that"
                   " looks closer at where the return jumps, for the medium policy)")
    p.add_argument("--margin", type=float, default=1.05, help="stop once stochastic return >= margin * bar twice")
    p.add_argument("--out", default=str(RESULTS))
    f = sub.add_parser("finalize")
    f.add_argument("--task", required=True, choices=sorted(EXPERT_BAR))
    f.add_argument("--out", default=str(RESULTS))
    f.add_argument("--max-snapshots", type=int, default=8, help="float16 actor snapshots kept for medium-replay")
    f.add_argument("--allow-below-bar", action="store_true", help="write even if the expert misses the bar")
    f.add_argument("--episodes", type=int, default=100, help="evaluation episodes per candidate")
    t = sub.add_parser("table", help="make every level's dataset and print the datasets table (docs/datasets.md)")
    t.add_argument("--tasks", nargs="+", default=sorted(EXPERT_BAR))
    t.add_argument("--transitions", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "train":
        args.max_steps = args.max_steps or MAX_STEPS[args.task]
        train(args)
    elif args.command == "finalize":
        finalize(args)
    else:
        table(args)


if __name__ == "__main__":
    main()
