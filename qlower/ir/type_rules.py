"""Type rules shared by the op definitions: float/quantized requirements, broadcasting, window
sizes, the accumulator type of a GEMM, one type domain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from qlower.errors import IRError
from qlower.ir.dtypes import DType
from qlower.ir.graph import TensorType
from qlower.ir.quant import QuantSpec


def fail(kind: str, msg: str) -> IRError:
    return IRError(f"{kind}: {msg}")


def require_float(kind: str, *types: TensorType) -> None:
    for t in types:
        if t.dtype is not DType.FLOAT32 or t.quant is not None:
            raise fail(kind, f"expects float32 without quantization, got {t}")


def require_quantized(kind: str, t: TensorType, *dtypes: DType) -> QuantSpec:
    if t.quant is None or (dtypes and t.dtype not in dtypes):
        want = "/".join(d.value for d in dtypes) or "integer"
        raise fail(kind, f"expects a quantized {want} tensor, got {t}")
    return t.quant


def is_float(t: TensorType) -> bool:
    return t.dtype is DType.FLOAT32


def broadcast_shape(kind: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Equal ranks, each dim equal or 1 on one side (as TOSA requires)."""
    if len(a) != len(b):
        raise fail(kind, f"operands must have equal rank to broadcast, got {a} and {b}")
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise fail(kind, f"shapes {a} and {b} don't broadcast")
        out.append(max(x, y))
    return tuple(out)


def window_output_size(size: int, k: int, stride: int, dil: int, p0: int, p1: int) -> int:
    """Output length of a sliding window (conv, pool) over ``size`` padded by ``p0`` and ``p1``:
    the one definition every stage uses."""
    return (size + p0 + p1 - dil * (k - 1) - 1) // stride + 1


def gemm_result(kind: str, x: TensorType, w: TensorType, bias: TensorType | None,
                 shape: tuple[int, ...], out_channels: int) -> TensorType:
    """Result type of a conv / fully connected: float, or an int32 accumulator."""
    if is_float(x):
        require_float(kind, x, w, *([bias] if bias else []))
        return TensorType(shape, DType.FLOAT32)
    xq = require_quantized(kind, x, DType.INT8, DType.INT16)
    wq = require_quantized(kind, w, DType.INT8)
    if xq.is_per_channel:
        raise fail(kind, "input must be quantized per tensor")
    if wq.is_per_channel and (wq.axis != 0 or len(wq.scale) != out_channels):
        raise fail(kind, f"per-channel weight quantization must be on axis 0 with {out_channels} scales, got {wq}")
    acc = QuantSpec.accumulator(xq, wq, axis=len(shape) - 1 if wq.is_per_channel else None)
    if bias is not None:
        expected = acc.with_axis(0 if acc.is_per_channel else None)
        if bias.dtype is not DType.INT32 or bias.shape != (out_channels,):
            raise fail(kind, f"bias must be int32[{out_channels}], got {bias}")
        if bias.quant is None or not same_scale(bias.quant, replace(expected, dynamic=bias.quant.dynamic)):
            raise fail(kind, f"bias quantization must be the accumulator's {expected}, got {bias.quant}")
    return TensorType(shape, DType.INT32, acc)


def same_scale(a: QuantSpec, b: QuantSpec) -> bool:
    return (np.allclose(a.scale, b.scale, rtol=1e-6, atol=0) and a.zero_point == b.zero_point
            and a.axis == b.axis)


def same_domain(kind: str, types: Sequence[TensorType]) -> None:
    first = types[0]
    for t in types[1:]:
        if t.dtype is not first.dtype or t.quant != first.quant:
            raise fail(kind, f"operands must share one type domain, got {first} and {t}")


def unchanged_quant(kind: str, t: TensorType, shape: tuple[int, ...]) -> TensorType:
    if t.quant is not None and t.quant.is_per_channel:
        raise fail(kind, f"can't move a per-channel quantized tensor ({t})")
    return TensorType(shape, t.dtype, t.quant)
