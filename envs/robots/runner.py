"""`PolicyRunner`: an exported policy (policy.onnx + policy.json) run with onnxruntime, no JAX needed.

The graph already normalizes the observation and rescales and clips the action, so the runner only
feeds float32 observations in and reads actions out. A recurrent policy's state is carried here
between calls and zeroed by `reset()` at every episode start.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from mbrl.core.errors import MissingDependencyError
from envs.robots.export_format import JSON_FILE, ONNX_FILE, ExportError, read_description


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
        state = self.description.get("state") or {}
        self.state_dim = int(state.get("dim", 0))
        self.control_rate_hz = self.description.get("control_rate_hz")
        self._state = None
        self.reset()
        self(np.zeros(self.obs_dim, np.float32))  # the first run allocates: keep it out of the first tick
        self.reset()

    def reset(self, batch: int = 1) -> None:
        """Zero the recurrent state (a new episode); nothing for a feedforward policy."""
        self._state = np.zeros((batch, self.state_dim), np.float32) if self.state_dim else None

    def set_state(self, state) -> None:
        """Set the recurrent state, float32 (batch, state_dim)."""
        self._state = np.asarray(state, np.float32).reshape(-1, self.state_dim)

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
        if self.state_dim:
            if self._state is None or self._state.shape[0] != batch.shape[0]:
                self.reset(batch.shape[0])
            feeds["state_in"] = self._state
            action, self._state = self.session.run(["action", "state_out"], feeds)
        else:
            (action,) = self.session.run(["action"], feeds)
        return action[0] if single else action
