"""Op definitions: rescale, clamp, integer and float arithmetic, comparisons, select, lookup tables, float unary ops and softmax."""

from __future__ import annotations

import numpy as np

from qlower.ir.dtypes import DType
from qlower.ir.graph import TensorType
from qlower.ir.opdefs import REQUIRED, register
from qlower.ir.quant import QuantSpec
from qlower.ir.type_rules import (
    broadcast_shape,
    fail,
    is_float,
    require_float,
    require_quantized,
    same_domain,
)

ROUNDINGS = ("single", "double", "double_half_up", "fp32", "integer_multiplier")   # requant.py


@register("rescale", ("input",), out=REQUIRED, rounding="single")
def _rescale(ops, attrs):
    """Requantize codes to ``out`` (requant module semantics), clamped to out's [qmin, qmax]."""
    (x,) = ops
    q = require_quantized("rescale", x)
    out: QuantSpec = attrs["out"]
    if attrs["rounding"] not in ROUNDINGS:
        raise fail("rescale", f"rounding must be one of {', '.join(ROUNDINGS)}, got {attrs['rounding']!r}")
    if out.is_per_channel:
        raise fail("rescale", "output must be quantized per tensor")
    if q.dynamic and not out.dynamic:
        raise fail("rescale", "a dynamic input can only be rescaled to a dynamic output")
    return (TensorType(x.shape, out.dtype, out),)


@register("clamp", ("input",), min=REQUIRED, max=REQUIRED)
def _clamp(ops, attrs):
    """Clamp to [min, max], in the input's own domain (codes for integers)."""
    (x,) = ops
    if attrs["min"] > attrs["max"]:
        raise fail("clamp", f"min {attrs['min']} > max {attrs['max']}")
    return (x,)


def _binary(kind: str, ops) -> tuple[TensorType, TensorType, tuple[int, ...]]:
    a, b = ops
    return a, b, broadcast_shape(kind, a.shape, b.shape)


def _additive(kind):
    def infer(ops, attrs):
        a, b, shape = _binary(kind, ops)
        if is_float(a):
            require_float(kind, a, b)
            return (TensorType(shape, DType.FLOAT32),)
        qa = require_quantized(kind, a, DType.INT32)
        qb = require_quantized(kind, b, DType.INT32)
        if qa.is_per_channel or qa != qb:
            raise fail(kind, f"int32 operands must share one per-tensor quantization, got {qa} and {qb}")
        _check_wrap(kind, attrs, qa, qb)
        return (TensorType(shape, DType.INT32, qa),)
    infer.__doc__ = (f"Elementwise {kind} with broadcasting; int32 operands share one scale. With ``wrap`` "
                     "(plain integers only: PyTorch's integer tensors) the result wraps around on overflow; "
                     "without it, any integer result must fit its dtype.")
    return infer


def _check_wrap(kind: str, attrs, qa: QuantSpec, qb: QuantSpec) -> None:
    """Wrapping is PyTorch's int32 arithmetic: the frontend asks for it on a model's own integer tensors.
    Arithmetic qlower derives (norms, accumulators) never wraps, even on scale-1 values, so an overflow
    there stays an error instead of a silently wrong number."""
    if attrs["wrap"] and not (qa.is_plain_integer and qb.is_plain_integer and attrs.get("shift", 0) == 0):
        raise fail(kind, "wrap is for plain int32 operands (scale 1, zero point 0) with no shift")


register("add", ("a", "b"), wrap=False)(_additive("add"))
register("sub", ("a", "b"), wrap=False)(_additive("sub"))


@register("mul", ("a", "b"), shift=0, wrap=False)
def _mul(ops, attrs):
    """Elementwise product; int32: ``round(a * b / 2**shift)``, scale s_a * s_b * 2**shift. With ``wrap``
    (plain integers, shift 0) the product wraps around on overflow like PyTorch's integer tensors."""
    a, b, shape = _binary("mul", ops)
    if is_float(a):
        require_float("mul", a, b)
        return (TensorType(shape, DType.FLOAT32),)
    qa = require_quantized("mul", a, DType.INT32)
    qb = require_quantized("mul", b, DType.INT32)
    _check_wrap("mul", attrs, qa, qb)
    if any(z for z in qa.zero_point + qb.zero_point):
        raise fail("mul", "int32 operands must have zero point 0")
    if qa.is_per_channel and qb.is_per_channel:
        raise fail("mul", "at most one operand may be quantized per channel")
    per = qa if qa.is_per_channel else qb if qb.is_per_channel else None
    sa, sb, k = qa.scale, qb.scale, 2.0 ** attrs["shift"]
    scales = tuple(x * y * k for x in sa for y in sb)
    spec = QuantSpec(DType.INT32, scales, (0,) * len(scales), DType.INT32.min, DType.INT32.max,
                     axis=per.axis if per else None)
    if per is not None and shape[per.axis] != len(scales):
        raise fail("mul", f"per-channel axis {per.axis} has {shape[per.axis]} elements, {len(scales)} scales")
    return (TensorType(shape, DType.INT32, spec),)


@register("intdiv", ("a", "b"))
def _intdiv(ops, attrs):
    """int32 division truncating toward zero; scale s_a / s_b."""
    a, b, shape = _binary("intdiv", ops)
    qa = require_quantized("intdiv", a, DType.INT32)
    qb = require_quantized("intdiv", b, DType.INT32)
    if qa.is_per_channel or qb.is_per_channel or any(qa.zero_point + qb.zero_point):
        raise fail("intdiv", "operands must be per-tensor with zero point 0")
    return (TensorType(shape, DType.INT32, QuantSpec.per_tensor(qa.scale[0] / qb.scale[0], 0, DType.INT32)),)


def _one_domain_binary(kind: str, ops) -> tuple[TensorType, tuple[int, ...]]:
    """Both operands in one per-tensor domain (their codes compare like their values)."""
    a, b, shape = _binary(kind, ops)
    same_domain(kind, (a, b))
    if a.quant is not None and a.quant.is_per_channel:
        raise fail(kind, "operands must be quantized per tensor")
    return a, shape


def _same_domain_binary(kind):
    def infer(ops, attrs):
        a, shape = _one_domain_binary(kind, ops)
        return (TensorType(shape, a.dtype, a.quant),)
    infer.__doc__ = (f"Elementwise {kind} with broadcasting, both operands in one domain (codes of one "
                     "QuantSpec compare like their values); the result keeps it.")
    return infer


register("minimum", ("a", "b"))(_same_domain_binary("minimum"))
register("maximum", ("a", "b"))(_same_domain_binary("maximum"))


@register("select", ("cond", "a", "b"))
def _select(ops, attrs):
    """``a`` where ``cond`` else ``b``, broadcasting; ``cond`` bool, ``a`` and ``b`` in one domain."""
    c, a, b = ops
    if c.dtype is not DType.BOOL:
        raise fail("select", f"cond must be bool, got {c}")
    same_domain("select", (a, b))
    if a.quant is not None and a.quant.is_per_channel:
        raise fail("select", "operands must be quantized per tensor")
    shape = broadcast_shape("select", broadcast_shape("select", c.shape, a.shape), b.shape)
    return (TensorType(shape, a.dtype, a.quant),)


def _compare(kind):
    def infer(ops, attrs):
        _, shape = _one_domain_binary(kind, ops)
        return (TensorType(shape, DType.BOOL),)
    infer.__doc__ = f"Elementwise {kind} (bool result), both operands in one domain (codes compare like values)."
    return infer


for _k in ("equal", "greater", "greater_equal"):
    register(_k, ("a", "b"))(_compare(_k))


def _logical(kind, arity):
    def infer(ops, attrs):
        for t in ops:
            if t.dtype is not DType.BOOL:
                raise fail(kind, f"operands must be bool, got {t}")
        shape = ops[0].shape if arity == 1 else broadcast_shape(kind, ops[0].shape, ops[1].shape)
        return (TensorType(shape, DType.BOOL),)
    infer.__doc__ = f"Elementwise {kind} of bool tensors."
    return infer


for _k in ("logical_and", "logical_or", "logical_xor"):
    register(_k, ("a", "b"))(_logical(_k, 2))
register("logical_not", ("input",))(_logical("logical_not", 1))


@register("table", ("input",), table=REQUIRED, offset=REQUIRED, out=REQUIRED)
def _table(ops, attrs):
    """Lookup ``table[input + offset]``; the table covers the input's whole declared code range,
    and a code outside it (a graph input may hold one) reads the nearest entry."""
    (x,) = ops
    q = require_quantized("table", x)
    table, offset, out = attrs["table"], attrs["offset"], attrs["out"]
    if not isinstance(table, np.ndarray) or table.ndim != 1:
        raise fail("table", "table must be a 1-D numpy array")
    if q.qmin + offset < 0 or q.qmax + offset >= table.size:
        raise fail("table", f"table of {table.size} entries with offset {offset} doesn't cover codes [{q.qmin}, {q.qmax}]")
    if table.min() < out.qmin or table.max() > out.qmax:
        raise fail("table", f"table entries leave the output range [{out.qmin}, {out.qmax}]")
    return (TensorType(x.shape, out.dtype, out),)


INTERP_ENTRIES = 513   # TOSA's int16 TABLE: a knot every 128 codes, both ends included


@register("table_interp", ("input",), table=REQUIRED, out=REQUIRED)
def _table_interp(ops, attrs):
    """TOSA's int16 TABLE: int16 codes index a 513-entry int16 table every 128 codes and interpolate
    linearly, ``(t[i] << 7) + (t[i+1] - t[i]) * frac`` with ``i = (x + 32768) >> 7``, ``frac = x & 127``:
    an int32 result in steps of 1/128 of the table's (``out``: its int32 quantization)."""
    (x,) = ops
    require_quantized("table_interp", x, DType.INT16)
    table, out = attrs["table"], attrs["out"]
    if not isinstance(table, np.ndarray) or table.shape != (INTERP_ENTRIES,) or table.dtype != np.int16:
        raise fail("table_interp", f"table must be an int16 array of {INTERP_ENTRIES} entries")
    if np.abs(np.diff(table.astype(np.int64))).max(initial=0) > DType.INT16.max:
        raise fail("table_interp", "neighbouring entries must differ by an int16 (TOSA's slope)")
    if not isinstance(out, QuantSpec) or out.dtype is not DType.INT32 or out.is_per_channel:
        raise fail("table_interp", "out must be a per-tensor int32 quantization")
    return (TensorType(x.shape, DType.INT32, out),)


def _float_unary(kind):
    def infer(ops, attrs):
        (x,) = ops
        require_float(kind, x)
        return (x,)
    infer.__doc__ = f"float32 {kind}."
    return infer


for _k in ("sigmoid", "tanh", "exp", "erf", "reciprocal"):
    register(_k, ("input",))(_float_unary(_k))


@register("softmax", ("input",), axis=REQUIRED)
def _softmax(ops, attrs):
    """float32 softmax along ``axis`` (quantized softmax is decomposed into integer ops)."""
    (x,) = ops
    require_float("softmax", x)
    return (x,)
