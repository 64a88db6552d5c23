"""A robot no registry knows, for the own-robot tests: a cart on a rail, pushed toward the origin.

State (position m, velocity m/s), action a force in [-1, 1] N; 50 Hz; x' = v, v' = 10 u - 5 v (a 0.1 kg cart with
strong friction: its speed follows 2 u within 0.2 s).
Reward r = -x_next^2 - 0.01 u^2, closed form, so an imported dataset's returns can be checked. Episodes of 100
steps start at a position in [-1, 1]. The logging policy pushes the wrong way half of the time.
`python -m mbrl.envs.robots.serve --step cart_robot:Cart --robot udp://127.0.0.1:0` serves it (with tests/ on
PYTHONPATH); `DECLARATION` is its task file.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

DT = 1.0 / 50.0
STEPS = 100

DECLARATION = """\
name = "cart"
control_hz = 50.0
max_episode_steps = 100
reward = "cart_robot:reward"

[[observation]]
name = "position"
unit = "m"
topic = "/joint_states"
field = "position[0]"

[[observation]]
name = "velocity"
unit = "m/s"
topic = "/joint_states"
field = "velocity[0]"

[[action]]
name = "force"
unit = "N"
low = -1.0
high = 1.0
topic = "/cmd"
field = "data[0]"
"""


def dynamics(state: np.ndarray, action) -> np.ndarray:
    x, v = state
    u = float(np.clip(np.asarray(action).reshape(-1)[0], -1.0, 1.0))
    v_next = v + DT * (10.0 * u - 5.0 * v)
    return np.array([x + DT * v_next, v_next])


def reward(obs, action, next_obs):
    return -jnp.square(next_obs[..., 0]) * 1.0 - 0.01 * jnp.square(action[..., 0])


def reward_np(action, next_state) -> float:
    return float(-next_state[0] ** 2 - 0.01 * float(np.asarray(action).reshape(-1)[0]) ** 2)


class Cart:
    """The robot side, as `mbrl.envs.robots.serve` wraps it."""

    obs_dim, act_dim = 2, 1
    action_low, action_high = np.array([-1.0]), np.array([1.0])

    def __init__(self):
        self.state = np.zeros(2)
        self.steps = 0

    def reset(self, seed):
        rng = np.random.default_rng(seed)
        self.state = np.array([rng.uniform(-1.0, 1.0), 0.0])
        self.steps = 0
        return self.state.copy()

    def step(self, action):
        self.state = dynamics(self.state, action)
        self.steps += 1
        return self.state.copy(), reward_np(action, self.state), False, self.steps >= STEPS


def logging_policy(state: np.ndarray, rng: np.random.Generator) -> float:
    """A poor controller: toward the origin or away from it, at random, with noise."""
    sign = 1.0 if rng.random() < 0.5 else -1.0
    return float(np.clip(-sign * 2.0 * state[0] + 0.3 * rng.normal(), -1.0, 1.0))


def declared_with_episodes(folder, episodes: int, seed: int) -> tuple:
    """The cart's declaration written to FOLDER/cart.toml, and its logging policy's episodes (`log_episodes`)."""
    declaration = folder / "cart.toml"
    declaration.write_text(DECLARATION)
    return declaration, log_episodes(episodes, seed)


def log_episodes(episodes: int, seed: int) -> list[dict]:
    """The logging policy's episodes: per episode obs (T+1, 2), actions (T, 1), rewards (T,)."""
    rng = np.random.default_rng(seed)
    robot, out = Cart(), []
    for episode in range(episodes):
        states, actions, rewards = [robot.reset(seed + episode)], [], []
        for _ in range(STEPS):
            u = logging_policy(states[-1], rng)
            state, r, _, _ = robot.step([u])
            states.append(state)
            actions.append([u])
            rewards.append(r)
        out.append({"obs": np.array(states), "actions": np.array(actions), "rewards": np.array(rewards)})
    return out
