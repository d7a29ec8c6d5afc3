"""Lowerings of the ops that cross between reals and codes: quantize, dequantize, cast.

They are bit-exact with ``qlower.reference.quantization`` (float32 arithmetic
like PyTorch's decomposed quantization ops):

- dequantize: CAST to float32 (exact), SUB the zero point (exact: codes are
  small integers), MUL by float32(scale): one float32 rounding, as the reference.
- quantize: MUL by float32(1/scale) (the reference's product), CLAMP to
  [qmin - zp, qmax - zp] in float, CAST to int (round half to even, like
  ``np.rint``), then add the zero point in integers. Clamping before rounding
  equals rounding before clamping because the bounds are integers, and adding
  the zero point after rounding keeps the reference's order: ``rint(y) + zp``
  and ``rint(y + zp)`` differ on ties when zp is odd. int32 codes (zero point
  0) are clamped after the CAST instead, with MAXIMUM/MINIMUM: float32 can't
  hold int32's bounds exactly.
"""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from qlower.backends.tosa.lowering import Lowerer, lowering
from qlower.backends.tosa.serializer import DT, Tensor, attr, tosa_dtype
from qlower.ir import Op

Op_ = ts.Op


def _broadcast_const(lw: Lowerer, values: np.ndarray, rank: int, dtype: object) -> Tensor:
    """A per-tensor or per-channel parameter as a constant of equal rank (TOSA broadcasting)."""
    values = np.asarray(values)
    return lw.w.const(values.reshape(values.shape if values.ndim == rank else (1,) * rank), dtype)


def _mul(lw: Lowerer, a: Tensor, b: Tensor) -> Tensor:
    shape = tuple(max(x, y) for x, y in zip(a.shape, b.shape))
    return lw.emit(Op_.MUL, [a, b, lw.scalar(0, DT.INT8)], shape, DT.FP32, attr("Mul"))


@lowering("dequantize")
def _dequantize(lw: Lowerer, op: Op) -> Tensor:
    xv, sv = op.operands
    x, q = lw.t(xv), xv.type.quant
    rank = x.rank
    zp = q.zero_point_array(rank)
    if x.dtype == DT.INT32:  # int32 codes may not be exact in float32: subtract first, in int32
        centered = lw.cast(lw.add_const(x, -zp), DT.FP32)
    else:
        centered = lw.add_const(lw.cast(x, DT.FP32), (-zp).astype(np.float32))
    scale = q.scale_array(rank).astype(np.float32)
    s = None if np.all(scale == 1.0) else _broadcast_const(lw, scale, rank, DT.FP32)
    if sv is not None:
        s = lw.t(sv) if s is None else _mul(lw, lw.t(sv), s)
    return centered if s is None else _mul(lw, centered, s)


@lowering("quantize")
def _quantize(lw: Lowerer, op: Op) -> Tensor:
    x = lw.t(op.operands[0])
    q, rank = op.attrs["out"], x.rank
    out_dtype = tosa_dtype(q.dtype)
    inv = (1.0 / q.scale_array(rank)).astype(np.float32)
    y = _mul(lw, x, _broadcast_const(lw, inv, rank, DT.FP32))
    if out_dtype == DT.INT32:  # zero point 0 (support): saturate in the CAST, then exact int32 bounds
        return lw.clamp(lw.cast(y, DT.INT32), q.qmin, q.qmax)
    zps = np.asarray(q.zero_point, dtype=np.int64)
    if np.all(zps == zps[0]):
        zp = int(zps[0])
        y = lw.cast(lw.clamp(y, q.qmin - zp, q.qmax - zp), DT.INT32 if zp else out_dtype)
        return lw.identity_rescale(y, zp, out_dtype) if zp else y
    # Per-channel zero points: round, add each channel's zero point in int32, then clamp.
    y = lw.cast(lw.clamp(y, q.qmin - int(zps.max()), q.qmax - int(zps.min())), DT.INT32)
    y = lw.add_const(y, q.zero_point_array(rank).astype(np.int32))
    return lw.saturate(lw.clamp(y, q.qmin, q.qmax), out_dtype)


@lowering("cast")
def _cast(lw: Lowerer, op: Op) -> Tensor:
    """int -> float exact (int32: round to nearest even), float -> int rounds half to even and
    saturates (TOSA CAST), int -> int saturates."""
    x = lw.t(op.operands[0])
    out = tosa_dtype(op.result.dtype)
    if out == DT.FP32 or x.dtype == DT.FP32:
        return lw.cast(x, out)
    return lw.saturate(x, out)
