"""Reference conv2d / fully_connected / matmul against PyTorch float64.

After zero-point subtraction the operands are small integers, so a float64
convolution computes the integer accumulator exactly (every partial sum is an
integer below 2**53): integer results are compared exactly.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference import run_graph

I8, I16, I32, F32 = DType.INT8, DType.INT16, DType.INT32, DType.FLOAT32


def _codes(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)


def _torch_conv(x_nhwc, w_ohwi, stride, dilation, pad, groups):
    """float64 conv of centered NHWC/OHWI arrays with zero padding (t, b, l, r); NHWC result."""
    x = torch.from_numpy(x_nhwc.astype(np.float64)).permute(0, 3, 1, 2)
    w = torch.from_numpy(w_ohwi.astype(np.float64)).permute(0, 3, 1, 2)
    x = F.pad(x, (pad[2], pad[3], pad[0], pad[1]))
    return F.conv2d(x, w, stride=stride, dilation=dilation, groups=groups).permute(0, 2, 3, 1).numpy()


def _run_conv(x, w, x_q, w_q, bias, **attrs):
    b = GraphBuilder()
    xv = b.input("x", TensorType(x.shape, DType.from_numpy(x.dtype), x_q))
    wv = b.constant(w, w_q, name="w")
    bv = None
    if bias is not None:
        acc_q = QuantSpec.accumulator(x_q, w_q, axis=0 if w_q.is_per_channel else None)
        bv = b.constant(bias, acc_q, name="bias")
    acc = b.op("conv2d", xv, wv, bv, **attrs)
    (out,) = run_graph(b.build([acc]), [x])
    assert out.dtype == np.int32 and out.shape == acc.shape
    return out


CONV_CASES = [  # name, x shape, weight shape, attrs
    ("plain", (2, 6, 7, 3), (4, 3, 3, 3), dict()),
    ("stride_dilation_asym_pad", (1, 11, 9, 4), (5, 3, 2, 4), dict(stride=(2, 3), dilation=(2, 1), pad=(1, 2, 0, 3))),
    ("groups", (1, 7, 7, 6), (9, 3, 3, 2), dict(groups=3, pad=(1, 1, 1, 1))),
    ("depthwise", (1, 8, 8, 5), (5, 3, 3, 1), dict(groups=5, pad=(1, 1, 1, 1), stride=(2, 2))),
    ("depthwise_multiplier", (1, 6, 5, 3), (6, 3, 3, 1), dict(groups=3, pad=(0, 2, 1, 0))),
    ("one_input_channel", (1, 5, 5, 1), (4, 2, 2, 1), dict()),
    ("pointwise", (1, 4, 4, 16), (8, 1, 1, 16), dict()),
]


@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("name,xs,ws,attrs", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_int8_conv2d_is_exact(name, xs, ws, attrs, per_channel, with_bias):
    rng = np.random.default_rng(len(name) * 7 + per_channel + 2 * with_bias)
    x, w = _codes(rng, xs, np.int8), _codes(rng, ws, np.int8)
    x_q = QuantSpec.per_tensor(0.02, int(rng.integers(-128, 128)))
    o = ws[0]
    if per_channel:  # per-channel weights, with their own zero points too
        w_zp = rng.integers(-10, 10, size=o)
        w_q = QuantSpec.per_channel(rng.uniform(0.001, 0.01, size=o), w_zp, axis=0)
    else:
        w_zp = np.array([int(rng.integers(-10, 10))])
        w_q = QuantSpec.per_tensor(0.005, int(w_zp[0]))
    bias = rng.integers(-(2**20), 2**20, size=o).astype(np.int32) if with_bias else None
    got = _run_conv(x, w, x_q, w_q, bias, **attrs)
    full = dict(stride=(1, 1), dilation=(1, 1), pad=(0, 0, 0, 0), groups=1) | attrs
    xc = x.astype(np.int64) - x_q.zero_point[0]
    wc = w.astype(np.int64) - w_zp.reshape(-1, 1, 1, 1)
    expected = _torch_conv(xc, wc, full["stride"], full["dilation"], full["pad"], full["groups"])
    expected = expected.astype(np.int64) + (0 if bias is None else bias.astype(np.int64))
    assert np.array_equal(got.astype(np.int64), expected)


def test_int16_conv2d_is_exact():
    rng = np.random.default_rng(3)
    x, w = _codes(rng, (1, 5, 5, 8), np.int16) // 4, _codes(rng, (3, 3, 3, 8), np.int8)
    x_q = QuantSpec.per_tensor(1e-4, 0, I16)
    got = _run_conv(x, w, x_q, QuantSpec.per_tensor(0.01), None, pad=(1, 1, 1, 1))
    expected = _torch_conv(x.astype(np.int64), w.astype(np.int64), (1, 1), (1, 1), (1, 1, 1, 1), 1)
    assert np.array_equal(got.astype(np.int64), expected.astype(np.int64))


def test_conv2d_pads_with_the_input_zero_point():
    # x is all at its zero point except one code; padding with the zero point adds nothing
    x = np.full((1, 3, 3, 1), -5, np.int8)
    x[0, 0, 0, 0] = -3                    # centered value 2
    w = np.ones((1, 3, 3, 1), np.int8) * 2
    got = _run_conv(x, w, QuantSpec.per_tensor(0.1, -5), QuantSpec.per_tensor(0.1), None, pad=(1, 1, 1, 1))
    expected = np.zeros((3, 3), np.int64)
    expected[:2, :2] = 4                  # the 4 windows that contain (0, 0): 2 * 2
    assert np.array_equal(got[0, :, :, 0], expected)


def test_float_conv2d_matches_torch():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 9, 8, 4)).astype(np.float32)
    w = rng.standard_normal((6, 3, 3, 2)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    b = GraphBuilder()
    y = b.op("conv2d", b.input("x", TensorType(x.shape, F32)), b.constant(w, name="w"), b.constant(bias, name="b"),
             groups=2, stride=(2, 1), dilation=(1, 2), pad=(1, 0, 2, 1))
    (out,) = run_graph(b.build([y]), [x])
    expected = _torch_conv(x, w, (2, 1), (1, 2), (1, 0, 2, 1), 2) + bias
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_conv2d_accumulator_overflow_is_an_execution_error():
    # 32767 * 127 * (3 * 3 * 64) ≈ 2.4e9 > 2**31 - 1
    x = np.full((1, 3, 3, 64), 32767, np.int16)
    w = np.full((1, 3, 3, 64), 127, np.int8)
    with pytest.raises(ExecutionError, match=r"conv2d producing %conv2d overflows int32"):
        _run_conv(x, w, QuantSpec.per_tensor(1e-4, 0, I16), QuantSpec.per_tensor(0.01), None)


# -- fully_connected / matmul --------------------------------------------------------------


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fully_connected_is_exact(per_channel, with_bias):
    rng = np.random.default_rng(10 + per_channel + 2 * with_bias)
    x, w = _codes(rng, (2, 3, 40), np.int8), _codes(rng, (7, 40), np.int8)
    x_q = QuantSpec.per_tensor(0.1, 17)
    w_q = QuantSpec.per_channel(rng.uniform(0.01, 0.1, 7), axis=0) if per_channel else QuantSpec.per_tensor(0.02)
    b = GraphBuilder()
    bias = rng.integers(-5000, 5000, size=7).astype(np.int32)
    bv = b.constant(bias, QuantSpec.accumulator(x_q, w_q, 0 if per_channel else None)) if with_bias else None
    acc = b.op("fully_connected", b.input("x", TensorType(x.shape, I8, x_q)), b.constant(w, w_q), bv)
    (out,) = run_graph(b.build([acc]), [x])
    expected = torch.from_numpy(x.astype(np.float64) - 17) @ torch.from_numpy(w.astype(np.float64)).T
    expected = expected.numpy().astype(np.int64) + (bias if with_bias else 0)
    assert out.dtype == np.int32 and np.array_equal(out.astype(np.int64), expected)


def test_fully_connected_overflow_is_an_execution_error():
    x = np.full((1, 300000), 127, np.int8)
    w = np.full((1, 300000), 127, np.int8)  # 127 * 127 * 3e5 ≈ 4.8e9
    b = GraphBuilder()
    acc = b.op("fully_connected", b.input("x", TensorType(x.shape, I8, QuantSpec.per_tensor(0.1))),
               b.constant(w, QuantSpec.per_tensor(0.1)), None, name="fc")
    with pytest.raises(ExecutionError, match="fully_connected producing %fc overflows int32"):
        run_graph(b.build([acc]), [x])


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.int8, np.int8), (np.int16, np.int8), (np.int16, np.int16)])
def test_matmul_is_exact(a_dtype, b_dtype):
    rng = np.random.default_rng(20)
    a, c = _codes(rng, (3, 4, 24), a_dtype), _codes(rng, (3, 24, 5), b_dtype)
    # TOSA keeps int16 zero points at 0; keep products' sum inside int32 for int16 x int16
    a_zp, c_zp = (-7 if a_dtype == np.int8 else 0), (9 if b_dtype == np.int8 else 0)
    if a_dtype == np.int16 and b_dtype == np.int16:
        a, c = a // 64, c // 64
    b = GraphBuilder()
    av = b.input("a", TensorType(a.shape, DType.from_numpy(a_dtype), QuantSpec.per_tensor(0.1, a_zp, DType.from_numpy(a_dtype))))
    cv = b.input("c", TensorType(c.shape, DType.from_numpy(b_dtype), QuantSpec.per_tensor(0.2, c_zp, DType.from_numpy(b_dtype))))
    (out,) = run_graph(b.build([b.op("matmul", av, cv)]), [a, c])
    expected = torch.from_numpy(a.astype(np.float64) - a_zp) @ torch.from_numpy(c.astype(np.float64) - c_zp)
    assert out.dtype == np.int32 and np.array_equal(out.astype(np.int64), expected.numpy().astype(np.int64))


def test_float_matmul_and_fully_connected_match_torch():
    rng = np.random.default_rng(21)
    a = rng.standard_normal((2, 3, 8)).astype(np.float32)
    c = rng.standard_normal((2, 8, 4)).astype(np.float32)
    w = rng.standard_normal((5, 8)).astype(np.float32)
    b = GraphBuilder()
    av, cv = b.input("a", TensorType(a.shape, F32)), b.input("c", TensorType(c.shape, F32))
    mm = b.op("matmul", av, cv)
    fc = b.op("fully_connected", av, b.constant(w), None)
    out_mm, out_fc = run_graph(b.build([mm, fc]), [a, c])
    np.testing.assert_allclose(out_mm, (torch.from_numpy(a).double() @ torch.from_numpy(c).double()).numpy(),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out_fc, a.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-6, atol=1e-6)


def test_matmul_whose_float64_sum_cannot_be_proven_exact_is_refused():
    # int16 x int16 with zero points: |code - zp| up to 65535; K * 65535**2 >= 2**53 for this K
    k = 2**21 + 2**11
    q = QuantSpec.per_tensor(0.1, -32768, I16)
    b = GraphBuilder()
    av = b.input("a", TensorType((1, 1, k), I16, q))
    cv = b.input("c", TensorType((1, k, 1), I16, q))
    g = b.build([b.op("matmul", av, cv, name="mm")])
    with pytest.raises(ExecutionError, match="matmul producing %mm: a sum of 2099200 products .* can't be proven exact"):
        run_graph(g, [np.zeros((1, 1, k), np.int16), np.zeros((1, k, 1), np.int16)])
