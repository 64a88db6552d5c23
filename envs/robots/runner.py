"""`PolicyRunner`: an exported policy (policy.onnx + policy.json) run with onnxruntime, no JAX needed.

The graph already normalizes the observation and rescales and clips the action, so the runner only
feeds float32 observations in and reads actions out. A recurrent policy (policy.json `state`) also
takes, each tick, its previous action (its own `policy_action` output of the last tick, in [-1, 1]),
the previous step's reward and whether the tick is an episode's first, and returns its next carry;
the runner carries all of these between calls and `reset()` restores the initial ones at every
episode start, as the training rollouts do. The control loop hands a policy only the observation's
values, so `RewardFeed` wraps the robot to pass each fresh observation's reward to the runner.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np

from mbrl.envs.robots.export_format import JSON_FILE, ONNX_FILE, RECURRENT_INPUTS, ExportError, read_description
from mbrl.envs.robots.protocol import Observation, Robot, RobotWrapper
from mbrl.core.errors import MissingDependencyError

_ONNX_TYPES = {"float32": "tensor(float)", "float64": "tensor(double)", "int32": "tensor(int32)",
               "int64": "tensor(int64)", "bool": "tensor(bool)"}


class PolicyRunner:
    def __init__(self, export_dir: str | Path, threads: int = 1):
        self.export_dir = Path(export_dir).absolute()
        self.description = read_description(self.export_dir)
        onnx_path = self.export_dir / ONNX_FILE
        if not onnx_path.is_file():
            raise ExportError(f"{onnx_path}: missing; expected {ONNX_FILE} next to {JSON_FILE}")
        data = onnx_path.read_bytes()
        expected = self.description.get("files", {}).get(ONNX_FILE, {}).get("sha256")
        if expected is not None and hashlib.sha256(data).hexdigest() != expected:
            raise ExportError(f"{onnx_path}: sha256 differs from the one in {JSON_FILE}; the export is damaged or mixed")
        try:
            import onnxruntime
        except ImportError:
            raise MissingDependencyError(
                "running an exported policy needs onnxruntime: pip install 'offline-mbrl[onnx]'"
            ) from None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads  # one observation per tick: threads only add latency
        options.inter_op_num_threads = 1
        try:
            self.session = onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph kinds
            raise ExportError(f"{onnx_path}: onnxruntime cannot load it ({type(exc).__name__}: {exc})") from None
        self.obs_dim = int(self.description["observation"]["dim"])
        self.act_dim = int(self.description["action"]["dim"])
        self.action_low = np.asarray(self.description["action"]["low"], np.float32)
        self.action_high = np.asarray(self.description["action"]["high"], np.float32)
        self.control_rate_hz = self.description.get("control_rate_hz")
        state = self.description.get("state")
        self.recurrent = state is not None
        # (input name, output name, initial value) per carry leaf
        self._leaves = [(leaf["input"], leaf["output"], np.asarray(leaf["initial"], leaf["dtype"]))
                        for leaf in (state or {}).get("carry", [])]
        self._check_graph()
        self._outputs = ["action"] + (["policy_action"] + [out for _, out, _ in self._leaves] if self.recurrent else [])
        self._batch = None
        self.reset()
        self(np.zeros(self.obs_dim, np.float32))  # the first run allocates: keep it out of the first tick
        self.reset()

    def _check_graph(self) -> None:
        """The graph's inputs and outputs are the ones policy.json describes (names, per-sample shapes, dtypes)."""
        json_path, onnx_path = self.export_dir / JSON_FILE, self.export_dir / ONNX_FILE
        inputs = {"obs": ("observation.dim", [self.obs_dim], "float32")}
        outputs = {"action": ("action.dim", [self.act_dim], "float32")}
        if self.recurrent:
            state = self.description["state"]
            for i, entry in enumerate(state["inputs"]):
                inputs[entry["name"]] = (f"state.inputs[{i}]", entry["shape"], entry["dtype"])
            outputs["policy_action"] = ("state.feedback", [self.act_dim], "float32")
            for i, leaf in enumerate(state["carry"]):
                inputs[leaf["input"]] = (f"state.carry[{i}].input", leaf["shape"], leaf["dtype"])
                outputs[leaf["output"]] = (f"state.carry[{i}].output", leaf["shape"], leaf["dtype"])
        for kind, expected, found in (("input", inputs, self.session.get_inputs()), ("output", outputs, self.session.get_outputs())):
            graph = {node.name: node for node in found}
            for name, (field, shape, dtype) in expected.items():
                node = graph.get(name)
                if node is None:
                    raise ExportError(f"{json_path}: field '{field}' names {kind} {name!r}, which {onnx_path.name} lacks "
                                      f"(it has {sorted(graph)})")
                if list(node.shape[1:]) != list(shape) or node.type != _ONNX_TYPES[dtype]:
                    raise ExportError(f"{json_path}: field '{field}' says {kind} {name!r} is {dtype} {shape} per sample; "
                                      f"{onnx_path.name} has {node.type} {list(node.shape[1:])}")
            if kind == "input" and set(graph) - set(expected):
                raise ExportError(f"{json_path}: field 'state' does not describe the graph inputs "
                                  f"{sorted(set(graph) - set(expected))} of {onnx_path.name}")

    def reset(self, batch: int = 1) -> None:
        """A new episode: the initial carry, zero previous action and reward, first = True (nothing for a
        Markov policy)."""
        self._batch = batch
        if not self.recurrent:
            return
        self._carry = [np.broadcast_to(initial, (batch, *initial.shape)).copy() for _, _, initial in self._leaves]
        self._prev_action = np.zeros((batch, self.act_dim), np.float32)
        self._prev_reward = np.zeros(batch, np.float32)
        self._first = np.ones(batch, bool)

    def give_reward(self, reward) -> None:
        """The reward of the step just taken (it arrives with the next observation): the next call's
        prev_reward. A float, or one per row of a batch. Markov policies ignore it."""
        if self.recurrent:
            self._prev_reward = np.broadcast_to(np.asarray(reward, np.float32), (self._batch,)).copy()

    @property
    def carry(self) -> list[np.ndarray]:
        """The carry leaves the next call feeds, (batch, *shape) each, in policy.json's `state.carry` order."""
        return [c.copy() for c in self._carry] if self.recurrent else []

    def __call__(self, obs) -> np.ndarray:
        """Actions for one observation (obs_dim,) -> (act_dim,), or a batch (B, obs_dim) -> (B, act_dim)."""
        obs = np.asarray(obs, np.float32)
        single = obs.ndim == 1
        batch = obs[None] if single else obs
        if batch.ndim != 2 or batch.shape[1] != self.obs_dim:
            raise ExportError(
                f"{self.export_dir}: the policy takes observations of dim {self.obs_dim}, found shape {obs.shape}"
            )
        feeds = {"obs": batch}
        if self.recurrent:
            if batch.shape[0] != self._batch:
                self.reset(batch.shape[0])
            feeds.update(zip(RECURRENT_INPUTS, (self._prev_action, self._prev_reward, self._first)))
            feeds.update((name, carry) for (name, _, _), carry in zip(self._leaves, self._carry))
        action, *rest = self.session.run(self._outputs, feeds)
        if self.recurrent:
            self._prev_action, *self._carry = rest
            self._prev_reward = np.zeros(self._batch, np.float32)  # until the next step's reward is given
            self._first = np.zeros(self._batch, bool)
        return action[0] if single else action


class RewardFeed(RobotWrapper):
    """A robot (wrapped) whose fresh observations hand their reward to a recurrent `PolicyRunner`.

    The reward an observation carries is the previous step's: the policy's prev_reward for the tick
    that acts on it. As the control loop's `account`, it counts once, with the first observation that
    carries it (a stale observation repeats nothing); a robot that reports no reward feeds 0.
    Everything else passes through to the robot.
    """

    def __init__(self, robot: Robot, runner: PolicyRunner):
        super().__init__(robot)
        self._runner = runner
        self._fed: int | None = None  # the seq of the last observation whose reward was fed
        self.rewards_seen = 0

    def reset(self, seed: int | None = None) -> None:
        self.robot.reset(seed)
        self._fed = None

    def observe(self) -> Observation:
        obs = self.robot.observe()
        if self._fed is None or obs.seq > self._fed:
            self._fed = obs.seq
            self._runner.give_reward(0.0 if obs.reward is None else float(obs.reward))
            self.rewards_seen += obs.reward is not None
        return obs


class ChangeFeed(RobotWrapper):
    """A robot (wrapped) observed as its task `+change` is (`mbrl.core.change`): each observation's values followed by
    their change since the previous fresh observation, 0 at the first after a reset. A stale observation (no new
    measurement: the same `seq`) repeats the last observed values and change. Everything else passes through."""

    def __init__(self, robot: Robot):
        super().__init__(robot)
        self._previous = None  # (seq, values, observed values) of the last fresh observation

    @property
    def obs_dim(self) -> int:
        return 2 * self.robot.obs_dim

    def reset(self, seed: int | None = None) -> None:
        self.robot.reset(seed)
        self._previous = None

    def observe(self) -> Observation:
        obs = self.robot.observe()
        values = np.asarray(obs.values, np.float32)
        if self._previous is not None and obs.seq <= self._previous[0]:
            observed = self._previous[2]
        else:
            change = np.zeros_like(values) if self._previous is None else values - self._previous[1]
            observed = np.concatenate([values, change])
            self._previous = (obs.seq, values, observed)
        return dataclasses.replace(obs, values=observed)
