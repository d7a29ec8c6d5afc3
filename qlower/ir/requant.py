"""Requantization: the one place where a real scale ratio becomes integers (DESIGN.md rule 5).

``quantize_multiplier`` turns a ratio into a 32-bit (multiplier, shift) pair as
TOSA RESCALE with ``scale32`` expects (ratio ≈ multiplier * 2**-shift, multiplier
in [2**30, 2**31)); ``apply_scale_32`` and ``rescale`` apply them with TOSA 1.0
semantics. The reference interpreter, the CPU kernels and the TOSA lowering all
call these functions, which is why those backends are bit-exact with each other.

Only NumPy and qlower.errors are imported here, so every stage may use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qlower.errors import QlowerError

MIN_SHIFT, MAX_SHIFT = 2, 62


class RequantRangeError(QlowerError, ValueError):
    """A value or ratio is outside what TOSA's apply_scale_32 admits."""


@dataclass(frozen=True)
class Multiplier:
    """Integer form of a scale ratio: ``ratio ≈ multiplier * 2**-shift`` (per channel when arrays)."""

    multiplier: np.ndarray  # int64, in [0, 2**31)
    shift: np.ndarray       # int64, in [MIN_SHIFT, MAX_SHIFT]
    # the same ratio as XNNPACK computes it, for the FLOAT_ROUNDINGS: the float32 quotient of the
    # float32 scales (None when the Multiplier was made from a ratio alone)
    scale32: np.ndarray | None = None

    @property
    def per_channel(self) -> bool:
        return self.multiplier.size > 1

    def ratio(self) -> np.ndarray:
        return self.multiplier.astype(np.float64) * np.exp2(-self.shift.astype(np.float64))


def quantize_multiplier(ratio: float | np.ndarray) -> Multiplier:
    """Nearest (multiplier, shift) with a 31-bit normalised multiplier.

    The shift is ``31 - e`` for ``ratio = m * 2**e`` (m in [0.5, 1)), capped at
    MAX_SHIFT, and the multiplier is ``ratio * 2**shift`` rounded once, half up.
    Exactness: scaling by a power of two is exact in float64 and so is
    ``x - floor(x)``, so the result is the nearest multiplier at that shift (error at
    most half a unit of ``2**-shift``; relative error at most 2**-31 when the
    multiplier is normalised). Ratios below 2**-32 hit the shift cap and keep
    fewer multiplier bits (0 means "ratio ≈ 0"); ratios of 2**29 or more can't be
    expressed and raise.
    """
    r = np.atleast_1d(np.asarray(ratio, dtype=np.float64))
    if np.any(~np.isfinite(r)) or np.any(r < 0):
        raise RequantRangeError(f"scale ratio must be finite and non-negative, got {r}")
    _, exp = np.frexp(r)                           # r = mant * 2**exp, mant in [0.5, 1)
    shift = np.minimum(31 - exp.astype(np.int64), MAX_SHIFT)
    scaled = np.ldexp(r, shift.astype(np.int32))   # exact; < 2**31
    whole = np.floor(scaled)
    mult = whole.astype(np.int64) + (scaled - whole >= 0.5)
    carry = mult == 2**31                          # mantissa rounded up to the next power of two
    mult = np.where(carry, mult // 2, mult)
    shift = np.where(carry, shift - 1, shift)
    shift = np.where(mult == 0, MAX_SHIFT, shift)
    if np.any(shift < MIN_SHIFT):
        raise RequantRangeError(f"scale ratio {r.max():.6g} is too large for a 32-bit rescale (must be < 2**29)")
    return Multiplier(mult, shift)


def _checked_scale(value, multiplier, shift) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three as int64 arrays; raises unless the multiplier is in [0, 2**31) and the shift in [2, 62]."""
    value = np.asarray(value, dtype=np.int64)
    multiplier = np.asarray(multiplier, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if np.any(multiplier < 0) or np.any(multiplier >= 2**31):
        raise RequantRangeError(f"rescale multiplier must be in [0, 2**31), got {multiplier}")
    if np.any(shift < MIN_SHIFT) or np.any(shift > MAX_SHIFT):
        raise RequantRangeError(f"rescale shift must be in [{MIN_SHIFT}, {MAX_SHIFT}], got {shift}")
    return value, multiplier, shift


def require_bound(shift: np.ndarray | int) -> np.ndarray:
    """apply_scale_32's REQUIRE: a value must lie in ``[-bound, bound)``, ``bound = min(2**(shift-1), 2**31)``
    (in range for the shift, and an int32)."""
    return np.minimum(np.left_shift(np.int64(1), np.asarray(shift, dtype=np.int64) - 1), np.int64(2**31))


def rounding_terms(shift: np.ndarray | int, double_round: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """What apply_scale_32 adds before its shift, for values >= 0 and for values < 0.

    SINGLE_ROUND adds ``2**(shift-1)`` to both (round half toward +inf); DOUBLE_ROUND (TFLite style)
    adds a further +2**30 / -2**30 when ``shift > 31``. Every fast twin (torch, C) takes these.
    """
    half = np.left_shift(np.int64(1), np.asarray(shift, dtype=np.int64) - 1)
    if not double_round:
        return half, half
    extra = np.where(np.asarray(shift) > 31, np.int64(1 << 30), np.int64(0))
    return half + extra, half - extra


def mul_rounding(shift: int) -> int:
    """TOSA MUL's term added before its right shift: ``2**(shift-1)`` (round half up), 0 without a shift."""
    return 1 << (shift - 1) if shift > 0 else 0


def apply_scale_32(value: np.ndarray, multiplier: np.ndarray, shift: np.ndarray,
                   double_round: bool = False) -> np.ndarray:
    """TOSA ``apply_scale_32``: ``(value * multiplier + round) >> shift`` in int64.

    ``round`` is ``rounding_terms(shift, double_round)``. Like the spec, this raises unless the
    multiplier is in [0, 2**31), the shift in [2, 62] and the value within ``require_bound(shift)``.
    Those bounds also keep ``value * multiplier + round`` below 2**63, so the int64 arithmetic is exact.
    """
    value, multiplier, shift = _checked_scale(value, multiplier, shift)
    bound = require_bound(shift)
    if np.any(value < -bound) or np.any(value >= bound):
        raise RequantRangeError(f"rescale input in [{value.min(initial=0)}, {value.max(initial=0)}] is out of range "
                                "for its shift or int32 (TOSA apply_scale_32 REQUIRE); use a larger shift "
                                "(smaller scale ratio) or keep values in int32")
    pos, neg = rounding_terms(shift, double_round)
    return np.right_shift(value * multiplier + np.where(value >= 0, pos, neg), shift)


def apply_scale_high_mul(value: np.ndarray, multiplier: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Requantization of TFLite's optimized (ruy) kernels, rounding ``double_half_up``.

    ``value * 2**max(31 - shift, 0)`` times the multiplier is first rounded to its high 32 bits
    half away from zero (gemmlowp's SaturatingRoundingDoublingHighMul), then shifted right by
    ``shift - 31`` rounding half up. Raises unless the multiplier is in [0, 2**31), the shift in
    [2, 62] and the left-shifted value an int32 (the kernels' int32 arithmetic would overflow).
    """
    value, multiplier, shift = _checked_scale(value, multiplier, shift)
    left = np.maximum(31 - shift, 0)
    shifted = np.left_shift(value, left)
    if np.any(shifted < -(2**31)) or np.any(shifted >= 2**31):
        raise RequantRangeError("rescale input shifted left by the multiplier's exponent leaves int32")
    p = shifted * multiplier
    p = p + np.where(p >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    high = np.where(p >= 0, p >> 31, -((-p) >> 31))            # divide by 2**31 toward zero
    right = np.maximum(shift - 31, 0)
    half = np.where(right > 0, np.left_shift(np.int64(1), np.maximum(right - 1, 0)), 0)
    return np.right_shift(high + half, right)


FLOAT_ROUNDINGS = ("fp32", "integer_multiplier")   # XNNPACK's, computed from ``Multiplier.scale32``


def xnnpack_scale(in_scale: np.ndarray | float, out_scale: float) -> np.ndarray:
    """XNNPACK's requantization scale: ``in_scale / out_scale`` computed in float32 from the float32 scales.

    XNNPACK computes ``input_scale * kernel_scale[c] / output_scale`` in float32 from the float32 scales
    a .tflite stores; an accumulator's scale ``s_in * s_w`` (float32s) is exact in float64, so its float32
    rounding is that float32 product, and the quotient below is XNNPACK's to the bit. (A ratio of two
    float32s rounded to float64 and then to float32 is the float32 quotient: 53 >= 2 * 24 + 2 bits.)"""
    num = np.asarray(in_scale, dtype=np.float64).astype(np.float32)
    return np.atleast_1d(num / np.float32(out_scale)).astype(np.float32)


def apply_scale_fp32(value: np.ndarray, scale32: np.ndarray, rounding: str) -> np.ndarray:
    """XNNPACK's requantization of int32 ``value`` (centered codes) by a float32 ratio, before the zero point.

    ``"fp32"`` (its convolutions and fully connected layers, every variant: AVX2/AVX-512 and NEON
    ``fp32`` microkernels): the value converted to float32 (rounding to nearest even above 2**24), times
    ``scale32`` in float32, rounded half to even (``cvtps``/``vcvtn``/magic-bias, all the same rounding).
    ``"integer_multiplier"`` (the operand scaling of its int8 ADD): ``scale32`` rounded half to even to
    an integer once, then an exact integer product."""
    value = np.asarray(value, dtype=np.int64)
    if np.any(value < -(2**31)) or np.any(value >= 2**31):
        raise RequantRangeError("an XNNPACK requantization input leaves int32")
    if rounding == "integer_multiplier":
        return value * np.rint(scale32).astype(np.int64)
    return np.rint(value.astype(np.float32) * scale32).astype(np.int64)   # |product| < 2**39: exact in int64


def rescale(codes: np.ndarray, in_zp: np.ndarray | int, out_zp: int, mult: Multiplier,
            qmin: int, qmax: int, axis: int | None = None, double_round: bool = False,
            rounding: str | None = None) -> np.ndarray:
    """TOSA RESCALE followed by a clamp to [qmin, qmax]: returns int64 codes.

    ``in_zp`` and the multiplier may be per channel along ``axis``. ``rounding`` ("single",
    "double", "double_half_up", or one of XNNPACK's ``FLOAT_ROUNDINGS``, which need ``mult.scale32``;
    the IR's rescale roundings) overrides ``double_round``.
    """
    codes = np.asarray(codes, dtype=np.int64)
    m, s = mult.multiplier, mult.shift
    if rounding in FLOAT_ROUNDINGS:
        if mult.scale32 is None:
            raise RequantRangeError(f"a {rounding} rescale needs the float32 scales (requantize_ratio)")
        m = mult.scale32
    zp = np.asarray(in_zp, dtype=np.int64)
    if axis is not None:
        shape = [1] * codes.ndim
        shape[axis] = -1
        m, s = m.reshape(shape), s.reshape(shape)
        zp = zp.reshape(shape) if zp.size > 1 else zp.reshape(())
    else:
        m, s, zp = m.reshape(()), s.reshape(()), zp.reshape(())
    if rounding in FLOAT_ROUNDINGS:
        out = apply_scale_fp32(codes - zp, m, rounding) + np.int64(out_zp)
    elif rounding == "double_half_up":
        out = apply_scale_high_mul(codes - zp, m, s) + np.int64(out_zp)
    else:
        out = apply_scale_32(codes - zp, m, s, double_round or rounding == "double") + np.int64(out_zp)
    return np.clip(out, qmin, qmax)


def requantize_ratio(in_scale: np.ndarray | float, out_scale: float) -> Multiplier:
    """Multiplier for codes in ``in_scale`` to codes in ``out_scale`` (with XNNPACK's float32 ratio)."""
    m = quantize_multiplier(np.asarray(in_scale, dtype=np.float64) / np.float64(out_scale))
    return Multiplier(m.multiplier, m.shift, xnnpack_scale(in_scale, out_scale))
