"""The verifier: one broken graph per rule (built by hand, since the builder refuses invalid
ops), each must raise a VerificationError naming the rule and the offending value."""

import numpy as np
import pytest

from qlower.errors import VerificationError
from qlower.ir import RULES, DType, Graph, GraphBuilder, Op, Origin, QuantSpec, TensorType, Value, verify_graph
from qlower.ir.opdefs import normalize_attrs

S_IN, S_W = 0.05, 0.02
XQ = QuantSpec.per_tensor(S_IN, -3)
WQ = QuantSpec.per_tensor(S_W, 0)


def _val(name, shape, dtype=DType.INT8, quant=None, origin=None):
    return Value(name, TensorType(shape, dtype, quant), origin)


def _op(kind, operands, results, **attrs):
    return Op(kind, tuple(operands), normalize_attrs(kind, attrs), tuple(results))


def _const(name, data, quant=None):
    data = np.asarray(data)
    v = _val(name, data.shape, DType.from_numpy(data.dtype), quant)
    return v, _op("constant", (), (v,), data=data, quant=quant)


def _assert_broken(graph: Graph, rule: str, *names: str):
    with pytest.raises(VerificationError) as e:
        verify_graph(graph)
    msg = str(e.value)
    assert f"[{rule}]" in msg, msg
    for n in names:
        assert f"%{n}" in msg, msg
    return msg


def _conv_graph(acc_quant):
    """int8 input, int8 weight; accumulator typed with ``acc_quant``."""
    x = _val("x", (1, 4, 4, 2), quant=XQ)
    w, wop = _const("w", np.ones((3, 1, 1, 2), np.int8), WQ)
    acc = _val("acc", (1, 4, 4, 3), DType.INT32, acc_quant)
    return Graph((x,), (wop, _op("conv2d", (x, w, None), (acc,))), (acc,))


def test_rules_table_lists_the_documented_rules():
    assert list(RULES) == ["ssa", "complete-types", "integers-are-quantized", "quant-spec-valid",
                           "types-match-registry", "runnable"]


# -- valid graphs pass ------------------------------------------------------------------


def test_correct_accumulator_scale_passes():
    good = QuantSpec(DType.INT32, (S_IN * S_W,), (0,), DType.INT32.min, DType.INT32.max)
    g = _conv_graph(good)
    assert verify_graph(g) is g


def test_valid_built_graphs_pass():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 6, 6, 4), DType.INT8, XQ))
    w = b.constant(np.ones((8, 3, 3, 4), np.int8), QuantSpec.per_channel(np.linspace(0.01, 0.08, 8), axis=0), name="w")
    acc = b.op("conv2d", x, w, None, pad=(1, 1, 1, 1))
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.1, 5))
    y32 = b.op("rescale", y, out=QuantSpec.per_tensor(0.001, 0, DType.INT32))
    s = b.op("add", y32, y32)
    z = b.op("rescale", s, out=QuantSpec.per_tensor(0.2, 0))
    cat = b.op("concat", (y, y), axis=3)
    f = b.op("dequantize", z, None)
    codes, scale = b.op("dynamic_quantize", f)
    back = b.op("dequantize", codes, scale)
    g = b.build([cat, back])
    assert verify_graph(g) is g


# -- ssa --------------------------------------------------------------------------------


def test_use_before_def():
    x = _val("x", (4,), DType.FLOAT32)
    a = _val("a", (4,), DType.FLOAT32)
    b = _val("b", (4,), DType.FLOAT32)
    ops = (_op("add", (x, b), (a,)), _op("exp", (x,), (b,)))  # %b used by the first op, defined by the second
    msg = _assert_broken(Graph((x,), ops, (a,)), "ssa", "b", "a")
    assert "not defined before" in msg


def test_dangling_output():
    x = _val("x", (4,), DType.FLOAT32)
    y = _val("y", (4,), DType.FLOAT32)
    ghost = _val("ghost", (4,), DType.FLOAT32)
    msg = _assert_broken(Graph((x,), (_op("exp", (x,), (y,)),), (y, ghost)), "ssa", "ghost")
    assert "graph output %ghost is not defined" in msg


def test_value_defined_twice():
    x = _val("x", (4,), DType.FLOAT32)
    y = _val("y", (4,), DType.FLOAT32)
    ops = (_op("exp", (x,), (y,)), _op("tanh", (x,), (y,)))
    msg = _assert_broken(Graph((x,), ops, (y,)), "ssa", "y")
    assert "defined twice" in msg


def test_input_listed_twice():
    x = _val("x", (4,), DType.FLOAT32)
    msg = _assert_broken(Graph((x, x), (), (x,)), "ssa", "x")
    assert "input twice" in msg


def test_origin_is_named_in_messages():
    x = _val("x", (4,), DType.FLOAT32)
    y = _val("y", (4,), DType.FLOAT32, origin=Origin(node="relu_3", module="body.block1", source="model.py:42"))
    msg = _assert_broken(Graph((x,), (), (y,)), "ssa", "y")
    assert "body.block1.relu_3 (model.py:42)" in msg


# -- complete-types ----------------------------------------------------------------------


def test_negative_dimension():
    x = _val("x", (2, -1), DType.FLOAT32)
    msg = _assert_broken(Graph((x,), (), (x,)), "complete-types", "x")
    assert "invalid shape (2, -1)" in msg


def test_missing_dtype():
    x = Value("x", TensorType((2,), "int8"))  # a string is not a DType
    msg = _assert_broken(Graph((x,), (), (x,)), "complete-types", "x")
    assert "no complete type" in msg


# -- integers-are-quantized --------------------------------------------------------------


def test_int8_value_without_quantspec():
    x = _val("x", (4,), DType.INT8, None)
    msg = _assert_broken(Graph((x,), (), (x,)), "integers-are-quantized", "x")
    assert "int8 but carries no QuantSpec" in msg


def test_int32_accumulator_without_quantspec():
    msg = _assert_broken(_conv_graph(None), "integers-are-quantized", "acc")
    assert "int32 but carries no QuantSpec" in msg


def test_float_with_quantspec():
    x = _val("x", (4,), DType.FLOAT32, QuantSpec.per_tensor(0.1))
    msg = _assert_broken(Graph((x,), (), (x,)), "integers-are-quantized", "x")
    assert "float32 but carries a QuantSpec" in msg


def test_quantspec_dtype_disagrees_with_value_dtype():
    x = _val("x", (4,), DType.INT8, QuantSpec.per_tensor(0.1, 0, DType.INT16))
    msg = _assert_broken(Graph((x,), (), (x,)), "integers-are-quantized", "x")
    assert "QuantSpec says int16" in msg


# -- quant-spec-valid --------------------------------------------------------------------


def test_per_channel_spec_with_wrong_scale_count():
    w = _val("w", (4, 3, 3, 2), DType.INT8, QuantSpec.per_channel([0.1, 0.2, 0.3], axis=0))
    msg = _assert_broken(Graph((w,), (), (w,)), "quant-spec-valid", "w")
    assert "3 scales for 4 channels on axis 0" in msg


@pytest.mark.parametrize("scale", [0.0, -0.5, float("inf"), float("nan")])
def test_non_positive_or_non_finite_scale(scale):
    x = _val("x", (4,), DType.INT8, QuantSpec.per_tensor(scale))
    msg = _assert_broken(Graph((x,), (), (x,)), "quant-spec-valid", "x")
    assert "non-positive or non-finite scale" in msg


@pytest.mark.parametrize("scales, zero_points, says", [
    ([0.1, float("nan"), 0.2], [0, 0, 0], "non-positive or non-finite scale"),
    ([0.1, 0.2, -0.3], [0, 0, 0], "non-positive or non-finite scale"),
    ([0.1, 0.2, 0.3], [0, -129, 0], "zero point outside int8"),
    ([0.1, 0.2, 0.3], [0, 0, 128], "zero point outside int8"),
])
def test_one_bad_channel_among_many(scales, zero_points, says):
    w = _val("w", (3, 2), DType.INT8, QuantSpec.per_channel(scales, zero_points, axis=0))
    assert says in _assert_broken(Graph((w,), (), (w,)), "quant-spec-valid", "w")


def test_quantspec_holds_plain_python_numbers():
    """numpy scalars of any width and Python numbers make the same, hashable spec; the accumulator's
    scales are the float64 products s_in * s_w[c]."""
    scales32 = np.array([0.1, 0.25, 3e-5], np.float32)
    a = QuantSpec.per_channel(scales32, np.array([1, -2, 3], np.int64), axis=0)
    b = QuantSpec(DType.INT8, tuple(float(s) for s in scales32), (1, -2, 3), -128, 127, axis=0)
    assert a == b and hash(a) == hash(b)
    assert all(type(s) is float for s in a.scale) and all(type(z) is int for z in a.zero_point)
    acc = QuantSpec.accumulator(XQ, a, axis=0)
    assert acc.scale == tuple(S_IN * float(s) for s in scales32)


def test_range_outside_dtype():
    x = _val("x", (4,), DType.INT8, QuantSpec.per_tensor(0.1, 0, DType.INT8, qmin=-200, qmax=127))
    msg = _assert_broken(Graph((x,), (), (x,)), "quant-spec-valid", "x")
    assert "range [-200, 127] outside int8" in msg


def test_qmin_above_qmax():
    x = _val("x", (4,), DType.INT8, QuantSpec.per_tensor(0.1, 0, DType.INT8, qmin=10, qmax=5))
    _assert_broken(Graph((x,), (), (x,)), "quant-spec-valid", "x")


def test_zero_point_outside_dtype():
    x = _val("x", (4,), DType.INT8, QuantSpec.per_tensor(0.1, 200))
    msg = _assert_broken(Graph((x,), (), (x,)), "quant-spec-valid", "x")
    assert "zero point outside int8" in msg


def test_several_scales_without_axis():
    x = _val("x", (2,), DType.INT8, QuantSpec(DType.INT8, (0.1, 0.2), (0, 0), -128, 127))
    msg = _assert_broken(Graph((x,), (), (x,)), "quant-spec-valid", "x")
    assert "2 scales but no channel axis" in msg


def test_scales_and_zero_points_disagree():
    x = _val("x", (2,), DType.INT8, QuantSpec(DType.INT8, (0.1, 0.2), (0,), -128, 127, axis=0))
    msg = _assert_broken(Graph((x,), (), (x,)), "quant-spec-valid", "x")
    assert "2 scales but 1 zero points" in msg


def test_channel_axis_outside_rank():
    x = _val("x", (2, 3), DType.INT8, QuantSpec.per_channel([0.1, 0.2, 0.3], axis=2))
    msg = _assert_broken(Graph((x,), (), (x,)), "quant-spec-valid", "x")
    assert "channel axis 2 outside rank 2" in msg


# -- types-match-registry ----------------------------------------------------------------


def test_int32_accumulator_with_wrong_scale():
    wrong = QuantSpec(DType.INT32, (S_IN * S_W * 2,), (0,), DType.INT32.min, DType.INT32.max)
    msg = _assert_broken(_conv_graph(wrong), "types-match-registry", "acc")
    assert "the registry infers int32[1x4x4x3] {s=0.001 zp=0}" in msg


def test_per_channel_accumulator_with_wrong_scales():
    ws = QuantSpec.per_channel([0.1, 0.2, 0.4], axis=0)
    x = _val("x", (1, 4), quant=XQ)
    w, wop = _const("w", np.ones((3, 4), np.int8), ws)
    acc = _val("acc", (1, 3), DType.INT32, QuantSpec.per_channel([S_IN * 0.1, S_IN * 0.2, S_IN * 0.3],
                                                                axis=1, dtype=DType.INT32))
    g = Graph((x,), (wop, _op("fully_connected", (x, w, None), (acc,))), (acc,))
    _assert_broken(g, "types-match-registry", "acc")


def test_broadcasting_mismatch_on_add():
    a = _val("a", (2, 3), DType.FLOAT32)
    b = _val("b", (2, 4), DType.FLOAT32)
    s = _val("s", (2, 4), DType.FLOAT32)
    msg = _assert_broken(Graph((a, b), (_op("add", (a, b), (s,)),), (s,)), "types-match-registry", "s")
    assert "don't broadcast" in msg


def test_add_of_int32_values_in_different_scales():
    q1 = QuantSpec.per_tensor(0.1, 0, DType.INT32)
    q2 = QuantSpec.per_tensor(0.2, 0, DType.INT32)
    a, b, s = _val("a", (4,), DType.INT32, q1), _val("b", (4,), DType.INT32, q2), _val("s", (4,), DType.INT32, q1)
    msg = _assert_broken(Graph((a, b), (_op("add", (a, b), (s,)),), (s,)), "types-match-registry", "s")
    assert "share one per-tensor quantization" in msg


def test_concat_operands_in_different_domains():
    a = _val("a", (1, 2), quant=QuantSpec.per_tensor(0.1, 0))
    b = _val("b", (1, 2), quant=QuantSpec.per_tensor(0.1, 4))
    c = _val("cat", (1, 4), quant=QuantSpec.per_tensor(0.1, 0))
    g = Graph((a, b), (_op("concat", ((a, b),), (c,), axis=1),), (c,))
    msg = _assert_broken(g, "types-match-registry", "cat")
    assert "share one type domain" in msg


def test_missing_required_operand():
    x = _val("x", (1, 4, 4, 2), quant=XQ)
    acc = _val("acc", (1, 4, 4, 3), DType.INT32, QuantSpec.per_tensor(S_IN * S_W, 0, DType.INT32))
    g = Graph((x,), (_op("conv2d", (x, None, None), (acc,)),), (acc,))
    msg = _assert_broken(g, "types-match-registry", "acc")
    assert "operand 'weight' is required" in msg


def test_wrong_result_shape():
    x = _val("x", (2, 3), DType.FLOAT32)
    y = _val("y", (3, 2), DType.FLOAT32)
    msg = _assert_broken(Graph((x,), (_op("exp", (x,), (y,)),), (y,)), "types-match-registry", "y")
    assert "has type float32[3x2], the registry infers float32[2x3]" in msg


def test_unknown_op_kind():
    x = _val("x", (2,), DType.FLOAT32)
    y = _val("y", (2,), DType.FLOAT32)
    msg = _assert_broken(Graph((x,), (Op("frobnicate", (x,), {}, (y,)),), (y,)), "types-match-registry", "y")
    assert "unknown op kind 'frobnicate'" in msg


def test_unknown_attribute():
    x = _val("x", (2,), DType.FLOAT32)
    y = _val("y", (2,), DType.FLOAT32)
    msg = _assert_broken(Graph((x,), (Op("exp", (x,), {"alpha": 1}, (y,)),), (y,)), "types-match-registry", "y")
    assert "unknown attribute(s) ['alpha']" in msg


def test_op_missing_defaulted_attributes():
    # kernels and backends read every attribute: a hand-written op must carry them all
    x = _val("x", (1, 4, 4, 2), DType.FLOAT32)
    w, wop = _const("w", np.ones((3, 1, 1, 2), np.float32))
    y = _val("y", (1, 4, 4, 3), DType.FLOAT32)
    g = Graph((x,), (wop, Op("conv2d", (x, w, None), {"stride": (1, 1)}, (y,))), (y,))
    msg = _assert_broken(g, "types-match-registry", "y")
    assert "lacks attribute(s) ['dilation', 'groups', 'pad']" in msg


def test_op_missing_a_required_attribute():
    x = _val("x", (2, 3), DType.FLOAT32)
    y = _val("y", (3, 2), DType.FLOAT32)
    msg = _assert_broken(Graph((x,), (Op("transpose", (x,), {}, (y,)),), (y,)), "types-match-registry", "y")
    assert "missing attribute 'perm'" in msg


def test_wrong_number_of_results():
    x = _val("x", (2, 3), DType.FLOAT32)
    codes = _val("codes", (2, 3), DType.INT8, QuantSpec(DType.INT8, (1.0,), (0,), -127, 127, dynamic="per_tensor"))
    g = Graph((x,), (_op("dynamic_quantize", (x,), (codes,)),), (codes,))
    msg = _assert_broken(g, "types-match-registry")
    assert "dynamic_quantize has 1 results, the registry says 2" in msg


def test_every_broken_rule_is_reported_with_the_pass_name():
    x = _val("x", (4,), DType.INT8, None)                          # integers-are-quantized
    f = _val("f", (4,), DType.FLOAT32, QuantSpec.per_tensor(1.0))  # integers-are-quantized
    ghost = _val("ghost", (4,), DType.FLOAT32)                     # ssa
    with pytest.raises(VerificationError) as e:
        verify_graph(Graph((x, f), (), (ghost,), name="g1"), after="fold_constants")
    msg = str(e.value)
    assert msg.startswith("graph 'g1' is invalid after fold_constants:")
    assert msg.count("[integers-are-quantized]") == 2 and msg.count("[ssa]") == 1
