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
- max pooling: the maximum over W then over H, padding at the dtype's lowest value
  (-inf for floats) so that it never wins. Float maxima and minima (max pooling,
  reduce_max, reduce_min) are TOSA 1.0's ``apply_max_s`` / ``apply_min_s`` folded
  over the taps in order (row-major over the window, increasing index along an
  axis): a NaN tap makes the result NaN; otherwise the result is the extreme value,
  and which of -0.0 and +0.0 a zero result is depends on the order: a maximum keeps
  the first tap that reaches it (``acc >= v ? acc : v``), a minimum the last
  (``acc < v ? acc : v``). ``zero_sign`` finds that tap without a loop over taps.
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


def _windows(op: Op, x: np.ndarray, fill) -> tuple[np.ndarray, np.ndarray]:
    """Row windows (along W) of ``x`` padded with ``fill``, and the function that takes their
    row-window results to whole windows (along H): [N, rows, OW, C, KW] and [N, OH, OW, C, KH] views."""
    (n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) = geometry(op)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    xp = xp[:, :sh * (oh - 1) + kh, :sw * (ow - 1) + kw]
    return sliding_window_view(xp, kw, axis=2)[:, :, ::sw], lambda rows: sliding_window_view(rows, kh, axis=1)[:, ::sh]


def _separable_max(op: Op, x: np.ndarray, fill) -> np.ndarray:
    """Maximum of each window of ``x`` padded with ``fill``: over KW, then over KH."""
    rows, columns = _windows(op, x, fill)
    return columns(rows.max(axis=-1)).max(axis=-1)


def _first_nonzero(codes: np.ndarray, last: bool = False) -> np.ndarray:
    """The first (or last) nonzero entry along the last axis, 0 where there is none."""
    hit = codes != 0
    at = codes.shape[-1] - 1 - np.argmax(hit[..., ::-1], axis=-1) if last else np.argmax(hit, axis=-1)
    return np.take_along_axis(codes, at[..., None], axis=-1)[..., 0]


def _zero_codes(x: np.ndarray) -> np.ndarray:
    """1 for +0.0 taps, 2 for -0.0 taps, 0 for the rest."""
    return np.where(x == 0, np.where(np.signbit(x), 2, 1), 0).astype(np.uint8)


def zero_sign(result: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``result`` with its zeros signed by ``codes`` (those of ``_zero_codes``: 2 means -0.0) and
    its NaNs made the quiet NaN."""
    out = np.where(result == 0, np.where(codes == 2, np.float32(-0.0), np.float32(0.0)), result)
    return np.where(np.isnan(out), np.float32(np.nan), out).astype(np.float32)


@kernel("max_pool2d")
def _max_pool2d(op: Op, x):
    if x.dtype != np.float32:
        return _separable_max(op, x, np.iinfo(x.dtype).min)
    with np.errstate(invalid="ignore"):
        out = _separable_max(op, x, -np.inf)
    rows, columns = _windows(op, _zero_codes(x), 0)   # padding is no zero tap
    return zero_sign(out, _first_nonzero(columns(_first_nonzero(rows))))


@kernel("reduce_sum")
def _reduce_sum(op: Op, x):
    if op.result.type.quant is None:
        return x.astype(np.float64).sum(axis=op.attrs["axis"], keepdims=True).astype(np.float32)
    return x.astype(np.int64).sum(axis=op.attrs["axis"], keepdims=True)


def _reduce_extreme(x: np.ndarray, axis: int, maximum: bool) -> np.ndarray:
    out = x.max(axis=axis, keepdims=True) if maximum else x.min(axis=axis, keepdims=True)
    if x.dtype != np.float32:
        return out
    codes = _first_nonzero(np.moveaxis(_zero_codes(x), axis, -1), last=not maximum)
    return zero_sign(out, np.expand_dims(codes, axis))


@kernel("reduce_max")
def _reduce_max(op: Op, x):
    return _reduce_extreme(x, op.attrs["axis"], maximum=True)


@kernel("reduce_min")
def _reduce_min(op: Op, x):
    return _reduce_extreme(x, op.attrs["axis"], maximum=False)
