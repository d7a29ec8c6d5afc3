"""The op registry: one table from op kind to operands, attributes and type inference.

Layout is NHWC throughout (DESIGN.md rule 4). Integer values always carry a
QuantSpec, so every op's result type, including an accumulator's derived
scale, follows from its operand types and attributes. The builder infers result
types from this table and the verifier re-infers them to check a graph.

Operand names ending in ``?`` are optional (None when absent), ``*`` variadic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from qlower.errors import IRError
from qlower.ir.dtypes import DType
from qlower.ir.graph import TensorType
from qlower.ir.quant import QuantSpec

OperandTypes = Sequence[TensorType | None | tuple[TensorType, ...]]
InferFn = Callable[[OperandTypes, dict[str, Any]], tuple[TensorType, ...]]


@dataclass(frozen=True)
class OpDef:
    kind: str
    operands: tuple[str, ...]
    attrs: dict[str, Any]          # name -> default (REQUIRED when it has none)
    infer: InferFn
    doc: str = ""
    results: int = 1  # -1: as many as the attributes say (delegate)

    def operand_is_optional(self, i: int) -> bool:
        return self.operands[i].endswith("?")

    def operand_is_variadic(self, i: int) -> bool:
        return self.operands[i].endswith("*")


REQUIRED = object()
OPS: dict[str, OpDef] = {}


def register(kind: str, operands: tuple[str, ...], results: int = 1, **attrs: Any):
    def wrap(fn: InferFn) -> InferFn:
        OPS[kind] = OpDef(kind, operands, attrs, fn, (fn.__doc__ or "").strip(), results)
        return fn
    return wrap


def op_def(kind: str) -> OpDef:
    try:
        return OPS[kind]
    except KeyError:
        raise IRError(f"unknown op kind '{kind}'") from None


def normalize_attrs(kind: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults, reject unknown or missing attributes."""
    d = op_def(kind)
    unknown = set(attrs) - set(d.attrs)
    if unknown:
        raise IRError(f"{kind}: unknown attribute(s) {sorted(unknown)}; known: {sorted(d.attrs)}")
    out = {}
    for name, default in d.attrs.items():
        if name in attrs:
            out[name] = attrs[name]
        elif default is REQUIRED:
            raise IRError(f"{kind}: missing attribute '{name}'")
        else:
            out[name] = default
    return out


def infer_types(kind: str, operand_types: OperandTypes, attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    d = op_def(kind)
    if len(operand_types) != len(d.operands):
        raise IRError(f"{kind}: expected {len(d.operands)} operands {d.operands}, got {len(operand_types)}")
    for i, t in enumerate(operand_types):
        if t is None and not d.operand_is_optional(i):
            raise IRError(f"{kind}: operand '{d.operands[i]}' is required")
        if isinstance(t, tuple) != d.operand_is_variadic(i):
            raise IRError(f"{kind}: operand '{d.operands[i]}' must {'' if d.operand_is_variadic(i) else 'not '}be a tuple")
    return d.infer(operand_types, attrs)


# -- shared rules --------------------------------------------------------------------

def _fail(kind: str, msg: str) -> IRError:
    return IRError(f"{kind}: {msg}")


def _require_float(kind: str, *types: TensorType) -> None:
    for t in types:
        if t.dtype is not DType.FLOAT32 or t.quant is not None:
            raise _fail(kind, f"expects float32 without quantization, got {t}")


def _require_quantized(kind: str, t: TensorType, *dtypes: DType) -> QuantSpec:
    if t.quant is None or (dtypes and t.dtype not in dtypes):
        want = "/".join(d.value for d in dtypes) or "integer"
        raise _fail(kind, f"expects a quantized {want} tensor, got {t}")
    return t.quant


def _is_float(t: TensorType) -> bool:
    return t.dtype is DType.FLOAT32


def broadcast_shape(kind: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Equal ranks, each dim equal or 1 on one side (as TOSA requires)."""
    if len(a) != len(b):
        raise _fail(kind, f"operands must have equal rank to broadcast, got {a} and {b}")
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise _fail(kind, f"shapes {a} and {b} don't broadcast")
        out.append(max(x, y))
    return tuple(out)


def _conv_out(size: int, k: int, stride: int, dil: int, p0: int, p1: int) -> int:
    return (size + p0 + p1 - dil * (k - 1) - 1) // stride + 1


def _gemm_result(kind: str, x: TensorType, w: TensorType, bias: TensorType | None,
                 shape: tuple[int, ...], out_channels: int) -> TensorType:
    """Result type of a conv / fully connected: float, or an int32 accumulator."""
    if _is_float(x):
        _require_float(kind, x, w, *([bias] if bias else []))
        return TensorType(shape, DType.FLOAT32)
    xq = _require_quantized(kind, x, DType.INT8, DType.INT16)
    wq = _require_quantized(kind, w, DType.INT8)
    if xq.is_per_channel:
        raise _fail(kind, "input must be quantized per tensor")
    if wq.is_per_channel and (wq.axis != 0 or len(wq.scale) != out_channels):
        raise _fail(kind, f"per-channel weight quantization must be on axis 0 with {out_channels} scales, got {wq}")
    acc = QuantSpec.accumulator(xq, wq, axis=len(shape) - 1 if wq.is_per_channel else None)
    if bias is not None:
        expected = acc.with_axis(0 if acc.is_per_channel else None)
        if bias.dtype is not DType.INT32 or bias.shape != (out_channels,):
            raise _fail(kind, f"bias must be int32[{out_channels}], got {bias}")
        if bias.quant is None or not _same_scale(bias.quant, replace(expected, dynamic=bias.quant.dynamic)):
            raise _fail(kind, f"bias quantization must be the accumulator's {expected}, got {bias.quant}")
    return TensorType(shape, DType.INT32, acc)


def _same_scale(a: QuantSpec, b: QuantSpec) -> bool:
    return (np.allclose(a.scale, b.scale, rtol=1e-6, atol=0) and a.zero_point == b.zero_point
            and a.axis == b.axis)


def _same_domain(kind: str, types: Sequence[TensorType]) -> None:
    first = types[0]
    for t in types[1:]:
        if t.dtype is not first.dtype or t.quant != first.quant:
            raise _fail(kind, f"operands must share one type domain, got {first} and {t}")


def _unchanged_quant(kind: str, t: TensorType, shape: tuple[int, ...]) -> TensorType:
    if t.quant is not None and t.quant.is_per_channel:
        raise _fail(kind, f"can't move a per-channel quantized tensor ({t})")
    return TensorType(shape, t.dtype, t.quant)


# -- ops ------------------------------------------------------------------------------

@register("constant", (), data=REQUIRED, quant=None)
def _constant(ops, attrs):
    """A constant tensor; integer data carries its QuantSpec."""
    data = attrs["data"]
    if not isinstance(data, np.ndarray):
        raise _fail("constant", "data must be a numpy array")
    return (TensorType(data.shape, DType.from_numpy(data.dtype), attrs["quant"]),)


@register("conv2d", ("input", "weight", "bias?"), stride=(1, 1), dilation=(1, 1), pad=(0, 0, 0, 0), groups=1)
def _conv2d(ops, attrs):
    """2-D convolution, NHWC input, OHWI weight (I = C / groups), pad (top, bottom, left, right)."""
    x, w, b = ops
    if x.rank != 4 or w.rank != 4:
        raise _fail("conv2d", f"expects NHWC input and OHWI weight, got {x.shape} and {w.shape}")
    n, h, wd, c = x.shape
    o, kh, kw, ci = w.shape
    g = attrs["groups"]
    if c % g or o % g or ci * g != c:
        raise _fail("conv2d", f"input channels {c}, weight {w.shape} and groups {g} disagree")
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = attrs["stride"], attrs["dilation"], attrs["pad"]
    oh, ow = _conv_out(h, kh, sh, dh, pt, pb), _conv_out(wd, kw, sw, dw, pl, pr)
    if oh <= 0 or ow <= 0:
        raise _fail("conv2d", f"empty output {oh}x{ow} for input {x.shape}")
    return (_gemm_result("conv2d", x, w, b, (n, oh, ow, o), o),)


@register("fully_connected", ("input", "weight", "bias?"))
def _fully_connected(ops, attrs):
    """``input[..., K] @ weight[N, K].T (+ bias[N])``."""
    x, w, b = ops
    if w.rank != 2 or x.shape[-1] != w.shape[1]:
        raise _fail("fully_connected", f"input {x.shape} and weight {w.shape} disagree")
    return (_gemm_result("fully_connected", x, w, b, x.shape[:-1] + (w.shape[0],), w.shape[0]),)


@register("matmul", ("a", "b"))
def _matmul(ops, attrs):
    """Batched ``a[..., M, K] @ b[..., K, N]``; batch dims equal."""
    a, b = ops
    if a.rank < 2 or a.rank != b.rank or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise _fail("matmul", f"shapes {a.shape} and {b.shape} disagree")
    shape = a.shape[:-1] + (b.shape[-1],)
    if _is_float(a):
        _require_float("matmul", a, b)
        return (TensorType(shape, DType.FLOAT32),)
    aq = _require_quantized("matmul", a, DType.INT8, DType.INT16)
    bq = _require_quantized("matmul", b, DType.INT8, DType.INT16)
    if aq.is_per_channel or bq.is_per_channel:
        raise _fail("matmul", "operands must be quantized per tensor")
    return (TensorType(shape, DType.INT32, QuantSpec.accumulator(aq, bq, None)),)


# TOSA's SINGLE_ROUND and DOUBLE_ROUND, and the rounding of TFLite's optimized kernels (requant.py)
ROUNDINGS = ("single", "double", "double_half_up")


@register("rescale", ("input",), out=REQUIRED, rounding="single")
def _rescale(ops, attrs):
    """Requantize codes to ``out`` (requant module semantics), clamped to out's [qmin, qmax]."""
    (x,) = ops
    q = _require_quantized("rescale", x)
    out: QuantSpec = attrs["out"]
    if attrs["rounding"] not in ROUNDINGS:
        raise _fail("rescale", f"rounding must be one of {', '.join(ROUNDINGS)}, got {attrs['rounding']!r}")
    if out.is_per_channel:
        raise _fail("rescale", "output must be quantized per tensor")
    if q.dynamic and not out.dynamic:
        raise _fail("rescale", "a dynamic input can only be rescaled to a dynamic output")
    return (TensorType(x.shape, out.dtype, out),)


@register("clamp", ("input",), min=REQUIRED, max=REQUIRED)
def _clamp(ops, attrs):
    """Clamp to [min, max], in the input's own domain (codes for integers)."""
    (x,) = ops
    if attrs["min"] > attrs["max"]:
        raise _fail("clamp", f"min {attrs['min']} > max {attrs['max']}")
    return (x,)


def _binary(kind: str, ops) -> tuple[TensorType, TensorType, tuple[int, ...]]:
    a, b = ops
    return a, b, broadcast_shape(kind, a.shape, b.shape)


def _additive(kind):
    def infer(ops, attrs):
        a, b, shape = _binary(kind, ops)
        if _is_float(a):
            _require_float(kind, a, b)
            return (TensorType(shape, DType.FLOAT32),)
        qa = _require_quantized(kind, a, DType.INT32)
        qb = _require_quantized(kind, b, DType.INT32)
        if qa.is_per_channel or qa != qb:
            raise _fail(kind, f"int32 operands must share one per-tensor quantization, got {qa} and {qb}")
        return (TensorType(shape, DType.INT32, qa),)
    infer.__doc__ = f"Elementwise {kind} with broadcasting; int32 operands share one scale."
    return infer


register("add", ("a", "b"))(_additive("add"))
register("sub", ("a", "b"))(_additive("sub"))


@register("mul", ("a", "b"), shift=0)
def _mul(ops, attrs):
    """Elementwise product; int32: ``round(a * b / 2**shift)``, scale s_a * s_b * 2**shift."""
    a, b, shape = _binary("mul", ops)
    if _is_float(a):
        _require_float("mul", a, b)
        return (TensorType(shape, DType.FLOAT32),)
    qa = _require_quantized("mul", a, DType.INT32)
    qb = _require_quantized("mul", b, DType.INT32)
    if any(z for z in qa.zero_point + qb.zero_point):
        raise _fail("mul", "int32 operands must have zero point 0")
    if qa.is_per_channel and qb.is_per_channel:
        raise _fail("mul", "at most one operand may be quantized per channel")
    per = qa if qa.is_per_channel else qb if qb.is_per_channel else None
    sa, sb, k = qa.scale, qb.scale, 2.0 ** attrs["shift"]
    scales = tuple(x * y * k for x in sa for y in sb)
    spec = QuantSpec(DType.INT32, scales, (0,) * len(scales), DType.INT32.min, DType.INT32.max,
                     axis=per.axis if per else None)
    if per is not None and shape[per.axis] != len(scales):
        raise _fail("mul", f"per-channel axis {per.axis} has {shape[per.axis]} elements, {len(scales)} scales")
    return (TensorType(shape, DType.INT32, spec),)


@register("intdiv", ("a", "b"))
def _intdiv(ops, attrs):
    """int32 division truncating toward zero; scale s_a / s_b."""
    a, b, shape = _binary("intdiv", ops)
    qa = _require_quantized("intdiv", a, DType.INT32)
    qb = _require_quantized("intdiv", b, DType.INT32)
    if qa.is_per_channel or qb.is_per_channel or any(qa.zero_point + qb.zero_point):
        raise _fail("intdiv", "operands must be per-tensor with zero point 0")
    return (TensorType(shape, DType.INT32, QuantSpec.per_tensor(qa.scale[0] / qb.scale[0], 0, DType.INT32)),)


def _one_domain_binary(kind: str, ops) -> tuple[TensorType, tuple[int, ...]]:
    """Both operands in one per-tensor domain (their codes compare like their values)."""
    a, b, shape = _binary(kind, ops)
    _same_domain(kind, (a, b))
    if a.quant is not None and a.quant.is_per_channel:
        raise _fail(kind, "operands must be quantized per tensor")
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
        raise _fail("select", f"cond must be bool, got {c}")
    _same_domain("select", (a, b))
    if a.quant is not None and a.quant.is_per_channel:
        raise _fail("select", "operands must be quantized per tensor")
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
                raise _fail(kind, f"operands must be bool, got {t}")
        shape = ops[0].shape if arity == 1 else broadcast_shape(kind, ops[0].shape, ops[1].shape)
        return (TensorType(shape, DType.BOOL),)
    infer.__doc__ = f"Elementwise {kind} of bool tensors."
    return infer


for _k in ("logical_and", "logical_or", "logical_xor"):
    register(_k, ("a", "b"))(_logical(_k, 2))
register("logical_not", ("input",))(_logical("logical_not", 1))


@register("concat", ("inputs*",), axis=REQUIRED)
def _concat(ops, attrs):
    """Concatenate along ``axis``; every operand has its own type, all in one domain."""
    (xs,) = ops
    axis = attrs["axis"]
    if not xs:
        raise _fail("concat", "needs at least one operand")
    _same_domain("concat", xs)
    ref = xs[0]
    for t in xs:
        if t.rank != ref.rank or any(d != e for i, (d, e) in enumerate(zip(t.shape, ref.shape)) if i != axis):
            raise _fail("concat", f"shapes {ref.shape} and {t.shape} differ off axis {axis}")
    shape = list(ref.shape)
    shape[axis] = sum(t.shape[axis] for t in xs)
    if ref.quant is not None and ref.quant.is_per_channel and ref.quant.axis == axis:
        raise _fail("concat", "can't concatenate along the per-channel axis")
    return (TensorType(shape, ref.dtype, ref.quant),)


@register("reshape", ("input",), shape=REQUIRED)
def _reshape(ops, attrs):
    """Row-major reshape (NHWC order)."""
    (x,) = ops
    shape = tuple(attrs["shape"])
    if int(np.prod(shape, dtype=np.int64)) != x.numel:
        raise _fail("reshape", f"can't reshape {x.shape} to {shape}")
    return (_unchanged_quant("reshape", x, shape),)


@register("transpose", ("input",), perm=REQUIRED)
def _transpose(ops, attrs):
    """``out.shape[i] = in.shape[perm[i]]``."""
    (x,) = ops
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise _fail("transpose", f"perm {perm} is not a permutation of rank {x.rank}")
    quant = x.quant
    if quant is not None and quant.is_per_channel:
        quant = quant.with_axis(perm.index(quant.axis))
    return (TensorType(tuple(x.shape[p] for p in perm), x.dtype, quant),)


@register("pad", ("input",), pads=REQUIRED, value=0)
def _pad(ops, attrs):
    """Constant padding; ``pads`` is (before, after) per dim; value in the input's domain."""
    (x,) = ops
    pads = tuple(attrs["pads"])
    if len(pads) != 2 * x.rank or min(pads) < 0:
        raise _fail("pad", f"pads {pads} must be 2 non-negative numbers per dim of {x.shape}")
    shape = tuple(d + pads[2 * i] + pads[2 * i + 1] for i, d in enumerate(x.shape))
    return (_unchanged_quant("pad", x, shape),)


@register("slice", ("input",), start=REQUIRED, stop=REQUIRED, step=None)
def _slice(ops, attrs):
    """``input[start:stop:step]`` per dim (positive steps, bounds within the shape)."""
    (x,) = ops
    start, stop = tuple(attrs["start"]), tuple(attrs["stop"])
    step = tuple(attrs["step"] or (1,) * x.rank)
    if not (len(start) == len(stop) == len(step) == x.rank):
        raise _fail("slice", f"start/stop/step must have one entry per dim of {x.shape}")
    shape = []
    for d, s0, s1, st in zip(x.shape, start, stop, step):
        if st < 1 or not 0 <= s0 <= s1 <= d:
            raise _fail("slice", f"bad slice {s0}:{s1}:{st} of a dim of size {d}")
        shape.append(len(range(s0, s1, st)))
    quant = x.quant
    if quant is not None and quant.is_per_channel:  # keep the scales of the channels kept
        sel = slice(start[quant.axis], stop[quant.axis], step[quant.axis])
        quant = replace(quant, scale=quant.scale[sel], zero_point=quant.zero_point[sel])
    return (TensorType(tuple(shape), x.dtype, quant),)


@register("gather", ("input", "indices"), axis=REQUIRED)
def _gather(ops, attrs):
    """``numpy.take(input, indices, axis)``: ``out.shape = in.shape[:axis] + indices.shape + in.shape[axis+1:]``.
    Indices are int32 integers (scale 1, zero point 0) that must lie in ``[0, in.shape[axis])`` (anything
    else is an execution error); their type's ``[qmin, qmax]`` narrower than int32 states a proven range
    (constant indices), which backends without a run-time check rely on."""
    x, idx = ops
    axis = attrs["axis"]
    if not isinstance(axis, int) or not 0 <= axis < x.rank:
        raise _fail("gather", f"axis {axis} out of range for {x.shape}")
    q = idx.quant
    if idx.dtype is not DType.INT32 or q is None or q.scale != (1.0,) or q.zero_point != (0,) or q.axis is not None \
            or q.dynamic:
        raise _fail("gather", f"indices must be int32 integers (scale 1, zero point 0), got {idx}")
    shape = tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1:])
    return (_unchanged_quant("gather", x, shape),)


def _pool(kind):
    def infer(ops, attrs):
        (x,) = ops
        if x.rank != 4:
            raise _fail(kind, f"expects NHWC input, got {x.shape}")
        if x.quant is not None and x.quant.is_per_channel:
            raise _fail(kind, "input must be quantized per tensor")
        n, h, w, c = x.shape
        (kh, kw), (sh, sw), (pt, pb, pl, pr) = attrs["kernel"], attrs["stride"], attrs["pad"]
        if max(pt, pb) >= kh or max(pl, pr) >= kw:
            raise _fail(kind, f"padding {attrs['pad']} must be smaller than the kernel {attrs['kernel']}: "
                              "a window made only of padding has no value")
        oh, ow = _conv_out(h, kh, sh, 1, pt, pb), _conv_out(w, kw, sw, 1, pl, pr)
        if oh <= 0 or ow <= 0:
            raise _fail(kind, f"empty output for input {x.shape}")
        if kind == "avg_pool2d" and x.quant is not None and x.dtype not in (DType.INT8, DType.INT16):
            raise _fail(kind, f"expects int8/int16 codes, got {x}")
        return (TensorType((n, oh, ow, c), x.dtype, x.quant),)
    return infer


register("avg_pool2d", ("input",), kernel=REQUIRED, stride=REQUIRED, pad=(0, 0, 0, 0))(_pool("avg_pool2d"))
register("max_pool2d", ("input",), kernel=REQUIRED, stride=REQUIRED, pad=(0, 0, 0, 0))(_pool("max_pool2d"))
OPS["avg_pool2d"] = replace(OPS["avg_pool2d"], doc="Average pooling; padding is not counted (TOSA); integer rounding as TOSA.")
OPS["max_pool2d"] = replace(OPS["max_pool2d"], doc="Max pooling; padding never wins.")


@register("reduce_sum", ("input",), axis=REQUIRED)
def _reduce_sum(ops, attrs):
    """Sum along ``axis`` keeping the dim; int32 codes keep their scale."""
    (x,) = ops
    if not _is_float(x):
        q = _require_quantized("reduce_sum", x, DType.INT32)
        if q.is_per_channel and q.axis == attrs["axis"]:
            raise _fail("reduce_sum", "can't sum along the per-channel axis")
        if any(q.zero_point):
            raise _fail("reduce_sum", "int32 input must have zero point 0")
    shape = list(x.shape)
    shape[attrs["axis"]] = 1
    return (TensorType(tuple(shape), x.dtype, x.quant),)


def _reduce_extreme(kind, what):
    def infer(ops, attrs):
        (x,) = ops
        shape = list(x.shape)
        shape[attrs["axis"]] = 1
        return (_unchanged_quant(kind, x, tuple(shape)),)
    infer.__doc__ = f"{what} along ``axis`` keeping the dim."
    return infer


register("reduce_max", ("input",), axis=REQUIRED)(_reduce_extreme("reduce_max", "Max"))
register("reduce_min", ("input",), axis=REQUIRED)(_reduce_extreme("reduce_min", "Min"))


def _arg_reduce(kind):
    def infer(ops, attrs):
        (x,) = ops
        axis = attrs["axis"]
        q = _require_quantized(kind, x, DType.INT8, DType.INT16, DType.INT32)
        if q.is_per_channel:
            raise _fail(kind, "codes quantized per channel don't compare across the axis")
        if not isinstance(axis, int) or not 0 <= axis < x.rank:
            raise _fail(kind, f"axis {axis} out of range for {x.shape}")
        shape = list(x.shape)
        shape[axis] = 1
        return (TensorType(tuple(shape), DType.INT32, QuantSpec.plain_integer(DType.INT32)),)
    which = "largest" if kind == "argmax" else "smallest"
    infer.__doc__ = (f"Index of the {which} code along ``axis`` (the first one on ties), keeping the dim; "
                     "per-tensor codes in, plain int32 out.")
    return infer


register("argmax", ("input",), axis=REQUIRED)(_arg_reduce("argmax"))
register("argmin", ("input",), axis=REQUIRED)(_arg_reduce("argmin"))


@register("table", ("input",), table=REQUIRED, offset=REQUIRED, out=REQUIRED)
def _table(ops, attrs):
    """Lookup ``table[input + offset]``; the table covers the input's whole declared code range,
    and a code outside it (a graph input may hold one) reads the nearest entry."""
    (x,) = ops
    q = _require_quantized("table", x)
    table, offset, out = attrs["table"], attrs["offset"], attrs["out"]
    if not isinstance(table, np.ndarray) or table.ndim != 1:
        raise _fail("table", "table must be a 1-D numpy array")
    if q.qmin + offset < 0 or q.qmax + offset >= table.size:
        raise _fail("table", f"table of {table.size} entries with offset {offset} doesn't cover codes [{q.qmin}, {q.qmax}]")
    if table.min() < out.qmin or table.max() > out.qmax:
        raise _fail("table", f"table entries leave the output range [{out.qmin}, {out.qmax}]")
    return (TensorType(x.shape, out.dtype, out),)


@register("quantize", ("input",), out=REQUIRED)
def _quantize(ops, attrs):
    """float32 -> codes: ``clamp(round_half_even(x * (1/scale)) + zp)``, in float32 like PyTorch."""
    (x,) = ops
    _require_float("quantize", x)
    out: QuantSpec = attrs["out"]
    if out.dynamic:
        raise _fail("quantize", "use dynamic_quantize for run-time scales")
    return (TensorType(x.shape, out.dtype, out),)


@register("dynamic_quantize", ("input",), results=2, granularity="per_tensor", dtype=DType.INT8, qmax=127)
def _dynamic_quantize(ops, attrs):
    """float32 -> symmetric codes with a run-time scale ``max|x| / qmax`` (per tensor or per row);
    results: the codes and the float32 scale."""
    (x,) = ops
    _require_float("dynamic_quantize", x)
    g, qmax = attrs["granularity"], attrs["qmax"]
    if g not in ("per_tensor", "per_row"):
        raise _fail("dynamic_quantize", f"granularity must be per_tensor or per_row, got {g!r}")
    spec = QuantSpec(attrs["dtype"], (1.0,), (0,), -qmax, qmax, dynamic=g)
    scale_shape = (1,) * x.rank if g == "per_tensor" else x.shape[:-1] + (1,)
    return TensorType(x.shape, attrs["dtype"], spec), TensorType(scale_shape, DType.FLOAT32)


@register("dequantize", ("input", "scale?"))
def _dequantize(ops, attrs):
    """codes -> float32: ``(x - zp) * scale`` (times the run-time ``scale`` operand when dynamic)."""
    x, s = ops
    q = _require_quantized("dequantize", x)
    if bool(q.dynamic) != (s is not None):
        raise _fail("dequantize", "a run-time scale operand is needed exactly when the input is dynamic")
    if s is not None:
        _require_float("dequantize", s)
        broadcast_shape("dequantize", x.shape, s.shape)
    return (TensorType(x.shape, DType.FLOAT32),)


@register("cast", ("input",), dtype=REQUIRED, out=None)
def _cast(ops, attrs):
    """Convert element type: int codes -> float (the code's value), float -> int (round half even)."""
    (x,) = ops
    dtype: DType = attrs["dtype"]
    if dtype.is_integer and attrs["out"] is None:
        raise _fail("cast", "an integer result needs its QuantSpec ('out')")
    return (TensorType(x.shape, dtype, attrs["out"] if dtype.is_integer else None),)


def _float_unary(kind):
    def infer(ops, attrs):
        (x,) = ops
        _require_float(kind, x)
        return (x,)
    infer.__doc__ = f"float32 {kind}."
    return infer


for _k in ("sigmoid", "tanh", "exp", "erf", "reciprocal"):
    register(_k, ("input",))(_float_unary(_k))


@register("softmax", ("input",), axis=REQUIRED)
def _softmax(ops, attrs):
    """float32 softmax along ``axis`` (quantized softmax is decomposed into integer ops)."""
    (x,) = ops
    _require_float("softmax", x)
    return (x,)


@register("delegate", ("inputs*",), results=-1, partition=REQUIRED, in_types=REQUIRED, out_types=REQUIRED)
def _delegate(ops, attrs):
    """A call into a compiled partition; its boundary types are what the backend reads and
    writes (DESIGN.md rule 6), so the operands must have exactly ``in_types``."""
    (xs,) = ops
    want = tuple(attrs["in_types"])
    if tuple(xs) != want:
        raise _fail("delegate", f"partition '{attrs['partition']}' reads {[str(t) for t in want]}, "
                                f"got {[str(t) for t in xs]}")
    return tuple(attrs["out_types"])


# PyTorch dtype names a float fallback may exchange with the IR, and the IR dtype that holds each
# (wider integers are narrowed to int32 with a range check at run time; other floats to float32).
ATEN_DTYPES = {"float32": DType.FLOAT32, "float64": DType.FLOAT32, "float16": DType.FLOAT32,
               "bfloat16": DType.FLOAT32, "bool": DType.BOOL, "int64": DType.INT32, "int32": DType.INT32,
               "int16": DType.INT32, "int8": DType.INT32, "uint8": DType.INT32}


def _aten_operand_type(t: TensorType, torch_dtype: str, what: str) -> None:
    if torch_dtype not in ATEN_DTYPES:
        raise _fail("aten", f"{what}: unsupported dtype {torch_dtype!r}; known: {sorted(ATEN_DTYPES)}")
    if t.dtype is not ATEN_DTYPES[torch_dtype]:
        raise _fail("aten", f"{what}: a {torch_dtype} tensor is held as {ATEN_DTYPES[torch_dtype].value}, got {t}")
    if t.dtype.is_integer and (t.quant is None or not t.quant.is_plain_integer):
        raise _fail("aten", f"{what}: integer tensors are plain integers (scale 1, zero point 0), got {t}")


@register("aten", ("inputs*",), results=-1, target=REQUIRED, args=REQUIRED, in_dtypes=REQUIRED,
          out_types=REQUIRED, out_dtypes=REQUIRED)
def _aten(ops, attrs):
    """A float fallback: the PyTorch core ATen op ``target`` (e.g. ``aten.abs.default``) called with
    ``args`` (JSON; tensor operands are ``{"input": i}``) on the operands as PyTorch tensors of
    ``in_dtypes``. Quantized values reach it dequantized; its results are ``out_types``."""
    (xs,) = ops
    in_dtypes, out_types, out_dtypes = tuple(attrs["in_dtypes"]), tuple(attrs["out_types"]), tuple(attrs["out_dtypes"])
    if not isinstance(attrs["target"], str) or not attrs["target"].startswith("aten."):
        raise _fail("aten", f"target must name an aten op ('aten.NAME.OVERLOAD'), got {attrs['target']!r}")
    if not isinstance(attrs["args"], str):
        raise _fail("aten", "args must be a JSON string")
    if len(in_dtypes) != len(xs) or len(out_dtypes) != len(out_types) or not out_types:
        raise _fail("aten", f"{len(xs)} operands with {len(in_dtypes)} dtypes, {len(out_types)} results with "
                            f"{len(out_dtypes)} dtypes")
    for i, (t, d) in enumerate(zip(xs, in_dtypes)):
        _aten_operand_type(t, d, f"operand {i}")
    for i, (t, d) in enumerate(zip(out_types, out_dtypes)):
        if not isinstance(t, TensorType):
            raise _fail("aten", f"result {i} must be a TensorType")
        _aten_operand_type(t, d, f"result {i}")
    return out_types


def op_docs() -> dict[str, str]:
    """One line of meaning per op kind."""
    return {k: d.doc for k, d in OPS.items()}
