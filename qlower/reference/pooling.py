"""Reference semantics of pooling and reductions (integer average pooling as TOSA 1.0).

Every kernel here costs a few whole-array NumPy operations, never one per tap, so
that a global pool over a tall map (an 800x90 window) is as cheap as a 3x3 one:

- integer average pooling: the exact int64 sum of the zero-point-centered taps
  that are not padding, read from 2-D prefix sums (integer cumulative sums over H
  then W; every partial sum is an exact int64), divided as TOSA AVG_POOL2D does by
  the number of real taps (``reciprocal_scale`` and ``apply_scale_32``);
- float average pooling: float64 sums in a fixed order, which *defines* the
  result (the cpu backend adds in the same order, so it is bit-identical): for each
  padded input row and output column the taps ``kx = 0 .. kw-1`` are added one after
  the other starting from the first tap, then for each output position these row
  sums ``ky = 0 .. kh-1`` are added the same way; padding taps are 0.0; the sum is
  divided in float64 by the number of real taps and rounded to float32 once;
- max pooling: the maximum over W then over H (exact for any order), padding at
  the dtype's lowest value so that it never wins. Float maxima (max pooling and
  reduce_max) follow IEEE 754 ``maximum``, which leaves nothing to the order of
  the comparisons: a NaN tap makes the result NaN, always the quiet NaN
  0x7FC00000 (NaN payloads are not propagated), and a zero maximum is +0.0 when
  one of the taps is +0.0 (-0.0 < +0.0), -0.0 otherwise.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from qlower.ir import Op, requant
from qlower.reference.registry import kernel


def reciprocal_scale(count: np.ndarray) -> requant.Multiplier:
    """TOSA ``reciprocal_scale``: multiplier/shift approximating 1/count for AVG_POOL2D.

    Computed once per distinct count (a pooled map has a handful of them)."""
    count = np.asarray(count, dtype=np.int64)
    values, where = np.unique(count, return_inverse=True)
    k = np.array([int(c - 1).bit_length() for c in values], dtype=np.int64)
    numerator = ((np.int64(1) << 30) + 1) << k
    return requant.Multiplier((numerator // values)[where].reshape(count.shape),
                              (30 + k)[where].reshape(count.shape))


def window_bounds(size: int, k: int, stride: int, pad_before: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """First and one-past-last real (non-padding) input index of each output's window along one axis."""
    start = np.arange(out, dtype=np.int64) * stride - pad_before
    return np.clip(start, 0, size), np.clip(start + k, 0, size)


def geometry(op: Op):
    """(n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) of a pooling op."""
    a = op.attrs
    _, oh, ow, _ = op.result.shape
    return tuple(op.operands[0].shape), tuple(a["kernel"]), tuple(a["stride"]), tuple(a["pad"]), (oh, ow)


def pool_counts(op: Op) -> np.ndarray:
    """Number of real (non-padding) taps of each output position, int64 [OH, OW]."""
    (n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) = geometry(op)
    y0, y1 = window_bounds(h, kh, sh, pt, oh)
    x0, x1 = window_bounds(w, kw, sw, pl, ow)
    return (y1 - y0)[:, None] * (x1 - x0)[None, :]


def _int_window_sums(op: Op, centered: np.ndarray) -> np.ndarray:
    """Exact int64 sum of each window's real taps of ``centered`` (int64 NHWC), [N, OH, OW, C]."""
    (n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) = geometry(op)
    prefix = np.zeros((n, h + 1, w + 1, c), dtype=np.int64)   # prefix[:, i, j] = sum of rows < i, columns < j
    np.cumsum(centered, axis=1, out=prefix[:, 1:, 1:])
    np.cumsum(prefix[:, 1:, 1:], axis=2, out=prefix[:, 1:, 1:])
    y0, y1 = window_bounds(h, kh, sh, pt, oh)
    x0, x1 = window_bounds(w, kw, sw, pl, ow)
    y0, y1, x0, x1 = y0[:, None], y1[:, None], x0[None, :], x1[None, :]
    return prefix[:, y1, x1] - prefix[:, y0, x1] - prefix[:, y1, x0] + prefix[:, y0, x0]


def float_window_sums(op: Op, x: np.ndarray) -> np.ndarray:
    """float64 window sums in the order that defines float average pooling (module docstring)."""
    (n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) = geometry(op)
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    rows_used = sh * (oh - 1) + kh
    span_w = sw * (ow - 1) + 1
    span_h = sh * (oh - 1) + 1
    with np.errstate(invalid="ignore", over="ignore"):   # inf + -inf is NaN, as it should be
        rows = xp[:, :rows_used, 0:span_w:sw].copy()
        for kx in range(1, kw):
            rows += xp[:, :rows_used, kx:kx + span_w:sw]
        acc = rows[:, 0:span_h:sh].copy()
        for ky in range(1, kh):
            acc += rows[:, ky:ky + span_h:sh]
    return acc


@kernel("avg_pool2d")
def _avg_pool2d(op: Op, x):
    t = op.operands[0].type
    count = pool_counts(op)
    if t.quant is None:
        return (float_window_sums(op, x) / count[None, :, :, None].astype(np.float64)).astype(np.float32)
    zp = t.quant.zero_point[0]
    acc = _int_window_sums(op, x.astype(np.int64) - zp)
    m = reciprocal_scale(count)
    scaled = requant.apply_scale_32(acc, m.multiplier[None, :, :, None], m.shift[None, :, :, None])
    return np.clip(scaled + zp, t.dtype.min, t.dtype.max)


def _separable_max(op: Op, x: np.ndarray, fill) -> np.ndarray:
    """Maximum of each window of ``x`` padded with ``fill``: over KW, then over KH."""
    (n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) = geometry(op)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    xp = xp[:, :sh * (oh - 1) + kh, :sw * (ow - 1) + kw]
    rows = sliding_window_view(xp, kw, axis=2)[:, :, ::sw].max(axis=-1)
    return sliding_window_view(rows, kh, axis=1)[:, ::sh].max(axis=-1)


def ieee_maximum(out: np.ndarray, x: np.ndarray, reduce) -> np.ndarray:
    """Float maxima ``out`` of ``x`` made IEEE 754 ``maximum``'s (module docstring): NaNs become
    the quiet NaN, zeros +0.0 where ``reduce`` (the same windows' max of a uint8 array like ``x``)
    finds a +0.0 tap, else -0.0."""
    zero = out == 0
    if zero.any():
        positive_zero = reduce(((x == 0) & ~np.signbit(x)).astype(np.uint8))
        out = np.where(zero, np.where(positive_zero == 1, np.float32(0.0), np.float32(-0.0)), out)
    nan = np.isnan(out)
    return np.where(nan, np.float32(np.nan), out) if nan.any() else out


@kernel("max_pool2d")
def _max_pool2d(op: Op, x):
    if x.dtype != np.float32:
        return _separable_max(op, x, np.iinfo(x.dtype).min)
    # padding (the lowest float32, or 0 in the +0.0 indicator) never changes which zero or NaN wins
    return ieee_maximum(_separable_max(op, x, np.finfo(np.float32).min), x, lambda z: _separable_max(op, z, 0))


@kernel("reduce_sum")
def _reduce_sum(op: Op, x):
    if op.result.type.quant is None:
        return x.astype(np.float64).sum(axis=op.attrs["axis"], keepdims=True).astype(np.float32)
    return x.astype(np.int64).sum(axis=op.attrs["axis"], keepdims=True)


@kernel("reduce_max")
def _reduce_max(op: Op, x):
    axis = op.attrs["axis"]
    out = x.max(axis=axis, keepdims=True)
    if x.dtype != np.float32:
        return out
    return ieee_maximum(out, x, lambda z: z.max(axis=axis, keepdims=True))
