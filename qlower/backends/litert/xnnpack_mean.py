"""A global mean as XNNPACK's int8 MEAN computes it (LiteRT's ``xnnpack`` kernels).

XNNPACK's MEAN over H and W (src/operators/reduce-nd.c and its qs8 sum microkernels) adds the raw
int8 codes of the plane in int32 (exact in every variant), then converts the sum in float32 with a
scale and a zero point of its own, derived from the float32 scales:

    scale = float32(float32(s_in / s_out) * float32(1 / N))
    zp    = float32(zp_out - float32(float32(N * zp_in) * scale))
    out   = clamp(round_half_even(float32(float32(sum) * scale) + zp), -128, 127)

Measured on LiteRT 2.3 (x86-64, AVX-512): 600 random shapes, scales and zero points, 12,125
outputs, all exact (the centered-sum or float64 forms each miss some). It is a function of the
centered sum alone, so ``XnnpackMean`` writes it as TFLM's MEAN is written (``global_means.MeanAsTable``): the
exact int32 sum of the centered codes and a ``table`` of XNNPACK's MEAN of every sum, within one
step of the pool form, checked on every sum before rewriting; the exporter writes one MEAN where
the table is XNNPACK's on every sum (``xnnpack_means``).
"""

from __future__ import annotations

import numpy as np

from qlower.backends.global_means import MeanAsTable, SummedMean, int8_per_tensor, summed_means
from qlower.ir import Graph

f32 = np.float32


def xnnpack_form(x_type, out_type, taps: int, sums: np.ndarray) -> np.ndarray | None:
    """XNNPACK's MEAN of each centered sum of ``taps`` codes of ``x_type`` into ``out_type`` (module doc), or
    None where it can't stand for it: int8 per tensor in and out, over the whole int8 range (XNNPACK clamps
    there), and the raw sums float32 holds exactly."""
    if not (int8_per_tensor(x_type) and int8_per_tensor(out_type)) \
            or (out_type.quant.qmin, out_type.quant.qmax) != (-128, 127) or taps * 128 >= 2**24:
        return None
    s_in, zp_in = f32(x_type.quant.scale[0]), int(x_type.quant.zero_point[0])
    s_out, zp_out = f32(out_type.quant.scale[0]), int(out_type.quant.zero_point[0])
    scale = f32(f32(s_in / s_out) * f32(f32(1) / f32(taps)))
    zp = f32(f32(zp_out) - f32(f32(taps * zp_in) * scale))
    raw = (np.asarray(sums, np.int64) + taps * zp_in).astype(f32)
    return np.clip(np.rint(f32(raw * scale) + zp), -128, 127).astype(np.int64)


class XnnpackMean(MeanAsTable):
    """Each global mean as XNNPACK's int8 MEAN computes it: within one step per mean, checked on every
    sum its input's codes can make before rewriting it."""

    name = "litert.xnnpack_mean"
    what = ("a mean over H and W rounds as XNNPACK's int8 MEAN does (one MEAN operator the delegate takes, "
            "instead of a sum of the plane and a lookup table)")
    form = staticmethod(xnnpack_form)


def xnnpack_means(graph: Graph) -> dict[int, SummedMean]:
    """id(table) -> the mean ``XnnpackMean`` wrote, where its table is XNNPACK's MEAN on every sum it holds
    (the exporter writes those four ops as one MEAN)."""
    found = {}
    for mean in summed_means(graph):
        x, final = mean.widen.operands[0], mean.final
        lo = -final.attrs["offset"]
        table = np.asarray(final.attrs["table"], np.int64)
        want = xnnpack_form(x.type, final.result.type, mean.taps, np.arange(lo, lo + table.size, dtype=np.int64))
        if want is not None and np.array_equal(want, table):
            found[id(final)] = mean
    return found
