"""Which IR ops the TOSA backend takes, per profile, and why not when it doesn't.

``check(op, profile)`` returns None when the op can be lowered, otherwise the
reason a user reads in the partition report. The lowering relies on these
checks: every form accepted here is one the lowering emits as valid TOSA 1.0
(tests lower and validate each), and ``lower()`` re-runs them before emitting.
Checks look only at types and attributes, never at constant data, so that the
partitioner can ask before any constant is folded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from qlower.errors import CompileError
from qlower.ir import DType, Op, TensorType, requant
from qlower.reference.aten_fallback import fallback_reason
from qlower.reference.elementwise import wraps
from qlower.registry import Registry

MAX_RANK = 6          # TOSA 1.0 level 8K
MAX_KERNEL = 8192     # level 8K: kernel extent, stride and padding
MAX_MUL_SHIFT = 63


@dataclass(frozen=True)
class Profile:
    """A TOSA 1.0 profile as a qlower target."""

    target: str       # qlower target name
    spec: str         # the profile's name in the TOSA specification
    tosa_opt: str     # the profiles list tosa-opt validates against
    float_ops: bool


PROFILES: dict[str, Profile] = {p.target: p for p in (
    Profile("tosa-1.0+int", "TOSA-1.0+INT", "pro_int", False),
    Profile("tosa-1.0+int+fp", "TOSA-1.0+INT+FP", "pro_int,pro_fp", True),
)}

FLOAT_REASON = ("float op: the TOSA-1.0+INT profile takes only integer ops "
                "(target tosa-1.0+int+fp takes it, or it stays on the host)")
DYNAMIC_REASON = ("dynamic quantization computes its scale at run time: stays on the host "
                  "(TOSA 1.0 has no exact float division to compute max|x| / qmax)")

_TOSA_DTYPES = {DType.INT8, DType.INT16, DType.INT32, DType.FLOAT32, DType.BOOL}
# RESHAPE takes bool_t in TOSA 1.0 (an attention mask's bools change shape between their cast and the softmax)
_BOOL_OPS = {"equal", "greater", "greater_equal", "select", "logical_and", "logical_or", "logical_xor",
             "logical_not", "reshape"}


def profile_for(target: str) -> Profile:
    try:
        return PROFILES[target]
    except KeyError:
        raise CompileError(f"unknown TOSA target '{target}'; known: {', '.join(PROFILES)}") from None


def fit_window(size: int, kernel: int, stride: int, dilation: int, pad_before: int, pad_after: int
               ) -> tuple[int, int]:
    """TOSA's output-size rule for a sliding window along one axis.

    TOSA 1.0 requires ``size - 1 + pads - (kernel - 1) * dilation`` to be a
    multiple of ``stride``; the IR (like PyTorch) rounds the output size down.
    The rows the window never reads are dropped: first from ``pad_after``, then
    from the input's end. Returns ``(pad_after, rows_to_crop)``; the output size
    and every window's content are unchanged.
    """
    extent = (kernel - 1) * dilation + 1
    excess = (size + pad_before + pad_after - extent) % stride
    from_pad = min(excess, pad_after)
    return pad_after - from_pad, excess - from_pad


# -- per-op checks ----------------------------------------------------------------------

Check = Callable[[Op, Profile], str | None]
CHECKS: Registry[str, Check] = Registry("TOSA support checks")


def _check(*kinds: str):
    return CHECKS.register(*kinds)


def _types(op: Op) -> list[TensorType]:
    return [v.type for v in op.input_values()] + [r.type for r in op.results]


def check(op: Op, profile: Profile) -> str | None:
    """None when ``op`` lowers to valid TOSA under ``profile``, else the reason it can't."""
    if op.kind == "dynamic_quantize":
        return DYNAMIC_REASON
    if op.kind == "delegate":
        return "a delegate call runs on the host"
    if op.kind == "aten":
        return fallback_reason(op.attrs["target"])
    for t in _types(op):
        if t.dtype is DType.BOOL and op.kind not in _BOOL_OPS and op.kind != "constant":
            return f"bool tensor: on TOSA only {', '.join(sorted(_BOOL_OPS))} take bool tensors here"
        if t.dtype not in _TOSA_DTYPES:
            return (f"{t.dtype.value} tensor: the TOSA 1.0 INT and FP profiles have no {t.dtype.value} "
                    "tensors (convert on the host)")
        if 0 in t.shape:
            return f"empty tensor {list(t.shape)}: TOSA tensors have no size-0 dimensions"
        if t.rank > MAX_RANK:
            return f"rank-{t.rank} tensor: TOSA 1.0 (level 8K) allows at most rank {MAX_RANK}"
    if not profile.float_ops and any(t.dtype is DType.FLOAT32 for t in _types(op)):
        return FLOAT_REASON
    if op.kind == "constant":
        return None  # emitted with (and in the layout of) whichever op reads it
    if op.kind == "rescale" and op.attrs["rounding"] not in ("single", "double"):
        return f"TOSA RESCALE has no {op.attrs['rounding']!r} rounding (TFLite's optimized kernels' own)"
    fn = CHECKS.get(op.kind)
    if fn is None:
        return f"the TOSA backend has no lowering for '{op.kind}'"
    return fn(op, profile)


def _int8_zero_point(what: str, zp: int) -> str | None:
    if not -128 <= zp <= 127:
        return f"{what} zero point {zp} is outside int8"
    return None


@_check("conv2d", "fully_connected")
def _gemm(op: Op, profile: Profile) -> str | None:
    x, w = op.operands[0].type, op.operands[1].type
    tosa_op = "CONV2D"
    if op.kind == "conv2d":
        groups, ci = op.attrs["groups"], w.shape[3]
        if groups > 1 and groups == x.shape[3] and ci == 1:
            tosa_op = "DEPTHWISE_CONV2D"
        (kh, kw), (dh, dw) = w.shape[1:3], op.attrs["dilation"]
        if max((kh - 1) * dh + 1, (kw - 1) * dw + 1, *op.attrs["stride"], *op.attrs["pad"]) > MAX_KERNEL:
            return f"kernel extent, stride or padding above {MAX_KERNEL}: beyond TOSA 1.0 level 8K"
    if x.dtype is DType.FLOAT32:
        return None
    if x.dtype not in (DType.INT8, DType.INT16) or w.dtype is not DType.INT8:
        return f"{x.dtype.value} input with {w.dtype.value} weights: TOSA {tosa_op} takes int8 x int8 or int16 x int8"
    zps = set(w.quant.zero_point)
    if len(zps) > 1:
        return f"per-channel weight zero points: TOSA {tosa_op} takes one weight zero point"
    if x.dtype is DType.INT16:  # int16 x int8 accumulates in int48 (EXT-INT16), with both zero points 0
        if x.quant.zero_point[0] != 0 or zps != {0}:
            return f"int16 input: TOSA {tosa_op} takes int16 x int8 with zero points 0 (symmetric int16 activations)"
        return None
    return _int8_zero_point("input", x.quant.zero_point[0]) or _int8_zero_point("weight", zps.pop())


@_check("matmul")
def _matmul(op: Op, profile: Profile) -> str | None:
    a, b = op.operands[0].type, op.operands[1].type
    if a.dtype is DType.FLOAT32:
        return None
    if DType.INT16 in (a.dtype, b.dtype):
        return ("int16 operands: TOSA MATMUL accumulates int16 in int48, "
                "which the IR's int32 accumulator can't express")
    return _int8_zero_point("a", a.quant.zero_point[0]) or _int8_zero_point("b", b.quant.zero_point[0])


@_check("rescale")
def _rescale(op: Op, profile: Profile) -> str | None:
    x = op.operands[0].type
    src, out = x.quant, op.attrs["out"]
    if src.is_per_channel and src.axis % x.rank != x.rank - 1:
        return (f"per-channel rescale along axis {src.axis} of a rank-{x.rank} tensor: "
                "TOSA RESCALE scales per channel only along the last axis")
    if len(set(src.zero_point)) > 1:
        return "per-channel input zero points: TOSA RESCALE takes one input zero point"
    if x.dtype is DType.INT32 and src.zero_point[0] != 0:
        return f"int32 input with zero point {src.zero_point[0]}: TOSA RESCALE reads int32 with zero point 0"
    if out.dtype is DType.INT32 and out.zero_point[0] != 0:
        return f"int32 output with zero point {out.zero_point[0]}: TOSA RESCALE writes int32 with zero point 0"
    try:
        requant.requantize_ratio(src.scale, out.scale[0])
    except requant.RequantRangeError as e:
        return f"the scale ratio has no 32-bit RESCALE form: {e}"
    return None


WRAP_REASON = ("plain int32 arithmetic wraps around on overflow in PyTorch, while TOSA 1.0 {} requires an int32 "
               "result in range (an overflow is an error in the reference model): stays on the host")


@_check("mul")
def _mul(op: Op, profile: Profile) -> str | None:
    if wraps(op):
        return WRAP_REASON.format("MUL")
    if op.result.type.dtype is DType.INT32 and not 0 <= op.attrs["shift"] <= MAX_MUL_SHIFT:
        return f"shift {op.attrs['shift']}: TOSA MUL shifts by 0..{MAX_MUL_SHIFT}"
    return None


@_check("add", "sub")
def _additive(op: Op, profile: Profile) -> str | None:
    return WRAP_REASON.format(op.kind.upper()) if wraps(op) else None


@_check("pad")
def _pad(op: Op, profile: Profile) -> str | None:
    t, value = op.operands[0].type, op.attrs["value"]
    if t.dtype.is_integer and not (t.dtype.min <= value <= t.dtype.max and float(value).is_integer()):
        return f"pad value {value} is not a {t.dtype.value} code"
    return None


@_check("avg_pool2d", "max_pool2d")
def _pool(op: Op, profile: Profile) -> str | None:
    x = op.operands[0].type
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = op.attrs["kernel"], op.attrs["stride"], op.attrs["pad"]
    if max(kh, kw, sh, sw, pt, pb, pl, pr) > MAX_KERNEL:
        return f"kernel, stride or padding above {MAX_KERNEL}: beyond TOSA 1.0 level 8K"
    pb, _ = fit_window(x.shape[1], kh, sh, 1, pt, pb)
    pr, _ = fit_window(x.shape[2], kw, sw, 1, pl, pr)
    if pt >= kh or pb >= kh or pl >= kw or pr >= kw:
        return (f"padding {op.attrs['pad']} not smaller than kernel {op.attrs['kernel']}: "
                "TOSA pooling needs every window to overlap the input")
    if op.kind == "avg_pool2d" and x.quant is not None:
        zp = x.quant.zero_point[0]
        lo, hi = x.dtype.min, x.dtype.max
        if not lo <= zp <= hi:
            return f"zero point {zp} is outside {x.dtype.value}"
    return None


@_check("clamp")
def _clamp(op: Op, profile: Profile) -> str | None:
    t, lo, hi = op.operands[0].type, op.attrs["min"], op.attrs["max"]
    if t.dtype.is_integer and (hi < t.dtype.min or lo > t.dtype.max):
        return f"clamp bounds [{lo}, {hi}] lie outside {t.dtype.value}'s range"
    return None


@_check("quantize")
def _quantize(op: Op, profile: Profile) -> str | None:
    out = op.attrs["out"]
    if out.dtype is DType.INT32 and any(out.zero_point):
        return ("quantize to int32 with a nonzero zero point: adding it in int32 could overflow, "
                "which TOSA leaves undefined")
    return None


@_check("gather")
def _gather(op: Op, profile: Profile) -> str | None:
    """GATHER on values reshaped to [outer, axis, inner]. An index outside the axis is undefined in TOSA
    (the reference model aborts, an NPU reads out of bounds), so only indices whose type proves them in
    range (constants) are taken; token ids and other run-time indices are checked on the host."""
    size, q = op.operands[0].type.shape[op.attrs["axis"]], op.operands[1].type.quant
    if not 0 <= q.qmin <= q.qmax < size:
        return (f"run-time indices: TOSA GATHER has no check for an index outside 0..{size - 1}, "
                "so the lookup runs on the host, which reports such an index as an error")
    return None


@_check("argmax", "argmin")
def _arg_reduce(op: Op, profile: Profile) -> str | None:
    x = op.operands[0].type
    if x.dtype not in (DType.INT8, DType.INT16):
        return f"{x.dtype.value} codes: TOSA 1.0 INT takes ARGMAX of int8 and int16 only"
    return None


def _yes(op: Op, profile: Profile) -> str | None:
    return None


for _kind in ("intdiv", "concat", "reshape", "transpose", "slice", "reduce_sum",
              "reduce_max", "reduce_min", "table", "table_interp", "dequantize", "cast", "sigmoid", "tanh", "exp",
              "erf", "reciprocal", "softmax", "minimum", "maximum", "equal", "greater", "greater_equal", "select", "logical_and",
              "logical_or", "logical_xor", "logical_not"):
    _check(_kind)(_yes)
