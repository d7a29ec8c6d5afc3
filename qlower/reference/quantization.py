"""Reference semantics of the ops that cross between reals and codes.

``quantize`` and ``dequantize`` follow PyTorch's decomposed quantization ops
(float32 arithmetic, multiply by the reciprocal scale, round half to even), so
that host-side quantization equals what the PyTorch model computes.
"""

from __future__ import annotations

import numpy as np

from qlower.ir import Op
from qlower.reference.registry import kernel

_EPS = np.finfo(np.float32).eps


def quantize_array(x: np.ndarray, scale, zero_point, qmin: int, qmax: int) -> np.ndarray:
    """``clamp(round_half_even(x * float32(1/scale)) + zp, qmin, qmax)`` computed in float32."""
    inv = (1.0 / np.asarray(scale, dtype=np.float64)).astype(np.float32)
    q = np.rint(x.astype(np.float32) * inv) + np.asarray(zero_point, dtype=np.float32)
    # clip in float64: same result for every float32 q, and exact int32 bounds
    return np.clip(q.astype(np.float64), qmin, qmax).astype(np.int64)


@kernel("quantize")
def _quantize(op: Op, x):
    if np.isnan(x).any():   # NaN has no code (casting it to an integer is undefined)
        raise ValueError("can't quantize NaN")
    q = op.attrs["out"]
    return quantize_array(x, q.scale_array(x.ndim), q.zero_point_array(x.ndim), q.qmin, q.qmax)


def dynamic_scale(x: np.ndarray, granularity: str, qmax: int) -> np.ndarray:
    """Run-time symmetric scale ``max(max|x| / qmax, eps)`` in float32, per tensor or per row."""
    x = x.astype(np.float32)
    if granularity == "per_tensor":
        amax = np.abs(x).max(initial=0.0).reshape((1,) * x.ndim)
    else:
        amax = np.abs(x).max(axis=-1, keepdims=True, initial=0.0)
    return np.maximum(amax.astype(np.float32) / np.float32(qmax), _EPS).astype(np.float32)


@kernel("dynamic_quantize")
def _dynamic_quantize(op: Op, x):
    qmax = op.attrs["qmax"]
    scale = dynamic_scale(x, op.attrs["granularity"], qmax)
    codes = np.clip(np.rint(x.astype(np.float32) / scale), -qmax, qmax).astype(np.int64)
    return codes, scale


@kernel("dequantize")
def _dequantize(op: Op, x, runtime_scale):
    q = op.operands[0].type.quant
    centered = (x.astype(np.int64) - q.zero_point_array(x.ndim)).astype(np.float32)
    scale = q.scale_array(x.ndim).astype(np.float32)
    if runtime_scale is not None:
        scale = (runtime_scale.astype(np.float32) * scale).astype(np.float32)
    return (centered * scale).astype(np.float32)


@kernel("cast")
def _cast(op: Op, x):
    out = op.result.type
    if out.dtype.is_float:
        return x.astype(np.float32)
    if x.dtype.kind == "f":  # clip in float64, where int32's bounds are exact (float32 rounds 2**31-1 up)
        return np.clip(np.rint(x.astype(np.float64)), out.dtype.min, out.dtype.max).astype(np.int64)
    return np.clip(x.astype(np.int64), out.dtype.min, out.dtype.max)


@kernel("table_interp")
def _table_interp(op: Op, x):
    t = op.attrs["table"].astype(np.int64)
    v = np.clip(x.astype(np.int64), -32768, 32767) + 32768
    base = t[v >> 7]
    return (base << 7) + (t[(v >> 7) + 1] - base) * (v & 127)


@kernel("table")
def _table(op: Op, x):
    table = op.attrs["table"]
    # a code outside the input's declared range reads the nearest entry (never wraps around)
    return table[np.clip(x.astype(np.int64) + op.attrs["offset"], 0, table.size - 1)]
