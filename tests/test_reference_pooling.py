"""Reference pooling, reductions and table lookups.

Integer average pooling is compared bit-exactly with the official TOSA reference
model (AVG_POOL2D); max pooling and reductions with PyTorch; float average
pooling with a direct float64 loop (padding not counted, as TOSA).
"""

import os

os.environ["TOSA_MODEL_NO_BACKTRACE"] = "1"

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import tosa_reference_model as trm
import tosa_serializer as ts

from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference import run_graph

I8, I16, I32, F32 = DType.INT8, DType.INT16, DType.INT32, DType.FLOAT32


def _run(kind, x, t, **attrs):
    b = GraphBuilder()
    (out,) = run_graph(b.build([b.op(kind, b.input("x", t), **attrs)]), [x])
    return out


def _tosa_avg_pool(x: np.ndarray, kernel, stride, pad, zp: int) -> np.ndarray:
    n, h, w, c = x.shape
    oh, ow = (h + pad[0] + pad[1] - kernel[0]) // stride[0] + 1, (w + pad[2] + pad[3] - kernel[1]) // stride[1] + 1
    dt = ts.DType.INT8 if x.dtype == np.int8 else ts.DType.INT16
    ser = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
    xv = ser.addPlaceholder(list(x.shape), dt, None)
    izp = ser.addConst([1], dt, np.array([zp], x.dtype), "izp")
    ozp = ser.addConst([1], dt, np.array([zp], x.dtype), "ozp")
    out = ser.addOutput([n, oh, ow, c], dt)
    attr = ts.TosaSerializerAttribute()
    attr.AvgPool2dAttribute(list(kernel), list(stride), list(pad), ts.DType.INT32)
    ser.addOperator(ts.Op.AVG_POOL2D, [xv.name, izp.name, ozp.name], [out.name], attr)
    outs, status = trm.run(ser.serialize(), [x])
    assert status == trm.GraphStatus.TOSA_VALID
    return outs[0]


# TOSA requires (size + pads - kernel) to be a multiple of the stride and pads below the kernel
POOL_CASES = [
    ((1, 7, 7, 3), (3, 3), (2, 2), (1, 1, 1, 1)),
    ((2, 6, 9, 4), (2, 3), (1, 2), (0, 1, 1, 1)),
    ((1, 7, 7, 16), (7, 7), (1, 1), (0, 0, 0, 0)),   # global average over 49 elements
    ((1, 5, 8, 2), (3, 4), (1, 2), (2, 0, 0, 2)),    # windows with only 1..2 real rows
    ((1, 9, 9, 5), (5, 5), (2, 2), (2, 2, 2, 2)),
]


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("shape,kernel,stride,pad", POOL_CASES)
def test_int_avg_pool2d_is_bit_exact_with_tosa(shape, kernel, stride, pad, dtype):
    rng = np.random.default_rng(sum(shape) + sum(kernel))
    info = np.iinfo(dtype)
    zp = int(rng.integers(-128, 128)) if dtype == np.int8 else 0  # TOSA: int16 zero point 0
    for _ in range(3):
        x = rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
        q = QuantSpec.per_tensor(0.1, zp, DType.from_numpy(dtype))
        got = _run("avg_pool2d", x, TensorType(shape, DType.from_numpy(dtype), q), kernel=kernel, stride=stride, pad=pad)
        assert got.dtype == dtype
        assert np.array_equal(got, _tosa_avg_pool(x, kernel, stride, pad, zp))


def test_int8_avg_pool2d_rounds_like_tosa_by_hand():
    # One 2x2 window per image, sums 2, -2, 6, -6. TOSA divides by 4 with reciprocal_scale(4):
    # multiplier ((2**30 + 1) << 2) // 4 = 2**30 + 1, shift 32, slightly more than 1/4, so
    #   (2 * (2**30 + 1) + 2**31) >> 32 = 1        (0.5 -> 1)
    #   (-2 * (2**30 + 1) + 2**31) >> 32 = -1      (-0.5 - tiny -> -1)
    #   (6 * (2**30 + 1) + 2**31) >> 32 = 2        (1.5 -> 2)
    #   (-6 * (2**30 + 1) + 2**31) >> 32 = -2      (-1.5 - tiny -> -2)
    x = np.array([[1, 1, 0, 0], [-1, -1, 0, 0], [3, 3, 0, 0], [-3, -3, 0, 0]], np.int8).reshape(4, 2, 2, 1)
    got = _run("avg_pool2d", x, TensorType(x.shape, I8, QuantSpec.per_tensor(0.1, 0)), kernel=(2, 2), stride=(2, 2))
    assert got.reshape(-1).tolist() == [1, -1, 2, -2]


def _float_avg_pool(x, kernel, stride, pad):
    n, h, w, c = x.shape
    oh, ow = (h + pad[0] + pad[1] - kernel[0]) // stride[0] + 1, (w + pad[2] + pad[3] - kernel[1]) // stride[1] + 1
    out = np.zeros((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            y0, x0 = i * stride[0] - pad[0], j * stride[1] - pad[2]
            ys = [y for y in range(y0, y0 + kernel[0]) if 0 <= y < h]
            xs = [v for v in range(x0, x0 + kernel[1]) if 0 <= v < w]
            out[:, i, j, :] = x[:, ys][:, :, xs].astype(np.float64).mean(axis=(1, 2))
    return out


@pytest.mark.parametrize("shape,kernel,stride,pad", POOL_CASES)
def test_float_avg_pool2d_does_not_count_padding(shape, kernel, stride, pad):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = _run("avg_pool2d", x, TensorType(shape, F32), kernel=kernel, stride=stride, pad=pad)
    np.testing.assert_allclose(got, _float_avg_pool(x, kernel, stride, pad), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int8, np.float32])
@pytest.mark.parametrize("shape,kernel,stride,pad", POOL_CASES + [((1, 6, 6, 2), (3, 3), (3, 3), (0, 2, 1, 0))])
def test_max_pool2d_matches_torch(shape, kernel, stride, pad, dtype):
    rng = np.random.default_rng(2)
    if dtype == np.int8:
        x = rng.integers(-128, 128, size=shape).astype(np.int8)
        x.reshape(-1)[:7] = -128   # windows of the minimum code: padding must never win
        t = TensorType(shape, I8, QuantSpec.per_tensor(0.1, -128))
    else:
        x = (rng.standard_normal(shape) * 1e3).astype(np.float32)
        t = TensorType(shape, F32)
    got = _run("max_pool2d", x, t, kernel=kernel, stride=stride, pad=pad)
    xt = F.pad(torch.from_numpy(x.astype(np.float64)).permute(0, 3, 1, 2), (pad[2], pad[3], pad[0], pad[1]),
               value=-np.inf)
    expected = F.max_pool2d(xt, kernel, stride).permute(0, 2, 3, 1).numpy()
    assert got.dtype == dtype and np.array_equal(got.astype(np.float64), expected)


# -- reductions -----------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_int32_reduce_sum(axis):
    rng = np.random.default_rng(axis)
    x = rng.integers(-(2**26), 2**26, size=(2, 5, 7, 3)).astype(np.int32)
    q = QuantSpec.per_channel([0.1, 0.2, 0.3], axis=3, dtype=I32) if axis != 3 else QuantSpec.per_tensor(0.1, 0, I32)
    got = _run("reduce_sum", x, TensorType(x.shape, I32, q), axis=axis)
    expected = torch.from_numpy(x).long().sum(dim=axis, keepdim=True).numpy()
    assert got.dtype == np.int32 and np.array_equal(got, expected)


def test_int32_reduce_sum_overflow_is_an_execution_error():
    from qlower.errors import ExecutionError

    x = np.full((1, 3), 2**30, np.int32)
    with pytest.raises(ExecutionError, match="reduce_sum producing %reduce_sum overflows int32"):
        _run("reduce_sum", x, TensorType(x.shape, I32, QuantSpec.per_tensor(0.1, 0, I32)), axis=1)


def test_float_reduce_sum():
    x = np.random.default_rng(3).standard_normal((4, 50)).astype(np.float32)
    got = _run("reduce_sum", x, TensorType(x.shape, F32), axis=1)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=1, keepdims=True), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("axis", [0, 2])
def test_reduce_max(axis):
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, size=(3, 4, 5)).astype(np.int8)
    got = _run("reduce_max", x, TensorType(x.shape, I8, QuantSpec.per_tensor(0.1, 7)), axis=axis)
    assert got.dtype == np.int8
    assert np.array_equal(got, torch.from_numpy(x).amax(dim=axis, keepdim=True).numpy())
    f = rng.standard_normal((3, 4, 5)).astype(np.float32)
    got = _run("reduce_max", f, TensorType(f.shape, F32), axis=axis)
    assert np.array_equal(got, torch.from_numpy(f).amax(dim=axis, keepdim=True).numpy())


# -- table -------------------------------------------------------------------------------------


def test_int8_table():
    codes = np.arange(-128, 128)
    table = (3 * (codes + 128) - 400).astype(np.int16)   # entry for code c: 3 * (c + 128) - 400
    x = np.random.default_rng(5).integers(-128, 128, size=(2, 3, 50)).astype(np.int8)
    x[0, 0, :2] = [-128, 127]
    out_q = QuantSpec.per_tensor(0.01, 0, I16)
    got = _run("table", x, TensorType(x.shape, I8, QuantSpec.per_tensor(0.1, 0)), table=table, offset=128, out=out_q)
    assert got.dtype == np.int16
    assert np.array_equal(got.astype(np.int64), 3 * (x.astype(np.int64) + 128) - 400)
    assert got[0, 0, :2].tolist() == [-400, 365]


def test_table_of_a_narrow_range_input():
    # codes in [0, 15] with offset 0: a 16-entry table (e.g. a 4-bit activation)
    table = np.array([v * v - 100 for v in range(16)], np.int8)
    x = np.array([[0, 1, 5, 15]], np.int8)
    q = QuantSpec.per_tensor(0.5, 0, qmin=0, qmax=15)
    got = _run("table", x, TensorType(x.shape, I8, q), table=table, offset=0, out=QuantSpec.per_tensor(0.1, 0))
    assert got.tolist() == [[-100, -99, -75, 125]]
