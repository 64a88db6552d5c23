"""`MujocoRobot`: a Gymnasium MuJoCo env as the robot, for deploy dry runs and robustness checks.

Imperfections a real robot has can be switched on: observation latency (the policy sees the state of
`obs_latency` steps ago), Gaussian observation noise, and action delay (a command is applied
`action_delay` steps after it was sent; the first ones apply the safe action). Faults for testing the
safety layer: `nan_obs_at` (these episode steps report NaN observations) and `freeze_obs_after` (from
this episode step on no new observation arrives: a dead sensor; the sim keeps running).
"""

from __future__ import annotations

import collections
import time

import gymnasium
import mujoco
import numpy as np

import mbrl.envs.tasks  # noqa: F401  registers the tasks' Gymnasium ids (NeoRL2/DMSD-v0, ...)
from mbrl.envs.robots.protocol import Observation, Robot, RobotError

# mjtJoint: free 0, ball 1, slide 2, hinge 3.
_QPOS_SUFFIXES = {0: ("x", "y", "z", "qw", "qx", "qy", "qz"), 1: ("qw", "qx", "qy", "qz"), 2: ("",), 3: ("",)}
_QVEL_SUFFIXES = {0: ("vx", "vy", "vz", "wx", "wy", "wz"), 1: ("wx", "wy", "wz"), 2: ("",), 3: ("",)}


def _joint_names(model, suffixes) -> list[str]:
    names = []
    for j in range(model.njnt):
        base = model.joint(j).name or f"joint{j}"
        names += [f"{base}.{s}" if s else base for s in suffixes[int(model.jnt_type[j])]]
    return names


def _names(env, obs_dim: int, act_dim: int) -> tuple[list[str], list[str]]:
    """Observation names for the v5 layout (qpos without the root's x (and y), then qvel, then extras)."""
    unwrapped = env.unwrapped
    model = getattr(unwrapped, "model", None)
    if model is None:
        return [f"obs_{i}" for i in range(obs_dim)], [f"action_{i}" for i in range(act_dim)]
    qpos = [f"qpos:{n}" for n in _joint_names(model, _QPOS_SUFFIXES)]
    qvel = [f"qvel:{n}" for n in _joint_names(model, _QVEL_SUFFIXES)]
    if getattr(unwrapped, "_exclude_current_positions_from_observation", False):
        qpos = qpos[2:] if model.njnt and int(model.jnt_type[0]) == 0 else qpos[1:]
    names = (qpos + qvel)[:obs_dim]
    names += [f"obs_{i}" for i in range(len(names), obs_dim)]  # e.g. Ant's contact forces
    actions = []
    for i in range(act_dim):
        name = model.actuator(i).name if i < model.nu else ""
        if not name and i < model.nu and model.actuator_trntype[i] == 0:  # a joint actuator: name it by its joint
            name = model.joint(int(model.actuator_trnid[i, 0])).name
        actions.append(name or f"action_{i}")
    return names, actions


def _make(env_id: str, **kwargs):
    try:
        return gymnasium.make(env_id, **kwargs)
    except gymnasium.error.Error as exc:
        raise RobotError(f"mujoco:{env_id}: cannot make the Gymnasium env ({exc})") from None


def env_facts(env_id: str) -> dict:
    """Dims, bounds, names and control rate of a Gymnasium env, for policy.json."""
    env = _make(env_id)
    try:
        obs_dim = int(np.prod(env.observation_space.shape))
        act_dim = int(np.prod(env.action_space.shape))
        obs_names, action_names = _names(env, obs_dim, act_dim)
        dt = getattr(env.unwrapped, "dt", None)
        return {
            "obs_dim": obs_dim,
            "act_dim": act_dim,
            "action_low": env.action_space.low.tolist(),
            "action_high": env.action_space.high.tolist(),
            "obs_names": tuple(obs_names),
            "action_names": tuple(action_names),
            "control_rate_hz": None if dt is None else 1.0 / float(dt),
        }
    finally:
        env.close()


def _time_limit(env):
    """The TimeLimit wrapper around a Gymnasium env, if any (its step counter is part of an episode's state)."""
    while env is not None:
        if isinstance(env, gymnasium.wrappers.TimeLimit):
            return env
        env = getattr(env, "env", None)
    return None


class MujocoRobot(Robot):
    def __init__(
        self,
        env_id: str,
        *,
        max_episode_steps: int | None = None,
        obs_latency: int = 0,
        obs_noise: float = 0.0,
        action_delay: int = 0,
        noise_seed: int = 0,
        nan_obs_at: tuple[int, ...] = (),
        freeze_obs_after: int | None = None,
    ):
        if obs_latency < 0 or action_delay < 0 or obs_noise < 0:
            raise RobotError(f"mujoco:{env_id}: obs_latency, action_delay and obs_noise must be >= 0")
        super().__init__(f"mujoco:{env_id}")
        self.env_id = env_id
        self.max_episode_steps = max_episode_steps
        self.obs_latency, self.obs_noise, self.action_delay = obs_latency, obs_noise, action_delay
        self.nan_obs_at = frozenset(nan_obs_at)
        self.freeze_obs_after = freeze_obs_after
        self._rng = np.random.default_rng(noise_seed)
        self.env = None
        self.safe_stops = 0  # how many times safe_stop ran (tests, logs)
        self.stopped = False

    def _env(self):
        if self.env is None:
            raise RobotError(f"{self.name}: not connected")
        return self.env

    def connect(self) -> None:
        kwargs = {} if self.max_episode_steps is None else {"max_episode_steps": self.max_episode_steps}
        self.env = _make(self.env_id, **kwargs)
        space = self.env.action_space
        self._set_spec(int(np.prod(self.env.observation_space.shape)), space.low, space.high)  # dims and bounds
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        obs, _ = self._env().reset(seed=seed)
        self.stopped = False
        self.step_count = 0
        self._seq += 1
        self._history = collections.deque([(np.asarray(obs, np.float64), time.monotonic(), self._seq, None, False, False)],
                                          maxlen=self.obs_latency + 1)
        self._frozen: Observation | None = None
        self._pending = collections.deque([self.rest_action] * self.action_delay)

    def observe(self) -> Observation:
        if self._frozen is not None:
            return self._frozen
        values, stamp, seq, reward, terminated, truncated = self._history[0]  # the oldest kept: obs_latency steps ago
        latest = self._history[-1]
        values = values.astype(np.float32)
        if self.obs_noise:
            values = values + self._rng.normal(0.0, self.obs_noise, values.shape).astype(np.float32)
        if self.step_count in self.nan_obs_at:
            values = np.full_like(values, np.nan)
        # Rewards and episode ends are the simulator's bookkeeping, not sensor data: never delayed.
        obs = Observation(values, stamp, seq, latest[3], latest[4], latest[5])
        if self.freeze_obs_after is not None and self.step_count >= self.freeze_obs_after:
            self._frozen = obs
        return obs

    def _send(self, sent: np.ndarray) -> None:
        if self.stopped:
            return
        self._pending.append(sent)
        applied = self._pending.popleft()
        obs, reward, terminated, truncated, _ = self._env().step(applied)
        self.step_count += 1
        self._seq += 1
        self._history.append((np.asarray(obs, np.float64), time.monotonic(), self._seq, float(reward), terminated, truncated))

    def snapshot(self) -> dict | None:
        """The episode in progress as plain values: MuJoCo's whole integration state, the time limit's counter,
        the latency and delay queues and the noise generator, so that `restore` continues it bit for bit
        (an exact resume of fine-tuning mid-episode)."""
        raw = self._env().unwrapped
        if not hasattr(raw, "model") or not hasattr(raw, "data"):
            return None  # not a MuJoCo simulation (DMSD, Simglucose): a resume starts a new episode
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        mj_state = np.empty(mujoco.mj_stateSize(raw.model, spec), np.float64)
        mujoco.mj_getState(raw.model, raw.data, mj_state, spec)
        limit = _time_limit(self.env)
        return {
            "env_id": self.env_id, "mj_state": mj_state.tolist(),
            "elapsed_steps": None if limit is None else limit._elapsed_steps,
            "step_count": self.step_count, "seq": self._seq, "stopped": self.stopped,
            "history": [[v.tolist(), seq, reward, terminated, truncated] for v, _, seq, reward, terminated, truncated in self._history],
            "pending": [a.tolist() for a in self._pending], "frozen": None if self._frozen is None else [
                self._frozen.values.tolist(), self._frozen.seq, self._frozen.reward, self._frozen.terminated,
                self._frozen.truncated],
            "rng": self._rng.bit_generator.state,
        }

    def restore(self, snapshot: dict) -> None:
        """Continue the episode of a `snapshot` (of a robot made with the same options); the next `observe`
        returns what it would have returned then."""
        if snapshot.get("env_id") != self.env_id:
            raise RobotError(f"{self.name}: a snapshot of {snapshot.get('env_id')!r} cannot be restored here")
        self.reset()
        raw = self._env().unwrapped
        mujoco.mj_setState(raw.model, raw.data, np.asarray(snapshot["mj_state"], np.float64), mujoco.mjtState.mjSTATE_INTEGRATION)
        limit = _time_limit(self.env)
        if limit is not None:
            limit._elapsed_steps = snapshot["elapsed_steps"]
        self.step_count, self._seq, self.stopped = snapshot["step_count"], snapshot["seq"], snapshot["stopped"]
        now = time.monotonic()
        self._history = collections.deque(
            [(np.asarray(v, np.float64), now, seq, reward, terminated, truncated) for v, seq, reward, terminated, truncated
             in snapshot["history"]], maxlen=self.obs_latency + 1)
        self._pending = collections.deque(np.asarray(a, np.float32) for a in snapshot["pending"])
        self._rng.bit_generator.state = snapshot["rng"]
        frozen = snapshot["frozen"]
        self._frozen = None if frozen is None else Observation(np.asarray(frozen[0], np.float32), now, *frozen[1:])

    def safe_stop(self) -> None:
        """A simulated robot has nothing to power down: stop stepping until the next reset."""
        self.safe_stops += 1
        self.stopped = True

    def disconnect(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
            self._spec = None
