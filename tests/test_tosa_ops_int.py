"""TOSA backend, integer ops: each op is lowered, validated with tosa-opt, run on the official
TOSA reference model and compared with the reference interpreter. Integer results must be
bit-exact (0 codes difference); the op counts show which TOSA form was exercised."""

import numpy as np
import pytest

from qlower.backends.tosa import TosaBackend
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph

BACKEND = TosaBackend()
INT, FP = "tosa-1.0+int", "tosa-1.0+int+fp"


def act(shape, scale=0.05, zp=0, dtype=DType.INT8, qmin=None, qmax=None):
    return TensorType(shape, dtype, QuantSpec.per_tensor(scale, zp, dtype, qmin, qmax))


def codes(rng, shape, dtype=np.int8, lo=None, hi=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dtype)


def assert_exact(graph, inputs, target=INT):
    """Lower + validate + run on the TOSA reference model; compare with the reference interpreter."""
    graph = verify_graph(graph)
    payload = BACKEND.lower(graph, target)
    got = BACKEND.execute(payload, inputs)
    want = run_graph(graph, inputs)
    assert len(got) == len(want)
    for g, w, t in zip(got, want, payload.output_types):
        assert g.dtype == w.dtype == t.dtype.numpy and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    return payload


def weights(rng, shape, channels=None, zp=0):
    data = codes(rng, shape, lo=-127)
    if channels is None:
        return data, QuantSpec.per_tensor(0.02, zp)
    return data, QuantSpec.per_channel(rng.uniform(0.005, 0.03, channels), (zp,) * channels)


CONV_CASES = [
    # (input NHWC, weight OHWI, stride, dilation, pad, bias, per-channel, x_zp, w_zp)
    ((1, 8, 8, 5), (6, 3, 3, 5), (1, 1), (1, 1), (1, 1, 1, 1), True, True, -7, 0),
    ((2, 9, 10, 3), (4, 3, 3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False, True, 12, 0),   # odd sizes: pad cut
    ((1, 8, 8, 2), (3, 3, 3, 2), (3, 3), (1, 1), (0, 0, 0, 0), True, False, 0, 0),     # input rows cropped
    ((1, 11, 9, 4), (5, 5, 3, 4), (3, 2), (2, 1), (0, 2, 2, 0), False, False, -128, 5),  # dilation, w zp
    ((1, 6, 6, 16), (8, 1, 1, 16), (1, 1), (1, 1), (0, 0, 0, 0), True, True, 127, 0),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(case):
    xs, ws, stride, dil, pad, has_bias, per_channel, x_zp, w_zp = case
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", act(xs, 0.05, x_zp))
    wd, wq = weights(rng, ws, ws[0] if per_channel else None, w_zp)
    w = b.constant(wd, wq, name="w")
    bias = None
    if has_bias:
        acc = QuantSpec.accumulator(x.quant, wq, None).with_axis(0 if per_channel else None)
        bias = b.constant(rng.integers(-5000, 5000, ws[0]).astype(np.int32), acc, name="b")
    y = b.op("conv2d", x, w, bias, stride=stride, dilation=dil, pad=pad)
    p = assert_exact(b.build([y]), [codes(rng, xs)])
    assert p.meta["tosa_ops"]["CONV2D"] == 1


@pytest.mark.parametrize("mult", [1, 2])
def test_depthwise_conv2d(mult):
    rng = np.random.default_rng(2)
    c = 6
    b = GraphBuilder()
    x = b.input("x", act((1, 9, 9, c), 0.1, -3))
    wd, wq = weights(rng, (c * mult, 3, 3, 1), c * mult)
    y = b.op("conv2d", x, b.constant(wd, wq), None, stride=(2, 2), pad=(1, 1, 1, 1), groups=c)
    p = assert_exact(b.build([y]), [codes(rng, (1, 9, 9, c))])
    assert p.meta["tosa_ops"] == {"DEPTHWISE_CONV2D": 1}


def test_grouped_conv2d_is_one_conv_per_group():
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", act((1, 7, 7, 6), 0.1, 4))
    wd, wq = weights(rng, (9, 3, 3, 2), 9)
    acc = QuantSpec.accumulator(x.quant, wq, None).with_axis(0)
    bias = b.constant(rng.integers(-900, 900, 9).astype(np.int32), acc)
    y = b.op("conv2d", x, b.constant(wd, wq), bias, pad=(1, 1, 1, 1), groups=3)
    p = assert_exact(b.build([y]), [codes(rng, (1, 7, 7, 6))])
    assert p.meta["tosa_ops"]["CONV2D"] == 3 and p.meta["tosa_ops"]["CONCAT"] == 1


def test_conv2d_with_runtime_weights():
    """Weights that are graph inputs get RESHAPE/TRANSPOSE operators instead of folded constants."""
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    x = b.input("x", act((1, 5, 5, 3), 0.1, 2))
    w = b.input("w", TensorType((4, 3, 3, 3), DType.INT8, QuantSpec.per_tensor(0.02, -1)))
    dw = b.input("dw", TensorType((6, 3, 3, 1), DType.INT8, QuantSpec.per_tensor(0.02, 3)))
    y = b.op("conv2d", x, w, None)
    d = b.op("conv2d", x, dw, None, pad=(1, 1, 1, 1), groups=3)
    p = assert_exact(b.build([y, d]), [codes(rng, (1, 5, 5, 3)), codes(rng, (4, 3, 3, 3)), codes(rng, (6, 3, 3, 1))])
    assert p.meta["tosa_ops"]["TRANSPOSE"] == 1 and p.meta["tosa_ops"]["DEPTHWISE_CONV2D"] == 1


@pytest.mark.parametrize("x_shape", [(3, 10), (2, 4, 10), (10,)])
@pytest.mark.parametrize("has_bias", [True, False])
def test_fully_connected(x_shape, has_bias):
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input("x", act(x_shape, 0.1, -20))
    wd, wq = weights(rng, (7, 10), 7)
    bias = None
    if has_bias:
        bias = b.constant(rng.integers(-3000, 3000, 7).astype(np.int32),
                          QuantSpec.accumulator(x.quant, wq, None).with_axis(0))
    y = b.op("fully_connected", x, b.constant(wd, wq), bias)
    assert_exact(b.build([y]), [codes(rng, x_shape)])


@pytest.mark.parametrize("a_shape,b_shape", [((4, 6), (6, 3)), ((2, 4, 6), (2, 6, 3)), ((2, 3, 4, 5), (2, 3, 5, 2))])
def test_matmul(a_shape, b_shape):
    rng = np.random.default_rng(6)
    b = GraphBuilder()
    a = b.input("a", act(a_shape, 0.1, 9))
    c = b.input("b", act(b_shape, 0.2, -4))
    y = b.op("matmul", a, c)
    k = b.op("matmul", a, b.constant(codes(rng, b_shape), QuantSpec.per_tensor(0.1, 3)))
    p = assert_exact(b.build([y, k]), [codes(rng, a_shape), codes(rng, b_shape)])
    assert p.meta["tosa_ops"]["MATMUL"] == 2


def _rescale_graph(in_type, out, rounding="single"):
    b = GraphBuilder()
    x = b.input("x", in_type)
    return b.build([b.op("rescale", x, out=out, rounding=rounding)])


ACC = TensorType((2, 3, 8), DType.INT32, QuantSpec.per_tensor(0.0004, 0, DType.INT32))
ACC_PC = TensorType((2, 3, 8), DType.INT32,
                    QuantSpec(DType.INT32, tuple(np.linspace(1e-4, 9e-4, 8)), (0,) * 8, DType.INT32.min,
                              DType.INT32.max, axis=2))
RESCALE_CASES = [
    ("i32->i8", ACC, QuantSpec.per_tensor(0.05, 3), {"RESCALE": 1}),
    ("i32->i8 per-channel", ACC_PC, QuantSpec.per_tensor(0.05, -128), {"RESCALE": 1}),
    ("i32->i8 relu clamp", ACC_PC, QuantSpec.per_tensor(0.05, -100, qmin=-100), {"RESCALE": 1, "CLAMP": 1}),
    ("i8->i8", act((4, 16), 0.05, 17), QuantSpec.per_tensor(0.031, -9), {"RESCALE": 1}),
    ("i8->i32", act((4, 16), 0.05, -17), QuantSpec.per_tensor(0.05 / 2**20, 0, DType.INT32), {"RESCALE": 1}),
    ("i8->i16", act((4, 16), 0.05, 7), QuantSpec.per_tensor(0.0007, 0, DType.INT16), {"RESCALE": 1}),
    ("i8->i16 zp", act((4, 16), 0.05, 7), QuantSpec.per_tensor(0.0007, 300, DType.INT16), None),
    ("i16 zp->i8", act((4, 16), 0.001, -40, DType.INT16), QuantSpec.per_tensor(0.1, 5), None),
    ("i32->i32 narrow", ACC, QuantSpec.per_tensor(0.0001, 0, DType.INT32, -5000, 7000), None),
]


@pytest.mark.parametrize("name,in_type,out,ops", RESCALE_CASES, ids=[c[0] for c in RESCALE_CASES])
def test_rescale(name, in_type, out, ops):
    rng = np.random.default_rng(7)
    np_dtype = in_type.dtype.numpy
    x = codes(rng, in_type.shape, np_dtype, -300000, 300000) if np_dtype == np.int32 else codes(rng, in_type.shape,
                                                                                                 np_dtype)
    p = assert_exact(_rescale_graph(in_type, out), [x])
    if ops is not None:
        assert p.meta["tosa_ops"] == ops


@pytest.mark.parametrize("rounding", ["single", "double"])
def test_rescale_rounding_ties(rounding):
    """x / 32 with multiplier 2**30, shift 35. Single rounding adds 2**34 (ties half up); double
    rounding adds a further +-2**30 (ties away from zero, and 15/32 double-rounds to 1)."""
    in_type = TensorType((8,), DType.INT32, QuantSpec.per_tensor(1.0, 0, DType.INT32))
    g = _rescale_graph(in_type, QuantSpec.per_tensor(32.0, 0), rounding)
    x = np.array([16, -16, 48, -48, 15, -15, 17, -17], np.int32)
    p = assert_exact(g, [x])
    (y,) = BACKEND.execute(p, [x])
    expected = [1, 0, 2, -1, 0, 0, 1, -1] if rounding == "single" else [1, -1, 2, -2, 1, 0, 1, -1]
    assert y.tolist() == expected
    assert p.meta["extensions"] == (["doubleround"] if rounding == "double" else [])


@pytest.mark.parametrize("dtype,lo,hi,tosa", [(DType.INT8, -20, 90, "CLAMP"), (DType.INT16, -900, 3000, "CLAMP"),
                                              (DType.INT32, -70000, 123456, "MAXIMUM")])
def test_clamp(dtype, lo, hi, tosa):
    rng = np.random.default_rng(8)
    b = GraphBuilder()
    x = b.input("x", act((3, 50), 0.1, 0, dtype))
    g = b.build([b.op("clamp", x, min=lo, max=hi)])
    xs = codes(rng, (3, 50), dtype.numpy, -200000, 200000) if dtype is DType.INT32 else codes(rng, (3, 50),
                                                                                              dtype.numpy)
    p = assert_exact(g, [xs])
    assert tosa in p.meta["tosa_ops"]
    assert p.meta["extensions"] == (["int16"] if dtype is DType.INT16 else [])


def _i32(scale=0.001, zp=0):
    return QuantSpec.per_tensor(scale, zp, DType.INT32)


@pytest.mark.parametrize("kind", ["add", "sub"])
def test_add_sub_broadcast(kind):
    rng = np.random.default_rng(9)
    b = GraphBuilder()
    a = b.input("a", TensorType((2, 3, 4), DType.INT32, _i32()))
    c = b.input("c", TensorType((1, 3, 1), DType.INT32, _i32()))
    k = b.constant(rng.integers(-1000, 1000, (1, 1, 4)).astype(np.int32), _i32())
    y = b.op(kind, b.op(kind, a, c), k)
    big = 1 << 28
    assert_exact(b.build([y]), [codes(rng, (2, 3, 4), np.int32, -big, big), codes(rng, (1, 3, 1), np.int32, -big, big)])


@pytest.mark.parametrize("shift", [0, 7])
def test_mul_with_shift_and_per_channel_constant(shift):
    rng = np.random.default_rng(10)
    b = GraphBuilder()
    a = b.input("a", TensorType((1, 4, 4, 3), DType.INT32, _i32()))
    c = b.constant(np.array([3, -200, 77], np.int32).reshape(1, 1, 1, 3),
                   QuantSpec.per_channel([0.1, 0.2, 0.3], axis=3, dtype=DType.INT32))
    y = b.op("mul", a, c, shift=shift)
    assert_exact(b.build([y]), [codes(rng, (1, 4, 4, 3), np.int32, -100000, 100000)])


def test_intdiv_truncates_toward_zero():
    b = GraphBuilder()
    a = b.input("a", TensorType((8,), DType.INT32, _i32()))
    c = b.input("c", TensorType((8,), DType.INT32, _i32()))
    y = b.op("intdiv", a, c)
    xa = np.array([7, -7, 7, -7, 1000, -1, 0, 2**31 - 1], np.int32)
    xc = np.array([2, 2, -2, -2, 3, 5, -9, 7], np.int32)
    p = assert_exact(b.build([y]), [xa, xc])
    (got,) = BACKEND.execute(p, [xa, xc])
    assert got[:4].tolist() == [3, -3, -3, 3]


def test_integer_ops_in_the_fp_profile_too():
    rng = np.random.default_rng(11)
    b = GraphBuilder()
    x = b.input("x", act((1, 6, 6, 4), 0.1, 5))
    wd, wq = weights(rng, (4, 3, 3, 4), 4)
    y = b.op("rescale", b.op("conv2d", x, b.constant(wd, wq), None, pad=(1, 1, 1, 1)), out=QuantSpec.per_tensor(0.2, 1))
    p = assert_exact(b.build([y]), [codes(rng, (1, 6, 6, 4))], target=FP)
    assert p.meta["profile"] == "TOSA-1.0+INT+FP"
