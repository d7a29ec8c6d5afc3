"""Lowerings of the multiply-accumulate ops: conv2d, fully_connected, matmul.

The IR and TOSA agree on what these compute (sum of ``(x - x_zp) * (w - w_zp)``
in int32, plus bias), so only layouts change: OHWI weights stay OHWI for
CONV2D, become [KH, KW, C, M] for DEPTHWISE_CONV2D, grouped convolutions are
one CONV2D per group, and TOSA's output-size rule is met by dropping rows the
window never reads (``support.fit_window``).

int16 x int8 (A16W8): TOSA accumulates in int48, with an int48 bias. The IR's
int32 accumulator holds every such sum (the frontend proves it from the weights),
so an exact RESCALE by 1 (a 16-bit multiplier: TOSA takes no 32-bit one on
int48) brings the int48 result back to the int32 the IR's ops read.
"""

from __future__ import annotations

import math

import numpy as np
import tosa_serializer as ts

from qlower.backends.tosa.lowering import Lowerer, lowering
from qlower.backends.tosa.serializer import DT, NUMPY_OF, Tensor, attr
from qlower.backends.tosa.support import fit_window
from qlower.errors import CompileError
from qlower.ir import Op, Value

Op_ = ts.Op


def _zero_points(lw: Lowerer, x: Tensor, xv: Value, w: Tensor, wv: Value) -> tuple[Tensor, Tensor]:
    """Input and weight zero-point operands (one weight zero point: checked by support)."""
    x_zp = xv.type.quant.zero_point[0] if xv.type.quant else 0
    w_zp = wv.type.quant.zero_point[0] if wv.type.quant else 0
    return lw.zero_point(x, x_zp), lw.zero_point(w, w_zp)


def _bias(lw: Lowerer, bv: Value | None, channels: int, acc_dtype: object) -> Tensor:
    """The bias operand; an absent bias (None in the IR) is an explicit zero bias in TOSA. An int48
    accumulator takes its int32 bias as an int48 constant (same values)."""
    if bv is None:
        return lw.w.const(np.zeros(channels, dtype=NUMPY_OF[acc_dtype]), acc_dtype)
    bias = lw.t(bv)
    if acc_dtype == DT.INT48:
        if not bias.is_const:
            raise CompileError("an int16 x int8 convolution needs a constant bias (TOSA takes it as int48)")
        return lw.w.const(bias.data.astype(np.int64), DT.INT48)
    return bias


def _acc_dtype(x: Tensor) -> object:
    return {DT.FP32: DT.FP32, DT.INT16: DT.INT48}.get(x.dtype, DT.INT32)


def _as_int32(lw: Lowerer, acc: Tensor) -> Tensor:
    """An int48 accumulator as int32: RESCALE by 1 (multiplier 2**14, shift 14; exact, as the sums fit int32)."""
    if acc.dtype != DT.INT48:
        return acc
    one, shift = lw.w.scalar(1 << 14, DT.INT16), lw.w.scalar(14, DT.INT8)
    return lw.emit(Op_.RESCALE, [acc, one, shift, lw.w.scalar(0, DT.INT48), lw.w.scalar(0, DT.INT32)],
                   acc.shape, DT.INT32, attr("Rescale", False, ts.RoundingMode.SINGLE_ROUND, False, False, False))


@lowering("conv2d")
def _conv2d(lw: Lowerer, op: Op) -> Tensor:
    xv, wv, bv = op.operands
    x, w = lw.t(xv), lw.t(wv)
    n, h, wd, c = xv.shape
    o, kh, kw, ci = wv.shape
    groups = op.attrs["groups"]
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = op.attrs["stride"], op.attrs["dilation"], op.attrs["pad"]
    pb, crop_h = fit_window(h, kh, sh, dh, pt, pb)
    pr, crop_w = fit_window(wd, kw, sw, dw, pl, pr)
    x = lw.slice(x, (0, 0, 0, 0), (n, h - crop_h, wd - crop_w, c))
    acc = _acc_dtype(x)
    bias = _bias(lw, bv, o, acc)
    x_zp, w_zp = _zero_points(lw, x, xv, w, wv)
    geometry = ([pt, pb, pl, pr], [sh, sw], [dh, dw], False, acc)
    out_shape = op.result.shape

    if groups > 1 and groups == c and ci == 1:
        # OHWI [C*M, KH, KW, 1] with output channel c*M + m -> TOSA [KH, KW, C, M].
        w_dw = lw.transpose(lw.reshape(w, (c, o // c, kh, kw)), (2, 3, 0, 1))
        return _as_int32(lw, lw.emit(Op_.DEPTHWISE_CONV2D, [x, w_dw, bias, x_zp, w_zp], out_shape, acc,
                                     attr("DepthwiseConv2d", *geometry)))
    if groups == 1:
        return _as_int32(lw, lw.emit(Op_.CONV2D, [x, w, bias, x_zp, w_zp], out_shape, acc,
                                     attr("Conv2d", *geometry)))
    og = o // groups
    parts = []
    for g in range(groups):
        xg = lw.slice(x, (0, 0, 0, g * ci), (n, x.shape[1], x.shape[2], ci))
        wg = lw.slice(w, (g * og, 0, 0, 0), (og, kh, kw, ci))
        bg = lw.slice(bias, (g * og,), (og,))
        parts.append(_as_int32(lw, lw.emit(Op_.CONV2D, [xg, wg, bg, x_zp, w_zp], out_shape[:3] + (og,), acc,
                                           attr("Conv2d", *geometry))))
    return lw.concat(parts, 3)


@lowering("fully_connected")
def _fully_connected(lw: Lowerer, op: Op) -> Tensor:
    """``[..., K] x [N, K]^T``: reshape to [B, 1, 1, K], a 1x1 CONV2D (bias fused), reshape back."""
    xv, wv, bv = op.operands
    x, w = lw.t(xv), lw.t(wv)
    k, n_out = xv.shape[-1], wv.shape[0]
    batch = math.prod(xv.shape[:-1])
    acc = _acc_dtype(x)
    x4 = lw.reshape(x, (batch, 1, 1, k))
    w4 = lw.reshape(w, (n_out, 1, 1, k))
    x_zp, w_zp = _zero_points(lw, x, xv, w, wv)
    y = _as_int32(lw, lw.emit(Op_.CONV2D, [x4, w4, _bias(lw, bv, n_out, acc), x_zp, w_zp], (batch, 1, 1, n_out),
                              acc, attr("Conv2d", [0, 0, 0, 0], [1, 1], [1, 1], False, acc)))
    return lw.reshape(y, op.result.shape)


@lowering("matmul")
def _matmul(lw: Lowerer, op: Op) -> Tensor:
    """Batched matmul as rank-3 MATMUL (batch dims flattened)."""
    av, bv = op.operands
    a, b = lw.t(av), lw.t(bv)
    m, k, n = av.shape[-2], av.shape[-1], bv.shape[-1]
    batch = math.prod(av.shape[:-2])
    a3, b3 = lw.reshape(a, (batch, m, k)), lw.reshape(b, (batch, k, n))
    a_zp, b_zp = _zero_points(lw, a, av, b, bv)
    y = lw.emit(Op_.MATMUL, [a3, b3, a_zp, b_zp], (batch, m, n), _acc_dtype(a), attr("MatMul"))
    return lw.reshape(y, op.result.shape)
