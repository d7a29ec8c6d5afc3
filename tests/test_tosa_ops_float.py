"""TOSA-1.0+INT+FP: float ops and the ops crossing between reals and codes, run on the TOSA
reference model and compared with the reference interpreter.

quantize / dequantize / cast must be bit-exact (the lowering reproduces the reference's float32
arithmetic). Single float32 operations (add, sub, mul, reciprocal, max, clamp, data movement)
are correctly rounded in both, so they are compared exactly too. Accumulations (conv, matmul,
sums, averages) and transcendental functions get a tolerance: the reference interpreter
computes in float64 and rounds once, the TOSA reference model computes in float32 in its own
order and with its own exp/tanh/erf, so results differ by a few float32 ulps.
"""

import numpy as np
import pytest

from qlower.backends.tosa import TosaBackend
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph

BACKEND = TosaBackend()
FP = "tosa-1.0+int+fp"
ACCUMULATION_TOL = {"rtol": 1e-5, "atol": 1e-5}   # inputs in [-1, 1], sums of < 300 terms
TRANSCENDENTAL_TOL = {"rtol": 1e-5, "atol": 1e-7}  # a few float32 ulps


def f32(shape):
    return TensorType(shape, DType.FLOAT32)


def rand(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def run_both(graph, inputs):
    graph = verify_graph(graph)
    payload = BACKEND.lower(graph, FP)
    got = BACKEND.execute(payload, inputs)
    want = run_graph(graph, inputs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
    return payload, got, want


def assert_exact(graph, inputs):
    payload, got, want = run_both(graph, inputs)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    return payload


def assert_close(graph, inputs, tol):
    payload, got, want = run_both(graph, inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **tol)
    return payload


def unary(in_type, kind, *extra, **attrs):
    b = GraphBuilder()
    x = b.input("x", in_type)
    return b.build([b.op(kind, x, *extra, **attrs)])


# -- float ops ---------------------------------------------------------------------------

@pytest.mark.parametrize("groups,has_bias", [(1, True), (1, False), (4, False)])
def test_conv2d_float(groups, has_bias):
    rng = np.random.default_rng(40)
    b = GraphBuilder()
    x = b.input("x", f32((1, 7, 7, 4)))
    w = b.constant(rand(rng, (4 if groups == 4 else 5, 3, 3, 4 // groups)))
    o = w.shape[0]
    bias = b.constant(rand(rng, (o,))) if has_bias else None
    y = b.op("conv2d", x, w, bias, stride=(2, 2), pad=(1, 1, 1, 1), groups=groups)
    assert_close(b.build([y]), [rand(rng, (1, 7, 7, 4))], ACCUMULATION_TOL)


def test_fully_connected_and_matmul_float():
    rng = np.random.default_rng(41)
    b = GraphBuilder()
    x = b.input("x", f32((3, 16)))
    a = b.input("a", f32((2, 3, 4)))
    fc = b.op("fully_connected", x, b.constant(rand(rng, (5, 16))), b.constant(rand(rng, (5,))))
    mm = b.op("matmul", a, b.constant(rand(rng, (2, 4, 6))))
    assert_close(b.build([fc, mm]), [rand(rng, (3, 16)), rand(rng, (2, 3, 4))], ACCUMULATION_TOL)


@pytest.mark.parametrize("kind", ["add", "sub", "mul"])
def test_binary_float_broadcast(kind):
    rng = np.random.default_rng(42)
    b = GraphBuilder()
    x = b.input("x", f32((2, 3, 4)))
    y = b.op(kind, x, b.constant(rand(rng, (1, 3, 1))))
    assert_exact(b.build([y]), [rand(rng, (2, 3, 4), -100, 100)])


@pytest.mark.parametrize("kind", ["avg_pool2d", "max_pool2d"])
def test_pool_float(kind):
    rng = np.random.default_rng(43)
    g = unary(f32((1, 8, 9, 3)), kind, kernel=(3, 3), stride=(2, 2), pad=(1, 1, 1, 1))
    if kind == "max_pool2d":
        assert_exact(g, [rand(rng, (1, 8, 9, 3))])
    else:
        assert_close(g, [rand(rng, (1, 8, 9, 3))], ACCUMULATION_TOL)


def test_reductions_and_clamp_float():
    rng = np.random.default_rng(44)
    x = rand(rng, (2, 5, 3), -4, 4)
    assert_close(unary(f32((2, 5, 3)), "reduce_sum", axis=1), [x], ACCUMULATION_TOL)
    assert_exact(unary(f32((2, 5, 3)), "reduce_max", axis=2), [x])
    assert_exact(unary(f32((2, 5, 3)), "clamp", min=-1.5, max=0.25), [x])


@pytest.mark.parametrize("kind,lo,hi", [("sigmoid", -8, 8), ("tanh", -4, 4), ("exp", -5, 5), ("erf", -3, 3)])
def test_transcendental(kind, lo, hi):
    rng = np.random.default_rng(45)
    assert_close(unary(f32((64,)), kind), [rand(rng, (64,), lo, hi)], TRANSCENDENTAL_TOL)


def test_reciprocal_is_correctly_rounded():
    rng = np.random.default_rng(46)
    x = rand(rng, (64,), 0.1, 10) * rng.choice([-1, 1], 64).astype(np.float32)
    assert_exact(unary(f32((64,)), "reciprocal"), [x])


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_decomposed(axis):
    rng = np.random.default_rng(47)
    p = assert_close(unary(f32((2, 5, 7)), "softmax", axis=axis), [rand(rng, (2, 5, 7), -6, 6)], TRANSCENDENTAL_TOL)
    assert p.meta["tosa_ops"] == {"REDUCE_MAX": 1, "SUB": 1, "EXP": 1, "REDUCE_SUM": 1, "RECIPROCAL": 1, "MUL": 1}


# -- quantize / dequantize / cast (bit-exact) ------------------------------------------------

QUANTIZE_CASES = [
    QuantSpec.per_tensor(0.5, 3),                      # odd zero point: ties must round before adding it
    QuantSpec.per_tensor(0.5, 0),
    QuantSpec.per_tensor(0.037, -128, qmin=-127),
    QuantSpec.per_tensor(0.002, 11, DType.INT16),
    QuantSpec.per_tensor(1e-7, 0, DType.INT32),                       # int32 saturation at 2**31 - 1
    QuantSpec.per_tensor(0.25, 0, DType.INT32, -1000, 2**31 - 100),  # bounds float32 can't hold
    QuantSpec.per_channel([0.5, 0.25, 0.1], [3, -4, 0], axis=1),
    QuantSpec.per_channel([0.5, 0.25, 0.1], [0, 0, 0], axis=1, qmin=-127),
]


@pytest.mark.parametrize("out", QUANTIZE_CASES, ids=str)
def test_quantize(out):
    rng = np.random.default_rng(48)
    x = np.concatenate([np.arange(-40, 40) * 0.25, [1e10, -1e10, 63.6, -64.1, 127.25, -129.75]]).astype(np.float32)
    x = np.concatenate([x, rand(rng, (6 * 3 * 10 - x.size,), -80, 80)]).reshape(6, 3, 10)
    p = assert_exact(unary(f32(x.shape), "quantize", out=out), [x])
    if out == QUANTIZE_CASES[0]:  # hand-checked: x * 2 rounded half to even, then + 3
        (y,) = BACKEND.execute(p, [x])
        flat = y.reshape(-1)
        # x = 0, 0.25, 0.5, 0.75 -> x * 2 = 0, 0.5, 1, 1.5 -> 0, 0, 1, 2 (rint(0.5 + 3) would give 4)
        assert flat[40:44].tolist() == [3, 3, 4, 5]
        assert flat[38:40].tolist() == [2, 3]        # x = -0.5, -0.25 -> -1, -0.5


DEQUANTIZE_CASES = [
    TensorType((4, 3, 8), DType.INT8, QuantSpec.per_tensor(0.0371, -7)),
    TensorType((4, 3, 8), DType.INT8, QuantSpec.per_channel(np.linspace(0.01, 0.2, 8), range(8), axis=2)),
    TensorType((4, 3, 8), DType.INT8, QuantSpec.per_channel([0.3, 0.02, 0.1], [1, -1, 0], axis=1)),
    TensorType((4, 3, 8), DType.INT16, QuantSpec.per_tensor(0.00037, 0, DType.INT16)),
    TensorType((4, 3, 8), DType.INT32, QuantSpec.per_channel(np.linspace(1e-5, 3e-5, 8), axis=2, dtype=DType.INT32)),
    TensorType((4, 3, 8), DType.INT32, QuantSpec.per_tensor(1e-4, -12345, DType.INT32)),
]


@pytest.mark.parametrize("in_type", DEQUANTIZE_CASES, ids=str)
def test_dequantize(in_type):
    rng = np.random.default_rng(49)
    info = np.iinfo(in_type.dtype.numpy)
    x = rng.integers(info.min, info.max, in_type.shape, endpoint=True).astype(in_type.dtype.numpy)
    assert_exact(unary(in_type, "dequantize", None), [x])


@pytest.mark.parametrize("granularity,scale_shape", [("per_tensor", (1, 1)), ("per_row", (5, 1))])
def test_dequantize_with_a_runtime_scale(granularity, scale_shape):
    rng = np.random.default_rng(50)
    q = QuantSpec(DType.INT32, tuple(np.linspace(0.01, 0.03, 6)), (0,) * 6, DType.INT32.min, DType.INT32.max,
                  axis=1, dynamic=granularity)
    b = GraphBuilder()
    x = b.input("x", TensorType((5, 6), DType.INT32, q))
    s = b.input("s", f32(scale_shape))
    g = b.build([b.op("dequantize", x, s)])
    assert_exact(g, [rng.integers(-10**6, 10**6, (5, 6)).astype(np.int32), rand(rng, scale_shape, 0.001, 0.1)])


def _quant(dtype):
    return QuantSpec.per_tensor(0.1, 0, dtype) if dtype.is_integer else None


CAST_CASES = [
    (DType.INT8, DType.FLOAT32), (DType.INT32, DType.FLOAT32), (DType.FLOAT32, DType.INT8),
    (DType.FLOAT32, DType.INT16), (DType.FLOAT32, DType.INT32),
]


@pytest.mark.parametrize("src,dst", CAST_CASES, ids=lambda d: d.value)
def test_cast_int_float(src, dst):
    if src is DType.FLOAT32:
        x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -128.5, 300.0, -300.0, 3e9, -3e9, 70000.4],
                     np.float32)
    else:
        x = np.array([-128, 127, 0, 5, -7], np.int8).astype(src.numpy)
        if src is DType.INT32:
            x = np.array([2**31 - 1, -2**31, 16777217, -16777219, 3], np.int32)
    assert_exact(unary(TensorType(x.shape, src, _quant(src)), "cast", dtype=dst, out=_quant(dst)), [x])


@pytest.mark.parametrize("src,dst", [(DType.INT32, DType.INT8), (DType.INT16, DType.INT8), (DType.INT8, DType.INT32),
                                     (DType.INT32, DType.INT16)], ids=lambda d: d.value)
def test_cast_int_int_saturates_in_the_int_profile(src, dst):
    x = np.array([-1000, -129, -128, 5, 127, 128, 100000 if src is DType.INT32 else 30000, -7]).astype(src.numpy)
    g = verify_graph(unary(TensorType(x.shape, src, _quant(src)), "cast", dtype=dst, out=_quant(dst)))
    p = BACKEND.lower(g, "tosa-1.0+int")
    (y,) = BACKEND.execute(p, [x])
    np.testing.assert_array_equal(y, run_graph(g, [x])[0])
    info = np.iinfo(dst.numpy)
    np.testing.assert_array_equal(y, np.clip(x.astype(np.int64), info.min, info.max))  # hand-derived


def test_signed_zeros_and_nans_of_maxima_and_minima_follow_tosa():
    """TOSA's apply_max_s keeps the first tap reaching the maximum (``acc >= v ? acc : v``) and
    apply_min_s the last (``acc < v ? acc : v``): which zero a zero result is depends on the
    operands' order. The reference defines exactly that, so the TOSA reference model agrees with
    it on inputs made of ±0.0, NaN and -inf (an IEEE 754 ``maximum`` would say +0.0 and differ)."""
    rng = np.random.default_rng(20261125)
    values = np.array([0.0, -0.0, -1.0, np.nan, -np.inf], np.float32)
    b = GraphBuilder("zeros")
    x, y = b.input("x", f32((1, 4, 4, 3))), b.input("y", f32((1, 4, 4, 3)))
    graph = b.build([b.op("minimum", x, y), b.op("maximum", x, y), b.op("maximum", y, x),
                     b.op("reduce_max", x, axis=1), b.op("reduce_min", x, axis=2),
                     b.op("max_pool2d", x, kernel=(2, 2), stride=(2, 2)),
                     b.op("max_pool2d", x, kernel=(3, 3), stride=(1, 1), pad=(1, 1, 1, 1))])
    zeros = 0
    for trial in range(6):
        inputs = [rng.choice(values[:2] if trial % 2 else values, (1, 4, 4, 3)), rng.choice(values[:2], (1, 4, 4, 3))]
        _, got, want = run_both(graph, inputs)
        for i, (g, w) in enumerate(zip(got, want)):
            same = ((g == w) & (np.signbit(g) == np.signbit(w))) | (np.isnan(g) & np.isnan(w))
            assert same.all(), f"output {i}, trial {trial}: {int((~same).sum())} element(s) differ"
            zeros += int(np.signbit(w[w == 0]).sum())
    assert zeros > 100   # the comparison saw many -0.0 results
