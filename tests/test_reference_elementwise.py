"""Reference elementwise ops: rescale, clamp, add/sub/mul/intdiv, float unary ops, softmax.

Integer expectations come from Python integers (hand-derived formulas), PyTorch
int64, or the official TOSA reference model (MUL with shift); float ops are
compared with PyTorch float64 within float32 tolerance.
"""

import os

os.environ["TOSA_MODEL_NO_BACKTRACE"] = "1"

import numpy as np
import pytest
import torch
import tosa_reference_model as trm
import tosa_serializer as ts

from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference import run_graph

I8, I32, F32 = DType.INT8, DType.INT32, DType.FLOAT32


def _run(kind, inputs, types, **attrs):
    """Run one op whose operands are graph inputs; returns its (first) result."""
    b = GraphBuilder()
    vals = [b.input(f"in{i}", t) for i, t in enumerate(types)]
    res = b.op(kind, *vals, **attrs)
    res = res if isinstance(res, tuple) else (res,)
    return run_graph(b.build(list(res)), inputs)


def _round_half_up(num: int, den: int) -> int:
    """floor(num / den + 1/2) in exact integers."""
    return (2 * num + den) // (2 * den)


# -- rescale -------------------------------------------------------------------------------


def test_rescale_per_channel_accumulator_to_int8_with_exact_ratios():
    # in scales 1.5 * 2**-12 * k for channel k=1,2,4 (as powers of two times 3), out scale 2**-6:
    # ratios 3 * 2**-7, 3 * 2**-6, 3 * 2**-5: representable exactly, so the result is
    # round_half_up(x * ratio) + zp, clamped to [qmin, qmax]
    in_q = QuantSpec.per_channel([1.5 * 2**-12, 1.5 * 2**-11, 1.5 * 2**-10], axis=3, dtype=I32)
    out_q = QuantSpec.per_tensor(2**-6, -20, qmin=-100, qmax=100)
    rng = np.random.default_rng(0)
    x = rng.integers(-6000, 6000, size=(1, 4, 5, 3)).astype(np.int32)
    x[0, 0, 1] = [64, 32, -16]  # exact ties: 64*3/128 = 1.5, 32*3/64 = 1.5, -16*3/32 = -1.5
    (out,) = _run("rescale", [x], [TensorType(x.shape, I32, in_q)], out=out_q)
    den = [128, 64, 32]
    expected = np.empty(x.shape, np.int64)
    for idx in np.ndindex(x.shape):
        v = _round_half_up(int(x[idx]) * 3, den[idx[3]]) - 20
        expected[idx] = min(max(v, -100), 100)
    assert out.dtype == np.int8 and np.array_equal(out.astype(np.int64), expected)
    assert out[0, 0, 1].tolist() == [2 - 20, 2 - 20, -1 - 20]  # ties rounded toward +inf


def test_rescale_int8_to_int8_double_rounding_by_hand():
    # ratio 3 * 2**-10 = (3 * 2**29) * 2**-39: multiplier 1610612736, shift 39 (> 31, so double
    # rounding adds a further ±2**30 before the shift)
    in_q = QuantSpec.per_tensor(3 * 2**-10, 5)
    out_q = QuantSpec.per_tensor(1.0, 1)
    x = np.arange(-128, 128, dtype=np.int8)
    for rounding in ("single", "double"):
        (out,) = _run("rescale", [x], [TensorType(x.shape, I8, in_q)], out=out_q, rounding=rounding)
        expected = []
        for code in x.tolist():
            v = code - 5
            rnd = 2**38 + ((2**30 if v >= 0 else -(2**30)) if rounding == "double" else 0)
            expected.append(min(max(((v * 1610612736 + rnd) >> 39) + 1, -128), 127))
        assert out.tolist() == expected, rounding


def test_rescale_random_ratios_are_within_half_a_step_of_the_real_ratio():
    rng = np.random.default_rng(1)
    for _ in range(20):
        s_in, s_out = float(np.exp2(rng.uniform(-20, -5))), float(np.exp2(rng.uniform(-8, -2)))
        zp = int(rng.integers(-50, 50))
        x = rng.integers(-(2**20), 2**20, size=1000).astype(np.int32)
        (out,) = _run("rescale", [x], [TensorType(x.shape, I32, QuantSpec.per_tensor(s_in, 0, I32))],
                      out=QuantSpec.per_tensor(s_out, zp))
        real = x.astype(np.float64) * (s_in / s_out) + zp
        inside = (real > -127) & (real < 126)
        # the 31-bit multiplier is within a relative 2**-31 of the ratio
        tol = 0.5 + np.abs(x.astype(np.float64)) * (s_in / s_out) * 2.0**-31 + 1e-9
        assert np.all(np.abs(out[inside] - real[inside]) <= tol[inside])
        assert np.all(out[real >= 128] == 127) and np.all(out[real <= -129] == -128)


def test_rescale_of_an_out_of_range_value_is_an_execution_error():
    # ratio 2**20 puts the shift at 10: values must stay in [-512, 512)
    x = np.array([3, 600], np.int32)
    with pytest.raises(ExecutionError, match="rescale producing %rescale: .*out of range"):
        _run("rescale", [x], [TensorType(x.shape, I32, QuantSpec.per_tensor(2.0**20, 0, I32))],
             out=QuantSpec.per_tensor(1.0, 0, I32))


# -- clamp, add, sub, mul, intdiv -------------------------------------------------------------


def test_clamp():
    x = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    (out,) = _run("clamp", [x], [TensorType(x.shape, I8, QuantSpec.per_tensor(0.1, 3))], min=-5, max=40)
    assert out.dtype == np.int8
    assert np.array_equal(out, torch.clamp(torch.from_numpy(x), -5, 40).numpy())
    f = np.linspace(-3, 3, 13, dtype=np.float32)
    (out,) = _run("clamp", [f], [TensorType(f.shape, F32)], min=-1.0, max=0.5)
    assert np.array_equal(out, torch.clamp(torch.from_numpy(f), -1.0, 0.5).numpy())


@pytest.mark.parametrize("kind,fn", [("add", torch.add), ("sub", torch.sub)])
def test_int32_add_sub_broadcast(kind, fn):
    rng = np.random.default_rng(2)
    q = QuantSpec.per_tensor(0.01, 0, I32)
    a = rng.integers(-(2**30), 2**30, size=(2, 1, 4)).astype(np.int32)
    c = rng.integers(-(2**30), 2**30, size=(1, 3, 4)).astype(np.int32)
    (out,) = _run(kind, [a, c], [TensorType(a.shape, I32, q), TensorType(c.shape, I32, q)])
    expected = fn(torch.from_numpy(a).long(), torch.from_numpy(c).long()).numpy()
    assert out.dtype == np.int32 and out.shape == (2, 3, 4) and np.array_equal(out, expected)


def test_int32_add_overflow_is_an_execution_error():
    q = QuantSpec.per_tensor(0.01, 0, I32)
    a = np.array([2**31 - 1, 5], np.int32)
    with pytest.raises(ExecutionError, match=r"add producing %add overflows int32 \(range 10\.\.4294967294\)"):
        _run("add", [a, a], [TensorType(a.shape, I32, q)] * 2)


@pytest.mark.parametrize("kind,fn", [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul)])
def test_float_binary_ops_broadcast(kind, fn):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 1)).astype(np.float32)
    c = rng.standard_normal((1, 5)).astype(np.float32)
    (out,) = _run(kind, [a, c], [TensorType(a.shape, F32), TensorType(c.shape, F32)])
    assert out.dtype == np.float32
    assert np.array_equal(out, fn(torch.from_numpy(a), torch.from_numpy(c)).numpy())  # IEEE float32: exact


def _tosa_mul(a: np.ndarray, c: np.ndarray, shift: int) -> np.ndarray:
    shape = list(np.broadcast_shapes(a.shape, c.shape))
    ser = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
    av = ser.addPlaceholder(list(a.shape), ts.DType.INT32, None)
    cv = ser.addPlaceholder(list(c.shape), ts.DType.INT32, None)
    sv = ser.addConst([1], ts.DType.INT8, np.array([shift], np.int8), "shift")
    out = ser.addOutput(shape, ts.DType.INT32)
    attr = ts.TosaSerializerAttribute()
    attr.MulAttribute()
    ser.addOperator(ts.Op.MUL, [av.name, cv.name, sv.name], [out.name], attr)
    outs, status = trm.run(ser.serialize(), [a, c])
    assert status == trm.GraphStatus.TOSA_VALID
    return outs[0]


@pytest.mark.parametrize("shift", [0, 1, 5, 17, 31])
def test_int32_mul_with_shift_is_bit_exact_with_tosa(shift):
    rng = np.random.default_rng(shift)
    # products stay in int32 after the shift: |a*c| < 2**(31 + shift)
    lim = 2 ** ((31 + shift) // 2)
    a = rng.integers(-lim, lim, size=(4, 1, 64)).astype(np.int64)
    c = rng.integers(-lim, lim, size=(1, 8, 64)).astype(np.int64)
    a[0, 0, :4] = [1, -1, 3, -3]                 # exact ties for shift 1
    c[0, 0, :4] = [1, 1, 1, 1]
    a, c = np.clip(a, -(2**31), 2**31 - 1).astype(np.int32), np.clip(c, -(2**31), 2**31 - 1).astype(np.int32)
    qa = QuantSpec.per_tensor(0.5, 0, I32)
    qc = QuantSpec.per_channel(np.linspace(0.1, 0.8, 64), axis=2, dtype=I32)
    (out,) = _run("mul", [a, c], [TensorType(a.shape, I32, qa), TensorType(c.shape, I32, qc)], shift=shift)
    assert out.dtype == np.int32 and np.array_equal(out, _tosa_mul(a, c, shift))
    if shift == 1:  # round half up: 1/2 -> 1, -1/2 -> 0, 3/2 -> 2, -3/2 -> -1
        assert out[0, 0, :4].tolist() == [1, 0, 2, -1]


def test_intdiv_truncates_toward_zero():
    q = QuantSpec.per_tensor(1.0, 0, I32)
    a = np.array([[7, -7, 7, -7, 0, 2**31 - 1, -(2**31)]], np.int32)
    c = np.array([[2, 2, -2, -2, 5, 3, 7]], np.int32)
    (out,) = _run("intdiv", [a, c], [TensorType(a.shape, I32, q)] * 2)
    expected = torch.div(torch.from_numpy(a).long(), torch.from_numpy(c).long(), rounding_mode="trunc")
    assert np.array_equal(out, expected.numpy())
    assert out.tolist() == [[3, -3, -3, 3, 0, 715827882, -306783378]]


def test_intdiv_errors():
    q = QuantSpec.per_tensor(1.0, 0, I32)
    with pytest.raises(ExecutionError, match="intdiv producing %intdiv: intdiv by zero"):
        _run("intdiv", [np.array([1, 2], np.int32), np.array([1, 0], np.int32)], [TensorType((2,), I32, q)] * 2)
    with pytest.raises(ExecutionError, match="intdiv producing %intdiv overflows int32"):
        _run("intdiv", [np.array([-(2**31)], np.int32), np.array([-1], np.int32)], [TensorType((1,), I32, q)] * 2)


# -- float ops -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,fn", [("sigmoid", torch.sigmoid), ("tanh", torch.tanh), ("exp", torch.exp),
                                     ("erf", torch.erf), ("reciprocal", torch.reciprocal)])
@pytest.mark.parametrize("shape", [(3, 40), ()], ids=["matrix", "scalar"])
def test_float_unary_matches_torch(kind, fn, shape):
    rng = np.random.default_rng(4)
    x = np.asarray(rng.standard_normal(shape) * 4, dtype=np.float32)
    if kind == "reciprocal":
        x = np.asarray(np.where(np.abs(x) < 1e-3, 1.0, x), dtype=np.float32)
    (out,) = _run(kind, [x], [TensorType(shape, F32)])
    assert out.dtype == np.float32 and out.shape == shape
    np.testing.assert_allclose(out, fn(torch.from_numpy(x).double()).numpy(), rtol=2e-7, atol=1e-30)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_matches_torch(axis):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 4, 5)) * 10).astype(np.float32)
    x[0, 0, 0] = 80.0  # large logits must not overflow
    (out,) = _run("softmax", [x], [TensorType(x.shape, F32)], axis=axis)
    expected = torch.softmax(torch.from_numpy(x).double(), dim=axis).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(out.astype(np.float64).sum(axis=axis), 1.0, rtol=1e-6)
