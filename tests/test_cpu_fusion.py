"""CPU fusions are bit-exact with the reference interpreter, and integer errors read like its own.

Each kernel against the reference, op by op, is tests/test_kernel_conformance.py;
here are the chains the plan fuses (the native quantized add, conv + rescale) and
the exact values and messages of integer division and int32 overflow. Every graph
runs under all configurations of ``qlower.testing.cpu_checks.CONFIGS`` with every
intermediate value traced.
"""

import numpy as np
import pytest

from qlower.backends.cpu import lut, native, prepare
from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph
from qlower.testing.cpu_checks import assert_cpu_matches_reference
from qlower.testing.graph_checks import random_inputs

I8, I16, I32, F32 = DType.INT8, DType.INT16, DType.INT32, DType.FLOAT32


def q8(scale=0.05, zp=0, **kw):
    return QuantSpec.per_tensor(scale, zp, I8, **kw)


def q32(scale):
    return QuantSpec.per_tensor(scale, 0, I32)


def check(build, seed=0, **kw):
    b = GraphBuilder("t")
    graph = verify_graph(b.build(build(b)))
    return assert_cpu_matches_reference(graph, random_inputs(graph, seed), **kw)


def test_intdiv_truncates_toward_zero_and_reports_division_by_zero():
    b = GraphBuilder("div")
    a = b.input("a", TensorType((8,), I32, q32(1.0)))
    c = b.input("c", TensorType((8,), I32, q32(1.0)))
    graph = verify_graph(b.build([b.op("intdiv", a, c)]))
    av = np.array([7, -7, 7, -7, 0, 2**31 - 1, -(2**31), 5], np.int32)
    cv = np.array([2, 2, -2, -2, 3, -1, 7, 5], np.int32)
    assert_cpu_matches_reference(graph, [av, cv])
    np.testing.assert_array_equal(prepare(graph).run([av, cv])[0], [3, -3, -3, 3, 0, -(2**31) + 1, -306783378, 1])
    cv[2] = 0
    with pytest.raises(ExecutionError, match="by zero"):
        run_graph(graph, [av, cv])
    with pytest.raises(ExecutionError, match="by zero"):
        prepare(graph).run([av, cv])


def test_int32_add_overflow_raises_like_the_reference():
    b = GraphBuilder("ovf")
    a = b.input("a", TensorType((2,), I32, q32(1.0)))
    graph = verify_graph(b.build([b.op("add", a, a)]))
    big = [np.array([1, 2**30 + 5], np.int32)]
    with pytest.raises(ExecutionError, match="overflows int32"):
        run_graph(graph, big)
    with pytest.raises(ExecutionError, match="overflows int32"):
        prepare(graph).run(big)


def _quantized_add(b, kind, clamp, shape_a=(1, 5, 6, 8), shape_b=(1, 5, 6, 8)):
    a = b.input("a", TensorType(shape_a, I8, q8(0.05, -3)))
    c = b.input("c", TensorType(shape_b, I8, q8(0.08, 10)))
    common = q32(0.05 / 2**10)
    s = b.op(kind, b.op("rescale", a, out=common), b.op("rescale", c, out=common))
    y = b.op("rescale", s, out=q8(0.1, -128 if clamp else 5))
    return [b.op("clamp", y, min=-128, max=60) if clamp else y]


@pytest.mark.parametrize("kind", ["add", "sub"])
@pytest.mark.parametrize("clamp", [False, True])
def test_quantized_add_fuses_and_matches(kind, clamp):
    plans = check(lambda b: _quantized_add(b, kind, clamp))
    assert native.load() is not None, "the native CPU kernels did not build (scripts/setup_compiler.sh)"
    assert plans[0].fused == [f"rescale+rescale+{kind}+rescale" + ("+clamp" if clamp else "")]


def test_quantized_add_with_broadcast_is_not_fused_and_matches():
    plans = check(lambda b: _quantized_add(b, "add", False, shape_b=(1, 1, 1, 8)))
    assert plans[0].fused == []


def test_fusion_leaves_shared_intermediates_alone():
    """A rescale result read twice, or a graph output, stays a value of its own."""
    rng = np.random.default_rng(5)

    def build(b):
        x = b.input("x", TensorType((1, 4, 4, 3), I8, q8(0.1, 0)))
        w = b.constant(rng.integers(-128, 128, (4, 1, 1, 3)).astype(np.int8), QuantSpec.per_tensor(0.01), name="w")
        acc = b.op("conv2d", x, w, None)
        y = b.op("rescale", acc, out=q8(0.05, 0))
        return [b.op("clamp", y, min=0, max=127), b.op("clamp", y, min=-5, max=5)]
    plans = check(build)
    assert plans[0].fused == ["conv2d+rescale"]


def _shifted_add(b, kind, a_shape=(1, 256, 256, 1)):
    """TFLite's residual add: each input shifted left by a rescale, then scaled to a common int32 scale."""
    a = b.input("a", TensorType(a_shape, I8, q8(0.05, -3)))
    c = b.input("c", TensorType(a_shape, I8, q8(0.08, 10)))
    common = q32(0.08 / 2**20)

    def side(x, scale):
        return b.op("rescale", b.op("rescale", x, out=q32(scale / 2**20)), out=common, rounding="double")
    s = b.op(kind, side(a, 0.05), side(c, 0.08))
    y = b.op("rescale", s, out=q8(0.1, -100), rounding="double")
    return [b.op("clamp", y, min=-100, max=90)]


@pytest.mark.parametrize("kind", ["add", "sub"])
def test_shifted_residual_add_is_one_table_exact_on_every_code_pair(kind):
    """Every one of the 65,536 pairs of codes (the table's first and last entries included) against the
    reference, with the table kernel (native and torch), unfused, and traced op by op."""
    b = GraphBuilder("t")
    graph = verify_graph(b.build(_shifted_add(b, kind)))
    codes = np.arange(-128, 128, dtype=np.int8)
    pairs = [np.repeat(codes, 256).reshape(1, 256, 256, 1), np.tile(codes, 256).reshape(1, 256, 256, 1)]
    plans = assert_cpu_matches_reference(graph, pairs, configs=({}, {"native": False}, {"fuse": False}), trace=False)
    label = f"rescale+rescale+rescale+rescale+{kind}+rescale+clamp"
    assert plans[0].fused == plans[1].fused == [label]
    assert plans[2].fused == []


def test_a_chain_that_can_fail_is_not_tabled_and_raises_like_the_reference():
    """An output rescale by 2**22.5 takes sums in [-128, 128) only (TOSA's REQUIRE): no table (it would hide
    the error); the native add runs, matches the reference where the sums are small and raises where it does."""
    def build(b):
        a = b.input("a", TensorType((1, 2, 3, 4), I8, q8(0.05, 0)))
        c = b.input("c", TensorType((1, 2, 3, 4), I8, q8(0.05, 0)))
        s = b.op("add", b.op("rescale", a, out=q32(0.05)), b.op("rescale", c, out=q32(0.05)))
        return [b.op("rescale", s, out=q8(0.05 / 2**22.5, 0))]
    b = GraphBuilder("t")
    graph = verify_graph(b.build(build(b)))
    assert lut.table_of(graph.inputs[0], graph.inputs[1], list(graph.ops)) is None
    rng = np.random.default_rng(3)
    small = [rng.integers(-60, 61, (1, 2, 3, 4)).astype(np.int8) for _ in range(2)]
    plans = assert_cpu_matches_reference(graph, small, configs=({}, {"fuse": False}), trace=False)
    assert plans[0].fused == ["rescale+rescale+add+rescale"]
    big = [np.full((1, 2, 3, 4), 100, np.int8)] * 2
    with pytest.raises(ExecutionError, match="out of range"):
        run_graph(graph, big)
    with pytest.raises(ExecutionError, match="out of range"):
        plans[0].run(big)
