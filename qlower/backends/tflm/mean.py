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
of every sum (``global_means.SummedMean``, written by ``global_means.MeanAsTable``), so the reference computes exactly what TFLM's MEAN does, and the
exporter writes the four ops as one MEAN where it checks the table is TFLM's on every sum the proven
codes make (``export.py``). Declared within one step of the pool form per mean, and applied only where
that is checked on every sum the input's codes can make.
"""

from __future__ import annotations

import math

import numpy as np

from qlower.backends.global_means import MeanAsTable, int8_per_tensor

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


def tflm_form(x_type, out_type, taps: int, sums: np.ndarray) -> np.ndarray | None:
    """TFLM's MEAN of each centered sum of ``taps`` codes of ``x_type`` into ``out_type``, or None where TFLM's
    MEAN can't stand for it: int8 per tensor in and out over the whole int8 range (TFLM clamps there), and
    the multiplier's left shift keeping every sum in int32."""
    if not (int8_per_tensor(x_type) and int8_per_tensor(out_type)) or (out_type.quant.qmin, out_type.quant.qmax) \
            != (-128, 127):
        return None
    s_in, s_out = x_type.quant.scale[0], out_type.quant.scale[0]
    _, e = tflite_multiplier(float(np.float32(s_in)) / float(np.float32(s_out)))
    if 31 + e < 0 or int(np.max(np.abs(sums))) << max(mean_multiplier(taps, s_in, s_out)[1], 0) >= INT32:
        return None
    return tflm_mean(sums, taps, s_in, s_out, out_type.quant.zero_point[0])


class TflmMean(MeanAsTable):
    """Each global mean as TFLM's int8 MEAN computes it (module doc): within one step per mean, checked on
    every sum its input's codes can make before rewriting it."""

    name = "tflm.mean"
    what = ("a mean over H and W rounds as TFLM's int8 MEAN does (one MEAN operator instead of a sum of the "
            "plane and a lookup table)")
    form = staticmethod(tflm_form)
