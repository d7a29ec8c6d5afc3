"""Pooling and reductions on extreme and ordinary shapes: cpu bit-exact with the reference,
and the reference's meaning checked against direct computations.

The extreme shape is a tall 1x800x90x8 map pooled with an 800x90 window (a global
pool), an 800x1 and a 1x90 window; every test runs it once. Ordinary shapes add
strides, padding (windows with few real taps) and batches. Speed is measured by
``benchmarks/extreme_shapes.py``, not here.
"""

import math

import numpy as np
import pytest

from qlower.backends.cpu import prepare
from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, requant, verify_graph
from qlower.reference import run_graph

I8, I16, I32, F32 = DType.INT8, DType.INT16, DType.INT32, DType.FLOAT32

TALL = (1, 800, 90, 8)
NO_PAD = (0, 0, 0, 0)
EXTREME = [(TALL, (800, 90), (1, 1), NO_PAD),
           (TALL, (800, 1), (1, 1), NO_PAD),
           (TALL, (1, 90), (1, 1), NO_PAD)]
ORDINARY = [((1, 64, 64, 8), (7, 7), (1, 1), (3, 3, 3, 3)),     # medium map, 7x7 window, "same" padding
            ((2, 9, 11, 3), (3, 3), (2, 2), (1, 1, 1, 1)),
            ((1, 10, 7, 5), (4, 2), (3, 1), (0, 3, 1, 0)),      # bottom windows with a single real row
            ((2, 13, 6, 4), (5, 6), (2, 3), (4, 0, 2, 5)),      # top windows with a single real row
            ((1, 120, 40, 4), (50, 17), (3, 2), (7, 7, 3, 3)),  # large windows, many outputs
            ((1, 5, 5, 2), (5, 5), (4, 4), NO_PAD),             # stride beyond the input: one window
            ((3, 4, 30, 2), (1, 1), (1, 2), NO_PAD)]
CASES = EXTREME + ORDINARY
CASE_IDS = [f"{'x'.join(map(str, s))}-k{k[0]}x{k[1]}-s{st[0]}x{st[1]}-p{''.join(map(str, p))}"
            for s, k, st, p in CASES]


def _graph(kind, t, **attrs):
    b = GraphBuilder(kind)
    return verify_graph(b.build([b.op(kind, b.input("x", t), **attrs)]))


def _type(shape, dtype, zp=0):
    if dtype is F32:
        return TensorType(shape, F32)
    return TensorType(shape, dtype, QuantSpec.per_tensor(0.05, zp, dtype))


def _codes(rng, shape, dtype):
    info = np.iinfo(dtype.numpy)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype.numpy)


def _floats(rng, shape):
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, size=shape)).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, size=max(1, flat.size // 50))] = -0.0   # zeros of both signs
    flat[rng.integers(0, flat.size, size=max(1, flat.size // 50))] = 0.0
    return x


def _reference_and_cpu(graph, x):
    (expected,) = run_graph(graph, [x])
    (got,) = prepare(graph).run([x])
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    # bit for bit, which also tells -0.0 from 0.0 and compares NaN payloads
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()
    return expected


# -- cpu == reference ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape,kernel,stride,pad", CASES, ids=CASE_IDS)
def test_avg_pool2d_int_cpu_is_bit_exact(shape, kernel, stride, pad):
    rng = np.random.default_rng(20240611)
    for dtype, zp in ((I8, -7), (I8, 127), (I16, 0), (I16, -300)):
        x = _codes(rng, shape, dtype)
        out = _reference_and_cpu(_graph("avg_pool2d", _type(shape, dtype, zp), kernel=kernel, stride=stride, pad=pad), x)
        assert out.dtype == dtype.numpy


@pytest.mark.parametrize("shape,kernel,stride,pad", CASES, ids=CASE_IDS)
def test_avg_pool2d_float_cpu_is_bit_exact(shape, kernel, stride, pad):
    x = _floats(np.random.default_rng(7321), shape)
    out = _reference_and_cpu(_graph("avg_pool2d", _type(shape, F32), kernel=kernel, stride=stride, pad=pad), x)
    assert out.dtype == np.float32


@pytest.mark.parametrize("shape,kernel,stride,pad", CASES, ids=CASE_IDS)
def test_max_pool2d_cpu_is_bit_exact(shape, kernel, stride, pad):
    rng = np.random.default_rng(99)
    for dtype in (I8, I16, I32):
        x = _codes(rng, shape, dtype)
        x.reshape(-1)[: x.size // 3] = dtype.min   # whole windows of the lowest code: padding never wins
        _reference_and_cpu(_graph("max_pool2d", _type(shape, dtype, 3 if dtype is I8 else 0),
                                  kernel=kernel, stride=stride, pad=pad), x)
    x = _floats(rng, shape)
    x.reshape(-1)[: x.size // 3] = np.float32(-0.0)   # windows whose maximum is a zero of either sign
    _reference_and_cpu(_graph("max_pool2d", _type(shape, F32), kernel=kernel, stride=stride, pad=pad), x)


def test_float_special_values_cpu_is_bit_exact():
    rng = np.random.default_rng(4242)
    shape = (2, 12, 10, 3)
    x = rng.choice(np.array([0.0, -0.0, 1.5, -2.25, np.inf, -np.inf, 1e38, -1e38], np.float32), size=shape)
    for kernel, stride, pad in [((3, 3), (1, 1), (1, 1, 1, 1)), ((2, 4), (2, 3), (0, 1, 3, 0)), ((12, 10), (1, 1), NO_PAD)]:
        _reference_and_cpu(_graph("avg_pool2d", _type(shape, F32), kernel=kernel, stride=stride, pad=pad), x)
        with_nan = x.copy()
        with_nan.reshape(-1)[::17] = np.nan
        _reference_and_cpu(_graph("max_pool2d", _type(shape, F32), kernel=kernel, stride=stride, pad=pad), with_nan)
        for axis in range(4):
            _reference_and_cpu(_graph("reduce_max", _type(shape, F32), axis=axis), with_nan)
    zeros = rng.choice(np.array([0.0, -0.0, -1.0], np.float32), size=shape)
    for axis in range(4):
        _reference_and_cpu(_graph("reduce_max", _type(shape, F32), axis=axis), zeros)
    # the extreme case once
    x = rng.choice(np.array([0.0, -0.0, 3.0, -np.inf], np.float32), size=TALL)
    x[..., :4] = np.minimum(x[..., :4], 0)   # channels whose maximum is a zero
    _reference_and_cpu(_graph("avg_pool2d", _type(TALL, F32), kernel=(800, 90), stride=(1, 1)), x)
    _reference_and_cpu(_graph("max_pool2d", _type(TALL, F32), kernel=(800, 90), stride=(1, 1)), x)


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_reductions_cpu_is_bit_exact_on_the_tall_map(axis):
    rng = np.random.default_rng(31337)
    x32 = rng.integers(-(2**14), 2**14, size=TALL).astype(np.int32)
    q = QuantSpec.per_tensor(0.001, 0, I32)
    _reference_and_cpu(_graph("reduce_sum", TensorType(TALL, I32, q), axis=axis), x32)
    _reference_and_cpu(_graph("reduce_max", TensorType(TALL, I32, q), axis=axis), x32)
    _reference_and_cpu(_graph("reduce_max", _type(TALL, I8, 5), axis=axis), _codes(rng, TALL, I8))
    f = (rng.standard_normal(TALL) * 100).astype(np.float32)
    _reference_and_cpu(_graph("reduce_sum", _type(TALL, F32), axis=axis), f)
    _reference_and_cpu(_graph("reduce_max", _type(TALL, F32), axis=axis), f)


def test_int16_sum_beyond_int32_is_an_execution_error_on_both():
    # 72,000 taps of code 32767: the sum exceeds int32, which TOSA's apply_scale_32 does not admit
    x = np.full(TALL, 32767, np.int16)
    graph = _graph("avg_pool2d", _type(TALL, I16, 0), kernel=(800, 90), stride=(1, 1))
    with pytest.raises(ExecutionError):
        run_graph(graph, [x])
    with pytest.raises(ExecutionError):
        prepare(graph).run([x])
    x[0, ::2] = -32768   # alternate rows: the sum fits again, and both agree on the value
    _reference_and_cpu(graph, x)


# -- the reference's meaning, computed directly -------------------------------------------------


def _windows(shape, kernel, stride, pad):
    """For each output (i, j): the real (non-padding) rows and columns of its window."""
    n, h, w, c = shape
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = kernel, stride, pad
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    for i in range(oh):
        for j in range(ow):
            ys = [y for y in range(i * sh - pt, i * sh - pt + kh) if 0 <= y < h]
            xs = [v for v in range(j * sw - pl, j * sw - pl + kw) if 0 <= v < w]
            yield i, j, ys, xs
    return oh, ow


def _out_hw(shape, kernel, stride, pad):
    return ((shape[1] + pad[0] + pad[1] - kernel[0]) // stride[0] + 1,
            (shape[2] + pad[2] + pad[3] - kernel[1]) // stride[1] + 1)


def _naive_int_avg_pool(x, kernel, stride, pad, zp, dtype):
    """TOSA AVG_POOL2D by hand: exact Python-int sum of (code - zp) over the real taps, then
    reciprocal_scale(count) written out and requant.apply_scale_32, + zp, clamp."""
    n, _, _, c = x.shape
    out = np.zeros((n, *_out_hw(x.shape, kernel, stride, pad), c), np.int64)
    for i, j, ys, xs in _windows(x.shape, kernel, stride, pad):
        count = len(ys) * len(xs)
        k = (count - 1).bit_length()
        multiplier, shift = (((1 << 30) + 1) << k) // count, 30 + k
        for b in range(n):
            for ch in range(c):
                total = sum(int(x[b, y, v, ch]) - zp for y in ys for v in xs)
                scaled = int(requant.apply_scale_32(np.int64(total), np.int64(multiplier), np.int64(shift)))
                out[b, i, j, ch] = min(max(scaled + zp, dtype.min), dtype.max)
    return out.astype(dtype.numpy)


SMALL = [((1, 7, 7, 3), (3, 3), (2, 2), (1, 1, 1, 1)),
         ((2, 6, 9, 2), (2, 3), (1, 2), (0, 1, 1, 1)),
         ((1, 5, 8, 2), (3, 4), (1, 2), (2, 0, 0, 2)),
         ((1, 9, 5, 2), (9, 5), (1, 1), NO_PAD),
         ((1, 11, 4, 1), (6, 3), (2, 1), (5, 5, 2, 2)),
         ((1, 4, 13, 2), (1, 7), (3, 2), (0, 0, 6, 6))]


@pytest.mark.parametrize("shape,kernel,stride,pad", SMALL)
def test_reference_int_avg_pool2d_is_tosa_by_hand(shape, kernel, stride, pad):
    rng = np.random.default_rng(555)
    for dtype, zp in ((I8, 0), (I8, -128), (I8, 77), (I16, 0), (I16, 1234)):
        x = _codes(rng, shape, dtype)
        (got,) = run_graph(_graph("avg_pool2d", _type(shape, dtype, zp), kernel=kernel, stride=stride, pad=pad), [x])
        assert got.dtype == dtype.numpy
        np.testing.assert_array_equal(got, _naive_int_avg_pool(x, kernel, stride, pad, zp, dtype))


def test_reference_int_avg_pool2d_extreme_window_by_hand():
    rng = np.random.default_rng(8)
    x = _codes(rng, TALL, I8)
    (got,) = run_graph(_graph("avg_pool2d", _type(TALL, I8, -3), kernel=(800, 90), stride=(1, 1)), [x])
    total = x.astype(np.int64).sum(axis=(1, 2)) + 3 * 72000   # exact: sum of (code - zp) over every tap
    k = (72000 - 1).bit_length()
    expected = requant.apply_scale_32(total, (((1 << 30) + 1) << k) // 72000, 30 + k) - 3
    np.testing.assert_array_equal(got.reshape(-1), np.clip(expected, -128, 127).reshape(-1))


@pytest.mark.parametrize("shape,kernel,stride,pad", SMALL + EXTREME[:1])
def test_reference_float_avg_pool2d_is_the_average(shape, kernel, stride, pad):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    (got,) = run_graph(_graph("avg_pool2d", _type(shape, F32), kernel=kernel, stride=stride, pad=pad), [x])
    n, _, _, c = shape
    expected = np.zeros((n, *_out_hw(shape, kernel, stride, pad), c))
    for i, j, ys, xs in _windows(shape, kernel, stride, pad):
        taps = x[:, ys][:, :, xs].astype(np.float64).reshape(n, -1, c)
        for b in range(n):
            for ch in range(c):
                expected[b, i, j, ch] = math.fsum(taps[b, :, ch]) / taps.shape[1]
    # float64 sums of float32 taps, one rounding to float32: within float32 rounding of the exact mean
    np.testing.assert_allclose(got, expected, rtol=2e-7, atol=1e-12)


@pytest.mark.parametrize("shape,kernel,stride,pad", SMALL + EXTREME[:1])
def test_reference_max_pool2d_by_hand(shape, kernel, stride, pad):
    rng = np.random.default_rng(12)
    x = rng.choice(np.array([-0.0, 0.0, -1.0, -3.5], np.float32), size=shape)
    x.reshape(-1)[5::41] = np.nan
    (got,) = run_graph(_graph("max_pool2d", _type(shape, F32), kernel=kernel, stride=stride, pad=pad), [x])
    n, _, _, c = shape
    for i, j, ys, xs in _windows(shape, kernel, stride, pad):
        for b in range(n):
            for ch in range(c):
                taps = x[b, ys][:, xs, ch].reshape(-1)
                if np.isnan(taps).any():
                    assert np.isnan(got[b, i, j, ch])
                    continue
                # TOSA apply_max_s (acc >= v ? acc : v) over the taps row by row keeps the first tap that
                # reaches the maximum: that one's sign when the maximum is a zero
                best = taps[np.flatnonzero(taps == taps.max())[0]]
                assert got[b, i, j, ch].tobytes() == np.float32(best).tobytes()
