"""GraphBuilder type inference, op by op, against hand-derived shapes and QuantSpecs.

Shapes of convolutions are also checked against PyTorch's own shape arithmetic.
"""

import numpy as np
import pytest
import torch

from qlower.errors import IRError
from qlower.ir import DType, GraphBuilder, Origin, QuantSpec, TensorType

I8, I16, I32, F32 = DType.INT8, DType.INT16, DType.INT32, DType.FLOAT32
XQ = QuantSpec.per_tensor(0.5, 2)


def _acc(*scales, axis=None):
    """The int32 accumulator spec with the given (already multiplied) scales."""
    if axis is None:
        return QuantSpec.per_tensor(scales[0], 0, I32)
    return QuantSpec.per_channel(scales, axis=axis, dtype=I32)


def _in(b, shape, dtype=I8, quant=XQ, name="x"):
    return b.input(name, TensorType(shape, dtype, quant if dtype is not F32 else None))


WQ = QuantSpec.per_tensor(0.25)


def _w(b, shape, quant=WQ, dtype=np.int8):
    return b.constant(np.ones(shape, dtype), quant, name="w")


# -- conv2d ------------------------------------------------------------------------------


def test_conv2d_plain():
    b = GraphBuilder()
    acc = b.op("conv2d", _in(b, (1, 10, 12, 3)), _w(b, (8, 3, 3, 3)), None)
    assert acc.type == TensorType((1, 8, 10, 8), I32, _acc(0.125))


def test_conv2d_stride_dilation_asymmetric_pad():
    b = GraphBuilder()
    # H: (10 + 1 + 2 - 1*(3-1) - 1) // 2 + 1 = 6;  W: (12 + 0 + 3 - 2*(3-1) - 1) // 3 + 1 = 4
    acc = b.op("conv2d", _in(b, (2, 10, 12, 3)), _w(b, (8, 3, 3, 3)), None,
               stride=(2, 3), dilation=(1, 2), pad=(1, 2, 0, 3))
    assert acc.shape == (2, 6, 4, 8)


@pytest.mark.parametrize("h,w,k,stride,dilation,pad", [
    (10, 12, (3, 3), (2, 3), (1, 2), (1, 2, 0, 3)),
    (7, 7, (3, 5), (1, 2), (2, 1), (0, 0, 2, 2)),
    (9, 4, (1, 1), (3, 3), (1, 1), (0, 0, 0, 0)),
    (224, 224, (3, 3), (2, 2), (1, 1), (0, 1, 0, 1)),
])
def test_conv2d_shapes_agree_with_torch(h, w, k, stride, dilation, pad):
    b = GraphBuilder()
    x = _in(b, (1, h, w, 2), F32)
    acc = b.op("conv2d", x, b.constant(np.ones((3, *k, 2), np.float32)), None,
               stride=stride, dilation=dilation, pad=pad)
    xt = torch.nn.functional.pad(torch.zeros(1, 2, h, w), (pad[2], pad[3], pad[0], pad[1]))
    ref = torch.nn.functional.conv2d(xt, torch.zeros(3, 2, *k), stride=stride, dilation=dilation)
    assert acc.shape == (1, ref.shape[2], ref.shape[3], 3)
    assert acc.type.quant is None and acc.dtype is F32


def test_conv2d_groups_and_per_channel_weights():
    b = GraphBuilder()
    wq = QuantSpec.per_channel([0.5, 0.25, 0.125, 1.0, 2.0, 4.0], axis=0)
    acc = b.op("conv2d", _in(b, (1, 5, 5, 4)), _w(b, (6, 3, 3, 2), wq), None, groups=2)
    assert acc.type == TensorType((1, 3, 3, 6), I32, _acc(0.25, 0.125, 0.0625, 0.5, 1.0, 2.0, axis=3))


def test_depthwise_conv2d_with_channel_multiplier_and_bias():
    b = GraphBuilder()
    wq = QuantSpec.per_channel([0.1 * (i + 1) for i in range(8)], axis=0)
    acc_q = _acc(*(0.5 * 0.1 * (i + 1) for i in range(8)), axis=0)  # bias: axis 0 of its own shape
    bias = b.constant(np.zeros(8, np.int32), acc_q, name="bias")
    acc = b.op("conv2d", _in(b, (1, 6, 6, 4)), _w(b, (8, 3, 3, 1), wq), bias, groups=4, stride=(2, 2),
               pad=(1, 1, 1, 1))
    assert acc.shape == (1, 3, 3, 8)
    assert acc.quant == acc_q.with_axis(3)


def test_conv2d_per_tensor_bias():
    b = GraphBuilder()
    bias = b.constant(np.zeros(8, np.int32), _acc(0.125), name="bias")
    acc = b.op("conv2d", _in(b, (1, 3, 3, 3)), _w(b, (8, 1, 1, 3)), bias)
    assert acc.type == TensorType((1, 3, 3, 8), I32, _acc(0.125))


def test_conv2d_int16_input():
    b = GraphBuilder()
    acc = b.op("conv2d", _in(b, (1, 3, 3, 3), I16, QuantSpec.per_tensor(0.001, 0, I16)), _w(b, (2, 1, 1, 3)), None)
    assert acc.type == TensorType((1, 3, 3, 2), I32, _acc(0.001 * 0.25))


@pytest.mark.parametrize("setup,message", [
    (dict(wshape=(8, 3, 3, 2)), "input channels 3, weight (8, 3, 3, 2) and groups 1 disagree"),
    (dict(wshape=(6, 3, 3, 1), groups=2), "input channels 3, weight (6, 3, 3, 1) and groups 2 disagree"),
    (dict(bias=("int32", (7,), 0.125)), "bias must be int32[8]"),
    (dict(bias=("int32", (8,), 0.5)), "bias quantization must be the accumulator's {s=0.125 zp=0}"),
    (dict(bias=("int8", (8,), 0.125)), "bias must be int32[8]"),
    (dict(wq=QuantSpec.per_channel([0.1] * 3, axis=3)), "per-channel weight quantization must be on axis 0 with 8"),
    (dict(xq=QuantSpec.per_channel([0.1] * 3, axis=3)), "input must be quantized per tensor"),
    (dict(xshape=(1, 2, 2, 3)), "empty output"),
    (dict(xshape=(2, 2, 3)), "expects NHWC input and OHWI weight"),
    (dict(xdtype=F32), "expects float32 without quantization"),
])
def test_conv2d_rejects_bad_operands(setup, message):
    b = GraphBuilder()
    xq = setup.get("xq", XQ)
    xdtype = setup.get("xdtype", I8)
    x = _in(b, setup.get("xshape", (1, 5, 5, 3)), xdtype, xq)
    w = _w(b, setup.get("wshape", (8, 3, 3, 3)), setup.get("wq", QuantSpec.per_tensor(0.25)))
    bias = None
    if "bias" in setup:
        dt, shape, scale = setup["bias"]
        bias = b.constant(np.zeros(shape, dt), QuantSpec.per_tensor(scale, 0, DType(dt)), name="bias")
    with pytest.raises(IRError, match="^conv2d: ") as e:
        b.op("conv2d", x, w, bias, groups=setup.get("groups", 1))
    assert message in str(e.value)


def test_errors_name_the_model_location():
    b = GraphBuilder()
    x = _in(b, (1, 5, 5, 3))
    with pytest.raises(IRError) as e:
        b.op("conv2d", x, _w(b, (8, 3, 3, 2)), None, origin=Origin("conv_7", "features.3", "net.py:88"))
    assert str(e.value).endswith("at features.3.conv_7 (net.py:88)")


# -- fully_connected, matmul --------------------------------------------------------------


def test_fully_connected_per_channel():
    b = GraphBuilder()
    wq = QuantSpec.per_channel([0.5, 1.0, 2.0], axis=0)
    acc = b.op("fully_connected", _in(b, (2, 5, 16)), _w(b, (3, 16), wq), None)
    assert acc.type == TensorType((2, 5, 3), I32, _acc(0.25, 0.5, 1.0, axis=2))


def test_fully_connected_float_and_errors():
    b = GraphBuilder()
    y = b.op("fully_connected", _in(b, (4, 16), F32), b.constant(np.ones((3, 16), np.float32)), None)
    assert y.type == TensorType((4, 3), F32)
    with pytest.raises(IRError, match=r"fully_connected: input \(4, 16\) and weight \(3, 15\) disagree"):
        b.op("fully_connected", _in(b, (4, 16)), _w(b, (3, 15)), None)


def test_matmul():
    b = GraphBuilder()
    a = _in(b, (2, 3, 4), I8, QuantSpec.per_tensor(0.1, 3), "a")
    c = _in(b, (2, 4, 5), I8, QuantSpec.per_tensor(0.2, -1), "c")
    acc = b.op("matmul", a, c)
    assert acc.type == TensorType((2, 3, 5), I32, _acc(0.1 * 0.2))
    with pytest.raises(IRError, match=r"matmul: shapes \(2, 3, 4\) and \(3, 4, 5\) disagree"):
        b.op("matmul", a, _in(b, (3, 4, 5), name="d"))
    with pytest.raises(IRError, match="matmul: operands must be quantized per tensor"):
        b.op("matmul", a, _in(b, (2, 4, 5), quant=QuantSpec.per_channel([0.1] * 5, axis=2), name="e"))


# -- elementwise --------------------------------------------------------------------------


def test_mul_with_per_channel_constant_and_shift():
    b = GraphBuilder()
    a = _in(b, (1, 4, 4, 3), I32, QuantSpec.per_tensor(0.5, 0, I32))
    c = b.constant(np.ones((1, 1, 1, 3), np.int32), QuantSpec.per_channel([0.1, 0.2, 0.4], axis=3, dtype=I32))
    y = b.op("mul", a, c, shift=2)
    # scales s_a * s_c[k] * 2**shift
    assert y.type == TensorType((1, 4, 4, 3), I32, _acc(0.5 * 0.1 * 4, 0.5 * 0.2 * 4, 0.5 * 0.4 * 4, axis=3))
    with pytest.raises(IRError, match="mul: int32 operands must have zero point 0"):
        b.op("mul", a, _in(b, (1, 4, 4, 3), I32, QuantSpec.per_tensor(0.5, 1, I32), "z"))
    with pytest.raises(IRError, match="mul: at most one operand may be quantized per channel"):
        b.op("mul", c, c)


def test_add_sub_intdiv_clamp():
    b = GraphBuilder()
    q = QuantSpec.per_tensor(0.01, 0, I32)
    a, c = _in(b, (2, 1, 3), I32, q, "a"), _in(b, (2, 4, 1), I32, q, "c")
    assert b.op("add", a, c).type == TensorType((2, 4, 3), I32, q)
    assert b.op("sub", c, a).type == TensorType((2, 4, 3), I32, q)
    d = _in(b, (2, 4, 3), I32, QuantSpec.per_tensor(0.5, 0, I32), "d")
    assert b.op("intdiv", a, d).type == TensorType((2, 4, 3), I32, QuantSpec.per_tensor(0.01 / 0.5, 0, I32))
    x = _in(b, (3,), I8, XQ, "x")
    assert b.op("clamp", x, min=2, max=100).type == x.type
    with pytest.raises(IRError, match="add: int32 operands must share one per-tensor quantization"):
        b.op("add", a, d)
    with pytest.raises(IRError, match=r"add: operands must have equal rank to broadcast, got \(2, 1, 3\) and \(3,\)"):
        b.op("add", a, _in(b, (3,), I32, q, "e"))
    with pytest.raises(IRError, match=r"sub: expects a quantized int32 tensor, got int8\[3\]"):
        b.op("sub", x, x)
    with pytest.raises(IRError, match="clamp: min 5 > max 4"):
        b.op("clamp", x, min=5, max=4)


def test_rescale():
    b = GraphBuilder()
    acc = _in(b, (1, 2, 2, 3), I32, _acc(0.1, 0.2, 0.3, axis=3))
    out = QuantSpec.per_tensor(0.05, -7, qmin=-100, qmax=100)
    assert b.op("rescale", acc, out=out).type == TensorType((1, 2, 2, 3), I8, out)
    with pytest.raises(IRError, match="rescale: output must be quantized per tensor"):
        b.op("rescale", acc, out=QuantSpec.per_channel([0.1] * 3, axis=3))
    with pytest.raises(IRError, match="rescale: rounding must be one of single, double, double_half_up, fp32, "
                                      "integer_multiplier, got 'up'"):
        b.op("rescale", acc, out=out, rounding="up")
    with pytest.raises(IRError, match="rescale: expects a quantized integer tensor, got float32"):
        b.op("rescale", _in(b, (3,), F32), out=out)
    dyn = _in(b, (3,), I32, QuantSpec(I32, (0.5,), (0,), I32.min, I32.max, dynamic="per_tensor"), "dyn")
    with pytest.raises(IRError, match="rescale: a dynamic input can only be rescaled to a dynamic output"):
        b.op("rescale", dyn, out=out)


@pytest.mark.parametrize("kind", ["sigmoid", "tanh", "exp", "erf", "reciprocal"])
def test_float_unary(kind):
    b = GraphBuilder()
    assert b.op(kind, _in(b, (2, 3), F32)).type == TensorType((2, 3), F32)
    with pytest.raises(IRError, match=f"{kind}: expects float32 without quantization"):
        b.op(kind, _in(b, (2, 3)))


def test_softmax():
    b = GraphBuilder()
    assert b.op("softmax", _in(b, (2, 3), F32), axis=1).type == TensorType((2, 3), F32)
