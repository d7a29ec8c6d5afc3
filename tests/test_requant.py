"""qlower.ir.requant: multiplier derivation, apply_scale_32, and bit-exactness with TOSA RESCALE.

The key test runs TOSA 1.0 RESCALE (and RESCALE + CLAMP) on the official TOSA
reference model over thousands of random values per graph and compares with
``qlower.ir.requant.rescale`` exactly. Everything else is checked against exact
rational arithmetic (``fractions.Fraction``) or hand-derived integers.
"""

import os

os.environ["TOSA_MODEL_NO_BACKTRACE"] = "1"

import zlib
from fractions import Fraction

import numpy as np
import pytest
import tosa_reference_model as trm
import tosa_serializer as ts

from qlower.ir.requant import (
    MAX_SHIFT,
    Multiplier,
    RequantRangeError,
    apply_scale_32,
    quantize_multiplier,
    requantize_ratio,
    rescale,
)

# -- quantize_multiplier -------------------------------------------------------------


def _assert_nearest(ratio: float, m: int, s: int) -> None:
    """(m, s) is a nearest representation of ``ratio`` at shift ``s``: error ≤ half a unit of 2**-s."""
    err = abs(Fraction(ratio) - Fraction(m, 2**s))
    assert err <= Fraction(1, 2 ** (s + 1)), (ratio, m, s, float(err))


def test_quantize_multiplier_is_normalised_and_nearest_for_random_ratios():
    rng = np.random.default_rng(0)
    ratios = np.exp2(rng.uniform(-31, 28.9, size=2000))
    mult = quantize_multiplier(ratios)
    assert mult.multiplier.shape == mult.shift.shape == ratios.shape
    for r, m, s in zip(ratios, mult.multiplier.tolist(), mult.shift.tolist()):
        assert 2**30 <= m < 2**31 and 2 <= s <= MAX_SHIFT
        _assert_nearest(float(r), m, s)
        # normalised multiplier: relative reconstruction error at most 2**-31
        assert abs(Fraction(float(r)) - Fraction(m, 2**s)) <= Fraction(float(r)) / 2**31


@pytest.mark.parametrize("k", [-31, -20, -1, 0, 1, 10, 28])
def test_quantize_multiplier_powers_of_two_are_exact(k):
    mult = quantize_multiplier(2.0**k)
    assert (int(mult.multiplier[0]), int(mult.shift[0])) == (2**30, 30 - k)
    assert mult.ratio()[0] == 2.0**k


@pytest.mark.parametrize("k", [-25, -3, 0, 5, 20])
def test_quantize_multiplier_just_below_a_power_of_two_carries_into_the_exponent(k):
    # 2**k * (1 - 2**-40): the 31-bit mantissa rounds up to 2**31, which must carry
    # into the shift rather than overflow the multiplier.
    r = 2.0**k * (1 - 2.0**-40)
    mult = quantize_multiplier(r)
    assert (int(mult.multiplier[0]), int(mult.shift[0])) == (2**30, 30 - k)
    # just above: mantissa 0.5 * (1 + 2**-39) rounds to exactly 2**30 at the next exponent
    r = 2.0**k * (1 + 2.0**-39)
    mult = quantize_multiplier(r)
    assert (int(mult.multiplier[0]), int(mult.shift[0])) == (2**30, 30 - k)
    # a ratio whose mantissa needs all 31 bits: (2**31 - 1) * 2**-(31-k)
    r = (2**31 - 1) * 2.0 ** (k - 31)
    mult = quantize_multiplier(r)
    assert (int(mult.multiplier[0]), int(mult.shift[0])) == (2**31 - 1, 31 - k)


def test_quantize_multiplier_zero():
    mult = quantize_multiplier(0.0)
    assert int(mult.multiplier[0]) == 0 and 2 <= int(mult.shift[0]) <= MAX_SHIFT
    assert mult.ratio()[0] == 0.0
    out = rescale(np.array([-2**31, -5, 0, 7, 2**31 - 1]), 0, 3, mult, -128, 127)
    assert out.tolist() == [3, 3, 3, 3, 3]


def test_quantize_multiplier_tiny_ratios_round_to_nearest_at_the_largest_shift():
    rng = np.random.default_rng(1)
    ratios = np.exp2(rng.uniform(-100, -32, size=1000))
    ratios = np.concatenate([ratios, [2.0**-33, 2.0**-40, 2.0**-63, 2.0**-64, 1e-300, 5e-324]])
    mult = quantize_multiplier(ratios)
    for r, m, s in zip(ratios, mult.multiplier.tolist(), mult.shift.tolist()):
        assert s == MAX_SHIFT and 0 <= m < 2**31
        _assert_nearest(float(r), m, s)
    # 2**-40 = 2**22 * 2**-62 exactly; 2**-64 is a quarter unit: nearest is 0
    assert mult.multiplier[-5] == 2**22
    assert mult.multiplier[-3] == 0


def test_quantize_multiplier_tiny_ratio_rounds_once_not_twice():
    # r * 2**62 = 2**29 + 2.25: the nearest multiplier at shift 62 is 2**29 + 2.
    # Rounding the 31-bit mantissa first (2**30 + 4.5 -> 2**30 + 5) and then
    # halving it again would give 2**29 + 3, an error of 0.75 units.
    r = (2**30 + 4.5) * 2.0**-63
    mult = quantize_multiplier(r)
    assert (int(mult.multiplier[0]), int(mult.shift[0])) == (2**29 + 2, 62)


@pytest.mark.parametrize("bad", [2.0**29, 2.0**29 * (1 - 2.0**-40), 1e12, float("inf"), float("nan"), -0.5])
def test_quantize_multiplier_rejects_what_scale32_cannot_express(bad):
    with pytest.raises(RequantRangeError):
        quantize_multiplier(bad)


def test_quantize_multiplier_largest_expressible_ratio():
    r = (2**31 - 1) * 2.0**-2  # multiplier 2**31 - 1, shift 2: just below 2**29
    mult = quantize_multiplier(r)
    assert (int(mult.multiplier[0]), int(mult.shift[0])) == (2**31 - 1, 2)


def test_requantize_ratio_per_channel():
    mult = requantize_ratio(np.array([0.5, 0.25, 3.0]), 0.5)  # ratios 1, 0.5, 6
    assert mult.per_channel
    assert mult.multiplier.tolist() == [2**30, 2**30, 3 * 2**29]
    assert mult.shift.tolist() == [30, 31, 28]


# -- apply_scale_32 ----------------------------------------------------------------------


def test_apply_scale_32_single_round_ties_toward_plus_infinity():
    v = np.array([-5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5])
    # multiplier 2**30, shift 31: v / 2, ties (odd v) rounded up
    out = apply_scale_32(v, 2**30, 31)
    assert out.tolist() == [-2, -2, -1, -1, 0, 0, 1, 1, 2, 2, 3]
    # shift 32: v / 4; ties at v = ±2
    out = apply_scale_32(v, 2**30, 32)
    assert out.tolist() == [-1, -1, -1, 0, 0, 0, 0, 1, 1, 1, 1]


def test_apply_scale_32_double_round():
    v = np.array([-5, -3, -2, -1, 0, 1, 2, 3, 5])
    # shift 32 > 31: the spec adds a further ±2**30 before the shift (sign of v):
    #   v >= 0: (v * 2**30 + 2**31 + 2**30) >> 32 = floor((v + 3) / 4)
    #   v <  0: (v * 2**30 + 2**31 - 2**30) >> 32 = floor((v + 1) / 4)
    out = apply_scale_32(v, 2**30, 32, double_round=True)
    assert out.tolist() == [-1, -1, -1, 0, 0, 1, 1, 1, 2]
    # shift <= 31: double rounding is single rounding
    assert apply_scale_32(v, 2**30, 31, double_round=True).tolist() == apply_scale_32(v, 2**30, 31).tolist()


def test_apply_scale_32_is_exact_at_extremes():
    # int32 extremes with the largest multiplier and shift 62: no int64 overflow
    v = np.array([-(2**31), 2**31 - 1])
    out = apply_scale_32(v, 2**31 - 1, 62)
    expect = [(int(x) * (2**31 - 1) + 2**61) >> 62 for x in v]
    assert out.tolist() == expect


@pytest.mark.parametrize("value,shift", [(512, 10), (-513, 10), (2, 2), (-3, 2), (2**31, 62), (-(2**31) - 1, 62)])
def test_apply_scale_32_rejects_values_outside_its_require(value, shift):
    with pytest.raises(RequantRangeError):
        apply_scale_32(np.array([value]), 2**30, shift)


def test_apply_scale_32_accepts_the_edges_of_its_require():
    # multiplier 2**30 with shift 10 is the ratio 2**20; the REQUIRE admits [-512, 512)
    out = apply_scale_32(np.array([-512, 511]), 2**30, 10)
    assert out.tolist() == [-512 * 2**20, 511 * 2**20]


@pytest.mark.parametrize("multiplier,shift", [(-1, 30), (2**31, 30), (2**30, 1), (2**30, 63)])
def test_apply_scale_32_rejects_bad_multiplier_or_shift(multiplier, shift):
    with pytest.raises(RequantRangeError):
        apply_scale_32(np.array([1]), multiplier, shift)


def test_rescale_clamps_to_qmin_qmax_and_applies_zero_points():
    mult = quantize_multiplier(0.5)
    codes = np.array([-128, -3, 0, 10, 127])
    # (code - 2) * 0.5 rounded half up, then + (-1), clamped to [-10, 20]
    out = rescale(codes, 2, -1, mult, -10, 20)
    assert out.tolist() == [-10, -3, -2, 3, 20]  # -3: -2.5 rounds up to -2, then -1


def test_rescale_raises_when_a_value_breaks_the_require():
    mult = Multiplier(np.array([2**30]), np.array([10]))
    with pytest.raises(RequantRangeError):
        rescale(np.array([0, 600]), 0, 0, mult, -128, 127)


# -- bit-exact with the TOSA reference model ---------------------------------------------

_TS = {np.int8: ts.DType.INT8, np.int16: ts.DType.INT16, np.int32: ts.DType.INT32}


def _tosa_rescale(x: np.ndarray, out_dtype, multiplier: np.ndarray, shift: np.ndarray, in_zp: int, out_zp: int,
                  double_round: bool, clamp: tuple[int, int] | None = None):
    """Run RESCALE (+ CLAMP) on the TOSA reference model; per channel when the multiplier has >1 entry."""
    in_dtype = x.dtype.type
    per_channel = multiplier.size > 1
    ser = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
    xin = ser.addPlaceholder(list(x.shape), _TS[in_dtype], None)
    m = ser.addConst([multiplier.size], ts.DType.INT32, multiplier.astype(np.int32), "mult")
    s = ser.addConst([shift.size], ts.DType.INT8, shift.astype(np.int8), "shift")
    izp = ser.addConst([1], _TS[in_dtype], np.array([in_zp], dtype=in_dtype), "izp")
    ozp = ser.addConst([1], _TS[out_dtype], np.array([out_zp], dtype=out_dtype), "ozp")
    mid = ser.addIntermediate(list(x.shape), _TS[out_dtype]) if clamp else None
    out = ser.addOutput(list(x.shape), _TS[out_dtype])
    attr = ts.TosaSerializerAttribute()
    rounding = ts.RoundingMode.DOUBLE_ROUND if double_round else ts.RoundingMode.SINGLE_ROUND
    attr.RescaleAttribute(True, rounding, per_channel, False, False)
    ser.addOperator(ts.Op.RESCALE, [xin.name, m.name, s.name, izp.name, ozp.name], [(mid or out).name], attr)
    if clamp:
        cattr = ts.TosaSerializerAttribute()
        lo, hi = (list(np.array([c], dtype=out_dtype).tobytes()) for c in clamp)
        cattr.ClampAttribute(lo, hi, ts.NanPropagationMode.PROPAGATE)
        ser.addOperator(ts.Op.CLAMP, [mid.name], [out.name], cattr)
    outs, status = trm.run(ser.serialize(), [x])
    return (outs[0] if status == trm.GraphStatus.TOSA_VALID else None), status


def _random_values(rng, n: int, dtype, shift: np.ndarray, zp: int) -> np.ndarray:
    """Codes of ``dtype`` whose ``code - zp`` meets apply_scale_32's REQUIRE for every channel's shift,
    mixing uniform draws, the range edges and values near rounding ties."""
    info = np.iinfo(dtype)
    c = shift.size
    lim = np.minimum(2.0 ** (shift.astype(np.float64) - 1), 2.0**40)
    lo = np.maximum(info.min, np.ceil(zp - lim)).astype(np.int64)
    hi = np.minimum(info.max, np.floor(zp + lim - 1)).astype(np.int64)
    rows = n // c
    vals = rng.integers(lo, hi, size=(rows, c), endpoint=True)
    # a band of small values (where ties and the sign of rounding matter most)
    small = rng.integers(-300, 300, size=(rows // 4, c)) + zp
    vals[: rows // 4] = np.clip(small, lo, hi)
    vals[-1], vals[-2], vals[-3] = lo, hi, zp
    return vals.astype(dtype) if c > 1 else vals.reshape(-1).astype(dtype)


_CASES = [  # in dtype, out dtype, log2 ratio range, in zp range, out zp range
    (np.int32, np.int8, (-24, 2), (0, 0), (-128, 127)),
    (np.int8, np.int8, (-6, 6), (-128, 127), (-128, 127)),
    (np.int8, np.int32, (-4, 16), (-128, 127), (0, 0)),
    (np.int16, np.int8, (-16, 0), (0, 0), (-128, 127)),
    (np.int32, np.int16, (-20, 0), (0, 0), (0, 0)),
]


@pytest.mark.parametrize("double_round", [False, True], ids=["single", "double"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c[0].__name__}->{c[1].__name__}" if isinstance(c, tuple) else "")
def test_rescale_is_bit_exact_with_tosa(case, per_channel, double_round):
    in_dtype, out_dtype, (lr0, lr1), izp_range, ozp_range = case
    seed = zlib.crc32(f"{in_dtype.__name__}{out_dtype.__name__}{per_channel}{double_round}".encode())
    rng = np.random.default_rng(seed)
    channels = 16 if per_channel else 1
    for _ in range(3):
        ratios = np.exp2(rng.uniform(lr0, lr1, size=channels))
        mult = quantize_multiplier(ratios)
        in_zp = int(rng.integers(*izp_range, endpoint=True))
        out_zp = int(rng.integers(*ozp_range, endpoint=True))
        x = _random_values(rng, 8192, in_dtype, mult.shift, in_zp)
        expected, status = _tosa_rescale(x, out_dtype, mult.multiplier, mult.shift, in_zp, out_zp, double_round)
        assert status == trm.GraphStatus.TOSA_VALID
        info = np.iinfo(out_dtype)
        got = rescale(x, in_zp, out_zp, mult, int(info.min), int(info.max),
                      axis=x.ndim - 1 if per_channel else None, double_round=double_round)
        mismatch = np.flatnonzero(got.reshape(-1) != expected.reshape(-1).astype(np.int64))
        assert mismatch.size == 0, f"{mismatch.size} mismatches, first at {x.reshape(-1)[mismatch[:5]]}"


@pytest.mark.parametrize("double_round", [False, True], ids=["single", "double"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_rescale_with_arbitrary_multiplier_and_shift_is_bit_exact_with_tosa(per_channel, double_round):
    """Not only normalised multipliers: any multiplier in [0, 2**31) and shift in [2, 62]."""
    rng = np.random.default_rng(7 + 2 * per_channel + double_round)
    channels = 32 if per_channel else 1
    for _ in range(3):
        m = rng.integers(0, 2**31, size=channels)
        s = rng.integers(2, 63, size=channels)
        if not per_channel:  # cover the low and high shifts across iterations
            s = rng.integers(2, 63, size=1)
        x = _random_values(rng, 4096, np.int32, s, 0)
        expected, status = _tosa_rescale(x, np.int32, m, s, 0, 0, double_round)
        assert status == trm.GraphStatus.TOSA_VALID
        got = rescale(x, 0, 0, Multiplier(m, s), -(2**31), 2**31 - 1,
                      axis=x.ndim - 1 if per_channel else None, double_round=double_round)
        assert np.array_equal(got.reshape(-1), expected.reshape(-1).astype(np.int64))


def test_rescale_ties_are_bit_exact_with_tosa():
    """Every value in a dense band with power-of-two ratios: each tie of SINGLE and DOUBLE rounding."""
    x = np.arange(-2048, 2048, dtype=np.int32)
    for shift in (31, 32, 33, 35, 40):
        for double_round in (False, True):
            m, s = np.array([2**30]), np.array([shift])
            expected, status = _tosa_rescale(x, np.int32, m, s, 0, 0, double_round)
            assert status == trm.GraphStatus.TOSA_VALID
            got = rescale(x, 0, 0, Multiplier(m, s), -(2**31), 2**31 - 1, double_round=double_round)
            assert np.array_equal(got, expected.astype(np.int64)), (shift, double_round)


@pytest.mark.parametrize("out_dtype,qrange", [(np.int8, (-127, 127)), (np.int8, (0, 127)), (np.int8, (-20, 35)),
                                              (np.int16, (-1000, 999))])
def test_rescale_with_narrow_range_equals_tosa_rescale_then_clamp(out_dtype, qrange):
    rng = np.random.default_rng(qrange[0] + 1000)
    for per_channel in (False, True):
        channels = 8 if per_channel else 1
        mult = quantize_multiplier(np.exp2(rng.uniform(-14, -4, size=channels)))
        out_zp = int(rng.integers(*qrange)) if out_dtype == np.int8 else 0  # TOSA: int16 zero point is 0
        x = _random_values(rng, 4096, np.int32, mult.shift, 0)
        expected, status = _tosa_rescale(x, out_dtype, mult.multiplier, mult.shift, 0, out_zp, False, clamp=qrange)
        assert status == trm.GraphStatus.TOSA_VALID
        got = rescale(x, 0, out_zp, mult, *qrange, axis=1 if per_channel else None)
        assert got.min() >= qrange[0] and got.max() <= qrange[1]
        assert np.array_equal(got.reshape(-1), expected.reshape(-1).astype(np.int64))


def test_require_violation_is_an_error_in_both_tosa_and_qlower():
    x = np.array([1, -5, 600, 3], dtype=np.int32)
    m, s = np.array([2**30]), np.array([10])  # REQUIRE: value in [-512, 512)
    _, status = _tosa_rescale(x, np.int8, m, s, 0, 0, False)
    assert status != trm.GraphStatus.TOSA_VALID
    with pytest.raises(RequantRangeError):
        rescale(x, 0, 0, Multiplier(m, s), -128, 127)
    # int8 input with a zero point: code - zp = 127 - (-128) = 255 breaks shift 8's [-128, 128)
    x8 = np.array([0, 127], dtype=np.int8)
    m, s = np.array([2**30]), np.array([8])
    _, status = _tosa_rescale(x8, np.int8, m, s, -128, 0, False)
    assert status != trm.GraphStatus.TOSA_VALID
    with pytest.raises(RequantRangeError):
        rescale(x8, -128, 0, Multiplier(m, s), -128, 127)
