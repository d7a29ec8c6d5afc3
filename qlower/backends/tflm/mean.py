"""A global mean as TFLM's int8 MEAN computes it, as a declared rewrite of the graph.

The frontend's global average (``global_means``: widen x k to int16, average pool, rescale) has no
one-kernel form in TFLM that rounds as it does, so it used to be a sum of the plane and a lookup of
the reference's results (several operators and a table in flash). TFLM's int8 MEAN (its reduce
kernel's ``EvalIntegerMean``: TFLite's ``reference_ops::QuantizedMeanOrSum``, read in tflite-micro's
source and checked against its interpreter by tests/test_tflm_mean.py) is a function of the sum ``S``
of the N reduced codes minus N times the input's zero point alone:

    M, e  = QuantizeMultiplier(s_in / s_out)           # in double, from the tensors' float32 scales
    k     = min(floor(log2 N), 32, 31 + e)             # 1/N folded into the multiplier
    out   = clamp(MultiplyByQuantizedMultiplier(S, (M << k) / N, e - k) + zp_out, -128, 127)

(``/`` truncates; ``MultiplyByQuantizedMultiplier`` rounds twice, gemmlowp's ``SaturatingRounding
DoublingHighMul`` then ``RoundingDivideByPOT``, as TFLM's convolutions do). ``TflmMean`` gives the
program that arithmetic *before partitioning*, as ``litert`` gives its programs LiteRT's kernels'
roundings: the mean becomes the exact int32 sum of its centered codes and a ``table`` of TFLM's MEAN
of every sum (``SummedMean``), so the reference computes exactly what TFLM's MEAN does, and the
exporter writes the four ops as one MEAN where it checks the table is TFLM's on every sum the proven
codes make (``export.py``). Declared within one step of the pool form per mean, and applied only where
that is checked on every sum the input's codes can make.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qlower.backends.global_means import GlobalMean, global_means
from qlower.ir import DType, Graph, Op, QuantSpec, rebuild, requant
from qlower.ir.rewrite import Rewrite, Rewritten
from qlower.reference.pooling import reciprocal_scale

INT32 = 2**31


def tflite_multiplier(ratio: float) -> tuple[int, int]:
    """TFLite's ``QuantizeMultiplier(double)``: (Q31 multiplier, exponent) with ratio ~ M * 2**(e - 31)."""
    if ratio == 0.0:
        return 0, 0
    mant, exp = math.frexp(ratio)
    q = math.floor(mant * INT32 + 0.5)   # TfLiteRound of a positive number: half away from zero
    if q == INT32:
        q, exp = q // 2, exp + 1
    if exp < -31:
        return 0, 0
    return q, exp   # (the shift > 30 clamp is the single-rounding build's; TFLM's rounds twice: rounding.py)


def multiply_by_quantized_multiplier(x: np.ndarray, multiplier: int, exponent: int) -> np.ndarray:
    """TFLite's ``MultiplyByQuantizedMultiplier`` (two roundings, gemmlowp's) on int32 ``x``: the caller
    checks ``x * 2**max(exponent, 0)`` stays in int32 (``tflm_form``)."""
    left, right = max(exponent, 0), max(-exponent, 0)
    p = (np.asarray(x, np.int64) << left) * np.int64(multiplier)
    p = p + np.where(p >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    high = np.where(p >= 0, p >> 31, -((-p) >> 31))          # SaturatingRoundingDoublingHighMul: toward zero
    mask = (1 << right) - 1
    threshold = (mask >> 1) + (high < 0)
    return (high >> right) + ((high & mask) > threshold)      # RoundingDivideByPOT: half away from zero


def mean_multiplier(taps: int, in_scale: float, out_scale: float) -> tuple[int, int]:
    """The (multiplier, exponent) TFLM's int8 MEAN of ``taps`` codes applies to their centered sum."""
    m, e = tflite_multiplier(float(np.float32(in_scale)) / float(np.float32(out_scale)))
    k = min(taps.bit_length() - 1, 32, 31 + e)
    return (m << k) // taps, e - k


def tflm_mean(sums: np.ndarray, taps: int, in_scale: float, out_scale: float, out_zp: int) -> np.ndarray:
    """TFLM's int8 MEAN over ``taps`` codes whose centered sums are ``sums`` (module doc)."""
    return np.clip(multiply_by_quantized_multiplier(sums, *mean_multiplier(taps, in_scale, out_scale)) + out_zp,
                   -128, 127)


def _int8_per_tensor(t) -> bool:
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


def tflm_form(x_type, out_type, taps: int, sums: np.ndarray) -> np.ndarray | None:
    """TFLM's MEAN of each centered sum of ``taps`` codes of ``x_type`` into ``out_type``, or None where TFLM's
    MEAN can't stand for it: int8 per tensor in and out over the whole int8 range (TFLM clamps there), and
    the multiplier's left shift keeping every sum in int32."""
    if not (_int8_per_tensor(x_type) and _int8_per_tensor(out_type)) or (out_type.quant.qmin, out_type.quant.qmax) \
            != (-128, 127):
        return None
    s_in, s_out = x_type.quant.scale[0], out_type.quant.scale[0]
    _, e = tflite_multiplier(float(np.float32(s_in)) / float(np.float32(s_out)))
    if 31 + e < 0 or int(np.max(np.abs(sums))) << max(mean_multiplier(taps, s_in, s_out)[1], 0) >= INT32:
        return None
    return tflm_mean(sums, taps, s_in, s_out, out_type.quant.zero_point[0])


def plane_sums(x_type, taps: int, lo: int, hi: int) -> np.ndarray:
    """Every centered sum of ``taps`` codes of ``x_type`` in [lo, hi]."""
    zp = x_type.quant.zero_point[0]
    return np.arange(taps * (lo - zp), taps * (hi - zp) + 1, dtype=np.int64)


MAX_ENTRIES = 2**18   # the largest table of sums the rewrite writes into the program (int8: 256 KB)


@dataclass(frozen=True)
class SummedMean:
    """A global mean in TFLM's MEAN's form (``TflmMean`` writes it): the codes centered into int32 (scale
    kept, zero point removed: exact), summed over H then W, and a table of the sum."""

    widen: Op     # rescale int8 -> int32 (ratio 1, zero point 0)
    rows: Op      # reduce_sum over axis 1
    cols: Op      # reduce_sum over axis 2
    final: Op     # table of the plane's sum

    @property
    def taps(self) -> int:
        return self.widen.result.shape[1] * self.widen.result.shape[2]


def summed_means(graph: Graph) -> list[SummedMean]:
    """The means ``TflmMean`` wrote: each op the only reader of the one before, none a graph output."""
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
        if widen is None or not _int8_per_tensor(widen.operands[0].type) or widen.result.type.rank != 4:
            continue
        xq, wq = widen.operands[0].type.quant, widen.attrs["out"]
        if wq.scale[0] == xq.scale[0] and wq.zero_point[0] == 0:
            found.append(SummedMean(widen, rows, cols, op))
    return found


def _as_table(mean: GlobalMean, form=tflm_form) -> tuple[np.ndarray, int, int] | None:
    """(TFLM's MEAN of every sum from the least on, the least and the greatest sum), or None unless TFLM's MEAN
    stands for ``mean`` and is within one step of its pool form on every sum its input's codes can make
    (``form``: another kernel's MEAN of the sums, with ``tflm_form``'s signature)."""
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
    if np.max(np.abs(final_codes(mean, pooled) - want[sums - lo])) > TflmMean.steps:
        return None
    return want.astype(np.int8), lo, hi


class TflmMean(Rewrite):
    """Each global mean as TFLM's int8 MEAN computes it (module doc): within one step per mean, checked on
    every sum its input's codes can make before rewriting it."""

    name = "tflm.mean"
    steps = 1
    what = ("a mean over H and W rounds as TFLM's int8 MEAN does (one MEAN operator instead of a sum of the "
            "plane and a lookup table)")

    def table(self, mean: GlobalMean) -> tuple[np.ndarray, int, int] | None:
        """The kernel's MEAN of every sum, or None (``_as_table``)."""
        return _as_table(mean)

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
