"""Reference semantics of pooling and reductions (integer average pooling as TOSA 1.0)."""

from __future__ import annotations

import numpy as np

from qlower import requant
from qlower.ir import Op
from qlower.reference.registry import kernel


def reciprocal_scale(count: np.ndarray) -> requant.Multiplier:
    """TOSA ``reciprocal_scale``: multiplier/shift approximating 1/count for AVG_POOL2D."""
    count = np.asarray(count, dtype=np.int64)
    k = np.array([int(c - 1).bit_length() for c in count.reshape(-1)], dtype=np.int64).reshape(count.shape)
    numerator = ((np.int64(1) << 30) + 1) << k
    return requant.Multiplier(numerator // count, 30 + k)


def _windows(x: np.ndarray, kernel_hw, stride, pad, fill):
    """Yield the strided window taps of a padded NHWC tensor, and a mask of real elements."""
    n, h, w, c = x.shape
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = kernel_hw, stride, pad
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    valid = np.pad(np.ones((h, w), dtype=np.int64), ((pt, pb), (pl, pr)))
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    for ky in range(kh):
        for kx in range(kw):
            ys, xs = slice(ky, ky + sh * (oh - 1) + 1, sh), slice(kx, kx + sw * (ow - 1) + 1, sw)
            yield xp[:, ys, xs, :], valid[ys, xs]


@kernel("avg_pool2d")
def _avg_pool2d(op: Op, x):
    a, t = op.attrs, op.operands[0].type
    if t.quant is None:
        acc, count = 0.0, 0
        for tap, valid in _windows(x.astype(np.float64), a["kernel"], a["stride"], a["pad"], 0.0):
            acc, count = acc + tap, count + valid
        return (acc / count[None, :, :, None]).astype(np.float32)
    zp = t.quant.zero_point[0]
    acc, count = 0, 0
    for tap, valid in _windows(x.astype(np.int64) - zp, a["kernel"], a["stride"], a["pad"], 0):
        acc, count = acc + tap, count + valid
    m = reciprocal_scale(count)
    scaled = requant.apply_scale_32(acc, m.multiplier[None, :, :, None], m.shift[None, :, :, None])
    return np.clip(scaled + zp, t.dtype.min, t.dtype.max)


@kernel("max_pool2d")
def _max_pool2d(op: Op, x):
    a = op.attrs
    lowest = np.finfo(np.float32).min if x.dtype == np.float32 else np.iinfo(x.dtype).min
    out = None
    for tap, _ in _windows(x, a["kernel"], a["stride"], a["pad"], lowest):
        out = tap if out is None else np.maximum(out, tap)
    return out


@kernel("reduce_sum")
def _reduce_sum(op: Op, x):
    if op.result.type.quant is None:
        return x.astype(np.float64).sum(axis=op.attrs["axis"], keepdims=True).astype(np.float32)
    return x.astype(np.int64).sum(axis=op.attrs["axis"], keepdims=True)


@kernel("reduce_max")
def _reduce_max(op: Op, x):
    return x.max(axis=op.attrs["axis"], keepdims=True)
