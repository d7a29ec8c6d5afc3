"""The CPU backend's requantization (torch and native) equals qlower.ir.requant bit for bit."""

import zlib

import numpy as np
import pytest
import torch

from qlower.backends.cpu import native
from qlower.backends.cpu.quantization import Requantizer, RescaleParams, ScaleConstants
from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, requant

NATIVE = native.load()


def test_the_native_kernels_are_built():
    """Every check below runs on the torch kernels and on the native C ones: a machine where the
    C kernels did not build must fail here, not quietly test only half (scripts/setup_compiler.sh)."""
    assert NATIVE is not None, (f"the native CPU kernels are not loaded: {native.unavailable_reason()}. Install gcc "
                                "with OpenMP (scripts/setup_compiler.sh) and don't set QLOWER_CPU_NATIVE=0 for the tests")
    assert native.unavailable_reason() is None


def _op():
    """Any op, for error messages."""
    b = GraphBuilder()
    x = b.input("x", TensorType((1,), DType.INT32, QuantSpec.per_tensor(1.0, 0, DType.INT32)))
    b.op("rescale", x, out=QuantSpec.per_tensor(1.0))
    return b._ops[0]


@pytest.mark.parametrize("double_round", [False, True])
def test_scale_constants_match_requant_apply_scale_32(double_round):
    rng = np.random.default_rng(0)
    n = 20000
    shift = rng.integers(requant.MIN_SHIFT, requant.MAX_SHIFT + 1, n)
    half = np.left_shift(np.int64(1), shift - 1)
    limit = np.minimum(half, 2**31)  # the REQUIRE bound: in range for the shift and an int32
    value = (rng.random(n) * 2 * limit - limit).astype(np.int64)
    # rounding boundaries and range ends, where an off-by-one would show
    value[:1000] = -limit[:1000]
    value[1000:2000] = limit[1000:2000] - 1
    value[2000:3000] = (limit[2000:3000] >> 1) * np.sign(rng.standard_normal(1000)).astype(np.int64)
    mult = rng.integers(2**30, 2**31, n)
    mult[3000:3100] = 2**31 - 1
    expected = requant.apply_scale_32(value, mult, shift, double_round)
    got = ScaleConstants.of(mult, shift, double_round)(torch.from_numpy(value))
    np.testing.assert_array_equal(got.numpy(), expected)


def test_apply_scale_32_require_raises():
    for value in (-(2**9) - 1, 2**9):
        with pytest.raises(requant.RequantRangeError):
            requant.apply_scale_32(np.array([value]), np.array([2**30]), np.array([10]))
        with pytest.raises(requant.RequantRangeError):
            ScaleConstants.of(np.array([2**30]), np.array([10]))(torch.tensor([value]))


def _numpy_rescale(x, params: RescaleParams, axis, offset=None, clamp=None):
    codes = x.astype(np.int64) + (0 if offset is None else offset)
    m = requant.Multiplier(params.mult, params.shift)
    y = requant.rescale(codes, params.in_zp if params.in_zp.size > 1 else params.in_zp[0], params.out_zp, m,
                        params.qmin, params.qmax, axis=axis, double_round=params.double_round)
    return y if clamp is None else np.clip(y, *clamp)


CASES = [  # in dtype, out dtype, per-channel, in zp, ratio range
    (DType.INT32, DType.INT8, True, 0, (1e-4, 1e-2)),
    (DType.INT32, DType.INT8, False, 0, (1e-5, 1e-3)),
    (DType.INT32, DType.INT16, True, 0, (1e-3, 1e-1)),
    (DType.INT32, DType.INT32, False, 0, (0.3, 0.9)),
    (DType.INT8, DType.INT8, False, -7, (0.2, 3.0)),
    (DType.INT8, DType.INT32, False, 100, (2.0**9, 2.0**11)),
    (DType.INT16, DType.INT8, True, 0, (1e-3, 1e-2)),
    (DType.INT16, DType.INT16, False, 5, (0.5, 1.5)),
    (DType.INT8, DType.INT16, True, 3, (1.0, 40.0)),
]


@pytest.mark.parametrize("double_round", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].value}-{c[1].value}-{'pc' if c[2] else 'pt'}")
def test_requantizer_matches_requant_rescale(case, double_round):
    in_dtype, out_dtype, per_channel, in_zp, (lo, hi) = case
    # a stable seed per case (hash() of an Enum differs between processes)
    rng = np.random.default_rng(zlib.crc32(repr((case, double_round)).encode()))
    shape, channels = (2, 5, 3, 17), 17
    ratio = rng.uniform(lo, hi, channels if per_channel else 1)
    m = requant.quantize_multiplier(ratio)
    out_zp = int(rng.integers(out_dtype.min // 4, out_dtype.max // 4)) if out_dtype is not DType.INT32 else 11
    params = RescaleParams(np.full(ratio.size, in_zp, np.int64), m.multiplier, m.shift, out_zp,
                           out_dtype.min + 1, out_dtype.max - 2, out_dtype, 3 if per_channel else None, double_round)
    bound = min(in_dtype.max, 2**24) if in_dtype is DType.INT32 else in_dtype.max
    x = rng.integers(max(in_dtype.min, -bound), bound, shape).astype(in_dtype.numpy)
    expected = _numpy_rescale(x, params, 3 if per_channel else None).astype(out_dtype.numpy)
    for nat in (None, NATIVE):
        rq = Requantizer(params, 4, in_dtype, _op(), nat)
        got = rq(torch.from_numpy(x))
        assert got.dtype == torch.from_numpy(expected).dtype
        np.testing.assert_array_equal(got.numpy(), expected, err_msg=f"native={nat is not None}")
        np.testing.assert_array_equal(rq.torch_path(torch.from_numpy(x)).numpy(), expected)


def test_requantizer_with_offset_and_clamp():
    """The fused GEMM epilogue: rescale(acc + offset) then a clamp, as the ops one by one."""
    rng = np.random.default_rng(3)
    c = 33
    m = requant.quantize_multiplier(rng.uniform(1e-4, 1e-3, c))
    params = RescaleParams(np.zeros(c, np.int64), m.multiplier, m.shift, -20, -127, 127, DType.INT8, 3, False)
    acc = rng.integers(-(2**22), 2**22, (1, 4, 6, c)).astype(np.int32)
    offset = rng.integers(-(2**20), 2**20, c)
    expected = _numpy_rescale(acc, params, 3, offset, (-20, 90)).astype(np.int8)
    for nat in (None, NATIVE):
        rq = Requantizer(params, 4, DType.INT32, _op(), nat, offset=offset, clamp=(-20, 90))
        np.testing.assert_array_equal(rq(torch.from_numpy(acc)).numpy(), expected)


def test_requantizer_reports_overflow_and_range_errors():
    m = requant.quantize_multiplier(np.array([0.5]))
    params = RescaleParams(np.zeros(1, np.int64), m.multiplier, m.shift, 0, -128, 127, DType.INT8, None, False)
    acc = np.array([[2**31 - 10]], np.int32)
    offset = np.array([100])  # acc + offset leaves int32: the reference raises on the accumulator
    for nat in (None, NATIVE):
        rq = Requantizer(params, 2, DType.INT32, _op(), nat, offset=offset)
        with pytest.raises(ExecutionError, match="overflows int32"):
            rq(torch.from_numpy(acc))
    # a ratio of 2**20 has shift 11: int32 inputs beyond +-2**10 break apply_scale_32's REQUIRE
    m = requant.quantize_multiplier(np.array([2.0**20]))
    params = RescaleParams(np.zeros(1, np.int64), m.multiplier, m.shift, 0, DType.INT32.min, DType.INT32.max,
                           DType.INT32, None, False)
    with pytest.raises(requant.RequantRangeError):
        requant.apply_scale_32(np.array([5000]), m.multiplier, m.shift)
    for nat in (None, NATIVE):
        rq = Requantizer(params, 1, DType.INT32, _op(), nat)
        with pytest.raises(ExecutionError, match="REQUIRE"):
            rq(torch.tensor([1, 5000], dtype=torch.int32))
