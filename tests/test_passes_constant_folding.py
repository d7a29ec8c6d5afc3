"""Constant folding: structural before/after texts (some as exact texts, qlower/ir/parser.py) plus
bit-identical runs.

S3 (SCENARIOS.md): a concat of quantized ramps folds to exactly the eager
quantized reference. The expected codes are derived by hand in the comments.
"""

import numpy as np
import pytest

from qlower.errors import VerificationError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.passes import FoldConstants, PassManager, default_pipeline, eliminate_dead_code, fold_constants
from qlower.reference import run_graph
from qlower.testing.graph_checks import assert_graph_text, assert_rewrites, assert_same_outputs

OUT = QuantSpec.per_tensor(1 / 127, 0, qmin=-127, qmax=127)
H = np.linspace(-1 + 1 / 5, 1 - 1 / 5, 5)   # -0.8 -0.4 0 0.4 0.8, varies along W
V = np.linspace(-1 + 1 / 4, 1 - 1 / 4, 4)   # -0.75 -0.25 0.25 0.75, varies along H
# Codes at scale 1/127: H*127 = -101.6 -50.8 0 50.8 101.6 -> round; V*127 = -95.25 -31.75 31.75 95.25.
H_CODES = [-102, -51, 0, 51, 102]
V_CODES = [-95, -32, 32, 95]


def h_ramp() -> np.ndarray:
    """The horizontal ramp of S3, NHWC [1, 4, 5, 1]."""
    return np.broadcast_to(H.reshape(1, 1, 5, 1), (1, 4, 5, 1)).astype(np.float32)


def v_ramp() -> np.ndarray:
    return np.broadcast_to(V.reshape(1, 4, 1, 1), (1, 4, 5, 1)).astype(np.float32)


def checker() -> np.ndarray:
    """+0.5 where (h + w) is even, -0.5 elsewhere."""
    hh, ww = np.meshgrid(np.arange(4), np.arange(5), indexing="ij")
    return np.where((hh + ww) % 2 == 0, 0.5, -0.5).reshape(1, 4, 5, 1).astype(np.float32)


def fold(graph):
    return PassManager([fold_constants, eliminate_dead_code], verify=True)(graph).graph


def quantized(b, data, scale, name):
    """float constant -> quantize at its own scale -> rescale to the shared output scale (S3 variant)."""
    c = b.constant(data, name=name)
    q = b.op("quantize", c, out=QuantSpec.per_tensor(scale, 0), name=name + "_q")
    return b.op("rescale", q, out=OUT, name=name + "_r")


def folded_codes(graph) -> np.ndarray:
    assert [op.kind for op in graph.ops] == ["constant"]
    return graph.ops[0].attrs["data"]


def test_s3_concat_of_two_quantized_ramps_folds_to_the_eager_codes():
    b = GraphBuilder()
    h = b.op("quantize", b.constant(h_ramp(), name="h"), out=OUT, name="hq")
    v = b.op("quantize", b.constant(v_ramp(), name="v"), out=OUT, name="vq")
    before = b.build([b.op("concat", (h, v), axis=3, name="cat")])
    after = fold(before)
    assert_graph_text(after, """
        graph main() {
          %cat = constant : int8[1x4x5x2] {s=0.00787402 zp=0 q=[-127,127]}
          return %cat
        }""")
    codes = folded_codes(after)
    assert codes.dtype == np.int8
    for row in range(4):
        assert codes[0, row, :, 0].tolist() == H_CODES
    for col in range(5):
        assert codes[0, :, col, 1].tolist() == V_CODES
    assert_same_outputs(before, after, trials=1)


@pytest.mark.parametrize("order", ["hv", "hh", "vh"])
def test_s3_operands_with_their_own_scales_rescaled_before_concat(order):
    # h at scale 1/100: codes -80 -40 0 40 80; rescale by 1.27 -> -101.6 -50.8 ... -> H_CODES.
    # v at scale 1/160: codes -120 -40 40 120; rescale by 0.79375 -> -95.25 -31.75 ... -> V_CODES.
    b = GraphBuilder()
    make = {"h": lambda: quantized(b, h_ramp(), 1 / 100, "h"), "v": lambda: quantized(b, v_ramp(), 1 / 160, "v")}
    parts = tuple(make[k]() for k in order)
    before = b.build([b.op("concat", parts, axis=3, name="cat")])
    after = fold(before)
    codes = folded_codes(after)
    assert after.outputs[0].type == before.outputs[0].type
    expected = {"h": np.tile(H_CODES, (4, 1)), "v": np.tile(np.array(V_CODES)[:, None], (1, 5))}
    for ch, k in enumerate(order):
        assert np.array_equal(codes[0, :, :, ch], expected[k])
    assert_same_outputs(before, after, trials=1)


def test_s3_three_inputs_with_three_scales():
    # The checkerboard at scale 1/64 holds codes +-32; rescaled by 127/64 = 1.984375 they are +-63.5,
    # which TOSA's SINGLE_ROUND rounds half up: +64 and -63 (quantizing 0.5 directly would give +-64).
    # A fold that read the checkerboard's codes with the output scale would give +-32.
    b = GraphBuilder()
    parts = (quantized(b, h_ramp(), 1 / 100, "h"), quantized(b, v_ramp(), 1 / 160, "v"),
             quantized(b, checker(), 1 / 64, "c"))
    before = b.build([b.op("concat", parts, axis=3, name="cat")])
    after = default_pipeline(verify=True)(before).graph
    codes = folded_codes(after)
    assert codes.shape == (1, 4, 5, 3)
    assert np.array_equal(codes[0, :, :, 0], np.tile(H_CODES, (4, 1)))
    assert np.array_equal(codes[0, :, :, 1], np.tile(np.array(V_CODES)[:, None], (1, 5)))
    assert np.array_equal(codes[0, :, :, 2], np.where(checker()[0, :, :, 0] > 0, 64, -63))
    assert_same_outputs(before, after, trials=1)


def test_s3_one_constant_and_one_runtime_input_folds_only_the_constant_side():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4, 5, 1), DType.INT8, OUT))
    before = b.build([b.op("concat", (quantized(b, h_ramp(), 1 / 100, "h"), x), axis=3, name="cat")])
    after = fold(before)
    assert_graph_text(after, """
        graph main(%x: int8[1x4x5x1] {s=0.00787402 zp=0 q=[-127,127]}) {
          %h_r = constant : int8[1x4x5x1] {s=0.00787402 zp=0 q=[-127,127]}
          %cat = concat((%h_r, %x)) {axis=3}
          return %cat
        }""")
    xs = np.arange(-10, 10, dtype=np.int8).reshape(1, 4, 5, 1)
    (out,) = run_graph(after, [xs])
    assert np.array_equal(out[0, :, :, 0], np.tile(H_CODES, (4, 1)))
    assert np.array_equal(out[..., 1:], xs)
    assert_same_outputs(before, after)


def test_conv_of_constants_folds_through_the_int32_accumulator():
    # x codes 1 2 3 4 (s=0.5) times w code 3 (s=0.25): accumulator codes 3 6 9 12 at s=0.125;
    # rescale to s=0.25 halves them: 1.5 3 4.5 6 -> round half up -> 2 3 5 6.
    assert_rewrites(fold, """
        graph main() {
          %x = constant() {data=array(int8[1x2x2x1], [1, 2, 3, 4]), quant=quant(int8 {s=0.5 zp=0})}
          %w = constant() {data=array(int8[1x1x1x1], [3]), quant=quant(int8 {s=0.25 zp=0})}
          %acc = conv2d(%x, %w, none) {dilation=(1, 1), groups=1, pad=(0, 0, 0, 0), stride=(1, 1)}
          %y = rescale(%acc) {out=quant(int8 {s=0.25 zp=0})}
          return %y
        }""", """
        graph main() {
          %y = constant() {data=array(int8[1x2x2x1], [2, 3, 5, 6]), quant=quant(int8 {s=0.25 zp=0})}
          return %y
        }""")


def test_transposed_per_channel_weight_folds_with_its_channel_axis_moved():
    # the weight [in, out] with one scale per output column, transposed to [out, in]: folded, its
    # data transposed and its channel axis moved from 1 to 0
    assert_rewrites(fold, """
        graph main(%x: int8[2x3] {s=0.1 zp=2}) {
          %w = constant() {data=array(int8[3x4], [-6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5]),
                           quant=quant(int8 {s=[0.5,0.25,0.125,0.0625] zp=[0,0,0,0] axis=1})}
          %w_oi = transpose(%w) {perm=(1, 0)}
          %fc = fully_connected(%x, %w_oi, none)
          return %fc
        }""", """
        graph main(%x: int8[2x3] {s=0.1 zp=2}) {
          %w_oi = constant() {data=array(int8[4x3], [-6, -2, 2, -5, -1, 3, -4, 0, 4, -3, 1, 5]),
                              quant=quant(int8 {s=[0.5,0.25,0.125,0.0625] zp=[0,0,0,0] axis=0})}
          %fc = fully_connected(%x, %w_oi, none)
          return %fc
        }""")


def test_large_results_are_not_folded_except_weight_transforms():
    b = GraphBuilder()
    c = b.constant(np.ones((4, 8), np.float32), name="c")
    big = b.op("sigmoid", c, name="big")                 # 128 bytes > 64
    moved = b.op("transpose", c, perm=(1, 0), name="moved")  # 128 bytes, but a weight transform
    before = b.build([big, moved])
    after = PassManager([FoldConstants(max_bytes=64), eliminate_dead_code])(before).graph
    assert [op.kind for op in after.ops] == ["constant", "sigmoid", "constant"]
    assert_same_outputs(before, after, trials=1)
    assert [op.kind for op in fold(before).ops] == ["constant", "constant"]


def test_multi_result_and_dynamic_ops_are_not_folded():
    b = GraphBuilder()
    c = b.constant(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), name="c")
    codes, scale = b.op("dynamic_quantize", c, granularity="per_row")
    before = b.build([b.op("dequantize", codes, scale, name="y")])
    result = PassManager([fold_constants])(before)
    assert not result.changed
    assert result.graph is before


def test_an_op_that_fails_on_its_constants_is_refused_before_folding():
    """A constant zero divisor: the IR verifier's 'runnable' rule refuses the graph before any pass
    (issue 30: what the reference can't run, no target runs), so folding never meets it."""
    b = GraphBuilder()
    s = QuantSpec.per_tensor(1.0, 0, DType.INT32)
    a = b.constant(np.array([6, 7], np.int32), s, name="a")
    z = b.constant(np.array([0, 1], np.int32), s, name="z")
    before = b.build([b.op("intdiv", a, z, name="q")])
    with pytest.raises(VerificationError, match="intdiv"):
        fold(before)


def test_dequantize_of_a_constant_is_kept_so_codes_reach_integer_backends():
    import numpy as np

    from qlower.ir import GraphBuilder, QuantSpec, verify_graph
    from qlower.passes.constant_folding import fold_constants

    b = GraphBuilder()
    k = b.constant(np.array([[-102, 0, 102]], np.int8), QuantSpec.per_tensor(1 / 127, 0, qmin=-127, qmax=127), name="k")
    out = b.op("dequantize", k, None, name="out")
    g = verify_graph(b.build([out]))
    result = fold_constants(g)
    assert [op.kind for op in result.graph.ops] == ["constant", "dequantize"]
