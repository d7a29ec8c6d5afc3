"""Reference quantize / dequantize / dynamic_quantize / cast against PyTorch.

qlower's quantize follows PyTorch's decomposed quantization ops (the ones PT2E
graphs contain), so it is compared with ``torch.ops.quantized_decomposed``
exactly. ``torch.quantize_per_tensor`` (ATen's quantizer) computes its float32
product differently: it agrees exactly when 1/scale is exact in float32 and
within one code otherwise.
"""

import numpy as np
import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

from qlower.errors import InputError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference import run_graph

I8, I16, I32, F32 = DType.INT8, DType.INT16, DType.INT32, DType.FLOAT32
QD = torch.ops.quantized_decomposed
_TORCH_DTYPE = {I8: torch.int8, I16: torch.int16, DType.UINT8: torch.uint8}


def _quantize(x: np.ndarray, q: QuantSpec) -> np.ndarray:
    b = GraphBuilder()
    (out,) = run_graph(b.build([b.op("quantize", b.input("x", TensorType(x.shape, F32)), out=q)]), [x])
    return out


def _dequantize(codes: np.ndarray, q: QuantSpec) -> np.ndarray:
    b = GraphBuilder()
    x = b.input("x", TensorType(codes.shape, q.dtype, q))
    (out,) = run_graph(b.build([b.op("dequantize", x, None)]), [codes])
    return out


@pytest.mark.parametrize("dtype,qrange", [(I8, None), (I8, (-127, 127)), (DType.UINT8, None), (I16, None)])
def test_quantize_per_tensor_equals_quantized_decomposed(dtype, qrange):
    rng = np.random.default_rng(0)
    qmin, qmax = qrange or (dtype.min, dtype.max)
    for _ in range(50):
        scale = float(np.float32(np.exp2(rng.uniform(-14, 1))))
        zp = int(rng.integers(qmin, qmax + 1)) if dtype is not I16 else 0
        x = (rng.standard_normal(2000) * scale * (qmax - qmin) / 4).astype(np.float32)
        got = _quantize(x, QuantSpec.per_tensor(scale, zp, dtype, qmin, qmax))
        expected = QD.quantize_per_tensor(torch.from_numpy(x), scale, zp, qmin, qmax, _TORCH_DTYPE[dtype]).numpy()
        assert got.dtype == dtype.numpy and np.array_equal(got, expected)


def test_quantize_rounds_half_to_even():
    x = np.array([0.25, 0.75, 1.25, -0.25, -0.75, 100.0, -100.0], np.float32)
    # x / 0.5 = 0.5, 1.5, 2.5, -0.5, -1.5 -> 0, 2, 2, -0, -2; then + zp 3; then clamp
    got = _quantize(x, QuantSpec.per_tensor(0.5, 3))
    assert got.tolist() == [3, 5, 5, 3, 1, 127, -128]


def test_quantize_per_channel_equals_quantized_decomposed():
    rng = np.random.default_rng(1)
    for axis in (0, 1, 3):
        shape = (4, 3, 2, 5)
        c = shape[axis]
        scales = np.exp2(rng.uniform(-10, 0, size=c)).astype(np.float32)  # observers give float32 scales
        zps = rng.integers(-20, 20, size=c)
        x = (rng.standard_normal(shape) * 40 * scales.reshape([-1 if i == axis else 1 for i in range(4)]))
        x = x.astype(np.float32)
        got = _quantize(x, QuantSpec.per_channel(scales, zps, axis=axis))
        expected = QD.quantize_per_channel(torch.from_numpy(x), torch.from_numpy(scales), torch.from_numpy(zps),
                                           axis, -128, 127, torch.int8).numpy()
        assert np.array_equal(got, expected)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_quantize_against_torch_quantize_per_tensor():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(20000) * 3).astype(np.float32)
    for scale in (2.0**-5, 0.25, 1.0):  # 1/scale exact: the two agree exactly
        got = _quantize(x, QuantSpec.per_tensor(scale, 3))
        assert np.array_equal(got, torch.quantize_per_tensor(torch.from_numpy(x), scale, 3, torch.qint8).int_repr().numpy())
    for _ in range(20):
        scale = float(np.float32(np.exp2(rng.uniform(-7, -3))))
        got = _quantize(x, QuantSpec.per_tensor(scale, -4)).astype(np.int64)
        ref = torch.quantize_per_tensor(torch.from_numpy(x), scale, -4, torch.qint8).int_repr().numpy()
        assert np.abs(got - ref).max() <= 1


def test_dequantize_equals_quantized_decomposed():
    rng = np.random.default_rng(3)
    codes = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    for _ in range(20):
        scale, zp = float(np.exp2(rng.uniform(-12, 2))), int(rng.integers(-128, 128))
        got = _dequantize(codes, QuantSpec.per_tensor(scale, zp))
        expected = QD.dequantize_per_tensor(torch.from_numpy(codes), scale, zp, -128, 127, torch.int8).numpy()
        assert got.dtype == np.float32 and np.array_equal(got, expected)
    scales = np.exp2(rng.uniform(-10, 0, size=16)).astype(np.float32)
    zps = rng.integers(-5, 5, size=16)
    got = _dequantize(codes, QuantSpec.per_channel(scales, zps, axis=1))
    expected = QD.dequantize_per_channel(torch.from_numpy(codes), torch.from_numpy(scales), torch.from_numpy(zps),
                                         1, -128, 127, torch.int8).numpy()
    assert np.array_equal(got, expected)


def test_quantize_dequantize_round_trip_is_within_half_a_step():
    rng = np.random.default_rng(4)
    x = rng.uniform(-5, 5, size=5000).astype(np.float32)
    q = QuantSpec.per_tensor(10 / 255, 0)
    err = np.abs(_dequantize(_quantize(x, q), q).astype(np.float64) - x)
    assert err.max() <= q.scale[0] / 2 * (1 + 1e-6)


@pytest.mark.parametrize("granularity", ["per_tensor", "per_row"])
def test_dynamic_quantize_and_dequantize_with_runtime_scale(granularity):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 4, 32)) * np.array([1e-3, 1.0, 50.0]).reshape(3, 1, 1)).astype(np.float32)
    x[2, 3] = 0.0  # an all-zero row: the scale falls back to float32 eps
    b = GraphBuilder()
    xv = b.input("x", TensorType(x.shape, F32))
    codes, scale = b.op("dynamic_quantize", xv, granularity=granularity)
    deq = b.op("dequantize", codes, scale)
    got_codes, got_scale, got_deq = run_graph(b.build([codes, scale, deq]), [x])

    xt = torch.from_numpy(x)
    amax = xt.abs().amax() if granularity == "per_tensor" else xt.abs().amax(dim=-1, keepdim=True)
    scale_t = torch.clamp(amax / 127.0, min=torch.finfo(torch.float32).eps).reshape(got_scale.shape)
    codes_t = torch.clamp(torch.round(xt / scale_t), -127, 127).to(torch.int8)
    assert got_scale.dtype == np.float32 and np.array_equal(got_scale, scale_t.numpy())
    assert got_codes.dtype == np.int8 and np.array_equal(got_codes, codes_t.numpy())
    assert np.array_equal(got_deq, (codes_t.float() * scale_t).numpy())
    assert np.all(np.abs(got_deq - x) <= got_scale / 2 * (1 + 1e-6))


def test_dequantize_of_a_dynamic_accumulator_multiplies_static_and_runtime_scales():
    b = GraphBuilder()
    acc_q = QuantSpec(I32, (0.5, 0.25), (0, 0), I32.min, I32.max, axis=1, dynamic="per_row")
    acc = b.input("acc", TensorType((2, 2), I32, acc_q))
    s = b.input("s", TensorType((2, 1), F32))
    g = b.build([b.op("dequantize", acc, s)])
    (out,) = run_graph(g, [np.array([[4, 8], [-6, 100]], np.int32), np.array([[0.5], [2.0]], np.float32)])
    assert out.tolist() == [[4 * 0.5 * 0.5, 8 * 0.25 * 0.5], [-6 * 0.5 * 2.0, 100 * 0.25 * 2.0]]


def test_cast():
    b = GraphBuilder()
    codes = b.input("c", TensorType((5,), I8, QuantSpec.per_tensor(0.1, 3)))
    f = b.input("f", TensorType((8,), F32))
    as_float = b.op("cast", codes, dtype=F32)
    as_int8 = b.op("cast", f, dtype=I8, out=QuantSpec.per_tensor(1.0, 0))
    as_int32 = b.op("cast", f, dtype=I32, out=QuantSpec.per_tensor(1.0, 0, I32))
    c = np.array([-128, -1, 0, 3, 127], np.int8)
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 300.0, -1e10, 1e10], np.float32)
    got_f, got_8, got_32 = run_graph(b.build([as_float, as_int8, as_int32]), [c, x])
    assert got_f.dtype == np.float32 and got_f.tolist() == [-128.0, -1.0, 0.0, 3.0, 127.0]  # the code's value
    xt = torch.from_numpy(x).double()
    assert np.array_equal(got_8, torch.clamp(torch.round(xt), -128, 127).numpy())  # half to even, saturating
    assert np.array_equal(got_32, torch.clamp(torch.round(xt), -(2**31), 2**31 - 1).numpy())
    assert got_8.tolist() == [0, 2, 2, 0, -2, 127, -128, 127]
    assert got_32.tolist() == [0, 2, 2, 0, -2, 300, -(2**31), 2**31 - 1]


def test_quantize_to_int32_saturates_at_the_int32_bounds():
    x = np.array([1e10, -1e10, 7.0], np.float32)
    assert _quantize(x, QuantSpec.per_tensor(1.0, 0, I32)).tolist() == [2**31 - 1, -(2**31), 7]


def test_a_table_reads_the_nearest_entry_for_codes_outside_the_declared_range():
    """A table over the narrow range [-127, 127] fed -128 would index entry -1 (the last one) if
    it wrapped; the IR says it reads the nearest entry, as the TOSA lowering's 256-entry table does."""
    narrow = QuantSpec.per_tensor(0.1, 0, DType.INT8, qmin=-127, qmax=127)
    b = GraphBuilder("lookup")
    x = b.input("x", TensorType((5,), DType.INT8, narrow))
    table = np.arange(-127, 128, dtype=np.int8)[::-1].copy()  # negation over [-127, 127]
    g = b.build([b.op("table", x, table=table, offset=127, out=narrow)])
    got = run_graph(g, [np.array([-128, -127, 0, 5, 127], np.int8)])[0]
    np.testing.assert_array_equal(got, [127, 127, 0, -5, -127])
    from qlower.api import lower_graph

    codes = np.array([-128, -127, 0, 5, 127], np.int8)
    for target in ("cpu", "tosa-1.0+int"):
        prog = lower_graph(g, target)
        with pytest.raises(InputError, match=r"holds -128 at index \(0,\), outside \[-127, 127\]"):
            prog.run(codes)  # a user's out-of-range code is refused on every target ...
        # ... and below that check both backends agree with the reference out of range too
        np.testing.assert_array_equal(prog.runner().run([codes])[0], got)
