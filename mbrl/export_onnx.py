"""Translate a per-sample JAX function into an ONNX graph with a dynamic batch axis.

Why not jax2onnx: its 0.17 release pins orbax-checkpoint < 0.11.37 (the project uses 0.12) and its
first conversion imports every plugin module (~1,500, ~40 s on a 2-core machine). A policy is a small
graph, so we walk its jaxpr and emit the few ONNX operators it needs with `onnx.helper`.

How: the function is traced on ONE observation (static shapes, no symbolic dims), then every value
that depends on an input is emitted with an extra leading batch axis ("batched"), as `jax.vmap`
would. Values that do not depend on an input (parameters, normalizer, bounds and anything computed
from them alone) are folded to constants by evaluating the primitive with JAX, so only input-
dependent operators reach the graph. Calls (jit, custom_jvp/vjp, remat) are inlined, a `scan` is
unrolled (its length is static), a scatter with constant indices becomes an ONNX Gather.
ONNX runtimes have next to no complex arithmetic, so a complex value (an LRU's diagonal recurrence)
is carried as two real tensors, its real and imaginary parts; the graph's inputs and outputs are
real. A primitive outside the supported set raises `OnnxExportError` naming it, never a silent wrong
graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Literal

from mbrl.core.errors import MissingDependencyError, UserError

OPSET = 18  # reduce ops take axes as an input from opset 18 on
IR_VERSION = 9  # opset 18 needs IR >= 8; onnxruntime >= 1.16 reads IR 9
_INT64_MAX = np.iinfo(np.int64).max

_CALL_PRIMITIVES = {
    "jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
    "custom_vjp_call_jaxpr", "remat", "checkpoint", "remat2", "custom_lin",
}  # fmt: skip
_UNARY = {
    "tanh": "Tanh", "exp": "Exp", "log": "Log", "logistic": "Sigmoid", "neg": "Neg", "abs": "Abs",
    "sqrt": "Sqrt", "sign": "Sign", "floor": "Floor", "ceil": "Ceil", "erf": "Erf", "sin": "Sin",
    "cos": "Cos", "not": "Not", "copy": "Identity", "copy_p": "Identity", "optimization_barrier": "Identity",
}  # fmt: skip
_BINARY = {
    "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max", "min": "Min", "pow": "Pow",
    "eq": "Equal", "lt": "Less", "gt": "Greater", "le": "LessOrEqual", "ge": "GreaterOrEqual",
    "and": "And", "or": "Or", "xor": "Xor", "rem": "Mod",
}  # fmt: skip
_REDUCE = {"reduce_sum": "ReduceSum", "reduce_max": "ReduceMax", "reduce_min": "ReduceMin", "reduce_prod": "ReduceProd"}
# Linear in their complex operands: the real and imaginary parts go through the same real operator.
_COMPONENTWISE = {
    "add", "sub", "neg", "copy", "copy_p", "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose",
    "concatenate", "stack", "split", "slice", "select_n", "reduce_sum", "scatter-add", "scatter",
}  # fmt: skip
_MAX_UNROLL = 1024  # scan steps: the unrolled graph grows with the length


class OnnxExportError(UserError):
    """The policy uses an operation this exporter cannot express in ONNX."""


def _onnx():
    try:
        import onnx
    except ImportError:
        raise MissingDependencyError(
            "exporting to ONNX needs the 'onnx' extra: pip install 'offline-mbrl[onnx]'"
        ) from None
    return onnx


class _Value:
    """A jaxpr value: a host constant, or a named graph tensor (batched: has the leading batch axis).
    A batched complex value is two real tensors: `name` its real part, `imag` its imaginary part."""

    __slots__ = ("const", "name", "imag", "batched", "shape", "dtype")

    def __init__(self, *, const=None, name=None, imag=None, batched=False, shape=(), dtype=np.float32):
        self.const, self.name, self.imag, self.batched = const, name, imag, batched
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


def _constant(array) -> _Value:
    array = np.asarray(array)
    return _Value(const=array, shape=array.shape, dtype=array.dtype)


def _is_complex(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.complexfloating)


def _real_dtype(dtype) -> np.dtype:
    return np.finfo(np.dtype(dtype)).dtype  # complex64 -> float32, complex128 -> float64


def _part(value: _Value, k: int) -> _Value:
    """The real (k=0) or imaginary (k=1) part of a complex value, as a real value; a real value as it is."""
    if not _is_complex(value.dtype):
        return value
    dtype = _real_dtype(value.dtype)
    if value.const is not None:
        return _constant((value.const.real if k == 0 else value.const.imag).astype(dtype))
    return _Value(name=value.name if k == 0 else value.imag, batched=True, shape=value.shape, dtype=dtype)


class _Graph:
    def __init__(self, onnx):
        self.onnx = onnx
        self.nodes: list = []
        self.initializers: dict[str, Any] = {}
        self._count = 0
        self.batch_ref: str | None = None  # a batched graph input, to read the batch size from

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def node(self, op: str, inputs: Sequence[str], hint: str | None = None, **attrs) -> str:
        out = self.fresh(hint or op.lower())
        self.nodes.append(self.onnx.helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def const(self, array, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.initializers[name] = self.onnx.numpy_helper.from_array(np.asarray(array), name)
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, np.int64), "shape")

    def tensor(self, value: _Value) -> str:
        return value.name if value.const is None else self.const(value.const)

    def batched_like(self, value: _Value) -> str:
        """`value` with the leading batch axis (a constant is broadcast to the batch size)."""
        if value.batched:
            return value.name
        source = self.tensor(value)
        batch = self.node("Slice", [self.node("Shape", [self.batch_ref]), self.ints([0]), self.ints([1])])
        target = self.node("Concat", [batch, self.ints(list(value.shape))], axis=0)
        return self.node("Expand", [self.node("Unsqueeze", [source, self.ints([0])]), target])

    def prune(self, outputs: Sequence[str]) -> None:
        """Drop nodes and constants that no output depends on (dead branches of the traced function)."""
        needed = set(outputs)
        kept = []
        for node in reversed(self.nodes):
            if any(o in needed for o in node.output):
                kept.append(node)
                needed.update(node.input)
        self.nodes = kept[::-1]
        self.initializers = {k: v for k, v in self.initializers.items() if k in needed}


def _align(graph: _Graph, value: _Value, out_rank: int) -> str:
    """A name for `value` that broadcasts like its per-sample shape against per-sample rank `out_rank`."""
    name = graph.tensor(value)
    if value.batched and len(value.shape) < out_rank:  # (B,) scalar-per-sample against (B, ...) arrays
        name = graph.node("Unsqueeze", [name, graph.ints(list(range(1 + len(value.shape), 1 + out_rank)))])
    return name


def _onnx_dtype(onnx, dtype) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _dot_general(graph: _Graph, lhs: _Value, rhs: _Value, params) -> str:
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    # The layer of an MLP: batched (B, n) @ constant (n, m) is MatMul, which broadcasts over B.
    if lhs.batched and not rhs.batched and not lb and len(lhs.shape) == 1 and len(rhs.shape) == 2 and lc == (0,) and rc == (0,):
        return graph.node("MatMul", [lhs.name, graph.tensor(rhs)])
    letters = iter("abcdefghijklmnopqrstuvwxy")
    lhs_sub = [next(letters) for _ in lhs.shape]
    rhs_sub = [next(letters) for _ in rhs.shape]
    for i, j in zip(lc + lb, rc + rb):
        rhs_sub[j] = lhs_sub[i]
    out_sub = [lhs_sub[i] for i in lb]
    out_sub += [s for i, s in enumerate(lhs_sub) if i not in lc + lb]
    out_sub += [s for j, s in enumerate(rhs_sub) if j not in rc + rb]
    z = "z"  # the batch axis
    prefix = lambda v: z if v.batched else ""  # noqa: E731
    equation = f"{prefix(lhs)}{''.join(lhs_sub)},{prefix(rhs)}{''.join(rhs_sub)}->{z}{''.join(out_sub)}"
    return graph.node("Einsum", [graph.tensor(lhs), graph.tensor(rhs)], equation=equation)


def _emit(graph: _Graph, eqn, ins: list[_Value]) -> list[str]:
    """ONNX nodes for one primitive with at least one batched input; the names of its outputs."""
    prim = eqn.primitive.name
    names = _emit_math(graph, prim, eqn.params, ins, len(eqn.outvars[0].aval.shape))
    if names is None:
        names = _emit_layout(graph, prim, eqn.params, ins, eqn.outvars)
    if names is None:
        raise OnnxExportError(
            f"ONNX export: the policy uses the JAX primitive '{prim}', which this exporter does not translate "
            f"(supported: elementwise math, dot_general, reshape/broadcast/transpose/slice/split/concatenate/stack, "
            f"reductions, scan, scatter with constant indices, complex add/mul/select)"
        )
    return names


def _emit_math(graph: _Graph, prim: str, params, ins: list[_Value], out_rank: int) -> list[str] | None:
    """Elementwise primitives and dot_general; None for any other."""
    onnx = graph.onnx
    if prim in _UNARY:
        return [graph.node(_UNARY[prim], [ins[0].name])]
    if prim in _BINARY or prim == "ne":
        a, b = (_align(graph, v, out_rank) for v in ins)
        if prim == "ne":
            return [graph.node("Not", [graph.node("Equal", [a, b])])]
        return [graph.node(_BINARY[prim], [a, b])]
    if prim == "clamp":  # clamp(lo, x, hi); ONNX Clip needs scalar bounds, Max/Min broadcast
        lo, x, hi = (_align(graph, v, out_rank) for v in ins)
        return [graph.node("Min", [graph.node("Max", [x, lo]), hi])]
    if prim == "select_n":
        if len(ins) != 3:
            raise OnnxExportError(f"ONNX export: select_n with {len(ins) - 1} cases is not supported (2 only)")
        pred, false_case, true_case = (_align(graph, v, out_rank) for v in ins)
        if ins[0].dtype != np.bool_:
            pred = graph.node("Cast", [pred], to=onnx.TensorProto.BOOL)
        return [graph.node("Where", [pred, true_case, false_case])]
    if prim == "integer_pow":
        return [graph.node("Pow", [ins[0].name, graph.const(np.asarray(params["y"], ins[0].dtype))])]
    if prim == "square":
        return [graph.node("Mul", [ins[0].name, ins[0].name])]
    if prim == "rsqrt":
        return [graph.node("Reciprocal", [graph.node("Sqrt", [ins[0].name])])]
    if prim == "log1p":
        return [graph.node("Log", [graph.node("Add", [ins[0].name, graph.const(np.asarray(1, ins[0].dtype))])])]
    if prim == "expm1":
        return [graph.node("Sub", [graph.node("Exp", [ins[0].name]), graph.const(np.asarray(1, ins[0].dtype))])]
    if prim == "is_finite":
        x = ins[0].name
        return [graph.node("Not", [graph.node("Or", [graph.node("IsNaN", [x]), graph.node("IsInf", [x])])])]
    if prim == "convert_element_type":
        return [graph.node("Cast", [ins[0].name], to=_onnx_dtype(onnx, params["new_dtype"]))]
    if prim == "dot_general":
        return [_dot_general(graph, ins[0], ins[1], params)]
    return None


def _emit_layout(graph: _Graph, prim: str, params, ins: list[_Value], outs) -> list[str] | None:
    """Primitives that move, reduce, gather or scatter values; None for any other."""
    onnx = graph.onnx
    if prim in ("reshape", "squeeze", "expand_dims"):
        return [graph.node("Reshape", [ins[0].name, graph.ints([0, *outs[0].aval.shape])])]
    if prim == "broadcast_in_dim":
        shape = tuple(params["shape"])
        kept = [1] * len(shape)
        for src, dst in enumerate(params["broadcast_dimensions"]):
            kept[dst] = ins[0].shape[src]
        reshaped = graph.node("Reshape", [ins[0].name, graph.ints([0, *kept])])
        return [graph.node("Expand", [reshaped, graph.ints([1, *shape])])]
    if prim == "transpose":
        return [graph.node("Transpose", [ins[0].name], perm=[0, *(p + 1 for p in params["permutation"])])]
    if prim in _REDUCE:
        axes = graph.ints([a + 1 for a in params["axes"]])
        return [graph.node(_REDUCE[prim], [ins[0].name, axes], keepdims=0)]
    if prim == "concatenate":
        parts = [graph.batched_like(v) for v in ins]
        return [graph.node("Concat", parts, axis=params["dimension"] + 1)]
    if prim == "stack":
        axis = graph.ints([params["axis"] + 1])
        parts = [graph.node("Unsqueeze", [graph.batched_like(v), axis]) for v in ins]
        return [graph.node("Concat", parts, axis=params["axis"] + 1)]
    if prim == "split":
        names = [graph.fresh("split") for _ in outs]
        sizes = graph.ints([int(s) for s in params["sizes"]])
        graph.nodes.append(onnx.helper.make_node("Split", [ins[0].name, sizes], names, axis=params["axis"] + 1))
        return names
    if prim == "slice":
        rank = len(ins[0].shape)
        strides = params["strides"] or (1,) * rank
        starts = graph.ints([0, *params["start_indices"]])
        ends = graph.ints([_INT64_MAX, *params["limit_indices"]])
        return [graph.node("Slice", [ins[0].name, starts, ends, graph.ints(range(rank + 1)), graph.ints([1, *strides])])]
    if prim == "argmax" or prim == "argmin":
        (axis,) = params["axes"]
        op = "ArgMax" if prim == "argmax" else "ArgMin"
        index = graph.node(op, [ins[0].name], axis=axis + 1, keepdims=0)
        return [graph.node("Cast", [index], to=_onnx_dtype(onnx, params["index_dtype"]))]
    if prim in ("scatter-add", "scatter"):
        return [_scatter(graph, prim, ins, params)]
    return None


def _scatter(graph: _Graph, prim: str, ins: list[_Value], params) -> str:
    """scatter(-add) with constant indices: each output position takes at most one update, so the
    scatter is a Gather of the updates (plus a zero column for untouched positions) at a constant map."""
    operand, indices, updates = ins
    if indices.const is not None and int(np.prod(updates.shape)) < 2**24:  # exact as float32 codes
        n = int(np.prod(updates.shape))
        zeros = np.zeros(operand.shape, np.float32)
        place = lambda u: np.asarray(jax.lax.scatter_add(zeros, indices.const, u, params["dimension_numbers"],  # noqa: E731
                                                         mode=params["mode"]))
        count = place(np.ones(updates.shape, np.float32))
        if count.max(initial=0) <= 1:
            code = place(np.arange(1, n + 1, dtype=np.float32).reshape(updates.shape))
            index_map = np.where(count > 0, code - 1, n).astype(np.int64)
            flat = graph.node("Reshape", [graph.batched_like(updates), graph.ints([0, n])])
            padded = graph.node("Concat", [flat, graph.batched_like(_constant(np.zeros(1, updates.dtype)))], axis=1)
            gathered = _Value(name=graph.node("Gather", [padded, graph.ints(index_map)], axis=1), batched=True,
                              shape=operand.shape, dtype=updates.dtype)
            rank = len(operand.shape)
            if prim == "scatter-add":
                return graph.node("Add", [_align(graph, operand, rank), gathered.name])
            mask = graph.const(count > 0)
            return graph.node("Where", [mask, gathered.name, _align(graph, operand, rank)])
    raise OnnxExportError(f"ONNX export: '{prim}' is translated only with constant indices that hit each position at most once")


def _emit_complex(graph: _Graph, eqn, ins: list[_Value]) -> list:
    """Nodes for a primitive with a complex input or output: complex values as (real, imaginary) pairs of
    real tensors. Returns, per output, a name (a real output) or a pair of names (a complex one)."""
    prim = eqn.primitive.name
    out = eqn.outvars[0].aval
    rank = len(out.shape)
    if prim in _COMPONENTWISE:
        re = _emit(graph, eqn, [_part(v, 0) for v in ins])
        im = _emit(graph, eqn, [_part(v, 1) for v in ins])
        return [(r, i) if _is_complex(v.aval.dtype) else r for r, i, v in zip(re, im, eqn.outvars)]
    if prim == "complex":
        return [(graph.batched_like(ins[0]), graph.batched_like(ins[1]))]
    if prim in ("real", "imag"):
        return [graph.batched_like(_part(ins[0], 0 if prim == "real" else 1))]
    if prim == "convert_element_type" and _is_complex(out.dtype):
        dtype = _real_dtype(out.dtype)
        if _is_complex(ins[0].dtype):
            re, im = (graph.batched_like(_part(ins[0], k)) for k in (0, 1))
        else:
            re = graph.node("Cast", [ins[0].name], to=_onnx_dtype(graph.onnx, dtype))
            im = graph.batched_like(_constant(np.zeros(ins[0].shape, dtype)))
        if _is_complex(ins[0].dtype) and _real_dtype(ins[0].dtype) != dtype:
            re, im = (graph.node("Cast", [n], to=_onnx_dtype(graph.onnx, dtype)) for n in (re, im))
        return [(re, im)]
    if prim == "convert_element_type":  # complex -> real keeps the real part, as numpy and lax do
        return [graph.node("Cast", [_part(ins[0], 0).name], to=_onnx_dtype(graph.onnx, out.dtype))]
    if prim == "mul":  # (a + bi)(c + di) = (ac - bd) + (ad + bc)i
        (a, b), (c, d) = ((_part(v, 0), _part(v, 1)) for v in ins)
        arith = lambda op, x, y: _arith(graph, op, x, y, rank)  # noqa: E731
        re = arith("Sub", arith("Mul", a, c), arith("Mul", b, d))
        im = arith("Add", arith("Mul", a, d), arith("Mul", b, c))
        return [(graph.batched_like(re), graph.batched_like(im))]
    raise OnnxExportError(
        f"ONNX export: the policy uses the JAX primitive '{prim}' on complex values, which this exporter does not "
        f"translate (supported on complex values: complex, real, imag, add, sub, mul, select, shape ops, reduce_sum)"
    )


def _arith(graph: _Graph, op: str, x: _Value, y: _Value, rank: int) -> _Value:
    """x op y for real values; folded on the host when both are constants."""
    if x.const is not None and y.const is not None:
        fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op]
        return _constant(fn(x.const, y.const).astype(x.dtype))
    shape = np.broadcast_shapes(x.shape, y.shape)
    name = graph.node(op, [_align(graph, x, rank), _align(graph, y, rank)])
    return _Value(name=name, batched=True, shape=shape, dtype=x.dtype)


def _index(graph: _Graph, value: _Value, i: int) -> _Value:
    """value[i] along its first per-sample axis (a scan's step)."""
    if value.const is not None:
        return _constant(value.const[i])
    shape = value.shape[1:]
    if _is_complex(value.dtype):
        re, im = (_index(graph, _part(value, k), i) for k in (0, 1))
        return _Value(name=re.name, imag=im.name, batched=True, shape=shape, dtype=value.dtype)
    return _Value(name=graph.node("Gather", [value.name, graph.const(np.asarray(i, np.int64))], axis=1), batched=True,
                  shape=shape, dtype=value.dtype)


def _stack(graph: _Graph, values: list[_Value]) -> _Value:
    """The values stacked along a new first per-sample axis (a scan's stacked outputs)."""
    first = values[0]
    shape = (len(values), *first.shape)
    if all(v.const is not None for v in values):
        return _constant(np.stack([v.const for v in values]))
    if _is_complex(first.dtype):
        re, im = (_stack(graph, [_part(v, k) for v in values]) for k in (0, 1))
        return _Value(name=graph.batched_like(re), imag=graph.batched_like(im), batched=True, shape=shape,
                      dtype=first.dtype)
    axis = graph.ints([1])
    parts = [graph.node("Unsqueeze", [graph.batched_like(v), axis]) for v in values]
    return _Value(name=graph.node("Concat", parts, axis=1), batched=True, shape=shape, dtype=first.dtype)


def _scan(graph: _Graph, eqn, ins: list[_Value]) -> list[_Value]:
    """A `lax.scan` unrolled: its length is static, and a policy's scans are short (one step when acting)."""
    params = eqn.params
    length, num_consts, num_carry = int(params["length"]), int(params["num_consts"]), int(params["num_carry"])
    if length > _MAX_UNROLL:
        raise OnnxExportError(f"ONNX export: a scan of {length} steps would be unrolled into the graph (at most {_MAX_UNROLL})")
    body = params["jaxpr"]
    consts, carry, xs = ins[:num_consts], ins[num_consts : num_consts + num_carry], ins[num_consts + num_carry :]
    steps = range(length - 1, -1, -1) if params["reverse"] else range(length)
    ys_by_step = {}
    for i in steps:
        outs = _run(graph, body.jaxpr, body.consts, consts + carry + [_index(graph, x, i) for x in xs])
        carry, ys_by_step[i] = outs[:num_carry], outs[num_carry:]
    if not length:
        return list(carry) + [_constant(np.zeros(v.aval.shape, v.aval.dtype)) for v in eqn.outvars[num_carry:]]
    num_ys = len(eqn.outvars) - num_carry
    return list(carry) + [_stack(graph, [ys_by_step[i][k] for i in range(length)]) for k in range(num_ys)]


def _subjaxpr(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if sub is not None:
            return sub
    raise OnnxExportError(f"ONNX export: cannot inline the call primitive '{eqn.primitive.name}'")


def _run(graph: _Graph, jaxpr, consts, args: list[_Value]) -> list[_Value]:
    env: dict[Any, _Value] = {}

    def read(var) -> _Value:
        if isinstance(var, Literal):
            return _Value(const=np.asarray(var.val, var.aval.dtype), shape=var.aval.shape, dtype=var.aval.dtype)
        return env[var]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = _Value(const=np.asarray(value), shape=np.shape(value), dtype=np.asarray(value).dtype)
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        if eqn.primitive.name in _CALL_PRIMITIVES:
            sub = _subjaxpr(eqn)
            sub_consts = sub.consts if isinstance(sub, ClosedJaxpr) else []
            sub = sub.jaxpr if isinstance(sub, ClosedJaxpr) else sub
            # custom_vjp_call passes its residual-free primal function first; extra invars are consts.
            results = _run(graph, sub, sub_consts, ins[len(ins) - len(sub.invars):])
        elif not any(v.batched for v in ins):  # fold: it does not depend on an input
            out = eqn.primitive.bind(*(v.const if v.const is not None else None for v in ins), **eqn.params)
            out = out if eqn.primitive.multiple_results else [out]
            results = [_constant(o) for o in out]
        elif eqn.primitive.name == "scan":
            results = _scan(graph, eqn, ins)
        else:
            complex_ = any(_is_complex(v.dtype) for v in ins) or any(_is_complex(v.aval.dtype) for v in eqn.outvars)
            names = _emit_complex(graph, eqn, ins) if complex_ else _emit(graph, eqn, ins)
            results = [
                _Value(name=n[0], imag=n[1], batched=True, shape=v.aval.shape, dtype=v.aval.dtype) if isinstance(n, tuple)
                else _Value(name=n, batched=True, shape=v.aval.shape, dtype=v.aval.dtype)
                for n, v in zip(names, eqn.outvars)
            ]
        for var, value in zip(eqn.outvars, results):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def to_onnx(
    fn: Callable,
    example_args: Sequence[np.ndarray],
    input_names: Sequence[str],
    output_names: Sequence[str],
    doc: str = "",
):
    """An ONNX ModelProto computing `jax.vmap(fn)` on inputs of shape (batch, *example.shape).

    `fn` maps per-sample arrays (the shapes of `example_args`) to one array or a tuple of arrays;
    everything it closes over becomes a constant of the graph.
    """
    onnx = _onnx()
    closed = jax.make_jaxpr(fn)(*example_args)
    graph = _Graph(onnx)
    inputs, args = [], []
    for name, example in zip(input_names, example_args):
        example = np.asarray(example)
        if _is_complex(example.dtype):
            raise OnnxExportError(f"to_onnx: input {name!r} is complex; pass its real and imaginary parts as real arrays")
        inputs.append(onnx.helper.make_tensor_value_info(name, _onnx_dtype(onnx, example.dtype), ["batch", *example.shape]))
        args.append(_Value(name=name, batched=True, shape=example.shape, dtype=example.dtype))
    graph.batch_ref = input_names[0]
    results = _run(graph, closed.jaxpr, closed.consts, args)
    if len(results) != len(output_names):
        raise ValueError(f"to_onnx: the function returns {len(results)} arrays, {len(output_names)} output names given")
    outputs = []
    for name, value in zip(output_names, results):
        if _is_complex(value.dtype):
            raise OnnxExportError(f"to_onnx: output {name!r} is complex; return its real and imaginary parts as real arrays")
        graph.nodes.append(onnx.helper.make_node("Identity", [graph.batched_like(value)], [name]))
        outputs.append(onnx.helper.make_tensor_value_info(name, _onnx_dtype(onnx, value.dtype), ["batch", *value.shape]))
    graph.prune(output_names)
    model = onnx.helper.make_model(
        onnx.helper.make_graph(graph.nodes, "policy", inputs, outputs, list(graph.initializers.values()), doc_string=doc),
        opset_imports=[onnx.helper.make_opsetid("", OPSET)],
        producer_name="offline-mbrl",
        ir_version=IR_VERSION,
    )
    onnx.checker.check_model(model)
    return model
