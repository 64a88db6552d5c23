"""Update rates of OfflineRL-Kit (PyTorch) for the workloads of scripts/bench.py's agent figures.

Usage (run by hand, right after `python scripts/bench.py --only ...` on the same idle machine; the project itself
never imports torch):
    PYTHONPATH=PATH/TO/OfflineRL-Kit VENV_WITH_TORCH/bin/python scripts/experiments/peer_offlinerlkit.py [--quick]

The OfflineRL-Kit checkout is used UNMODIFIED (commit e3ce697 was measured); this file only imports it. Its
package imports `gym` and `torch.utils.tensorboard` for annotations and logging only; when they are missing, inert
placeholder modules stand in (reported in the first JSON line). Prints one JSON line per figure on stdout.

Each figure is one policy's `learn` as OfflineRL-Kit's trainers call it (MFPolicyTrainer / MBPolicyTrainer: sample
the batch from its ReplayBuffer, then `policy.learn(batch)`), configured as its run_example/run_<algo>.py for a
halfcheetah-shaped task (obs 17, act 6), on the buffers bench.py uses (1M real rows, 250k model rows, standard
normal). Our figures sample their batches inside the compiled chunk, so the peer's sampling is timed too.

- td3_bc_update: TD3BCPolicy, actor and 2 critics of 2x256, alpha 2.5, policy noise 0.2, clip 0.5, actor every 2.
- cql_update: CQLPolicy, actor and 2 critics of 3x256, weight 5, temperature 1, 10 repeated actions, auto-alpha,
  deterministic backup, no Lagrange.
- iql_update: IQLPolicy, actor (Gaussian), 2 Q and a V of 2x256, expectile 0.7, temperature 3.
- edac10_update: EDACPolicy, actor and 10 critics of 3x256, eta 1.
- combo_update: COMBOPolicy (CQL's settings above, rho_s mix), batch 256 half real, half model rows.
- mobile_update: MOBILEPolicy, actor and 2 critics of 2x256, 10 next states from each elite of a 7-member ensemble
  of 4x200 (5 elites), penalty 1.5, batch 256 with 5% real rows.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import types

import numpy as np
import torch

OBS_DIM, ACT_DIM = 17, 6
REAL_ROWS, MODEL_ROWS, BATCH = 1_000_000, 250_000, 256


def emit(name, **fields):
    print(json.dumps({"figure": name, **fields}), flush=True)


def install_import_shims():
    """Inert `gym` and `torch.utils.tensorboard` where missing: OfflineRL-Kit imports them but no timed path runs
    them."""
    shims = []
    try:
        import gym  # noqa: F401
    except ImportError:
        gym = types.ModuleType("gym")
        gym.Env = object
        spaces = types.ModuleType("gym.spaces")
        spaces.Space = object
        envs, mujoco = types.ModuleType("gym.envs"), types.ModuleType("gym.envs.mujoco")
        mujoco_env = types.ModuleType("gym.envs.mujoco.mujoco_env")
        mujoco_env.MujocoEnv = object
        mujoco.mujoco_env, envs.mujoco, gym.spaces, gym.envs = mujoco_env, mujoco, spaces, envs
        for module in (gym, spaces, envs, mujoco, mujoco_env):
            sys.modules[module.__name__] = module
        shims.append("gym")
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        sys.modules["torch.utils.tensorboard"] = types.ModuleType("torch.utils.tensorboard")
        sys.modules["torch.utils.tensorboard"].SummaryWriter = None
        shims.append("torch.utils.tensorboard")
    return shims


class Box:
    """The three attributes of a gym Box that the policies read."""

    def __init__(self, dim):
        self.low, self.high, self.shape = -np.ones(dim, np.float32), np.ones(dim, np.float32), (dim,)


def matmul_gflops(n=2048, reps=10):
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    for _ in range(3):
        torch.mm(a, b, out=c)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n ** 3 / best / 1e9


def timed_rate(step, warmup, per_block, blocks):
    """(best, median) updates/s over `blocks` blocks of `per_block` calls, after `warmup` calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(per_block):
            step()
        times.append(time.perf_counter() - start)
    times.sort()
    return per_block / times[0], per_block / times[len(times) // 2], times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small buffers and blocks (a smoke test)")
    parser.add_argument("--only", default="", help="comma-separated figure names")
    args = parser.parse_args()
    torch.set_num_threads(2)
    np.random.seed(0)
    torch.manual_seed(0)
    shims = install_import_shims()

    import offlinerlkit
    from offlinerlkit.buffer import ReplayBuffer
    from offlinerlkit.dynamics import EnsembleDynamics
    from offlinerlkit.modules import Actor, ActorProb, Critic, DiagGaussian, EnsembleCritic, EnsembleDynamicsModel, TanhDiagGaussian
    from offlinerlkit.nets import MLP
    from offlinerlkit.policy import COMBOPolicy, CQLPolicy, EDACPolicy, IQLPolicy, MOBILEPolicy, TD3BCPolicy
    from offlinerlkit.utils.noise import GaussianNoise
    from offlinerlkit.utils.scaler import StandardScaler
    from offlinerlkit.utils.termination_fns import get_termination_fn

    root = os.path.dirname(os.path.dirname(os.path.abspath(offlinerlkit.__file__)))
    commit = subprocess.run(["git", "-C", root, "log", "-1", "--format=%s"], capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    emit("environment", torch=torch.__version__, python=platform.python_version(), threads=torch.get_num_threads(),
         cpu=cpu, cpu_capability=torch.backends.cpu.get_cpu_capability(), offlinerlkit=root,
         offlinerlkit_commit=commit, import_shims=shims)
    emit("matmul_gflops", value=round(matmul_gflops(), 2), unit="GFLOP/s (torch.mm 2048^2 float32, best of 10)")

    real_n, model_n = (100_000, 50_000) if args.quick else (REAL_ROWS, MODEL_ROWS)
    rng = np.random.default_rng(0)

    def buffer(rows):
        data = {"observations": rng.standard_normal((rows, OBS_DIM), dtype=np.float32),
                "actions": np.tanh(rng.standard_normal((rows, ACT_DIM), dtype=np.float32)),
                "next_observations": rng.standard_normal((rows, OBS_DIM), dtype=np.float32),
                "rewards": rng.standard_normal(rows, dtype=np.float32),
                "terminals": np.zeros(rows, np.float32)}
        out = ReplayBuffer(rows, (OBS_DIM,), np.float32, ACT_DIM, np.float32, "cpu")
        out.load_dataset(data)
        return out

    real, model = buffer(real_n), buffer(model_n)
    space = Box(ACT_DIM)

    def mlp(inputs, hidden):
        return MLP(input_dim=inputs, hidden_dims=hidden)

    def prob_actor(hidden):
        backbone = mlp(OBS_DIM, hidden)
        dist = TanhDiagGaussian(latent_dim=backbone.output_dim, output_dim=ACT_DIM, unbounded=True,
                                conditioned_sigma=True, max_mu=1.0)
        return ActorProb(backbone, dist, "cpu")

    def alpha():
        log_alpha = torch.zeros(1, requires_grad=True)
        return (-ACT_DIM, log_alpha, torch.optim.Adam([log_alpha], lr=1e-4))

    def adam(module, lr):
        return torch.optim.Adam(module.parameters(), lr=lr)

    def critics(n, hidden):
        return [Critic(mlp(OBS_DIM + ACT_DIM, hidden), "cpu") for _ in range(n)]

    def dynamics():
        ensemble = EnsembleDynamicsModel(obs_dim=OBS_DIM, action_dim=ACT_DIM, hidden_dims=[200, 200, 200, 200],
                                         num_ensemble=7, num_elites=5,
                                         weight_decays=[2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4], device="cpu")
        out = EnsembleDynamics(ensemble, adam(ensemble, 1e-3), StandardScaler(),
                               get_termination_fn(task="halfcheetah-medium-v2"))
        out.scaler.fit(rng.standard_normal((10_000, OBS_DIM + ACT_DIM)).astype(np.float32))
        ensemble.eval()
        return out

    cql_settings = dict(action_space=space, tau=0.005, gamma=0.99, cql_weight=5.0, temperature=1.0,
                        max_q_backup=False, deterministic_backup=True, with_lagrange=False,
                        lagrange_threshold=10.0, cql_alpha_lr=3e-4, num_repeart_actions=10)

    def td3_bc():
        actor = Actor(mlp(OBS_DIM, [256, 256]), ACT_DIM, max_action=1.0, device="cpu")
        c1, c2 = critics(2, [256, 256])
        policy = TD3BCPolicy(actor, c1, c2, adam(actor, 3e-4), adam(c1, 3e-4), adam(c2, 3e-4), tau=0.005,
                             gamma=0.99, max_action=1.0, exploration_noise=GaussianNoise(sigma=0.1), policy_noise=0.2,
                             noise_clip=0.5, update_actor_freq=2, alpha=2.5,
                             scaler=StandardScaler(mu=np.zeros(OBS_DIM), std=np.ones(OBS_DIM)))
        return policy, lambda: real.sample(BATCH)

    def cql():
        actor = prob_actor([256, 256, 256])
        c1, c2 = critics(2, [256, 256, 256])
        policy = CQLPolicy(actor, c1, c2, adam(actor, 1e-4), adam(c1, 3e-4), adam(c2, 3e-4), alpha=alpha(),
                           **cql_settings)
        return policy, lambda: real.sample(BATCH)

    def iql():
        backbone = mlp(OBS_DIM, [256, 256])
        dist = DiagGaussian(latent_dim=backbone.output_dim, output_dim=ACT_DIM, unbounded=False,
                            conditioned_sigma=False, max_mu=1.0)
        actor = ActorProb(backbone, dist, "cpu")
        q1, q2 = critics(2, [256, 256])
        v = Critic(mlp(OBS_DIM, [256, 256]), "cpu")
        policy = IQLPolicy(actor, q1, q2, v, adam(actor, 3e-4), adam(q1, 3e-4), adam(q2, 3e-4), adam(v, 3e-4),
                           action_space=space, tau=0.005, gamma=0.99, expectile=0.7, temperature=3.0)
        return policy, lambda: real.sample(BATCH)

    def edac():
        actor = prob_actor([256, 256, 256])
        ensemble = EnsembleCritic(OBS_DIM, ACT_DIM, [256, 256, 256], num_ensemble=10, device="cpu")
        policy = EDACPolicy(actor, ensemble, adam(actor, 1e-4), adam(ensemble, 3e-4), tau=0.005, gamma=0.99,
                            alpha=alpha(), max_q_backup=False, deterministic_backup=False, eta=1.0)
        return policy, lambda: real.sample(BATCH)

    def combo():
        actor = prob_actor([256, 256, 256])
        c1, c2 = critics(2, [256, 256, 256])
        policy = COMBOPolicy(dynamics(), actor, c1, c2, adam(actor, 1e-4), adam(c1, 3e-4), adam(c2, 3e-4),
                             alpha=alpha(), uniform_rollout=False, rho_s="mix", **cql_settings)
        half = BATCH // 2
        return policy, lambda: {"real": real.sample(half), "fake": model.sample(BATCH - half)}

    def mobile():
        actor = prob_actor([256, 256])
        ensemble = torch.nn.ModuleList(critics(2, [256, 256]))
        policy = MOBILEPolicy(dynamics(), actor, ensemble, adam(actor, 1e-4), adam(ensemble, 3e-4), tau=0.005,
                              gamma=0.99, alpha=alpha(), penalty_coef=1.5, num_samples=10,
                              deterministic_backup=True, max_q_backup=False)
        real_part = int(BATCH * 0.05)
        return policy, lambda: {"real": real.sample(real_part), "fake": model.sample(BATCH - real_part)}

    figures = {"td3_bc_update": td3_bc, "cql_update": cql, "iql_update": iql, "edac10_update": edac,
               "combo_update": combo, "mobile_update": mobile}
    chosen = [name for name in args.only.split(",") if name] or list(figures)
    per_block, blocks = (10, 2) if args.quick else (100, 3)
    for name in chosen:
        policy, sample = figures[name]()
        policy.train()
        best, median, times = timed_rate(lambda: policy.learn(sample()), warmup=10, per_block=per_block, blocks=blocks)
        emit(name, value=round(best, 2), unit="updates/s", median_updates_per_s=round(median, 2),
             block_seconds=[round(t, 3) for t in times], updates_per_block=per_block,
             timed="ReplayBuffer.sample + policy.learn, best block", load_avg_1m=round(os.getloadavg()[0], 2))


if __name__ == "__main__":
    main()
