"""Export a trained policy as a self-contained folder a robot can run without the training code.

The input is a `PolicySpec`: an explicit description of the deterministic policy (the actor's apply
function and parameters, the observation normalizer, the action bounds, names, control rate and
where it came from, and for a recurrent policy its memory at an episode start). `export_policy`
writes, atomically (a temporary folder renamed into place):

- `policy.onnx`: obs -> action with the observation envelope (clip), the normalizer, the action
  rescaling and the action clipping baked into the graph (as Isaac Lab's exporter bakes its
  normalizer), with a dynamic batch axis, opset 18.
  Input `obs` float32 (batch, obs_dim); output `action` float32 (batch, act_dim).
  A recurrent policy (NEUBAY) takes and returns its state each tick:
  inputs  obs, prev_action (batch, act_dim), prev_reward (batch,), first bool (batch,), carry_0, carry_1, ...
  outputs action, policy_action (batch, act_dim), next_carry_0, next_carry_1, ...
  `policy_action` is the policy's own action in [-1, 1] before rescaling and clipping: the next tick's
  `prev_action`, as in training. A complex carry leaf travels as real (..., 2) arrays (real, imaginary).
- `policy.jax`: the same function serialized with `jax.export` (a symbolic batch axis, lowered for CPU
  and CUDA). It runs in any process with jax installed and nothing of this project:

      exported = jax.export.deserialize(bytearray(open("policy.jax", "rb").read()))
      action = exported.call(obs)                      # obs: float32 (batch, obs_dim)
      action, policy_action, *carry = exported.call(obs, prev_action, prev_reward, first, *carry)  # recurrent

- `policy.json`: observation and action names, dims and bounds, the normalizer, the control rate, the
  env, dataset and run ids, `params_sha256` (sha256 of the parameter bytes, leaves in pytree order),
  sha256 of both model files, the framework version, and `state` (null for a Markov policy): the
  recurrent inputs, the carry leaves (ONNX names, shapes, dtypes, initial values) and the reset rule.

`mbrl.export_run.load_policy_from_run(run_dir)` builds the PolicySpec of a run written by `mbrl train`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mbrl import __version__
from mbrl.core.types import PolicyInput
from mbrl.envs.robots.export_format import (
    CARRY_DTYPES, FORMAT, FORMAT_VERSION, JAX_FILE, JSON_FILE, ONNX_FILE, RECURRENT_INPUTS, RESET_RULE, ExportError,
    state_inputs,
)
from mbrl.envs.robots.runner import PolicyRunner
from mbrl.export_onnx import OPSET, to_onnx

JAX_PLATFORMS = ("cpu", "cuda")
OBS_CLIP_STD = 10.0


def observation_envelope(observations, num_std: float = OBS_CLIP_STD, min_std: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) = mean ± num_std * std per dimension of `observations` (N, obs_dim); std floored at min_std."""
    observations = np.asarray(observations, np.float64)
    mean, std = observations.mean(axis=0), np.maximum(observations.std(axis=0), min_std)
    return (mean - num_std * std).astype(np.float32), (mean + num_std * std).astype(np.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class PolicySpec:
    """A deterministic policy, described explicitly enough to be exported.

    apply_fn(params, obs) -> u for a Markov policy; apply_fn(params, carry, inputs) -> (u, carry) for a
        recurrent one (`initial_carry` given), with `inputs` a `mbrl.core.types.PolicyInput` of ONE step:
        obs (obs_dim,) normalized, prev_action (act_dim,) the previous u, prev_reward () float32,
        first () bool. `obs` is ONE normalized observation (obs_dim,); `u` is the squashed action in
        [-1, 1]^act_dim (for SAC-style actors tanh of the mean, as `act(..., deterministic=True)` returns).
    initial_carry: the recurrent memory at an episode start for one sample (a pytree of arrays, no batch
        axis); None for a Markov policy.
    obs_mean / obs_std: the normalizer, obs_n = (obs - mean) / std; None for an agent without one.
    obs_low / obs_high: the raw observation is clipped into this envelope first, so that an observation
        far outside the training data cannot drive the network into regions it never saw (and float32
        round-off stays small). Default with a normalizer: mean ± 10 std (Stable-Baselines3's
        VecNormalize clips normalized observations at 10 by default); without one: no envelope.
        `observation_envelope(dataset_obs)` makes one from data.
    action_low / action_high: the robot's bounds; the exported action is always clipped to them.
    rescale_actions: map u from [-1, 1] onto [low, high] (True), or take u in the robot's units and
        only clip (False: the agents of this project act directly in the dataset's units).
    """

    apply_fn: Callable
    params: Any
    obs_dim: int
    act_dim: int
    action_low: Any
    action_high: Any
    obs_mean: Any = None
    obs_std: Any = None
    obs_low: Any = None
    obs_high: Any = None
    rescale_actions: bool = True
    initial_carry: Any = None
    obs_names: tuple[str, ...] | None = None
    action_names: tuple[str, ...] | None = None
    obs_units: tuple[str, ...] | None = None
    action_units: tuple[str, ...] | None = None
    task: str | None = None
    task_declared: bool = False  # a robot declared by its user: its action bounds are the robot's, exactly
    control_rate_hz: float | None = None
    env_id: str | None = None
    dataset: str | None = None
    run_id: str | None = None
    metadata: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        def vector(name, value, dim):
            array = np.broadcast_to(np.asarray(value, np.float32), (dim,)).copy() if value is not None else None
            if array is not None and not np.all(np.isfinite(array)):
                raise ExportError(f"policy spec: {name} must be finite, found {array.tolist()}")
            object.__setattr__(self, name, array)

        for name in ("obs_dim", "act_dim"):
            if not isinstance(getattr(self, name), (int, np.integer)) or getattr(self, name) < 1:
                raise ExportError(f"policy spec: {name} must be a positive int, found {getattr(self, name)!r}")
        vector("action_low", self.action_low, self.act_dim)
        vector("action_high", self.action_high, self.act_dim)
        vector("obs_mean", self.obs_mean, self.obs_dim)
        vector("obs_std", self.obs_std, self.obs_dim)
        if not np.all(self.action_low < self.action_high):
            raise ExportError(f"policy spec: action_low {self.action_low.tolist()} must be below action_high {self.action_high.tolist()}")
        if (self.obs_mean is None) != (self.obs_std is None):
            raise ExportError("policy spec: give both obs_mean and obs_std, or neither")
        if self.obs_std is not None and not np.all(self.obs_std > 0):
            raise ExportError(f"policy spec: obs_std must be > 0, found {self.obs_std.tolist()}")
        if (self.obs_low is None) != (self.obs_high is None):
            raise ExportError("policy spec: give both obs_low and obs_high, or neither")
        if self.obs_low is None and self.obs_mean is not None:
            object.__setattr__(self, "obs_low", self.obs_mean - OBS_CLIP_STD * self.obs_std)
            object.__setattr__(self, "obs_high", self.obs_mean + OBS_CLIP_STD * self.obs_std)
        vector("obs_low", self.obs_low, self.obs_dim)
        vector("obs_high", self.obs_high, self.obs_dim)
        if self.obs_low is not None and not np.all(self.obs_low <= self.obs_high):
            raise ExportError(f"policy spec: obs_low {self.obs_low.tolist()} must not exceed obs_high {self.obs_high.tolist()}")
        if self.initial_carry is not None:
            object.__setattr__(self, "initial_carry", _host_carry(self.initial_carry))
        names = {"obs_names": self.obs_dim, "action_names": self.act_dim}
        for name, dim in names.items():
            value = getattr(self, name)
            prefix = "obs" if name == "obs_names" else "action"
            value = tuple(f"{prefix}_{i}" for i in range(dim)) if value is None else tuple(str(v) for v in value)
            if len(value) != dim:
                raise ExportError(f"policy spec: {name} has {len(value)} names, expected {dim}")
            object.__setattr__(self, name, value)

    @property
    def recurrent(self) -> bool:
        return self.initial_carry is not None


def _host_carry(carry):
    """The carry as numpy arrays; ExportError for a leaf of a dtype policy.json cannot describe."""
    out = jax.tree.map(np.asarray, carry)
    for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
        if _encoded(leaf).dtype.name not in CARRY_DTYPES:
            raise ExportError(f"policy spec: initial_carry{jax.tree_util.keystr(path)} has dtype {leaf.dtype}; "
                              f"expected one of {', '.join(CARRY_DTYPES)}, complex64 or complex128")
    if not jax.tree.leaves(out):
        raise ExportError("policy spec: initial_carry has no arrays; give None for a Markov policy")
    return out


def _encoded(leaf) -> np.ndarray:
    """A carry leaf as the graph carries it: complex -> (..., 2) real, imaginary; others as they are."""
    leaf = np.asarray(leaf)
    if np.iscomplexobj(leaf):
        return np.stack([leaf.real, leaf.imag], axis=-1)
    return leaf


def carry_leaves(spec: PolicySpec) -> list[dict]:
    """Per carry leaf: its pytree path, source dtype and encoded initial value (what policy.json describes)."""
    if not spec.recurrent:
        return []
    leaves = jax.tree_util.tree_flatten_with_path(spec.initial_carry)[0]
    return [{"path": jax.tree_util.keystr(path), "source_dtype": leaf.dtype, "initial": _encoded(leaf)}
            for path, leaf in leaves]


def policy_function(spec: PolicySpec) -> Callable:
    """The per-sample deterministic policy: raw obs -> action in the robot's units; recurrent:
    (obs, prev_action, prev_reward, first, *carry) -> (action, policy_action, *next_carry), carry encoded."""
    low, high = spec.action_low, spec.action_high

    def normalize(obs):
        if spec.obs_low is not None:
            obs = jnp.clip(obs, spec.obs_low, spec.obs_high)
        if spec.obs_mean is not None:
            obs = (obs - spec.obs_mean) / spec.obs_std
        return obs

    def to_action(u):
        if spec.rescale_actions:
            u = low + (u + 1.0) * (0.5 * (high - low))
        return jnp.clip(u, low, high)

    if not spec.recurrent:
        return lambda obs: to_action(spec.apply_fn(spec.params, normalize(obs)))

    like, treedef = jax.tree.flatten(spec.initial_carry)

    def decode(x, leaf):
        return jax.lax.complex(x[..., 0], x[..., 1]).astype(leaf.dtype) if np.iscomplexobj(leaf) else x

    def encode(x):
        return jnp.stack([x.real, x.imag], axis=-1) if jnp.iscomplexobj(x) else x

    def recurrent(obs, prev_action, prev_reward, first, *encoded):
        carry = treedef.unflatten([decode(x, leaf) for x, leaf in zip(encoded, like)])
        u, new_carry = spec.apply_fn(spec.params, carry, PolicyInput(normalize(obs), prev_action, prev_reward, first))
        return (to_action(u), u, *(encode(x) for x in treedef.flatten_up_to(new_carry)))

    return recurrent


def params_sha256(params) -> str:
    """sha256 of the parameter bytes: every leaf as little-endian C-order bytes, in pytree order."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
    return digest.hexdigest()


def _example_inputs(spec: PolicySpec) -> list[np.ndarray]:
    inputs = [np.zeros(spec.obs_dim, np.float32)]
    if spec.recurrent:
        inputs += [np.zeros(spec.act_dim, np.float32), np.zeros((), np.float32), np.ones((), bool)]
        inputs += [leaf["initial"] for leaf in carry_leaves(spec)]
    return inputs


def _io_names(spec: PolicySpec) -> tuple[list[str], list[str]]:
    if spec.recurrent:
        count = len(carry_leaves(spec))
        return (["obs", *RECURRENT_INPUTS, *(f"carry_{i}" for i in range(count))],
                ["action", "policy_action", *(f"next_carry_{i}" for i in range(count))])
    return ["obs"], ["action"]


def _check_outputs(spec: PolicySpec) -> None:
    """apply_fn on one observation gives (act_dim,) (and a carry like the initial one): a clear error
    before any tracing deeper down."""
    def call():
        obs = np.zeros(spec.obs_dim, np.float32)
        if not spec.recurrent:
            return jax.eval_shape(lambda o: spec.apply_fn(spec.params, o), obs)
        inputs = PolicyInput(obs, *_example_inputs(spec)[1:4])
        return jax.eval_shape(lambda c, i: spec.apply_fn(spec.params, c, i), spec.initial_carry, inputs)

    try:
        out = call()
    except Exception as exc:  # any tracing error of user code: report it in one line
        raise ExportError(f"policy spec: apply_fn fails on one observation of shape ({spec.obs_dim},): "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    if spec.recurrent:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ExportError("policy spec: a recurrent apply_fn must return (action, carry)")
        out, carry = out
        describe_leaves = lambda tree: [(tuple(x.shape), np.dtype(x.dtype).name) for x in jax.tree.leaves(tree)]  # noqa: E731
        found, expected = describe_leaves(carry), describe_leaves(spec.initial_carry)
        if jax.tree.structure(carry) != jax.tree.structure(spec.initial_carry) or found != expected:
            raise ExportError(f"policy spec: apply_fn returns a carry of (shape, dtype) {found}, expected one like "
                              f"initial_carry {expected}")
    shape = [tuple(getattr(o, "shape", ())) for o in out] if isinstance(out, tuple) else tuple(getattr(out, "shape", ()))
    if shape != (spec.act_dim,):
        raise ExportError(f"policy spec: apply_fn returns shapes {shape} for one observation, expected ({spec.act_dim},)")


def export_jax(spec: PolicySpec) -> tuple[bytes, list[str]]:
    """`jax.export` bytes of the batched policy, and the platforms it was lowered for."""
    fn = policy_function(spec)
    (batch,) = jax.export.symbolic_shape("batch")
    args = [jax.ShapeDtypeStruct((batch, *x.shape), x.dtype) for x in _example_inputs(spec)]
    batched = jax.jit(jax.vmap(fn))
    try:
        exported = jax.export.export(batched, platforms=JAX_PLATFORMS)(*args)
    except Exception:  # a jaxlib without CUDA lowering rules: a CPU-only artifact is still useful
        exported = jax.export.export(batched, platforms=("cpu",))(*args)
    return bytes(exported.serialize()), list(exported.platforms)


def describe_state(spec: PolicySpec) -> dict | None:
    """policy.json's `state`: what a runner feeds a recurrent policy each tick and carries between ticks."""
    if not spec.recurrent:
        return None
    inputs, outputs = _io_names(spec)
    count = len(RECURRENT_INPUTS)
    carry = []
    for leaf, name_in, name_out in zip(carry_leaves(spec), inputs[1 + count :], outputs[2:]):
        initial = leaf["initial"]
        complex_ = np.issubdtype(leaf["source_dtype"], np.complexfloating)
        encoding = f"{leaf['source_dtype'].name} as (..., 2): real, imaginary" if complex_ else None
        carry.append({"input": name_in, "output": name_out, "path": leaf["path"], "shape": list(initial.shape),
                      "dtype": initial.dtype.name, "encoding": encoding, "initial": initial.tolist()})
    return {"inputs": state_inputs(spec.act_dim), "feedback": {"prev_action": "policy_action"}, "carry": carry,
            "reset": RESET_RULE}


def describe(spec: PolicySpec, files: dict[str, bytes], platforms: list[str]) -> dict:
    """The content of policy.json."""
    inputs, outputs = _io_names(spec)
    normalizer = None
    if spec.obs_mean is not None:
        normalizer = {"mean": spec.obs_mean.tolist(), "std": spec.obs_std.tolist()}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "framework": "offline-mbrl",
        "framework_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "env_id": spec.env_id,
        "dataset": spec.dataset,
        "run_id": spec.run_id,
        "control_rate_hz": spec.control_rate_hz,
        "task": spec.task,
        "task_declared": spec.task_declared,
        "observation": {
            "dim": spec.obs_dim,
            "names": list(spec.obs_names),
            "units": None if spec.obs_units is None else list(spec.obs_units),
            "normalizer": normalizer,
            "low": None if spec.obs_low is None else spec.obs_low.tolist(),
            "high": None if spec.obs_high is None else spec.obs_high.tolist(),
        },
        "action": {
            "dim": spec.act_dim,
            "names": list(spec.action_names),
            "units": None if spec.action_units is None else list(spec.action_units),
            "low": spec.action_low.tolist(),
            "high": spec.action_high.tolist(),
            "rescaled_from_unit_range": spec.rescale_actions,
        },
        "state": describe_state(spec),
        "params_sha256": params_sha256(spec.params),
        "files": {name: {"sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()},
        "onnx": {"inputs": inputs, "outputs": outputs, "opset": OPSET},
        "jax": {"platforms": platforms, "inputs": inputs, "outputs": outputs},
        "metadata": spec.metadata,
    }


def export_policy(spec: PolicySpec, out_dir: str | Path) -> Path:
    """Write policy.onnx, policy.jax and policy.json into `out_dir` (replaced as a whole, atomically)."""
    out_dir = Path(out_dir).absolute()
    _check_outputs(spec)
    fn = policy_function(spec)
    inputs, outputs = _io_names(spec)
    doc = f"offline-mbrl policy for {spec.env_id or 'a robot'}: raw observation -> clipped action"
    onnx_bytes = to_onnx(fn, _example_inputs(spec), inputs, outputs, doc=doc).SerializeToString()
    jax_bytes, platforms = export_jax(spec)
    files = {ONNX_FILE: onnx_bytes, JAX_FILE: jax_bytes}
    description = describe(spec, files, platforms)

    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir}: exists and is not a directory; choose another --out")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        (tmp / JSON_FILE).write_text(json.dumps(description, indent=1) + "\n")
        old = None
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{tmp.name[-8:]}")
            out_dir.rename(old)
        tmp.rename(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def verify_export(spec: PolicySpec, export_dir: str | Path, count: int = 1000, seed: int = 0) -> float:
    """Max |action difference| between onnxruntime on policy.onnx and the JAX policy, over `count` observations
    drawn around the normalizer's range and far outside it. Raises if it exceeds 1e-5 (a translation bug)."""
    rng = np.random.default_rng(seed)
    if spec.obs_low is not None:
        mean, std = (spec.obs_low + spec.obs_high) / 2, (spec.obs_high - spec.obs_low) / (2 * OBS_CLIP_STD)
    else:
        mean = spec.obs_mean if spec.obs_mean is not None else np.zeros(spec.obs_dim, np.float32)
        std = spec.obs_std if spec.obs_std is not None else np.ones(spec.obs_dim, np.float32)
    # Half around the data, half far outside it (clipped by the envelope; without one, float32 round-off
    # grows with the input's size, so only moderately large inputs are compared).
    far = 100.0 if spec.obs_low is not None else 3.0
    scale = np.where(np.arange(count) % 2 == 0, 1.0, far)[:, None]
    obs = (mean + std * scale * rng.standard_normal((count, spec.obs_dim))).astype(np.float32)
    runner = PolicyRunner(export_dir)
    fn = jax.jit(jax.vmap(policy_function(spec)))
    if not spec.recurrent:
        worst = float(np.max(np.abs(runner(obs) - np.asarray(fn(obs)))))
    else:  # episodes in lockstep, each side carrying its own state: round-off must not accumulate
        steps = 20
        episodes = max(count // steps, 1)
        obs = np.resize(obs, (steps, episodes, spec.obs_dim))
        rewards = rng.standard_normal((steps, episodes)).astype(np.float32)
        carry = [np.broadcast_to(leaf["initial"], (episodes, *leaf["initial"].shape)) for leaf in carry_leaves(spec)]
        prev_action, prev_reward = np.zeros((episodes, spec.act_dim), np.float32), np.zeros(episodes, np.float32)
        runner.reset(episodes)
        worst = 0.0
        for t in range(steps):
            first = np.full(episodes, t == 0)
            action, prev_action, *carry = fn(obs[t], prev_action, prev_reward, first, *carry)
            worst = max(worst, float(np.max(np.abs(runner(obs[t]) - np.asarray(action)))))
            prev_reward = rewards[t]
            runner.give_reward(prev_reward)
    if not worst <= 1e-5:
        raise RuntimeError(f"{export_dir}: the ONNX policy differs from the JAX policy by {worst:.2e} (> 1e-5)")
    return worst
