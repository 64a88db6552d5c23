"""Throughput of the PyTorch peer, leggedrobotics/rsl_rl_rwm, on the two workloads of scripts/bench.py.

Usage (run by hand; the project itself never imports torch):
    PYTHONPATH=/work/peers/rsl_rl_rwm /work/peers/venv-torch/bin/python scripts/experiments/peer_rwm.py [--quick] [--checkout PATH]

The rsl_rl_rwm checkout is used UNMODIFIED (commit 18eebcd was measured); this file only imports it. Its one
unneeded import, GitPython (``git``, used by rsl_rl.utils.store_code_state for logging only), is replaced by an
empty placeholder module when it is not installed. Prints one JSON line per figure on stdout.

rwm_fit (gradient steps/s; paper sizes, --quick does not shrink it):
    SystemDynamicsEnsemble(state 11, action 3, extension 1 (reward), contact 0, termination 1, ensemble 5,
    history 32, GRU 2x256, heads [128]). One step is one minibatch of ``MBPOPPO.update_system_dynamics`` itself
    (reset, compute_loss(bootstrap=True), weighted loss sum, zero_grad, backward, clip_grad_norm_ 1.0, Adam 1e-3)
    on a fixed random batch of 1024 windows of 40 steps (forecast 8); only its replay buffer is swapped for one
    that yields that batch. 2 warm-up steps, then steps until >= 10 s (at least 3).

mopo_ppo_iteration (imagined env-steps/s):
    One MOPO-PPO iteration on E envs x T steps: under torch.inference_mode, reset the ensemble's GRU memory and
    warm it on a random 32-step window, then T times: ``PPO.act`` (ActorCritic 3x256 elu, init std 1.0), one
    stateful ensemble step, reward = extension - 1.0 * epistemic uncertainty, done = sigmoid(termination) > 0.5
    or epistemic > threshold (done envs: GRU ``reset_partial`` and a fresh random state), ``PPO.process_env_step``
    into rsl_rl's RolloutStorage; then ``PPO.compute_returns`` and, outside inference mode, ``PPO.update``
    (5 epochs, 4 minibatches, adaptive lr 1e-3, kl 0.01, clip 0.2, entropy 0.005, gamma 0.99, lam 0.95, grad
    norm 1.0). The env step is this file's minimal stand-in for Isaac Lab's imagination_step, which is not part of
    rsl_rl_rwm. One warm-up iteration, then one timed; value = E*T / seconds.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import types

ARCH = {"type": "rnn", "rnn_type": "gru", "rnn_num_layers": 2, "rnn_hidden_size": 256,
        "state_mean_shape": [128], "state_logstd_shape": [128], "extension_shape": [128],
        "contact_shape": [128], "termination_shape": [128]}
S, A, H, F, ENS, BATCH = 11, 3, 32, 8, 5, 1024
LOSS_WEIGHTS = dict.fromkeys(["state", "sequence", "bound", "kl", "extension", "contact", "termination"], 1.0)
UNCERTAINTY_PENALTY, UNCERTAINTY_THRESHOLD = 1.0, 1.0


def import_peer(checkout):
    if checkout:
        sys.path.insert(0, os.path.abspath(checkout))
    try:
        import git  # noqa: F401
    except ImportError:
        sys.modules["git"] = types.ModuleType("git")  # placeholder: only store_code_state uses it
    import rsl_rl
    return os.path.dirname(os.path.dirname(os.path.abspath(rsl_rl.__file__)))


def peer_info(root):
    def git(*args):
        r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    code_clean = subprocess.run(["git", "-C", root, "diff", "--quiet", "HEAD", "--", "*.py"]).returncode == 0
    return {"peer_commit": git("rev-parse", "--short", "HEAD"), "peer_code_unmodified": code_clean}


def new_dynamics(torch):
    from rsl_rl.modules import SystemDynamicsEnsemble
    return SystemDynamicsEnsemble(S, A, 1, 0, 1, "cpu", ensemble_size=ENS, history_horizon=H,
                                  architecture_config=ARCH)


def new_policy(torch, num_envs):
    from tensordict import TensorDict
    from rsl_rl.modules import ActorCritic
    obs = TensorDict({"policy": torch.zeros(num_envs, S)}, batch_size=[num_envs])
    with contextlib.redirect_stdout(sys.stderr):  # ActorCritic prints its MLPs
        policy = ActorCritic(obs, {"policy": ["policy"], "critic": ["policy"]}, A,
                             actor_hidden_dims=[256, 256, 256], critic_hidden_dims=[256, 256, 256],
                             activation="elu", init_noise_std=1.0)
    return policy, obs


class FixedBatch:
    """Stands in for MBPOPPO's ReplayBuffer: yields the same random minibatch."""

    def __init__(self, batch):
        self.batch = batch

    def mini_batch_generator(self, sequence_length, num_mini_batches, mini_batch_size):
        assert sequence_length == H + F and mini_batch_size == BATCH
        for _ in range(num_mini_batches):
            yield self.batch


def bench_rwm_fit(torch):
    from rsl_rl.algorithms import MBPOPPO
    policy, _ = new_policy(torch, 1)
    alg = MBPOPPO(policy, new_dynamics(torch), None, None, device="cpu", max_grad_norm=1.0,
                  system_dynamics_learning_rate=1e-3, system_dynamics_forecast_horizon=F,
                  system_dynamics_loss_weights=LOSS_WEIGHTS, system_dynamics_num_mini_batches=1,
                  system_dynamics_mini_batch_size=BATCH)
    shape = (BATCH, H + F)
    alg.system_replay_buffer = FixedBatch([torch.randn(*shape, S), torch.randn(*shape, A), torch.randn(*shape, 1),
                                           None, (torch.rand(*shape, 1) < 0.02).float()])
    for _ in range(2):  # warm-up
        alg.update_system_dynamics()
    steps, t0 = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - t0 < 10.0:
        losses = alg.update_system_dynamics()  # one minibatch = one gradient step
        steps += 1
    seconds = time.perf_counter() - t0
    assert all(map(lambda v: v == v, losses)), losses
    return {"figure": "rwm_fit", "value": steps / seconds, "unit": "steps/s", "windows_per_s": steps * BATCH / seconds,
            "batch": BATCH, "window": H + F, "history": H, "forecast": F, "ensemble": ENS, "state_dim": S,
            "action_dim": A, "gru": f"{ARCH['rnn_num_layers']}x{ARCH['rnn_hidden_size']}", "steps": steps, "seconds": seconds,
            "aux": "extension_dim=1 (reward) + termination_dim=1 heads, contact_dim=0: ran as specified",
            "calls": "rsl_rl.algorithms.MBPOPPO.update_system_dynamics -> SystemDynamicsEnsemble.compute_loss"}


def imagine(torch, alg, sd, E, T):
    from tensordict import TensorDict
    sd.reset()
    dones_total = 0
    with torch.inference_mode():
        state = sd(torch.randn(E, H, S), torch.randn(E, H, A))[0]  # warm the GRU memory on a 32-step window
        obs = TensorDict({"policy": state}, batch_size=[E])
        for _ in range(T):
            actions = alg.act(obs)
            state, _, epistemic, extension, _, termination = sd(obs["policy"].unsqueeze(1), actions.unsqueeze(1))
            rewards = extension.squeeze(-1) - UNCERTAINTY_PENALTY * epistemic
            dones = (torch.sigmoid(termination.squeeze(-1)) > 0.5) | (epistemic > UNCERTAINTY_THRESHOLD)
            reset_ids = dones.nonzero(as_tuple=False).squeeze(-1)
            if len(reset_ids) > 0:
                sd.reset_partial(reset_ids)
                state[reset_ids] = torch.randn(len(reset_ids), S)
                dones_total += len(reset_ids)
            obs = TensorDict({"policy": state}, batch_size=[E])
            alg.process_env_step(obs, rewards, dones.long(), {})
        t_ret = time.perf_counter()
        alg.compute_returns(obs)
    return t_ret, dones_total


def bench_mopo_ppo(torch, E, T):
    from rsl_rl.algorithms import PPO
    sd = new_dynamics(torch)
    policy, obs = new_policy(torch, E)
    alg = PPO(policy, num_learning_epochs=5, num_mini_batches=4, clip_param=0.2, gamma=0.99, lam=0.95,
              value_loss_coef=1.0, entropy_coef=0.005, learning_rate=1e-3, max_grad_norm=1.0,
              use_clipped_value_loss=True, schedule="adaptive", desired_kl=0.01, device="cpu")
    alg.init_storage("rl", E, T, obs, [A])
    for it in range(2):  # warm-up, then the timed iteration
        t0 = time.perf_counter()
        t_ret, dones = imagine(torch, alg, sd, E, T)
        t_upd = time.perf_counter()
        loss = alg.update()
        t1 = time.perf_counter()
    return {"figure": "mopo_ppo_iteration", "value": E * T / (t1 - t0), "unit": "imagined env-steps/s",
            "envs": E, "steps": T, "seconds": t1 - t0, "imagine_s": t_ret - t0, "returns_s": t_upd - t_ret,
            "update_s": t1 - t_upd, "done_rate": dones / (E * T), "uncertainty_threshold": UNCERTAINTY_THRESHOLD,
            "final_lr": alg.learning_rate, "value_loss": loss["value_function"],
            "calls": "rsl_rl.algorithms.PPO.act/process_env_step/compute_returns/update, "
                     "SystemDynamicsEnsemble.forward/reset/reset_partial, rsl_rl RolloutStorage"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="mopo_ppo_iteration with E=1024 instead of 4096")
    ap.add_argument("--checkout", help="rsl_rl_rwm checkout (else taken from PYTHONPATH)")
    args = ap.parse_args()
    root = import_peer(args.checkout)
    import numpy as np
    import torch
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    np.random.seed(0)
    common = {"torch_version": torch.__version__, "threads": torch.get_num_threads(), "device": "cpu",
              "quick": args.quick, **peer_info(root)}
    for run in (lambda: bench_rwm_fit(torch), lambda: bench_mopo_ppo(torch, 1024 if args.quick else 4096, 100)):
        load, cpu0, t0 = os.getloadavg()[0], time.process_time(), time.perf_counter()
        fig = run()  # cpu_per_wall well under `threads` means the cores were shared with something else
        cpu_per_wall = (time.process_time() - cpu0) / (time.perf_counter() - t0)
        print(json.dumps({**fig, **common, "load_before": load, "cpu_per_wall": round(cpu_per_wall, 2)}), flush=True)


if __name__ == "__main__":
    main()
