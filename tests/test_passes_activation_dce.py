"""Exact activation fusion and dead code elimination: expected texts and bit-identical runs."""

import numpy as np

from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.passes import PassManager, eliminate_dead_code, fuse_activations
from qlower.passes.activation_fusion import merge_clamps
from qlower.reference import run_graph
from qlower.testing.graph_checks import assert_graph_text, assert_same_outputs, random_inputs

X = QuantSpec.per_tensor(0.02, 3)


def run(before, passes=(fuse_activations,)):
    result = PassManager(list(passes), verify=True)(before)
    assert_same_outputs(before, result.graph)
    return result


def conv_relu(relu_zp: int, qmin: int = -127):
    """conv -> rescale to (zp=relu_zp, qmin) -> relu clamp(min=zp), and the graph without the clamp."""
    graphs = []
    for with_clamp in (True, False):
        b = GraphBuilder()
        x = b.input("x", TensorType((1, 3, 3, 2), DType.INT8, X))
        w = b.constant(np.array([[1, -2], [3, -1], [-2, 2], [1, 1]], np.int8).reshape(4, 1, 1, 2),
                       QuantSpec.per_channel([0.01, 0.02, 0.03, 0.04], axis=0, qmin=-127, qmax=127), name="w")
        acc = b.op("conv2d", x, w, None, name="acc")
        y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.003, relu_zp, qmin=qmin, qmax=127), name="y")
        if with_clamp:
            y = b.op("clamp", y, min=relu_zp, max=127, name="relu")
        graphs.append(b.build([y]))
    return graphs


def test_relu_whose_zero_point_is_qmin_is_removed():
    before, _ = conv_relu(relu_zp=-127)
    result = run(before)
    assert result.changed
    assert [op.kind for op in result.graph.ops] == ["constant", "conv2d", "rescale"]
    assert result.graph.outputs[0].type == before.outputs[0].type


def test_s1_relu_whose_zero_point_is_above_qmin_stays_explicit():
    # S1: relu's output zero point is about -111 while qmin is -127: codes -127..-112 are possible
    # after the rescale, and the clamp must map them to -111.
    before, without_clamp = conv_relu(relu_zp=-111)
    result = run(before)
    assert not result.changed and result.graph is before
    # The kept clamp matters: dropping it changes some outputs on the same inputs.
    inputs = random_inputs(before, seed=0)
    (kept,), (dropped,) = run_graph(before, inputs), run_graph(without_clamp, inputs)
    assert kept.min() == -111 and dropped.min() < -111
    assert not np.array_equal(kept, dropped)


def test_clamp_before_a_shared_domain_concat_keeps_every_quantspec():
    out = QuantSpec.per_tensor(0.05, -111, qmin=-127, qmax=127)
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 2, 3), DType.INT8, X))
    y = b.input("y", TensorType((1, 2, 2, 3), DType.INT8, out))
    r = b.op("rescale", x, out=out, name="r")
    relu = b.op("clamp", r, min=-111, max=127, name="relu")
    before = b.build([b.op("concat", (relu, y), axis=3, name="cat")])
    result = run(before)
    assert not result.changed
    assert [v.type for v in result.graph.values()] == [v.type for v in before.values()]


def test_clamp_directly_on_a_graph_input_is_not_trusted_to_qmin():
    # An input typed q=[-127,127] may still hold -128: removing clamp(min=-127) would not be exact.
    spec = QuantSpec.per_tensor(0.1, -127, qmin=-127, qmax=127)
    b = GraphBuilder()
    x = b.input("x", TensorType((64,), DType.INT8, spec))
    before = b.build([b.op("clamp", x, min=-127, max=127, name="c")])
    assert not run(before).changed
    (out,) = run_graph(before, [np.full(64, -128, np.int8)])
    assert np.all(out == -127)
    full = b.op("clamp", x, min=-128, max=127, name="full")   # a true no-op on int8
    assert_graph_text(run(b.build([full]), [fuse_activations, eliminate_dead_code]).graph, """
        graph main(%x: int8[64] {s=0.1 zp=-127 q=[-127,127]}) {
          return %x
        }""")


def test_consecutive_clamps_merge_into_their_intersection():
    b = GraphBuilder()
    x = b.input("x", TensorType((64,), DType.INT8, X))
    c1 = b.op("clamp", x, min=-100, max=100, name="c1")
    c2 = b.op("clamp", c1, min=-50, max=120, name="c2")
    c3 = b.op("clamp", c2, min=-60, max=90, name="c3")
    before = b.build([c3])
    assert_graph_text(run(before, [fuse_activations, eliminate_dead_code]).graph, """
        graph main(%x: int8[64] {s=0.02 zp=3}) {
          %c3 = clamp(%x) {max=90, min=-50}
          return %c3
        }""")


def test_disjoint_clamps_merge_to_the_bound_every_code_lands_on():
    assert merge_clamps((0, 5), (10, 20)) == (10, 10)
    assert merge_clamps((10, 20), (0, 5)) == (5, 5)
    for inner, outer in [((0, 5), (10, 20)), ((10, 20), (0, 5)), ((-1.5, 0.5), (2.0, 3.0))]:
        dtype = DType.FLOAT32 if isinstance(inner[0], float) else DType.INT8
        b = GraphBuilder()
        x = b.input("x", TensorType((256,), dtype, None if dtype.is_float else X))
        y = b.op("clamp", b.op("clamp", x, min=inner[0], max=inner[1]), min=outer[0], max=outer[1])
        after = run(b.build([y]), [fuse_activations, eliminate_dead_code]).graph
        assert after.count_ops() == {"clamp": 1}


def test_a_clamp_inside_a_previous_clamps_range_is_removed():
    b = GraphBuilder()
    x = b.input("x", TensorType((64,), DType.INT8, X))
    r = b.op("rescale", x, out=QuantSpec.per_tensor(0.1, 0, qmin=-127, qmax=127), name="r")
    no_op = b.op("clamp", r, min=-128, max=127, name="no_op")          # contains r's [-127, 127]
    narrow = b.op("clamp", no_op, min=-127, max=100, name="narrow")    # really cuts 101..127
    t = b.op("transpose", b.op("reshape", narrow, shape=(8, 8)), perm=(1, 0), name="t")
    before = b.build([b.op("clamp", t, min=-127, max=110, name="after_move")])  # within [-127, 100]
    assert_graph_text(run(before).graph, """
        graph main(%x: int8[64] {s=0.02 zp=3}) {
          %r = rescale(%x) {out={s=0.1 zp=0 q=[-127,127]}, rounding=single}
          %narrow = clamp(%r) {max=100, min=-127}
          %reshape = reshape(%narrow) {shape=(8, 8)}
          %t = transpose(%reshape) {perm=(1, 0)}
          return %t
        }""")


def test_dce_removes_dead_branches_and_keeps_outputs_and_inputs():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4), DType.FLOAT32))
    unused = b.input("unused", TensorType((2,), DType.FLOAT32))
    s = b.op("sigmoid", x, name="s")
    dead = b.op("exp", b.op("tanh", s, name="dead_a"), name="dead_b")
    codes, scale = b.op("dynamic_quantize", x, name="dq")   # only the codes are used below
    kept = b.op("dequantize", codes, scale, name="kept")
    _unused_scale_user = b.op("reciprocal", scale, name="dead_c")
    before = b.build([s, kept, x])
    result = PassManager([eliminate_dead_code], verify=True)(before)
    assert result.changed and dead not in set(result.graph.values())
    assert_graph_text(result.graph, """
        graph main(%x: float32[1x4], %unused: float32[2]) {
          %s = sigmoid(%x)
          %dq, %dq_1 = dynamic_quantize(%x) {dtype=int8, granularity=per_tensor, qmax=127}
          %kept = dequantize(%dq, %dq_1)
          return %s, %kept, %x
        }""")
    assert unused in result.graph.inputs
    assert_same_outputs(before, result.graph)
    assert not eliminate_dead_code(result.graph).changed
