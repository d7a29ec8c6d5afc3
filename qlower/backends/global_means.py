"""The frontend's global average, as backends find it in a graph.

The frontend writes a mean over H and W of int8 codes as a rescale to int16 (zero point removed,
x128), an unpadded ``avg_pool2d`` whose window is the whole plane, and a rescale to the output.
Backends that have a form of their own for it recognise it here: Ethos-U chooses between the
pool and a sum (``ethosu/means.py``). A kernel whose int8 MEAN is a function of the plane's sum
alone (TFLM's, ``tflm/mean.py``; XNNPACK's, ``litert/xnnpack_mean.py``) takes it as ``MeanAsTable``
writes it: the exact int32 sum of the centered codes and a table of the kernel's result of every
sum (``SummedMean``), which its exporter writes as one MEAN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from qlower.ir import DType, Graph, Op, QuantSpec, rebuild, requant
from qlower.ir.rewrite import Rewrite, Rewritten
from qlower.reference.pooling import reciprocal_scale

# a kernel's int8 MEAN: (input type, output type, taps, centered sums) -> its codes, or None where it can't stand
MeanForm = Callable[[Any, Any, int, np.ndarray], "np.ndarray | None"]


@dataclass(frozen=True)
class GlobalMean:
    widen: Op      # rescale int8 -> int16 (zero point 0): the average's input
    pool: Op       # avg_pool2d over the whole plane
    final: Op      # the rescale to the output, the pool's only reader


def global_means(graph: Graph) -> list[GlobalMean]:
    """The frontend's global averages: a widening rescale read only by an unpadded average pool
    whose window is the whole plane, read only by a rescale; neither intermediate is a graph output
    (a backend's form of its own replaces both)."""
    producers, users = graph.producers(), graph.users()
    found = []
    for op in graph.ops:
        if op.kind != "avg_pool2d" or any(op.attrs["pad"]):
            continue
        w = op.operands[0]
        widen = producers.get(w)
        n, h, wd, c = w.shape
        if (widen is None or widen.kind != "rescale" or tuple(op.attrs["kernel"]) != (h, wd)
                or w.dtype is not DType.INT16 or widen.operands[0].dtype is not DType.INT8
                or widen.operands[0].quant.is_per_channel or len(users.get(w, [])) != 1 or w in graph.outputs):
            continue
        readers = users.get(op.result, [])
        if len(readers) != 1 or readers[0].kind != "rescale" or op.result in graph.outputs:
            continue
        found.append(GlobalMean(widen, op, readers[0]))
    return found


def int8_per_tensor(t) -> bool:
    q = t.quant
    return t.dtype is DType.INT8 and q is not None and not q.is_per_channel and not q.dynamic


def pooled_codes(mean: GlobalMean, sums: np.ndarray) -> np.ndarray | None:
    """The pool's int16 result for each centered sum of the plane (the reference's own steps: the widening
    is ``k * (x - zp) + zp_w``, checked linear on every code), or None when the widening isn't linear."""
    x, widen = mean.widen.operands[0], mean.widen
    xq, wq = x.type.quant, widen.attrs["out"]
    codes = np.arange(xq.qmin, xq.qmax + 1, dtype=np.int64)
    try:
        wide = requant.rescale(codes, xq.zero_point[0], wq.zero_point[0],
                               requant.requantize_ratio(xq.scale[0], wq.scale[0]), wq.qmin, wq.qmax,
                               rounding=widen.attrs["rounding"])
    except requant.RequantRangeError:
        return None
    k = int(wide[1] - wide[0]) if wide.size > 1 else 0
    if k <= 0 or not np.array_equal(wide, k * (codes - xq.zero_point[0]) + wq.zero_point[0]):
        return None
    taps = int(np.prod(mean.pool.attrs["kernel"]))
    m = reciprocal_scale(np.asarray([taps]))
    if np.max(np.abs(sums)) * k >= requant.require_bound(m.shift[0]):
        return None
    pool_t = mean.pool.result.type
    return np.clip(requant.apply_scale_32(sums * k, m.multiplier[0], m.shift[0]) + wq.zero_point[0],
                   pool_t.dtype.min, pool_t.dtype.max)


def final_codes(mean: GlobalMean, pooled: np.ndarray) -> np.ndarray:
    """The mean's last op (the frontend's rescale, or ``TflmMean``'s table) on the pool's codes."""
    final = mean.final
    if final.kind == "table":
        table = final.attrs["table"]
        return table[np.clip(pooled + final.attrs["offset"], 0, table.size - 1)].astype(np.int64)
    fq, out = mean.pool.result.type.quant, final.attrs["out"]
    return requant.rescale(pooled, fq.zero_point[0], out.zero_point[0],
                           requant.requantize_ratio(fq.scale[0], out.scale[0]), out.qmin, out.qmax,
                           rounding=final.attrs["rounding"])


def plane_sums(x_type, taps: int, lo: int, hi: int) -> np.ndarray:
    """Every centered sum of ``taps`` codes of ``x_type`` in [lo, hi]."""
    zp = x_type.quant.zero_point[0]
    return np.arange(taps * (lo - zp), taps * (hi - zp) + 1, dtype=np.int64)


MAX_ENTRIES = 2**18   # the largest table of sums the rewrite writes into the program (int8: 256 KB)


@dataclass(frozen=True)
class SummedMean:
    """A global mean as a kernel's MEAN of the plane's sum (``MeanAsTable`` writes it): the codes centered
    into int32 (scale kept, zero point removed: exact), summed over H then W, and a table of the sum."""

    widen: Op     # rescale int8 -> int32 (ratio 1, zero point 0)
    rows: Op      # reduce_sum over axis 1
    cols: Op      # reduce_sum over axis 2
    final: Op     # table of the plane's sum

    @property
    def taps(self) -> int:
        return self.widen.result.shape[1] * self.widen.result.shape[2]


def summed_means(graph: Graph) -> list[SummedMean]:
    """The means a ``MeanAsTable`` wrote: each op the only reader of the one before, none a graph output."""
    producers, users = graph.producers(), graph.users()
    outputs = set(graph.outputs)

    def only(v, kind: str) -> Op | None:
        op = producers.get(v)
        ok = op is not None and op.kind == kind and len(users.get(v, [])) == 1 and v not in outputs
        return op if ok else None

    found = []
    for op in graph.ops:
        if op.kind != "table" or op.operands[0].dtype is not DType.INT32:
            continue
        cols = only(op.operands[0], "reduce_sum")
        rows = only(cols.operands[0], "reduce_sum") if cols is not None and cols.attrs["axis"] == 2 else None
        widen = only(rows.operands[0], "rescale") if rows is not None and rows.attrs["axis"] == 1 else None
        if widen is None or not int8_per_tensor(widen.operands[0].type) or widen.result.type.rank != 4:
            continue
        xq, wq = widen.operands[0].type.quant, widen.attrs["out"]
        if wq.scale[0] == xq.scale[0] and wq.zero_point[0] == 0:
            found.append(SummedMean(widen, rows, cols, op))
    return found


def table_of_sums(mean: GlobalMean, form: MeanForm, steps: int = 1) -> tuple[np.ndarray, int, int] | None:
    """(a kernel's MEAN of every sum from the least on, the least and the greatest sum), or None unless the
    kernel's MEAN (``form``) stands for ``mean`` and is within ``steps`` of its pool form on every sum its
    input's codes can make."""
    x = mean.widen.operands[0]
    taps = int(np.prod(mean.pool.attrs["kernel"]))
    sums = plane_sums(x.type, taps, x.type.quant.qmin, x.type.quant.qmax)
    lo, hi = min(int(sums[0]), x.type.quant.qmin - x.type.quant.zero_point[0]), \
        max(int(sums[-1]), x.type.quant.qmax - x.type.quant.zero_point[0])
    if hi - lo + 1 > MAX_ENTRIES:
        return None
    pooled = pooled_codes(mean, sums)
    every = np.arange(lo, hi + 1, dtype=np.int64)
    want = form(x.type, mean.final.result.type, taps, every)
    if pooled is None or want is None:
        return None
    if np.max(np.abs(final_codes(mean, pooled) - want[sums - lo])) > steps:
        return None
    return want.astype(np.int8), lo, hi


class MeanAsTable(Rewrite):
    """Each global mean as a kernel's int8 MEAN computes it (``form``: the kernel's result of each centered
    sum): the exact int32 sum of the centered codes and a ``table`` of the kernel's MEAN of every sum, within
    ``steps`` per mean, checked on every sum its input's codes can make before rewriting it. Subclasses name
    the kernel (``name``, ``what``, ``form``)."""

    steps = 1

    @staticmethod
    def form(x_type, out_type, taps: int, sums: np.ndarray) -> np.ndarray | None:
        raise NotImplementedError

    def table(self, mean: GlobalMean) -> tuple[np.ndarray, int, int] | None:
        """The kernel's MEAN of every sum, or None (``table_of_sums``)."""
        return table_of_sums(mean, self.form, self.steps)

    def apply(self, graph: Graph) -> Rewritten:
        found = {}
        for mean in global_means(graph):
            table = self.table(mean)
            if table is not None:
                found[mean.widen] = (mean, *table)
        if not found:
            return Rewritten(graph)
        by_op = {m.pool: v for v in found.values() for m in [v[0]]} | {v[0].final: v for v in found.values()}
        summed: dict[Op, object] = {}

        def rewrite(b, op, operands):
            if op in found:   # the exact int32 sum of the centered codes stands in for the widened codes
                mean, _, lo, hi = found[op]
                xq = op.operands[0].type.quant
                centred = b.op("rescale", operands[0],
                               out=QuantSpec.per_tensor(xq.scale[0], 0, DType.INT32, qmin=lo, qmax=hi))
                summed[mean.pool] = b.op("reduce_sum", b.op("reduce_sum", centred, axis=1), axis=2)
                return (summed[mean.pool],)
            entry = by_op.get(op)
            if entry is None:
                return None
            mean, table, lo, _ = entry
            if op is mean.pool:
                return (summed[op],)
            changed.append(op.result.name)
            return (b.op("table", operands[0], name=op.result.name, origin=op.result.origin, table=table,
                         offset=-lo, out=op.attrs["out"]),)

        changed: list[str] = []
        return Rewritten(rebuild(graph, rewrite), tuple(changed))
