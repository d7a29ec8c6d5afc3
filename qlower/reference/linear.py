"""Reference semantics of the multiply-accumulate ops: conv2d, fully_connected, matmul.

Integer ops accumulate ``(x - x_zp) * (w - w_zp)`` exactly. The sums are
computed as float64 GEMMs, which is exact here: after zero-point subtraction an
int8 operand is at most 255 in magnitude and an int16 one 65535, so every product
is below 2**24, and a sum of K < 2**29 such products stays below 2**53: no
partial sum is ever rounded. The result is
converted back to int64 and must fit the int32 accumulator.
"""

from __future__ import annotations

import numpy as np

from qlower.ir import Op, TensorType
from qlower.reference.registry import kernel

_EXACT_FLOAT_BOUND = 2.0**53


def _centered(x: np.ndarray, t: TensorType, axis: int | None = None) -> np.ndarray:
    """Codes minus zero point, as float64 (exact), or the float values."""
    if t.quant is None:
        return x.astype(np.float64)
    zp = t.quant.zero_point_array(x.ndim)
    return (x.astype(np.int64) - zp).astype(np.float64)


def _finish(acc: np.ndarray, bias: np.ndarray | None, out: TensorType) -> np.ndarray:
    if out.quant is None:
        res = acc if bias is None else acc + bias.astype(np.float64)
        return res.astype(np.float32)
    if np.abs(acc).max(initial=0) >= _EXACT_FLOAT_BOUND:
        raise ArithmeticError("accumulator exceeds the exact float64 range")
    res = np.rint(acc).astype(np.int64)
    if bias is not None:
        res = res + bias.astype(np.int64)
    return res


def conv2d_nhwc(x: np.ndarray, w: np.ndarray, stride, dilation, pad, groups: int) -> np.ndarray:
    """Float64 convolution of already-centered operands (zero padding)."""
    n, h, wd, c = x.shape
    o, kh, kw, ci = w.shape
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = stride, dilation, pad
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, oh, ow, o), dtype=np.float64)
    og = o // groups
    depthwise = ci == 1 and groups == c
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dh, kx * dw
            patch = xp[:, y0:y0 + sh * (oh - 1) + 1:sh, x0:x0 + sw * (ow - 1) + 1:sw, :]
            if depthwise:
                mult = o // c  # channel multiplier: output channel oc reads input channel oc // mult
                out += np.repeat(patch, mult, axis=3) * w[:, ky, kx, 0]
            elif groups == 1:
                out += patch @ w[:, ky, kx, :].T
            else:
                for g in range(groups):
                    out[..., g * og:(g + 1) * og] += patch[..., g * ci:(g + 1) * ci] @ w[g * og:(g + 1) * og, ky, kx, :].T
    return out


@kernel("conv2d")
def _conv2d(op: Op, x, w, bias):
    xt, wt, _ = (v.type if v is not None else None for v in op.operands)
    a = op.attrs
    acc = conv2d_nhwc(_centered(x, xt), _centered(w, wt), a["stride"], a["dilation"], a["pad"], a["groups"])
    return _finish(acc, bias, op.result.type)


@kernel("fully_connected")
def _fully_connected(op: Op, x, w, bias):
    xt, wt = op.operands[0].type, op.operands[1].type
    acc = _centered(x, xt) @ _centered(w, wt).T
    return _finish(acc, bias, op.result.type)


@kernel("matmul")
def _matmul(op: Op, a, b):
    at, bt = op.operands[0].type, op.operands[1].type
    acc = np.matmul(_centered(a, at), _centered(b, bt))
    return _finish(acc, None, op.result.type)
