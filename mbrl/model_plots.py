"""Pictures of a world model (`mbrl model eval DIR --plot`): open-loop predictions against the truth on held-out
episodes, per observation dimension, with 1σ and 2σ bands, and the model's uncertainty along them.

Each elite member is rolled out on its own from the episode's first state (a recurrent model first reads the
real history before it), fed the episode's real actions, following its own mean. The band at each step is the
elites' predictive spread: the variance of their paths plus the mean of their predicted variances for that step,
so it widens both where the members disagree (epistemic) and where each one expects noise (aleatoric). The bottom
panel plots the two parts apart, as norms over the observation dimensions.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

MAX_EPISODES = 3
MAX_STEPS = 1000
COLUMNS = 4


@jax.jit
def _elite_paths(model, start_obs, carry, actions):
    """Every elite on its own path: (K, E, obs_dim) next observations, (K, E, obs_dim) their predicted stds,
    (K, E) rewards. `start_obs` (E, obs_dim) and `carry` hold one copy per elite."""
    elites = model.elites
    rows = jnp.arange(elites.shape[0])

    def step(state, action):
        obs, carry = state
        batch_action = jnp.broadcast_to(action, (obs.shape[0], action.shape[-1]))
        if model.is_recurrent:
            means, stds, carry = model.member_predictions(obs, batch_action, carry)
        else:
            means, stds = model.member_predictions(obs, batch_action)
        own_mean, own_std = means[elites, rows], stds[elites, rows]  # elite i predicts from its own state
        next_obs = obs + own_mean[:, : model.obs_dim]
        return (next_obs, carry), (next_obs, own_std[:, : model.obs_dim], own_mean[:, model.obs_dim])

    _, (paths, stds, rewards) = jax.lax.scan(step, (start_obs, carry), actions)
    return paths, stds, rewards


def open_loop_episode(model, transitions, start: int, end: int) -> dict[str, np.ndarray] | None:
    """The elites' open-loop predictions over rows start..end-1 of one episode (after the model's history): the
    truth, the mean, the total std (epistemic and aleatoric together) and each part's norm per step. None when the
    episode is no longer than the history."""
    history = model.history
    first = start + history
    last = min(end, first + MAX_STEPS)
    if last <= first:
        return None
    count = int(model.elites.shape[0])
    obs, action = np.asarray(transitions.obs), np.asarray(transitions.action)
    obs_history = jnp.asarray(np.repeat(obs[None, start:first], count, axis=0))
    act_history = jnp.asarray(np.repeat(action[None, start:first], count, axis=0))
    carry = model.warm_up(obs_history, act_history)
    start_obs = jnp.asarray(np.repeat(obs[None, first], count, axis=0))
    paths, stds, rewards = (np.asarray(x, np.float64) for x in _elite_paths(model, start_obs, carry,
                                                                           jnp.asarray(action[first:last])))
    epistemic_var = paths.var(axis=1)  # (K, obs_dim)
    aleatoric_var = np.square(stds).mean(axis=1)
    return {
        "steps": np.arange(first, last) - start + 1,  # the step of the episode each prediction lands on
        "truth": np.asarray(transitions.next_obs[first:last], np.float64),
        "mean": paths.mean(axis=1),
        "std": np.sqrt(epistemic_var + aleatoric_var),
        "reward_truth": np.asarray(transitions.reward[first:last], np.float64),
        "reward_mean": rewards.mean(axis=1),
        "epistemic": np.sqrt(epistemic_var.sum(axis=1)),
        "aleatoric": np.sqrt(aleatoric_var.sum(axis=1)),
    }


def _frame_to_truth(axis, steps: np.ndarray, truth: np.ndarray, mean: np.ndarray) -> str:
    """Frame the panel on the truth's range widened by that range each side, so that a model which diverges leaves
    the frame instead of flattening the truth to a line (a constant, such as a patient parameter, gets 5% of its
    value each side); returns a title suffix naming the step it leaves at."""
    low, high = float(np.min(truth)), float(np.max(truth))
    span = max(high - low, 0.05 * max(abs(low), abs(high)), 1e-6)
    axis.set_ylim(low - span, high + span)
    outside = ~((mean >= low - span) & (mean <= high + span))  # NaN counts as outside
    return f" (model leaves the frame at step {int(steps[np.argmax(outside)])})" if outside.any() else ""


def plot_episode(curves: dict[str, np.ndarray], title: str, path: Path) -> Path:
    """One PNG: a panel per observation dimension (truth, mean, 1σ and 2σ bands), the reward, the uncertainty."""
    matplotlib.use("Agg")  # files only, no screen
    obs_dim = curves["truth"].shape[1]
    panels = obs_dim + 2
    rows = -(-panels // COLUMNS)
    figure, axes = plt.subplots(rows, COLUMNS, figsize=(4 * COLUMNS, 2.4 * rows), squeeze=False)
    steps = curves["steps"]
    for dim in range(obs_dim):
        axis = axes.flat[dim]
        mean, std = curves["mean"][:, dim], curves["std"][:, dim]
        axis.fill_between(steps, mean - 2 * std, mean + 2 * std, color="tab:blue", alpha=0.15, label="2σ")
        axis.fill_between(steps, mean - std, mean + std, color="tab:blue", alpha=0.3, label="1σ")
        axis.plot(steps, mean, color="tab:blue", lw=1, label="model")
        axis.plot(steps, curves["truth"][:, dim], color="black", lw=1, label="truth")
        axis.set_title(f"obs[{dim}]{_frame_to_truth(axis, steps, curves['truth'][:, dim], mean)}", fontsize=9)
    reward = axes.flat[obs_dim]
    reward.plot(steps, curves["reward_mean"], color="tab:blue", lw=1)
    reward.plot(steps, curves["reward_truth"], color="black", lw=1)
    reward.set_title(f"reward{_frame_to_truth(reward, steps, curves['reward_truth'], curves['reward_mean'])}", fontsize=9)
    uncertainty = axes.flat[obs_dim + 1]
    uncertainty.plot(steps, curves["epistemic"], color="tab:red", lw=1, label="epistemic (elites' spread)")
    uncertainty.plot(steps, curves["aleatoric"], color="tab:green", lw=1, label="aleatoric (predicted σ)")
    uncertainty.set_yscale("log")
    uncertainty.set_title("uncertainty, norm over dims", fontsize=9)
    uncertainty.legend(fontsize=7)
    for axis in axes.flat[panels:]:
        axis.axis("off")
    axes.flat[0].legend(fontsize=7)
    for axis in axes.flat[:panels]:
        axis.tick_params(labelsize=7)
    figure.suptitle(title, fontsize=10)
    figure.supxlabel("step of the episode (open loop from its first predicted step)", fontsize=9)
    figure.tight_layout(rect=(0, 0, 1, 0.98))  # room for the suptitle
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    figure.savefig(tmp, dpi=80)
    plt.close(figure)
    tmp.replace(path)
    return path


def plot_open_loop(model, transitions, episode_starts, episodes, out_dir: Path, label: str) -> list[Path]:
    """PNGs of the first `MAX_EPISODES` of `episodes` (held-out episode indices) under `out_dir`."""
    bounds = np.append(np.asarray(episode_starts), len(transitions.reward))
    written = []
    for episode in list(episodes)[:MAX_EPISODES]:
        curves = open_loop_episode(model, transitions, int(bounds[episode]), int(bounds[episode + 1]))
        if curves is None:
            continue
        title = f"{label}: held-out episode {episode}, {len(curves['steps'])} open-loop steps"
        written.append(plot_episode(curves, title, Path(out_dir) / f"open_loop_episode{episode}.png"))
    return written
