"""Lowerings of ops that move or reduce codes: constant, reshape, transpose, concat, pad,
slice, gather, pooling and reductions.

These are exact in both the IR and TOSA. Two IR forms have no single TOSA
operator: a strided slice (SLICE, then per strided axis RESHAPE into
(count, step), SLICE the first of each step, RESHAPE back) and pooling whose
output size TOSA's divisibility rule rejects (rows no window reads are cut,
see ``support.fit_window``).
"""

from __future__ import annotations

import math

import numpy as np
import tosa_serializer as ts

from qlower.backends.tosa.lowering import Lowerer, lowering
from qlower.backends.tosa.serializer import DT, Tensor, attr
from qlower.backends.tosa.support import fit_window
from qlower.ir import Op

Op_ = ts.Op


@lowering("constant")
def _constant(lw: Lowerer, op: Op) -> Tensor:
    """Constants are emitted lazily, in the layout their consumers read."""
    return lw.w.const(op.attrs["data"])


@lowering("reshape")
def _reshape(lw: Lowerer, op: Op) -> Tensor:
    return lw.reshape(lw.t(op.operands[0]), op.attrs["shape"])


@lowering("transpose")
def _transpose(lw: Lowerer, op: Op) -> Tensor:
    return lw.transpose(lw.t(op.operands[0]), op.attrs["perm"])


@lowering("concat")
def _concat(lw: Lowerer, op: Op) -> Tensor:
    xs = [lw.t(v) for v in op.operands[0]]
    return lw.concat(xs, op.attrs["axis"] % xs[0].rank)


@lowering("pad")
def _pad(lw: Lowerer, op: Op) -> Tensor:
    x = lw.t(op.operands[0])
    value = lw.scalar(op.attrs["value"] if x.dtype == DT.FP32 else int(op.attrs["value"]), x.dtype)
    return lw.emit(Op_.PAD, [x, lw.w.shape(op.attrs["pads"]), value], op.result.shape, x.dtype, attr("Pad"))


@lowering("slice")
def _slice(lw: Lowerer, op: Op) -> Tensor:
    x = lw.t(op.operands[0])
    start, stop = op.attrs["start"], op.attrs["stop"]
    step = op.attrs["step"] or (1,) * x.rank
    counts = [len(range(a, b, s)) for a, b, s in zip(start, stop, step)]
    # First a contiguous SLICE covering every selected element; a whole number of steps where it fits.
    sizes = []
    for d, (a, n, s) in enumerate(zip(start, counts, step)):
        whole = n * s
        sizes.append(whole if n > 1 and a + whole <= x.shape[d] else (n - 1) * s + 1)
    y = lw.slice(x, start, sizes)
    for d, (n, s) in enumerate(zip(counts, step)):
        if s == 1 or n == 1:
            continue
        if y.shape[d] < n * s:  # pad the last step so the axis splits into (n, s)
            pads = [0] * (2 * y.rank)
            pads[2 * d + 1] = n * s - y.shape[d]
            padded = tuple(dim + pads[2 * i + 1] for i, dim in enumerate(y.shape))
            zero = lw.scalar(0.0 if y.dtype == DT.FP32 else 0, y.dtype)
            y = lw.emit(Op_.PAD, [y, lw.w.shape(pads), zero], padded, y.dtype, attr("Pad"))
        before, after = math.prod(y.shape[:d]), math.prod(y.shape[d + 1:])
        split = lw.reshape(y, (before, n, s, after))
        picked = lw.slice(split, (0, 0, 0, 0), (before, n, 1, after))
        y = lw.reshape(picked, y.shape[:d] + (n,) + y.shape[d + 1:])
    return y


def _fit_pool_input(lw: Lowerer, x: Tensor, op: Op) -> tuple[Tensor, list[int]]:
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = op.attrs["kernel"], op.attrs["stride"], op.attrs["pad"]
    n, h, w, c = x.shape
    pb, crop_h = fit_window(h, kh, sh, 1, pt, pb)
    pr, crop_w = fit_window(w, kw, sw, 1, pl, pr)
    return lw.slice(x, (0, 0, 0, 0), (n, h - crop_h, w - crop_w, c)), [pt, pb, pl, pr]


@lowering("avg_pool2d")
def _avg_pool2d(lw: Lowerer, op: Op) -> Tensor:
    """AVG_POOL2D with input and output zero point both the input's (the IR keeps the type)."""
    xv = op.operands[0]
    x, pad = _fit_pool_input(lw, lw.t(xv), op)
    zp = lw.zero_point(x, xv.type.quant.zero_point[0] if xv.type.quant else 0)
    acc = DT.FP32 if x.dtype == DT.FP32 else DT.INT32
    return lw.emit(Op_.AVG_POOL2D, [x, zp, zp], op.result.shape, x.dtype,
                   attr("AvgPool2d", list(op.attrs["kernel"]), list(op.attrs["stride"]), pad, acc))


@lowering("max_pool2d")
def _max_pool2d(lw: Lowerer, op: Op) -> Tensor:
    x, pad = _fit_pool_input(lw, lw.t(op.operands[0]), op)
    return lw.emit(Op_.MAX_POOL2D, [x], op.result.shape, x.dtype,
                   attr("MaxPool2d", list(op.attrs["kernel"]), list(op.attrs["stride"]), pad,
                        ts.NanPropagationMode.PROPAGATE))


@lowering("reduce_sum")
def _reduce_sum(lw: Lowerer, op: Op) -> Tensor:
    x = lw.t(op.operands[0])
    return lw.emit(Op_.REDUCE_SUM, [x], op.result.shape, x.dtype, attr("ReduceSum", op.attrs["axis"] % x.rank))


@lowering("reduce_max")
def _reduce_max(lw: Lowerer, op: Op) -> Tensor:
    x = lw.t(op.operands[0])
    return lw.emit(Op_.REDUCE_MAX, [x], op.result.shape, x.dtype,
                   attr("ReduceMax", op.attrs["axis"] % x.rank, ts.NanPropagationMode.PROPAGATE))


@lowering("gather")
def _gather(lw: Lowerer, op: Op) -> Tensor:
    """GATHER reads values [N, K, C] and int32 indices [N, W]: the IR axis splits the input into
    (outer, axis, inner) with no data moved; the constant indices are repeated for every outer row.
    Indices that reverse the whole axis (a flip) are one REVERSE instead."""
    x, idx = lw.t(op.operands[0]), lw.t(op.operands[1])
    axis = op.attrs["axis"]
    outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
    width, size = math.prod(idx.shape), x.shape[axis]
    if not idx.is_const or (idx.data.size and not (0 <= idx.data.min() and idx.data.max() < size)):
        raise ValueError(f"GATHER indices must be constants in 0..{size - 1} (support() takes no others)")
    if idx.data.ndim == 1 and size > 1 and np.array_equal(idx.data, np.arange(size - 1, -1, -1)):
        return lw.emit(Op_.REVERSE, [x], x.shape, x.dtype, attr("Reverse", axis))  # a flip
    values = lw.reshape(x, (outer, size, inner))
    indices = lw.w.const(np.tile(idx.data.reshape(1, width), (outer, 1)), idx.dtype)
    out = lw.emit(Op_.GATHER, [values, indices], (outer, width, inner), x.dtype, attr("Gather"))
    return lw.reshape(out, op.result.shape)
