"""Lowerings of elementwise ops: rescale, clamp, add/sub/mul/intdiv, table, float unary ops, softmax.

Integer ops are exact: RESCALE multipliers come from ``qlower.ir.requant`` (the
same integers the reference interpreter applies), MUL's shift operand is the
IR's shift, and a table is either a 256-entry TABLE (int8 -> int8) or a
GATHER over the IR's table with the index clamped into range (so an input
outside the declared code range can't read out of bounds).
"""

from __future__ import annotations

import math

import numpy as np
import tosa_serializer as ts

from qlower.backends.tosa.division import Magic, division_magic
from qlower.backends.tosa.lowering import Lowerer, lowering
from qlower.backends.tosa.serializer import DT, NUMPY_OF, Tensor, attr, dtype_range, tosa_dtype
from qlower.ir import DType, Op, requant

Op_ = ts.Op


@lowering("rescale")
def _rescale(lw: Lowerer, op: Op) -> Tensor:
    """RESCALE (+ a clamp when the output's [qmin, qmax] is narrower than its dtype)."""
    xv = op.operands[0]
    src, out = xv.type.quant, op.attrs["out"]
    mult = requant.requantize_ratio(np.asarray(src.scale), out.scale[0])
    y = lw.rescale(lw.t(xv), mult, src.zero_point[0], out.zero_point[0], tosa_dtype(out.dtype),
                   double_round=op.attrs["rounding"] == "double")
    return lw.clamp(y, out.qmin, out.qmax)


@lowering("clamp")
def _clamp(lw: Lowerer, op: Op) -> Tensor:
    x = lw.t(op.operands[0])
    lo, hi = op.attrs["min"], op.attrs["max"]
    if x.dtype != DT.FP32:
        lo, hi = math.ceil(lo), math.floor(hi)
    return lw.clamp(x, lo, hi)


_BINARY = {"add": (Op_.ADD, "Add"), "sub": (Op_.SUB, "Sub")}


@lowering("add", "sub")
def _binary(lw: Lowerer, op: Op) -> Tensor:
    tosa_op, attr_kind = _BINARY[op.kind]
    a, b = (lw.t(v) for v in op.operands)
    return lw.emit(tosa_op, [a, b], op.result.shape, tosa_dtype(op.result.dtype), attr(attr_kind))


@lowering("intdiv")
def _intdiv(lw: Lowerer, op: Op) -> Tensor:
    """INTDIV, with a guard against zero divisors unless the divisor is a constant without zeros.

    TOSA leaves division by zero undefined (a REQUIRE) and the TOSA reference
    model dies of SIGFPE on it, taking the process along. The guard divides by
    1 instead and adds ``MUL(big, big, shift=1)``, which overflows exactly where
    the divisor was 0: the reference model then reports TOSA_UNPREDICTABLE,
    an ExecutionError like the reference interpreter's ZeroDivisionError. Where
    the divisor isn't 0 the added term is 0.
    """
    a, b = (lw.t(v) for v in op.operands)
    shape, i32 = op.result.shape, DT.INT32
    if lw.divide_by_multiply and b.is_const and a.shape == tuple(shape):
        divisor = np.unique(b.data)
        magic = division_magic(abs(int(divisor[0]))) if divisor.size == 1 else None
        if magic is not None:
            q = _divide_by_magic(lw, a, magic)
            return q if divisor[0] > 0 else lw.emit(Op_.SUB, [lw.w.const(np.zeros((1,) * a.rank, np.int32)), q],
                                                     shape, i32, attr("Sub"))
    if b.is_const and np.all(b.data != 0):
        return lw.emit(Op_.INTDIV, [a, b], shape, i32, attr("IntDiv"))
    ones = (1,) * b.rank

    def const(v: int) -> Tensor:
        return lw.w.const(np.full(ones, v, np.int32), i32)

    zero = lw.emit(Op_.EQUAL, [b, const(0)], b.shape, DT.BOOL, attr("Equal"))
    safe = lw.emit(Op_.SELECT, [zero, const(1), b], b.shape, i32, attr("Select"))
    big = lw.emit(Op_.SELECT, [zero, const(2**31 - 1), const(0)], b.shape, i32, attr("Select"))
    poison = lw.emit(Op_.MUL, [big, big, lw.scalar(1, DT.INT8)], b.shape, i32, attr("Mul"))
    quotient = lw.emit(Op_.INTDIV, [a, safe], shape, i32, attr("IntDiv"))
    return lw.emit(Op_.ADD, [quotient, poison], shape, i32, attr("Add"))


def _divide_by_magic(lw: Lowerer, a: Tensor, g: Magic) -> Tensor:
    """``trunc(a / g.divisor)`` as RESCALE, ADD, SUB, MUL and MAXIMUM/MINIMUM: the forms of
    division.py, exact for every int32 ``a`` (proven there; ``truncated_quotient`` is the same
    computation in Python)."""
    i32 = DT.INT32
    ones = (1,) * a.rank
    mult = requant.Multiplier(np.array([g.multiplier], np.int64), np.array([g.shift], np.int64))

    def floor_approx(x: Tensor) -> Tensor:
        return lw.rescale(lw.add_const(x, -g.offset), mult, 0, 0, i32)

    def sub(x: Tensor, y: Tensor) -> Tensor:
        return lw.emit(Op_.SUB, [x, y], a.shape, i32, attr("Sub"))

    positive = lw.clamp(a, 0, dtype_range(i32)[1])
    if not g.correct:
        negative = lw.add_const(lw.clamp(a, dtype_range(i32)[0], 0), g.divisor - 1)
        return lw.emit(Op_.ADD, [floor_approx(positive), floor_approx(negative)], a.shape, i32, attr("Add"))

    def floor(x: Tensor) -> Tensor:
        q0 = floor_approx(x)
        d = lw.w.const(np.full(ones, g.divisor, np.int32), i32)
        r0 = sub(x, lw.emit(Op_.MUL, [q0, d, lw.scalar(0, DT.INT8)], a.shape, i32, attr("Mul")))
        step = lw.clamp(lw.add_const(r0, 1 - g.divisor), 0, 1)
        return lw.emit(Op_.ADD, [q0, step], a.shape, i32, attr("Add"))

    magnitude = sub(lw.w.const(np.zeros(ones, np.int32), i32), lw.clamp(a, -dtype_range(i32)[1], 0))
    return sub(floor(positive), floor(magnitude))


@lowering("mul")
def _mul(lw: Lowerer, op: Op) -> Tensor:
    """MUL; its shift operand is the IR's shift for int32 and 0 for float (always present)."""
    a, b = (lw.t(v) for v in op.operands)
    shift = op.attrs["shift"] if op.result.dtype is DType.INT32 else 0
    return lw.emit(Op_.MUL, [a, b, lw.scalar(shift, DT.INT8)], op.result.shape, tosa_dtype(op.result.dtype),
                   attr("Mul"))


def _table_256(table: np.ndarray, offset: int, out_np: type) -> np.ndarray:
    """The IR table re-indexed for TOSA's int8 TABLE (``out = t[x + 128]``).

    Codes the IR table doesn't cover (outside the input's declared range) read
    the nearest entry.
    """
    idx = np.clip(np.arange(-128, 128) + offset, 0, table.size - 1)
    return table[idx].astype(out_np)


MAX_TABLE_BYTES = 3   # byte j is scaled by 2**(8j) in a RESCALE: multiplier 2**30, shift 30 - 8j >= 9


def _byte_tables(lw: Lowerer, x: Tensor, table: np.ndarray, offset: int, out_dtype: object) -> Tensor | None:
    """An int16 -> int32 lookup in a table of at most 256 entries as int8 TABLEs, the LUTs Vela
    runs on every Ethos-U (it has no GATHER on U55), or None when it doesn't fit.

    The codes move into int8 by a ratio-1 RESCALE whose output zero point puts the table's first
    entry at -128; codes beyond the table saturate to its ends, the nearest entry, as the IR's
    table reads them (so any int16 input is looked up exactly). The entries, minus ``base``, are
    written in ``k`` bytes (two's complement, the top one signed), one int8 TABLE per byte; each
    byte is widened to int32 and scaled by ``2**(8j)`` with an exact RESCALE (``(b * 2**30 +
    2**(s-1)) >> s``, ``s = 30 - 8j``: ``b * 2**(8j)`` plus a rounding term below one), summed,
    and ``base`` added back: exactly the entry."""
    out_zp = offset - 128                       # code -offset reads entry 0
    if x.dtype != DT.INT16 or out_dtype != DT.INT32 or table.size > 256 or not -128 <= out_zp <= 127:
        return None
    values = table[np.minimum(np.arange(256), table.size - 1)].astype(np.int64)
    span = int(values.max() - values.min())
    k = max(1, -(-span.bit_length() // 8))
    if k > MAX_TABLE_BYTES:
        return None
    half = 1 << (8 * k - 1)
    base = int(values.min()) + half
    if not dtype_range(DT.INT32)[0] <= base <= dtype_range(DT.INT32)[1]:
        return None
    signed = values - base                      # in [-half, half): k bytes, two's complement
    codes = lw.rescale(x, requant.quantize_multiplier(1.0), 0, out_zp, DT.INT8)
    total = None
    for j in range(k):
        top = j == k - 1
        byte = signed >> (8 * j) if top else (signed >> (8 * j)) & 255
        stored = byte if top else byte - 128    # int8 entries; unsigned bytes read back with zero point -128
        lut = lw.emit(Op_.TABLE, [codes, lw.w.const(stored.astype(np.int8), DT.INT8)], x.shape, DT.INT8, attr("Table"))
        scale = requant.Multiplier(np.array([2**30], np.int64), np.array([30 - 8 * j], np.int64))
        part = lw.rescale(lut, scale, 0 if top else -128, 0, DT.INT32)
        total = part if total is None else lw.emit(Op_.ADD, [total, part], x.shape, DT.INT32, attr("Add"))
    return lw.add_const(total, base)


@lowering("table")
def _table(lw: Lowerer, op: Op) -> Tensor:
    xv = op.operands[0]
    x = lw.t(xv)
    table, offset = np.asarray(op.attrs["table"]), int(op.attrs["offset"])
    out_dtype = tosa_dtype(op.result.dtype)
    out_np = NUMPY_OF[out_dtype]
    if x.dtype == DT.INT8 and out_dtype == DT.INT8:
        t256 = lw.w.const(_table_256(table, offset, out_np), DT.INT8)
        return lw.emit(Op_.TABLE, [x, t256], x.shape, DT.INT8, attr("Table"))
    if lw.byte_tables:
        split = _byte_tables(lw, x, table, offset, out_dtype)
        if split is not None:
            return split
    # GATHER(values [1, K, 1], indices [1, W]) -> [1, W, 1]
    idx = lw.clamp(lw.cast(x, DT.INT32), -offset, table.size - 1 - offset)
    idx = lw.add_const(idx, offset)
    numel = math.prod(x.shape)
    values = lw.w.const(table.astype(out_np).reshape(1, table.size, 1), out_dtype)
    y = lw.emit(Op_.GATHER, [values, lw.reshape(idx, (1, numel))], (1, numel, 1), out_dtype, attr("Gather"))
    return lw.reshape(y, op.result.shape)


@lowering("table_interp")
def _table_interp(lw: Lowerer, op: Op) -> Tensor:
    """TOSA's int16 TABLE (EXT-INT16): the IR op is its definition."""
    x = lw.t(op.operands[0])
    t513 = lw.w.const(np.asarray(op.attrs["table"], np.int16), DT.INT16)
    return lw.emit(Op_.TABLE, [x, t513], x.shape, DT.INT32, attr("Table"))


_FLOAT_UNARY = {"sigmoid": (Op_.SIGMOID, "Sigmoid"), "tanh": (Op_.TANH, "Tanh"), "exp": (Op_.EXP, "Exp"),
                "erf": (Op_.ERF, "Erf"), "reciprocal": (Op_.RECIPROCAL, "Reciprocal")}


@lowering(*_FLOAT_UNARY)
def _float_unary(lw: Lowerer, op: Op) -> Tensor:
    tosa_op, attr_kind = _FLOAT_UNARY[op.kind]
    x = lw.t(op.operands[0])
    return lw.emit(tosa_op, [x], x.shape, x.dtype, attr(attr_kind))


@lowering("softmax")
def _softmax(lw: Lowerer, op: Op) -> Tensor:
    """``exp(x - max) * reciprocal(sum(exp(x - max)))`` along the axis, in float32."""
    x = lw.t(op.operands[0])
    axis = op.attrs["axis"] % x.rank
    reduced = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
    nan = ts.NanPropagationMode.PROPAGATE
    m = lw.emit(Op_.REDUCE_MAX, [x], reduced, DT.FP32, attr("ReduceMax", axis, nan))
    e = lw.emit(Op_.EXP, [lw.emit(Op_.SUB, [x, m], x.shape, DT.FP32, attr("Sub"))], x.shape, DT.FP32, attr("Exp"))
    s = lw.emit(Op_.REDUCE_SUM, [e], reduced, DT.FP32, attr("ReduceSum", axis))
    r = lw.emit(Op_.RECIPROCAL, [s], reduced, DT.FP32, attr("Reciprocal"))
    return lw.emit(Op_.MUL, [e, r, lw.scalar(0, DT.INT8)], x.shape, DT.FP32, attr("Mul"))


# -- one-domain ops: min/max, comparisons, select, logical -------------------------------------
# TOSA 1.0's INT profile has MAXIMUM, MINIMUM, EQUAL, GREATER and GREATER_EQUAL for int32 only:
# narrower codes are cast to int32 (exact), and min/max cast back (exact: the result is one of the codes).

_ONE_DOMAIN = {"minimum": (Op_.MINIMUM, "Minimum"), "maximum": (Op_.MAXIMUM, "Maximum"),
               "equal": (Op_.EQUAL, "Equal"), "greater": (Op_.GREATER, "Greater"),
               "greater_equal": (Op_.GREATER_EQUAL, "GreaterEqual")}


@lowering(*_ONE_DOMAIN)
def _one_domain(lw: Lowerer, op: Op) -> Tensor:
    tosa_op, attr_kind = _ONE_DOMAIN[op.kind]
    a, b = (lw.t(v) for v in op.operands)
    if a.dtype in (DT.INT8, DT.INT16):
        a, b = lw.cast(a, DT.INT32), lw.cast(b, DT.INT32)
    args = (ts.NanPropagationMode.PROPAGATE,) if op.kind in ("minimum", "maximum") else ()
    out_dtype = DT.BOOL if op.result.dtype is DType.BOOL else a.dtype
    y = lw.emit(tosa_op, [a, b], op.result.shape, out_dtype, attr(attr_kind, *args))
    want = tosa_dtype(op.result.dtype) if op.result.dtype is not DType.BOOL else DT.BOOL
    return y if want == out_dtype else lw.cast(y, want)


_LOGICAL = {"logical_and": (Op_.LOGICAL_AND, "LogicalAnd"), "logical_or": (Op_.LOGICAL_OR, "LogicalOr"),
            "logical_xor": (Op_.LOGICAL_XOR, "LogicalXor"), "logical_not": (Op_.LOGICAL_NOT, "LogicalNot")}


@lowering(*_LOGICAL)
def _logical(lw: Lowerer, op: Op) -> Tensor:
    tosa_op, attr_kind = _LOGICAL[op.kind]
    return lw.emit(tosa_op, [lw.t(v) for v in op.operands], op.result.shape, DT.BOOL, attr(attr_kind))


@lowering("select")
def _select(lw: Lowerer, op: Op) -> Tensor:
    c, a, b = (lw.t(v) for v in op.operands)
    return lw.emit(Op_.SELECT, [c, a, b], op.result.shape, tosa_dtype(op.result.dtype), attr("Select"))
