"""Lowerings of the multiply-accumulate ops: conv2d, fully_connected, matmul.

The IR and TOSA agree on what these compute (sum of ``(x - x_zp) * (w - w_zp)``
in int32, plus bias), so only layouts change: OHWI weights stay OHWI for
CONV2D, become [KH, KW, C, M] for DEPTHWISE_CONV2D, grouped convolutions are
one CONV2D per group, and TOSA's output-size rule is met by dropping rows the
window never reads (``support.fit_window``).
"""

from __future__ import annotations

import math

import numpy as np
import tosa_serializer as ts

from qlower.backends.tosa.lowering import Lowerer, lowering
from qlower.backends.tosa.serializer import DT, NUMPY_OF, Tensor, attr
from qlower.backends.tosa.support import fit_window
from qlower.ir import Op, Value

Op_ = ts.Op


def _zero_points(lw: Lowerer, x: Tensor, xv: Value, w: Tensor, wv: Value) -> tuple[Tensor, Tensor]:
    """Input and weight zero-point operands (one weight zero point: checked by support)."""
    x_zp = xv.type.quant.zero_point[0] if xv.type.quant else 0
    w_zp = wv.type.quant.zero_point[0] if wv.type.quant else 0
    return lw.zero_point(x, x_zp), lw.zero_point(w, w_zp)


def _bias(lw: Lowerer, bv: Value | None, channels: int, acc_dtype: object) -> Tensor:
    """The bias operand; an absent bias (None in the IR) is an explicit zero bias in TOSA."""
    if bv is not None:
        return lw.t(bv)
    return lw.w.const(np.zeros(channels, dtype=NUMPY_OF[acc_dtype]), acc_dtype)


def _acc_dtype(x: Tensor) -> object:
    return DT.FP32 if x.dtype == DT.FP32 else DT.INT32


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
        return lw.emit(Op_.DEPTHWISE_CONV2D, [x, w_dw, bias, x_zp, w_zp], out_shape, acc,
                       attr("DepthwiseConv2d", *geometry))
    if groups == 1:
        return lw.emit(Op_.CONV2D, [x, w, bias, x_zp, w_zp], out_shape, acc, attr("Conv2d", *geometry))
    og = o // groups
    parts = []
    for g in range(groups):
        xg = lw.slice(x, (0, 0, 0, g * ci), (n, x.shape[1], x.shape[2], ci))
        wg = lw.slice(w, (g * og, 0, 0, 0), (og, kh, kw, ci))
        bg = lw.slice(bias, (g * og,), (og,))
        parts.append(lw.emit(Op_.CONV2D, [xg, wg, bg, x_zp, w_zp], out_shape[:3] + (og,), acc,
                             attr("Conv2d", *geometry)))
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
    y = lw.emit(Op_.CONV2D, [x4, w4, _bias(lw, bv, n_out, acc), x_zp, w_zp], (batch, 1, 1, n_out), acc,
                attr("Conv2d", [0, 0, 0, 0], [1, 1], [1, 1], False, acc))
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
