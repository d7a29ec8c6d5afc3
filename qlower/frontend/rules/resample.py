"""upsample_nearest2d as pure data movement (integer codes keep their input's domain) and
upsample_bilinear2d in exact int32 arithmetic (see ``upsample_bilinear2d``).

The index maps are PyTorch's own: the op is evaluated at import time on a plane
holding each element's row (or column) number, so every rounding rule of
``nearest`` (scale factors vs output sizes, float32 index arithmetic) is PyTorch's
by construction. Per spatial dim, a map that is an arithmetic progression
(copy, integer downsampling) is one strided ``slice``; one that repeats every
input index ``r`` times is ``concat`` of ``r`` copies and a reshape; any other is
a ``concat`` of slices, one per run of equal indices.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.rules import register
from qlower.frontend.rules.elementwise import _float_ref
from qlower.ir import DType, QuantSpec, Value

aten = torch.ops.aten
MAX_RUNS = 64


def index_maps(node, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Input row of every output row, input column of every output column, as PyTorch computes them."""
    rows = torch.arange(h, dtype=torch.float32).view(1, 1, h, 1).expand(1, 1, h, w).contiguous()
    cols = torch.arange(w, dtype=torch.float32).view(1, 1, 1, w).expand(1, 1, h, w).contiguous()
    with torch.no_grad():
        r = node.target(rows, *node.args[1:], **node.kwargs)
        c = node.target(cols, *node.args[1:], **node.kwargs)
    return r[0, 0, :, 0].round().long().numpy(), c[0, 0, 0, :].round().long().numpy()


@register(aten.upsample_nearest2d)
def upsample_nearest2d(ctx: ImportContext, node, input: Ref, **_):
    x = _float_ref(ctx, input)
    if x.rank != 4:
        raise ctx.unsupported(f"upsample_nearest2d of a rank-{x.rank} tensor")
    if x.is_quantized and (x.spec.is_per_channel or x.scale is not None):
        raise ctx.unsupported("upsample_nearest2d of per-channel or dynamically quantized codes")
    v = ctx.value_in(x, layout.NHWC) if x.is_quantized else ctx.as_float(x, layout.NHWC)
    rows, cols = index_maps(node, v.shape[1], v.shape[2])
    for axis, index in ((1, rows), (2, cols)):
        v = _gather(ctx, v, axis, index)
    return Ref.of(v, layout.NHWC)


def _gather(ctx: ImportContext, v: Value, axis: int, index: np.ndarray) -> Value:
    """``v`` indexed by the non-decreasing ``index`` along NHWC ``axis`` (1 or 2)."""
    size = v.shape[axis]
    if len(index) == size and np.array_equal(index, np.arange(size)):
        return v
    step = int(index[1] - index[0]) if len(index) > 1 else 1
    if step >= 1 and np.array_equal(index, index[0] + step * np.arange(len(index))):
        return _slice(ctx, v, axis, int(index[0]), int(index[-1]) + 1, step)
    counts = np.bincount(index, minlength=size)
    r = int(counts[0])
    if r > 1 and np.all(counts == r) and np.all(np.diff(index) >= 0):
        return _repeat_each(ctx, v, axis, r)
    shifted = _shifted_repeat(index, size)
    if shifted is not None:
        return _edge_repeat(ctx, v, axis, len(index), *shifted)
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
    if len(starts) > MAX_RUNS or np.any(np.diff(index) < 0):
        raise ctx.unsupported(f"nearest resampling with {len(starts)} runs along one dim (limit {MAX_RUNS})")
    lengths = np.diff(np.r_[starts, len(index)])
    pieces = []
    for st, n in zip(starts, lengths):
        row = _slice(ctx, v, axis, int(index[st]), int(index[st]) + 1, 1)
        pieces += [row] * int(n)
    return ctx.emit("concat", tuple(pieces), perm=layout.NHWC, axis=axis)


def _shifted_repeat(index: np.ndarray, size: int, max_repeat: int = 16) -> tuple[int, int] | None:
    """``(r, off)`` with ``index[o] == clip((o + off) // r, 0, size - 1)`` for every ``o`` (e.g. the taps
    of a 2x bilinear upsampling, ``(o - 1) // 2`` clamped), or None."""
    o = np.arange(len(index))
    for r in range(1, max_repeat + 1):
        for off in range(-2 * r, 2 * r + 1):
            if np.array_equal(index, np.clip((o + off) // r, 0, size - 1)):
                return r, off
    return None


def _edge_repeat(ctx: ImportContext, v: Value, axis: int, out: int, r: int, off: int) -> Value:
    """``v[clip((o + off) // r)]`` for ``o < out``: edge copies where the index leaves the range, every
    index ``r`` times, then the window starting at ``off`` (shifted by the left copies)."""
    size = v.shape[axis]
    left, right = max(0, -((0 + off) // r)), max(0, (out - 1 + off) // r - (size - 1))
    if left or right:
        pieces = [_slice(ctx, v, axis, 0, 1, 1)] * left + [v] + [_slice(ctx, v, axis, size - 1, size, 1)] * right
        v = ctx.emit("concat", tuple(pieces), perm=layout.NHWC, axis=axis)
    if r > 1:
        v = _repeat_each(ctx, v, axis, r)
    start = off + left * r
    if (start, start + out) != (0, v.shape[axis]):
        v = _slice(ctx, v, axis, start, start + out, 1)
    return v


def _slice(ctx: ImportContext, v: Value, axis: int, start: int, stop: int, step: int) -> Value:
    begin, end, steps = [0] * 4, list(v.shape), [1] * 4
    begin[axis], end[axis], steps[axis] = start, stop, step
    return ctx.emit("slice", v, perm=layout.NHWC, start=tuple(begin), stop=tuple(end), step=tuple(steps))


def _repeat_each(ctx: ImportContext, v: Value, axis: int, r: int) -> Value:
    """Every index along ``axis`` ``r`` times in a row: copies side by side on a new axis, then merged."""
    n, h, w, c = v.shape
    inner = (w * c) if axis == 1 else c
    outer = (n * h) if axis == 2 else n
    size = v.shape[axis]
    x = ctx.emit("reshape", v, perm=(), shape=(outer, size, 1, inner))
    x = ctx.emit("concat", (x,) * r, perm=(), axis=2)
    shape = (n, h * r, w, c) if axis == 1 else (n, h, w * r, c)
    return ctx.emit("reshape", x, perm=layout.NHWC, shape=shape)


# -- bilinear ------------------------------------------------------------------------------------

MAX_DENOMINATOR = 127
MAX_SIZE_DENOMINATOR = 2048  # 255 · D_h · D_w stays within int32


def interpolation_matrix(node, size: int, other: int, axis: int) -> np.ndarray:
    """PyTorch's own interpolation weights along one spatial axis (``[out, in]``, float64): the op
    evaluated on one-hot planes (plane ``c`` is 1 on row / column ``c``), everything else as in ``node``."""
    shape = (1, size, size, other) if axis == 0 else (1, size, other, size)
    planes = torch.zeros(shape, dtype=torch.float64)
    for c in range(size):
        if axis == 0:
            planes[0, c, c, :] = 1.0
        else:
            planes[0, c, :, c] = 1.0
    with torch.no_grad():
        out = node.target(planes.float(), *node.args[1:], **node.kwargs).double()
    return (out[0, :, :, 0] if axis == 0 else out[0, :, 0, :]).T.numpy()


def exact_weights(matrix: np.ndarray) -> tuple[np.ndarray, int] | None:
    """``matrix`` as integer codes over one denominator ``D`` (each row summing to ``D``), when PyTorch's
    float32 weights are such fractions to within float32 rounding; else None. Tried: every ``D <= 127``,
    and the denominators of exact size ratios (``out - 1`` with align_corners, else ``2·out``)."""
    out = matrix.shape[0]
    for d in [*range(1, MAX_DENOMINATOR + 1), out - 1, 2 * out]:
        if d < 1 or d > MAX_SIZE_DENOMINATOR:
            continue
        codes = np.rint(matrix * d)
        if np.abs(matrix * d - codes).max(initial=0.0) < 1e-4 and np.all(codes.sum(axis=1) == d):
            return codes.astype(np.int64), d
    return None


@register(aten.upsample_bilinear2d)
def upsample_bilinear2d(ctx: ImportContext, node, input: Ref, **_):
    """Separable, in exact int32: per axis, ``out = w0 · x[i0] + w1 · x[i1]`` with PyTorch's taps
    and weights as integer fractions ``w / D`` (one denominator per axis, e.g. ``2r`` for an integer
    factor ``r`` without align_corners), then one ``rescale`` to the output's domain. PyTorch computes
    the weights in float32, so the result can differ from fake-quant only where the exact value lies
    within float32 rounding of a rounding boundary: by one step."""
    x = _float_ref(ctx, input)
    if x.rank != 4 or not x.is_quantized or x.spec.is_per_channel or x.scale is not None:
        raise ctx.unsupported("bilinear resampling is integer for int8 codes quantized per tensor")
    v = ctx.value_in(x, layout.NHWC)
    _, h, w, _ = v.shape
    axes = []
    for axis, (size, other) in enumerate(((h, w), (w, h))):
        found = exact_weights(interpolation_matrix(node, size, other, axis))
        if found is None:
            raise ctx.unsupported("bilinear weights that aren't fractions k/D of one small denominator "
                                  "(a scale factor without an exact ratio); runs in float")
        axes.append(found)
    v = ctx.rescale(v, QuantSpec.per_tensor(v.quant.scale[0], 0, DType.INT32), layout.NHWC)
    for axis, (codes, denominator) in zip((1, 2), axes):
        v = _blend(ctx, v, axis, codes, denominator)
    return ctx.requant(v, layout.NHWC)


def _blend(ctx: ImportContext, v: Value, axis: int, codes: np.ndarray, denominator: int) -> Value:
    """``sum_j codes[o, j] · v[j]`` along ``axis`` (at most two taps per output), scale ``s / D``."""
    taps = [np.flatnonzero(row) for row in codes]
    if max(len(t) for t in taps) > 2:
        raise ctx.unsupported("bilinear resampling with more than two taps per output")
    first = np.array([t[0] for t in taps])
    second = np.array([t[-1] for t in taps])
    w_first = np.array([codes[o, t[0]] for o, t in enumerate(taps)])
    w_second = np.array([codes[o, t[-1]] if len(t) == 2 else 0 for o, t in enumerate(taps)])
    spec = QuantSpec.per_tensor(1.0 / denominator, 0, DType.INT32)
    shape = [1, 1, 1, 1]
    shape[axis] = len(taps)
    total = None
    for index, weights in ((first, w_first), (second, w_second)):
        if not weights.any():
            continue
        gathered = _gather(ctx, v, axis, index)
        c = ctx.constant(weights.reshape(shape).astype(np.int32), spec)  # already NHWC
        term = ctx.emit("mul", gathered, c, perm=layout.NHWC)
        total = term if total is None else ctx.emit("add", total, term, perm=layout.NHWC)
    return total
