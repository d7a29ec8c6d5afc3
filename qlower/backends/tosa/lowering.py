"""IR -> TOSA lowering: the registry of per-op lowerings and the context they share.

Each IR op kind has one small function in ``LOWERINGS`` (registered with
``@lowering``, in the style of torch._inductor's lowering table) that reads
its operands' TOSA tensors from the context and returns the tensor holding its
result. Concerns shared by many ops live once, in ``Lowerer``: constant
folding of layout changes, requantization (always through ``qlower.ir.requant``),
clamping to a dtype-dependent TOSA form, casts.

Guarantee: every emitted tensor has exactly the IR value's dtype and shape, so
the payload's boundary types are the subgraph's IR types.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tosa_serializer as ts

from qlower.backends.tosa.serializer import (
    DT,
    NUMPY_OF,
    GraphWriter,
    Tensor,
    attr,
    clamp_attr,
    dtype_range,
    rescale_attr,
    tosa_dtype,
)
from qlower.backends.tosa.support import Profile, check
from qlower.errors import CompileError, UnsupportedOpError
from qlower.ir import DType, Graph, Op, Value, requant
from qlower.registry import Registry

Op_ = ts.Op
LoweringFn = Callable[["Lowerer", Op], Tensor]
LOWERINGS: Registry[str, LoweringFn] = Registry("TOSA lowerings")
MAX_CONCAT_INPUTS = 64  # TOSA 1.0 level 8K: MAX_TENSOR_LIST_SIZE


def lowering(*kinds: str):
    return LOWERINGS.register(*kinds)


def describe(op: Op) -> str:
    """``kind %value (origin)`` for error messages."""
    name = f"{op.kind} %{op.results[0].name}" if op.results else op.kind
    return f"{name} at {op.origin.describe()}" if op.origin else name


class Lowerer:
    """State of one lowering: the writer and the TOSA tensor of every IR value."""

    def __init__(self, graph: Graph, profile: Profile, divide_by_multiply: bool = False,
                 byte_tables: bool = False) -> None:
        self.graph = graph
        self.profile = profile
        self.divide_by_multiply = divide_by_multiply   # intdiv by a constant without INTDIV (division.py)
        self.byte_tables = byte_tables                 # narrow int16 lookups as int8 TABLEs, not GATHER
        self.w = GraphWriter()
        self.env: dict[Value, Tensor] = {}

    # -- operands ---------------------------------------------------------------------
    def t(self, v: Value) -> Tensor:
        return self.env[v]

    def scalar(self, value: float, dtype: DType | object) -> Tensor:
        return self.w.scalar(value, tosa_dtype(dtype) if isinstance(dtype, DType) else dtype)

    def zero_point(self, t: Tensor, zp: int | float) -> Tensor:
        """A zero-point operand for ``t`` (0.0 for float tensors)."""
        return self.w.scalar(0.0 if t.dtype == DT.FP32 else int(zp), t.dtype)

    def emit(self, op: object, inputs: Sequence[Tensor], shape: Sequence[int], dtype: object,
             attribute: object) -> Tensor:
        return self.w.op(op, inputs, shape, dtype, attribute)

    # -- layout (constants are folded, runtime tensors get an operator) -----------------
    def reshape(self, t: Tensor, shape: Sequence[int]) -> Tensor:
        shape = tuple(int(d) for d in shape)
        if shape == t.shape:
            return t
        if t.is_const:
            return self.w.const(t.data.reshape(shape), t.dtype)
        return self.emit(Op_.RESHAPE, [t, self.w.shape(shape)], shape, t.dtype, attr("Reshape"))

    def transpose(self, t: Tensor, perm: Sequence[int]) -> Tensor:
        perm = tuple(perm)
        if perm == tuple(range(t.rank)):
            return t
        if t.is_const:
            return self.w.const(np.transpose(t.data, perm), t.dtype)
        shape = tuple(t.shape[p] for p in perm)
        return self.emit(Op_.TRANSPOSE, [t], shape, t.dtype, attr("Transpose", list(perm)))

    def slice(self, t: Tensor, start: Sequence[int], size: Sequence[int]) -> Tensor:
        start, size = tuple(start), tuple(size)
        if start == (0,) * t.rank and size == t.shape:
            return t
        if t.is_const:
            return self.w.const(t.data[tuple(slice(a, a + n) for a, n in zip(start, size))], t.dtype)
        return self.emit(Op_.SLICE, [t, self.w.shape(start), self.w.shape(size)], size, t.dtype, attr("Slice"))

    def concat(self, ts_: Sequence[Tensor], axis: int) -> Tensor:
        if len(ts_) == 1:
            return ts_[0]
        if all(t.is_const for t in ts_):
            return self.w.const(np.concatenate([t.data for t in ts_], axis), ts_[0].dtype)
        if len(ts_) > MAX_CONCAT_INPUTS:
            chunks = [ts_[i:i + MAX_CONCAT_INPUTS] for i in range(0, len(ts_), MAX_CONCAT_INPUTS)]
            return self.concat([self.concat(c, axis) for c in chunks], axis)
        shape = list(ts_[0].shape)
        shape[axis] = sum(t.shape[axis] for t in ts_)
        return self.emit(Op_.CONCAT, list(ts_), shape, ts_[0].dtype, attr("Concat", axis))

    # -- arithmetic helpers -----------------------------------------------------------
    def rescale(self, t: Tensor, mult: requant.Multiplier, in_zp: int, out_zp: int, out_dtype: object,
                double_round: bool = False) -> Tensor:
        """TOSA RESCALE (scale32) of ``t`` to ``out_dtype``, saturating to that dtype.

        Per channel (along the last axis) when ``mult`` has several entries. int16
        zero points, which RESCALE can't take, go through int32 arithmetic.
        """
        if t.dtype == DT.INT16 and in_zp != 0:
            t = self.add_const(self.cast(t, DT.INT32), -in_zp)
            in_zp = 0
        if out_dtype == DT.INT16 and out_zp != 0:
            wide = self.rescale(t, mult, in_zp, 0, DT.INT32, double_round)
            lo, hi = dtype_range(DT.INT16)
            return self.cast(self.add_const(self.clamp(wide, lo - out_zp, hi - out_zp), out_zp), DT.INT16)
        per_channel = mult.per_channel
        if per_channel:
            m = self.w.const(mult.multiplier.astype(np.int32).reshape(-1), DT.INT32)
            s = self.w.const(mult.shift.astype(np.int8).reshape(-1), DT.INT8)
        else:
            m = self.w.scalar(int(mult.multiplier.reshape(-1)[0]), DT.INT32)
            s = self.w.scalar(int(mult.shift.reshape(-1)[0]), DT.INT8)
        if double_round:
            self.w.extensions.add("doubleround")
        return self.emit(Op_.RESCALE, [t, m, s, self.w.scalar(in_zp, t.dtype), self.w.scalar(out_zp, out_dtype)],
                         t.shape, out_dtype, rescale_attr(double_round, per_channel))

    def identity_rescale(self, t: Tensor, out_zp: int, out_dtype: object) -> Tensor:
        """Add ``out_zp`` and saturate to ``out_dtype`` with a ratio-1 RESCALE."""
        return self.rescale(t, requant.quantize_multiplier(1.0), 0, out_zp, out_dtype)

    def clamp(self, t: Tensor, lo: float, hi: float) -> Tensor:
        """Clamp to [lo, hi] (bounds beyond the dtype are cut to it).

        CLAMP takes int8 (and int16 with the int16 extension) and float; int32
        has no CLAMP in TOSA-1.0+INT, so it is MAXIMUM then MINIMUM.
        """
        if t.dtype == DT.FP32:
            return self.emit(Op_.CLAMP, [t], t.shape, t.dtype, clamp_attr(float(lo), float(hi), t.dtype))
        dlo, dhi = dtype_range(t.dtype)
        lo, hi = max(int(lo), dlo), min(int(hi), dhi)
        if (lo, hi) == (dlo, dhi):
            return t
        if t.dtype in (DT.INT8, DT.INT16):
            return self.emit(Op_.CLAMP, [t], t.shape, t.dtype, clamp_attr(lo, hi, t.dtype))
        nan = ts.NanPropagationMode.PROPAGATE
        ones = (1,) * t.rank
        if lo > dlo:
            t = self.emit(Op_.MAXIMUM, [t, self.w.const(np.full(ones, lo, np.int32))], t.shape, t.dtype,
                          attr("Maximum", nan))
        if hi < dhi:
            t = self.emit(Op_.MINIMUM, [t, self.w.const(np.full(ones, hi, np.int32))], t.shape, t.dtype,
                          attr("Minimum", nan))
        return t

    def add_const(self, t: Tensor, value: int | np.ndarray) -> Tensor:
        """``t + value`` (int32 or float; ``value`` broadcasts over equal rank)."""
        arr = np.asarray(value, dtype=NUMPY_OF[t.dtype])
        if not arr.any():
            return t
        arr = arr.reshape(arr.shape if arr.ndim == t.rank else (1,) * t.rank)
        return self.emit(Op_.ADD, [t, self.w.const(arr, t.dtype)], t.shape, t.dtype, attr("Add"))

    def cast(self, t: Tensor, dtype: object) -> Tensor:
        """TOSA CAST: int widening and int <-> float conversions (float -> int rounds half to even)."""
        if dtype == t.dtype:
            return t
        return self.emit(Op_.CAST, [t], t.shape, dtype, attr("Cast"))

    def saturate(self, t: Tensor, dtype: object) -> Tensor:
        """Convert an integer tensor to ``dtype``, saturating (TOSA's CAST of ints wraps)."""
        if dtype == t.dtype:
            return t
        if np.iinfo(NUMPY_OF[dtype]).bits > np.iinfo(NUMPY_OF[t.dtype]).bits:
            return self.cast(t, dtype)
        lo, hi = dtype_range(dtype)
        return self.cast(self.clamp(self.cast(t, DT.INT32), lo, hi), dtype)


# -- the driver ---------------------------------------------------------------------------

@dataclass
class Lowered:
    """A lowered subgraph: the writer (still open for trace outputs) and the name maps."""

    writer: GraphWriter
    input_names: list[str]
    output_names: list[str]
    tensor_map: dict[str, str]  # TOSA tensor -> IR value name


def unsupported(op: Op, profile: Profile) -> UnsupportedOpError | None:
    reason = check(op, profile)
    if reason is None:
        return None
    return UnsupportedOpError(f"{describe(op)} can't be lowered to {profile.spec}: {reason}")


def emit_tosa(graph: Graph, profile: Profile, divide_by_multiply: bool = False,
              byte_tables: bool = False) -> Lowered:
    """Emit ``graph`` as one TOSA 1.0 graph (inputs and outputs in the graph's order); with
    ``divide_by_multiply``, an ``intdiv`` by a constant is written without INTDIV (division.py),
    with ``byte_tables`` an int16 -> int32 lookup over at most 256 codes as int8 TABLEs."""
    # constants last: a float weight is better reported through the op that reads it
    for op in sorted(graph.ops, key=lambda op: op.kind == "constant"):
        err = unsupported(op, profile)
        if err is not None:
            raise err
    lw = Lowerer(graph, profile, divide_by_multiply, byte_tables)
    for v in graph.inputs:
        lw.env[v] = lw.w.input(v.shape, tosa_dtype(v.dtype))
    for op in graph.ops:
        lw.w.current = op
        try:
            result = LOWERINGS[op.kind](lw, op)
        except (ValueError, KeyError, requant.RequantRangeError) as e:
            raise CompileError(f"lowering {describe(op)} to {profile.spec} failed: {e}") from e
        want = op.result.type
        if result.shape != want.shape or result.dtype != tosa_dtype(want.dtype):
            raise CompileError(f"lowering {describe(op)} produced {result.dtype.name}{list(result.shape)}, "
                               f"expected {want}: a bug in the TOSA lowering")
        lw.env[op.result] = result
    lw.w.current = None
    outputs = [lw.w.mark_output(lw.env[v]) for v in graph.outputs]
    # A value lowered to no operator (a no-op clamp, reshape to the same shape) shares its
    # operand's tensor; the map names the first value. Constants never emitted as such are absent.
    tensor_map: dict[str, str] = {}
    for v in graph.values():
        t = lw.env.get(v)
        if t is not None and t.name is not None and t.name not in tensor_map:
            tensor_map[t.name] = v.name
    return Lowered(lw.w, [lw.env[v].name for v in graph.inputs], outputs, tensor_map)


# The per-op lowerings register themselves into LOWERINGS (they import this module).
from qlower.backends.tosa import lower_elementwise, lower_layout, lower_linear, lower_quant, lower_reductions  # noqa: E402, F401, I001
