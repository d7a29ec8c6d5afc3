"""Op definitions that cross between reals and codes: quantize, dynamic_quantize, dequantize, cast."""

from __future__ import annotations

from qlower.ir.dtypes import DType
from qlower.ir.graph import TensorType
from qlower.ir.opdefs import REQUIRED, register
from qlower.ir.quant import QuantSpec
from qlower.ir.type_rules import (
    broadcast_shape,
    fail,
    require_float,
    require_quantized,
)


@register("quantize", ("input",), out=REQUIRED)
def _quantize(ops, attrs):
    """float32 -> codes: ``clamp(round_half_even(x * (1/scale)) + zp)``, in float32 like PyTorch."""
    (x,) = ops
    require_float("quantize", x)
    out: QuantSpec = attrs["out"]
    if out.dynamic:
        raise fail("quantize", "use dynamic_quantize for run-time scales")
    return (TensorType(x.shape, out.dtype, out),)


@register("dynamic_quantize", ("input",), results=2, granularity="per_tensor", dtype=DType.INT8, qmax=127)
def _dynamic_quantize(ops, attrs):
    """float32 -> symmetric codes with a run-time scale ``max|x| / qmax`` (per tensor or per row);
    results: the codes and the float32 scale."""
    (x,) = ops
    require_float("dynamic_quantize", x)
    g, qmax = attrs["granularity"], attrs["qmax"]
    if g not in ("per_tensor", "per_row"):
        raise fail("dynamic_quantize", f"granularity must be per_tensor or per_row, got {g!r}")
    spec = QuantSpec(attrs["dtype"], (1.0,), (0,), -qmax, qmax, dynamic=g)
    scale_shape = (1,) * x.rank if g == "per_tensor" else x.shape[:-1] + (1,)
    return TensorType(x.shape, attrs["dtype"], spec), TensorType(scale_shape, DType.FLOAT32)


@register("dequantize", ("input", "scale?"))
def _dequantize(ops, attrs):
    """codes -> float32: ``(x - zp) * scale`` (times the run-time ``scale`` operand when dynamic)."""
    x, s = ops
    q = require_quantized("dequantize", x)
    if bool(q.dynamic) != (s is not None):
        raise fail("dequantize", "a run-time scale operand is needed exactly when the input is dynamic")
    if s is not None:
        require_float("dequantize", s)
        broadcast_shape("dequantize", x.shape, s.shape)
    return (TensorType(x.shape, DType.FLOAT32),)


@register("cast", ("input",), dtype=REQUIRED, out=None)
def _cast(ops, attrs):
    """Convert element type: int codes -> float (the code's value), float -> int (round half even)."""
    (x,) = ops
    dtype: DType = attrs["dtype"]
    if dtype.is_integer and attrs["out"] is None:
        raise fail("cast", "an integer result needs its QuantSpec ('out')")
    return (TensorType(x.shape, dtype, attrs["out"] if dtype.is_integer else None),)
