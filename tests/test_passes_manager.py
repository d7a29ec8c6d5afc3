"""The pass manager: verification between passes, error messages, records, fixpoints;
and the default pipeline end to end on a small imported-looking graph."""

import numpy as np
import pytest

from qlower.errors import IRError, VerificationError
from qlower.ir import DType, Graph, GraphBuilder, Op, QuantSpec, TensorType, Value
from qlower.passes import (
    PassManager,
    PassResult,
    cancel_transposes,
    default_pipeline,
    eliminate_dead_code,
    fold_constants,
    pass_name,
)
from qlower.testing.graph_checks import assert_graph_text, assert_same_outputs

Q = QuantSpec.per_tensor(0.1, 0)


def small_graph() -> Graph:
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 2, 3), DType.INT8, Q))
    y = b.op("rescale", x, out=QuantSpec.per_tensor(0.2, 1), name="y")
    return b.build([y])


def broken_pass(graph: Graph) -> PassResult:
    """Hand-builds a rescale whose result claims int16 while its `out` says int8."""
    op = graph.ops[-1]
    wrong = Value(op.result.name, TensorType(op.result.shape, DType.INT16, QuantSpec.per_tensor(0.2, 1, DType.INT16)))
    bad = Op(op.kind, op.operands, op.attrs, (wrong,))
    return PassResult(Graph(graph.inputs, graph.ops[:-1] + (bad,), (wrong,), graph.name), True)


def test_a_broken_pass_is_named_with_the_passes_before_it():
    pm = PassManager([fold_constants, eliminate_dead_code, broken_pass, cancel_transposes], verify=True)
    with pytest.raises(VerificationError) as e:
        pm(small_graph())
    msg = str(e.value)
    assert "after pass 'broken_pass' (iteration 1)" in msg
    assert "passes run before it: fold_constants, eliminate_dead_code" in msg
    assert "the registry infers int8" in msg


def test_a_pass_that_claims_no_change_but_breaks_the_graph_is_caught():
    def quiet_breaker(graph):
        return PassResult(broken_pass(graph).graph, False)

    with pytest.raises(VerificationError, match="after pass 'quiet_breaker'"):
        PassManager([quiet_breaker], verify=True)(small_graph())


def test_a_pass_that_changes_the_signature_is_caught():
    def drop_rescale(graph):   # valid graph, but its output now has the input's type
        return PassResult(Graph(graph.inputs, (), graph.inputs, graph.name), True)

    with pytest.raises(VerificationError, match="changed its signature after pass 'drop_rescale'"):
        PassManager([eliminate_dead_code, drop_rescale], verify=True)(small_graph())


def test_without_verify_the_final_graph_is_still_checked():
    with pytest.raises(VerificationError, match="rerun with verify=True"):
        PassManager([eliminate_dead_code, broken_pass], verify=False)(small_graph())


def test_an_invalid_input_graph_is_reported_before_any_pass():
    bad = broken_pass(small_graph()).graph
    with pytest.raises(VerificationError, match="before any pass ran"):
        PassManager([eliminate_dead_code], verify=True)(bad)


def test_an_exception_inside_a_pass_says_which_pass_raised_it():
    def explode(graph):
        raise IRError("boom")

    with pytest.raises(IRError) as e:
        PassManager([eliminate_dead_code, explode])(small_graph())
    assert any("raised by pass 'explode'" in n and "before it: eliminate_dead_code" in n for n in e.value.__notes__)


def test_a_pass_must_return_a_pass_result():
    with pytest.raises(VerificationError, match="returned Graph, not a PassResult"):
        PassManager([lambda g: g])(small_graph())


def test_records_and_fixpoint():
    calls = []

    def always_changes(graph):
        calls.append(1)
        return PassResult(graph, True)

    pm = PassManager([always_changes, eliminate_dead_code], max_iterations=3)
    pm(small_graph())
    assert len(calls) == 3                   # bounded
    assert [(r.name, r.iteration) for r in pm.records][:2] == [("always_changes", 1), ("eliminate_dead_code", 1)]
    assert [r.changed for r in pm.records] == [True, False] * 3
    assert all(r.seconds >= 0 and r.ops_before == r.ops_after == 1 for r in pm.records)
    assert "always_changes" in pm.format_records()

    pm = PassManager([eliminate_dead_code], max_iterations=5)
    g = small_graph()
    assert not pm(g).changed and pm.run(g) is g
    assert len(pm.records) == 1              # nothing changed: the fixpoint is reached after one sweep


def test_default_pipeline_on_an_imported_looking_graph():
    # NHWC input; an NCHW-sensitive region (transpose there and back) around a rescale; an OIHW
    # weight transposed to OHWI at compile time; relu with zp == qmin; a dead debug branch.
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, QuantSpec.per_tensor(0.05, -4)))
    t = b.op("transpose", x, perm=(0, 3, 1, 2), name="to_nchw")
    r = b.op("rescale", t, out=QuantSpec.per_tensor(0.04, 0), name="r")
    back = b.op("transpose", r, perm=(0, 2, 3, 1), name="to_nhwc")
    w_oihw = np.arange(-12, 12, dtype=np.int8).reshape(3, 2, 2, 2)
    w = b.constant(w_oihw, QuantSpec.per_channel([0.01, 0.02, 0.03], axis=0), name="w_oihw")
    w_ohwi = b.op("transpose", w, perm=(0, 2, 3, 1), name="w")
    acc = b.op("conv2d", back, w_ohwi, None, name="acc")
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.02, -127, qmin=-127, qmax=127), name="y")
    relu = b.op("clamp", y, min=-127, max=127, name="relu")
    _debug = b.op("dequantize", acc, None, name="debug")
    before = b.build([relu])
    pm = default_pipeline(verify=True)
    result = pm(before)
    assert_graph_text(result.graph, """
        graph main(%x: int8[1x4x4x2] {s=0.05 zp=-4}) {
          %r = rescale(%x) {out={s=0.04 zp=0}, rounding=single}
          %w = constant : int8[3x2x2x2] {s=[0.01,0.02,0.03] zp=[0,0,0] axis=0}
          %acc = conv2d(%r, %w, none) {dilation=(1, 1), groups=1, pad=(0, 0, 0, 0), stride=(1, 1)}
          %y = rescale(%acc) {out={s=0.02 zp=-127 q=[-127,127]}, rounding=single}
          return %y
        }""")
    assert np.array_equal(result.graph.ops[1].attrs["data"], w_oihw.transpose(0, 2, 3, 1))
    assert_same_outputs(before, result.graph)
    assert {r.name for r in pm.records} == {"fold_constants", "cancel_transposes", "fuse_activations",
                                            "eliminate_dead_code"}
    assert pm.records[-1].changed is False   # stopped at a fixpoint
    assert [pass_name(p) for p in pm.passes] == [
        "fold_constants", "cancel_transposes", "fuse_activations", "eliminate_dead_code"]
