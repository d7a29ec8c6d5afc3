"""The IR printer: golden texts, written by hand from the format in qlower/ir/printer.py."""

import numpy as np

from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, print_graph, print_op, rebuild


def _conv_rescale():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, QuantSpec.per_tensor(0.5, -3)))
    w = b.constant(np.ones((3, 1, 1, 2), np.int8), QuantSpec.per_tensor(0.25), name="w")
    acc = b.op("conv2d", x, w, None)
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.125, 0))
    return b.build([y])


def test_conv_rescale_graph():
    assert print_graph(_conv_rescale()) == """\
graph main(%x: int8[1x4x4x2] {s=0.5 zp=-3}) {
  %w = constant int8[3, 1, 1, 2][1, 1, 1, 1, 1, 1] : int8[3x1x1x2] {s=0.25 zp=0}
  %conv2d = conv2d(%x, %w, none) {dilation=(1, 1), groups=1, pad=(0, 0, 0, 0), stride=(1, 1)} : int32[1x4x4x3] {s=0.125 zp=0}
  %rescale = rescale(%conv2d) {out={s=0.125 zp=0}, rounding=single} : int8[1x4x4x3] {s=0.125 zp=0}
  return %rescale
}"""


def test_str_of_a_graph_is_its_printed_form():
    g = _conv_rescale()
    assert str(g) == print_graph(g)


def test_without_types():
    assert print_graph(_conv_rescale(), show_types=False) == """\
graph main(%x: int8[1x4x4x2] {s=0.5 zp=-3}) {
  %w = constant int8[3, 1, 1, 2][1, 1, 1, 1, 1, 1] : int8[3x1x1x2] {s=0.25 zp=0}
  %conv2d = conv2d(%x, %w, none) {dilation=(1, 1), groups=1, pad=(0, 0, 0, 0), stride=(1, 1)}
  %rescale = rescale(%conv2d) {out={s=0.125 zp=0}, rounding=single}
  return %rescale
}"""


def test_per_channel_variadic_multi_result_and_narrow_range():
    b = GraphBuilder("dyn")
    x = b.input("x", TensorType((2, 8), DType.INT8, QuantSpec.per_tensor(0.5, 1, qmin=-127)))
    w = b.constant(np.ones((5, 8), np.int8), QuantSpec.per_channel([0.1, 0.2, 0.3, 0.4, 0.5], axis=0), name="w")
    w4 = b.constant(np.ones((4, 8), np.int8), QuantSpec.per_channel([0.1, 0.2, 0.3, 0.4], axis=0), name="w")
    acc = b.op("fully_connected", x, w, None, name="fc")
    acc4 = b.op("fully_connected", x, w4, None, name="fc")
    f = b.op("dequantize", x, None, name="f")
    q, s = b.op("dynamic_quantize", f, name="q")
    dq = b.op("dequantize", q, s, name="dq")
    cat = b.op("concat", (dq, f), axis=0, name="cat")
    assert print_graph(b.build([acc, acc4, cat])) == """\
graph dyn(%x: int8[2x8] {s=0.5 zp=1 q=[-127,127]}) {
  %w = constant : int8[5x8] {s=[0.1,…×5] zp=[0,…×5] axis=0}
  %w_1 = constant : int8[4x8] {s=[0.1,0.2,0.3,0.4] zp=[0,0,0,0] axis=0}
  %fc = fully_connected(%x, %w, none) : int32[2x5] {s=[0.05,…×5] zp=[0,…×5] axis=1}
  %fc_1 = fully_connected(%x, %w_1, none) : int32[2x4] {s=[0.05,0.1,0.15,0.2] zp=[0,0,0,0] axis=1}
  %f = dequantize(%x, none) : float32[2x8]
  %q, %q_1 = dynamic_quantize(%f) {dtype=int8, granularity=per_tensor, qmax=127} : \
int8[2x8] {s=1 zp=0 q=[-127,127] dynamic=per_tensor}, float32[1x1]
  %dq = dequantize(%q, %q_1) : float32[2x8]
  %cat = concat((%dq, %f)) {axis=0} : float32[4x8]
  return %fc, %fc_1, %cat
}"""


def test_array_attributes_and_scalars():
    b = GraphBuilder()
    x = b.input("x", TensorType((3,), DType.INT8, QuantSpec.per_tensor(0.1)))
    table = np.arange(-128, 128, dtype=np.int8)
    t = b.op("table", x, table=table, offset=128, out=QuantSpec.per_tensor(0.1))
    s = b.input("s", TensorType((), DType.FLOAT32))
    e = b.op("exp", s)
    g = b.build([t, e])
    assert print_graph(g) == """\
graph main(%x: int8[3] {s=0.1 zp=0}, %s: float32[scalar]) {
  %table = table(%x) {offset=128, out={s=0.1 zp=0}, table=int8[256]} : int8[3] {s=0.1 zp=0}
  %exp = exp(%s) : float32[scalar]
  return %table, %exp
}"""
    assert print_op(g.ops[1], show_types=False) == "%exp = exp(%s)"


def test_before_and_after_a_rewrite():
    """The style pass tests use: the graph before, the rewrite, the graph expected after."""
    b = GraphBuilder()
    x = b.input("x", TensorType((2, 2), DType.FLOAT32))
    y = b.op("sigmoid", x)
    before = b.build([b.op("tanh", y)])
    assert print_graph(before) == """\
graph main(%x: float32[2x2]) {
  %sigmoid = sigmoid(%x) : float32[2x2]
  %tanh = tanh(%sigmoid) : float32[2x2]
  return %tanh
}"""

    def expand_sigmoid(builder, op, operands):  # sigmoid(x) = 1 / (1 + exp(0 - x))
        if op.kind != "sigmoid":
            return None
        (src,) = operands
        zero = builder.constant(np.zeros((1, 1), np.float32), name="zero")
        one = builder.constant(np.ones((1, 1), np.float32), name="one")
        e = builder.op("exp", builder.op("sub", zero, src, name="neg"))
        return (builder.op("reciprocal", builder.op("add", one, e, name="denom"), name="sigmoid"),)

    after = rebuild(before, expand_sigmoid)
    assert print_graph(after) == """\
graph main(%x: float32[2x2]) {
  %zero = constant float32[1, 1][0.0] : float32[1x1]
  %one = constant float32[1, 1][1.0] : float32[1x1]
  %neg = sub(%zero, %x) : float32[2x2]
  %exp = exp(%neg) : float32[2x2]
  %denom = add(%one, %exp) : float32[2x2]
  %sigmoid = reciprocal(%denom) : float32[2x2]
  %tanh = tanh(%sigmoid) : float32[2x2]
  return %tanh
}"""
