"""Transpose cancellation and sinking: expected graphs as text (some before/after as exact texts,
qlower/ir/parser.py), and bit-identical runs."""

import numpy as np
import pytest

from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.passes import PassManager, cancel_transposes, eliminate_dead_code
from qlower.passes.transposes import compose, inverse, moves_only_unit_dims
from qlower.testing.graph_checks import assert_graph_text, assert_rewrites, assert_same_outputs

TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)
Q = QuantSpec.per_tensor(0.05, -3)


def run(before):
    """cancel_transposes then DCE, verified after each; the outputs must not change."""
    result = PassManager([cancel_transposes, eliminate_dead_code], verify=True)(before)
    assert_same_outputs(before, result.graph)
    return result


def passes(before):
    return run(before).graph


def test_permutation_algebra():
    x = np.arange(24).reshape(1, 2, 3, 4)
    for p, q in [(TO_NCHW, TO_NHWC), (TO_NCHW, (0, 1, 3, 2)), ((3, 2, 1, 0), (1, 0, 3, 2))]:
        assert np.array_equal(np.transpose(np.transpose(x, p), q), np.transpose(x, compose(p, q)))
        assert np.array_equal(np.transpose(np.transpose(x, p), inverse(p)), x)
    assert moves_only_unit_dims((1, 1, 4, 3), (0, 2, 3, 1))
    assert not moves_only_unit_dims((1, 2, 4, 3), (0, 2, 3, 1))


def test_inverse_transposes_cancel():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 3, 4), DType.FLOAT32))
    t = b.op("transpose", x, perm=TO_NCHW)
    before = b.build([b.op("transpose", t, perm=TO_NHWC, name="y")])
    result = run(before)
    assert result.changed
    assert_graph_text(result.graph, """
        graph main(%x: float32[1x2x3x4]) {
          return %x
        }""")


def test_two_transposes_compose_into_one():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 3, 4), DType.INT8, Q))
    t = b.op("transpose", x, perm=TO_NCHW)               # 1x4x2x3
    before = b.build([b.op("transpose", t, perm=(0, 1, 3, 2), name="y")])   # 1x4x3x2
    assert_graph_text(run(before).graph, """
        graph main(%x: int8[1x2x3x4] {s=0.05 zp=-3}) {
          %y = transpose(%x) {perm=(0, 3, 2, 1)}
          return %y
        }""")


def test_identity_transpose_is_removed_and_a_lone_transpose_stays():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 3, 4), DType.FLOAT32))
    i = b.op("transpose", x, perm=(0, 1, 2, 3), name="same")
    before = b.build([b.op("sigmoid", b.op("transpose", i, perm=TO_NCHW, name="t"), name="y")])
    assert_graph_text(run(before).graph, """
        graph main(%x: float32[1x2x3x4]) {
          %t = transpose(%x) {perm=(0, 3, 1, 2)}
          %y = sigmoid(%t)
          return %y
        }""")


def test_transpose_sinks_through_rescale_and_clamp_and_cancels():
    assert_rewrites(passes, """
        graph main(%x: int8[1x2x3x4] {s=0.05 zp=-3}) {
          %t = transpose(%x) {perm=(0, 3, 1, 2)}
          %r = rescale(%t) {out=quant(int8 {s=0.1 zp=5})}
          %c = clamp(%r) {max=90, min=-20}
          %y = transpose(%c) {perm=(0, 2, 3, 1)}
          return %y
        }""", """
        graph main(%x: int8[1x2x3x4] {s=0.05 zp=-3}) {
          %r = rescale(%x) {out=quant(int8 {s=0.1 zp=5})}
          %c = clamp(%r) {max=90, min=-20}
          return %c
        }""")


def test_per_channel_accumulator_keeps_its_channels_through_sinking():
    # conv -> NCHW -> per-channel rescale -> NHWC: after cancelling, the rescale reads the accumulator
    # in NHWC, its channel axis back on 3; a rescale that paired scales with the wrong axis would differ.
    assert_rewrites(passes, """
        graph main(%x: int8[1x3x3x2] {s=0.1 zp=1}) {
          %w = constant() {data=array(int8[3x1x2x2], [-6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5]),
                           quant=quant(int8 {s=[0.5,0.02,0.001] zp=[0,0,0] axis=0})}
          %acc = conv2d(%x, %w, none) {dilation=(1, 1), groups=1, pad=(0, 0, 0, 0), stride=(1, 1)}
          %acc_nchw = transpose(%acc) {perm=(0, 3, 1, 2)} : int32[1x3x3x2] {s=[0.05,0.002,0.0001] zp=[0,0,0] axis=1}
          %r = rescale(%acc_nchw) {out=quant(int8 {s=0.01 zp=0})}
          %y = transpose(%r) {perm=(0, 2, 3, 1)}
          return %y
        }""", """
        graph main(%x: int8[1x3x3x2] {s=0.1 zp=1}) {
          %w = constant() {data=array(int8[3x1x2x2], [-6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5]),
                           quant=quant(int8 {s=[0.5,0.02,0.001] zp=[0,0,0] axis=0})}
          %acc = conv2d(%x, %w, none) {dilation=(1, 1), groups=1, pad=(0, 0, 0, 0), stride=(1, 1)}
          %r = rescale(%acc) {out=quant(int8 {s=0.01 zp=0})}
          return %r
        }""")


def test_per_channel_quantize_and_dequantize_sink_with_their_axis_remapped():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 3, 4), DType.FLOAT32))
    t = b.op("transpose", x, perm=TO_NCHW)                  # channels (4) now on axis 1
    q = b.op("quantize", t, out=QuantSpec.per_channel([0.1, 0.2, 0.3, 0.4], [1, 2, 3, 4], axis=1), name="q")
    d = b.op("dequantize", q, None, name="d")
    before = b.build([b.op("transpose", d, perm=TO_NHWC, name="y")])
    assert_graph_text(run(before).graph, """
        graph main(%x: float32[1x2x3x4]) {
          %q = quantize(%x) {out={s=[0.1,0.2,0.3,0.4] zp=[1,2,3,4] axis=3}}
          %d = dequantize(%q, none)
          return %d
        }""")


def test_binary_op_with_a_constant_gets_the_constant_permuted_at_compile_time():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 3, 4), DType.FLOAT32))
    t = b.op("transpose", x, perm=TO_NCHW)                   # 1x4x2x3
    c = b.constant(np.array([1, 2, 3, 4], np.float32).reshape(1, 4, 1, 1), name="c")
    m = b.op("mul", c, t, name="m")                          # the transposed value on the right
    e = b.op("exp", m, name="e")
    before = b.build([b.op("transpose", e, perm=TO_NHWC, name="y")])
    assert_graph_text(run(before).graph, """
        graph main(%x: float32[1x2x3x4]) {
          %c_t = constant float32[1, 1, 1, 4][1.0, 2.0, 3.0, 4.0] : float32[1x1x1x4]
          %m = mul(%c_t, %x) {shift=0}
          %e = exp(%m)
          return %e
        }""")


def test_int32_per_channel_constant_operand_is_permuted_with_its_axis():
    assert_rewrites(passes, """
        graph main(%x: int32[1x2x3x4] {s=0.5 zp=0}) {
          %t = transpose(%x) {perm=(0, 3, 1, 2)}
          %c = constant() {data=array(int32[1x4x1x1], [1, -2, 3, -4]),
                           quant=quant(int32 {s=[1.0,2.0,3.0,4.0] zp=[0,0,0,0] axis=1})}
          %m = mul(%t, %c) {shift=1}
          %y = transpose(%m) {perm=(0, 2, 3, 1)} : int32[1x2x3x4] {s=[1.0,2.0,3.0,4.0] zp=[0,0,0,0] axis=3}
          return %y
        }""", """
        graph main(%x: int32[1x2x3x4] {s=0.5 zp=0}) {
          %c = constant() {data=array(int32[1x1x1x4], [1, -2, 3, -4]),
                           quant=quant(int32 {s=[1.0,2.0,3.0,4.0] zp=[0,0,0,0] axis=3})}
          %m = mul(%x, %c) {shift=1}
          return %m
        }""")


def test_reshape_reads_past_a_transpose_that_only_moves_unit_dims():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 1, 4, 3), DType.INT8, Q))
    t = b.op("transpose", x, perm=TO_NHWC)                   # 1x4x3x1: same element order
    before = b.build([b.op("reshape", t, shape=(1, 12), name="flat")])
    assert_graph_text(run(before).graph, """
        graph main(%x: int8[1x1x4x3] {s=0.05 zp=-3}) {
          %flat = reshape(%x) {shape=(1, 12)}
          return %flat
        }""")


def test_reshape_after_a_real_transpose_keeps_it():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 4, 3), DType.INT8, Q))
    t = b.op("transpose", x, perm=TO_NCHW)
    before = b.build([b.op("reshape", t, shape=(1, 24), name="flat")])
    assert not run(before).changed


def test_reshape_chains_collapse_and_identity_reshapes_go():
    """The fuzzer's shape: reshape -> reshape -> reshape back to the input shape -> transpose."""
    b = GraphBuilder()
    x = b.input("x", TensorType((4, 2), DType.INT8, Q))
    r1 = b.op("reshape", x, shape=(1, 4, 1, 2), name="r1")
    r2 = b.op("reshape", b.op("reshape", r1, shape=(8,), name="r_flat"), shape=(4, 2), name="r2")
    same = b.op("reshape", r2, shape=(4, 2), name="same")
    before = b.build([r1, b.op("transpose", same, perm=(1, 0), name="t")])
    assert_graph_text(run(before).graph, """
        graph main(%x: int8[4x2] {s=0.05 zp=-3}) {
          %r1 = reshape(%x) {shape=(1, 4, 1, 2)}
          %t = transpose(%x) {perm=(1, 0)}
          return %r1, %t
        }""")


@pytest.mark.parametrize("extra_use", ["middle", "first"])
def test_no_sinking_when_a_moved_value_has_another_user(extra_use):
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 3, 4), DType.INT8, Q))
    t = b.op("transpose", x, perm=TO_NCHW, name="t")
    r = b.op("rescale", t, out=QuantSpec.per_tensor(0.1), name="r")
    y = b.op("transpose", r, perm=TO_NHWC, name="y")
    before = b.build([y, r if extra_use == "middle" else t])
    result = run(before)
    assert not result.changed and result.graph is before


def test_a_shared_first_transpose_still_composes_for_each_user():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 3, 4), DType.FLOAT32))
    t = b.op("transpose", x, perm=TO_NCHW, name="t")
    y1 = b.op("transpose", t, perm=TO_NHWC, name="y1")
    y2 = b.op("transpose", t, perm=(0, 1, 3, 2), name="y2")
    before = b.build([y1, y2, t])
    assert_graph_text(run(before).graph, """
        graph main(%x: float32[1x2x3x4]) {
          %t = transpose(%x) {perm=(0, 3, 1, 2)}
          %y2 = transpose(%x) {perm=(0, 3, 2, 1)}
          return %x, %y2, %t
        }""")


def test_long_chain_of_alternating_transposes_cancels_completely():
    b = GraphBuilder()
    v = b.input("x", TensorType((1, 2, 3, 4), DType.INT8, Q))
    for i in range(3):
        v = b.op("transpose", v, perm=TO_NCHW)
        v = b.op("clamp", v, min=-100 + i, max=100 - i, name=f"c{i}")
        v = b.op("transpose", v, perm=TO_NHWC)
    result = run(b.build([v]))
    assert result.graph.count_ops() == {"clamp": 3}
