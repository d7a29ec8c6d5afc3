"""Non-GEMM CPU kernels and fusions are bit-exact with the reference interpreter.

Inputs come from ``random_inputs`` (codes anywhere in the dtype's range, not only
[qmin, qmax]); every graph runs under all configurations of
``qlower.testing.cpu_checks.CONFIGS`` with every intermediate value traced.
"""

import numpy as np
import pytest

from qlower.backends.cpu import native, prepare
from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify
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
    graph = verify(b.build(build(b)))
    return assert_cpu_matches_reference(graph, random_inputs(graph, seed), **kw)


@pytest.mark.parametrize("rounding", ["single", "double"])
def test_rescale_variants(rounding):
    def build(b):
        x = b.input("x", TensorType((2, 3, 4, 5), I8, q8(0.1, 7)))
        acc = b.input("acc", TensorType((1, 3, 4, 6), I32, QuantSpec(I32, tuple(np.linspace(1e-4, 3e-4, 6)),
                                                                       (0,) * 6, I32.min, I32.max, axis=3)))
        acc_axis1 = b.input("acc1", TensorType((1, 6, 4, 2), I32, QuantSpec(I32, tuple(np.linspace(1e-4, 3e-4, 6)),
                                                                          (0,) * 6, I32.min, I32.max, axis=1)))
        h = b.input("h", TensorType((3, 5), I16, QuantSpec.per_tensor(0.001, -30, I16)))
        return [b.op("rescale", x, out=q8(0.07, -3, qmin=-127, qmax=120), rounding=rounding),
                b.op("rescale", x, out=q32(0.1 / 2**10), rounding=rounding),
                b.op("rescale", acc, out=q8(0.3, 11), rounding=rounding),
                b.op("rescale", acc, out=QuantSpec.per_tensor(0.01, 4, I16), rounding=rounding),
                b.op("rescale", acc_axis1, out=q8(0.3, -2), rounding=rounding),
                b.op("rescale", h, out=q8(0.01, 1), rounding=rounding),
                b.op("rescale", h, out=q32(0.001 / 2**12), rounding=rounding)]
    check(build)


def test_clamp_add_sub_mul_with_broadcast_and_per_channel_constants():
    rng = np.random.default_rng(0)

    def build(b):
        x = b.input("x", TensorType((1, 4, 5, 6), I8, q8(0.1, 3)))
        x32 = b.op("rescale", x, out=q32(0.1 / 2**8))
        c = b.constant(rng.integers(-2**12, 2**12, (1, 1, 1, 6)).astype(np.int32), q32(0.1 / 2**8), name="c")
        s = b.op("add", x32, c)
        d = b.op("sub", c, x32)
        cm = b.constant(rng.integers(-300, 300, (1, 1, 1, 6)).astype(np.int32),
                        QuantSpec(I32, tuple(rng.uniform(0.01, 0.02, 6)), (0,) * 6, I32.min, I32.max, axis=3))
        m = b.op("mul", x32, cm, shift=7)
        m0 = b.op("mul", x32, x32, shift=0)
        f = b.input("f", TensorType((2, 1, 3), F32))
        g = b.input("g", TensorType((2, 4, 1), F32))
        return [b.op("clamp", x, min=-20, max=30), b.op("clamp", s, min=-1000, max=5000), d, m, m0,
                b.op("add", f, g), b.op("sub", f, g), b.op("mul", f, g), b.op("clamp", f, min=-0.5, max=0.25)]
    check(build)


def test_intdiv_truncates_toward_zero_and_reports_division_by_zero():
    b = GraphBuilder("div")
    a = b.input("a", TensorType((8,), I32, q32(1.0)))
    c = b.input("c", TensorType((8,), I32, q32(1.0)))
    graph = verify(b.build([b.op("intdiv", a, c)]))
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
    graph = verify(b.build([b.op("add", a, a)]))
    big = [np.array([1, 2**30 + 5], np.int32)]
    with pytest.raises(ExecutionError, match="overflows int32"):
        run_graph(graph, big)
    with pytest.raises(ExecutionError, match="overflows int32"):
        prepare(graph).run(big)


@pytest.mark.parametrize("dtype", [I8, I16])
def test_avg_pool_int(dtype):
    def build(b):
        x = b.input("x", TensorType((2, 7, 9, 5), dtype, QuantSpec.per_tensor(0.1, -9, dtype)))
        return [b.op("avg_pool2d", x, kernel=(3, 3), stride=(2, 2), pad=(1, 1, 1, 1)),
                b.op("avg_pool2d", x, kernel=(2, 4), stride=(1, 3), pad=(0, 1, 2, 0)),
                b.op("avg_pool2d", x, kernel=(7, 9), stride=(1, 1))]
    check(build)


def test_pools_and_reductions():
    def build(b):
        x = b.input("x", TensorType((1, 6, 7, 4), I8, q8(0.1, 2)))
        f = b.input("f", TensorType((1, 6, 7, 4), F32))
        i32 = b.input("i", TensorType((1, 5, 3, 4), I32, q32(0.01)))
        return [b.op("max_pool2d", x, kernel=(3, 3), stride=(2, 2), pad=(1, 1, 1, 1)),
                b.op("max_pool2d", x, kernel=(2, 3), stride=(2, 1), pad=(1, 0, 2, 1)),
                b.op("max_pool2d", f, kernel=(3, 2), stride=(1, 2), pad=(2, 0, 0, 1)),
                b.op("max_pool2d", i32, kernel=(2, 2), stride=(1, 1), pad=(1, 1, 1, 1)),
                b.op("avg_pool2d", f, kernel=(3, 3), stride=(2, 2), pad=(1, 1, 1, 1)),
                b.op("reduce_sum", i32, axis=1), b.op("reduce_sum", f, axis=3),
                b.op("reduce_max", x, axis=2), b.op("reduce_max", f, axis=0)]
    check(build)


def test_data_movement():
    rng = np.random.default_rng(3)

    def build(b):
        x = b.input("x", TensorType((1, 4, 5, 6), I8, q8(0.1, 2)))
        y = b.input("y", TensorType((1, 4, 3, 6), I8, q8(0.1, 2)))
        c = b.constant(rng.integers(-128, 128, (1, 4, 2, 6)).astype(np.int8), q8(0.1, 2), name="c")
        cat = b.op("concat", (x, y, c), axis=2)
        t = b.op("transpose", cat, perm=(0, 3, 1, 2))
        r = b.op("reshape", t, shape=(6, 40))
        p = b.op("pad", x, pads=(0, 0, 1, 2, 0, 3, 2, 0), value=2)
        s = b.op("slice", cat, start=(0, 1, 0, 1), stop=(1, 4, 10, 6), step=(1, 2, 3, 2))
        f = b.input("f", TensorType((2, 3), F32))
        return [r, p, s, b.op("pad", f, pads=(1, 0, 0, 2), value=-1.5), b.op("transpose", f, perm=(1, 0)), c]
    check(build)


def test_table_quantize_dequantize_cast():
    rng = np.random.default_rng(4)

    def build(b):
        x = b.input("x", TensorType((3, 7), I8, q8(0.1, 2)))
        table = rng.integers(-128, 128, 256).astype(np.int16)
        t = b.op("table", x, table=table, offset=128, out=q8(0.02, -1))
        f = b.input("f", TensorType((2, 3, 4), F32))
        qt = b.op("quantize", f, out=q8(0.02, 3, qmin=-127, qmax=127))
        qc = b.op("quantize", f, out=QuantSpec.per_channel([0.01, 0.02, 0.05, 0.1], [0, 1, -2, 3], axis=2))
        q32_ = b.op("quantize", f, out=QuantSpec.per_tensor(1e-9, 0, I32))
        dc = b.op("dequantize", qc, None)
        acc = b.input("acc", TensorType((2, 4), I32, QuantSpec(I32, (1e-3, 2e-3, 3e-3, 4e-3), (0,) * 4,
                                                                I32.min, I32.max, axis=1)))
        flags = b.input("flags", TensorType((3,), DType.BOOL))
        return [b.op("cast", flags, dtype=F32), b.op("cast", flags, dtype=I8, out=q8(1.0)),
                t, qt, qc, q32_, dc, b.op("dequantize", x, None), b.op("dequantize", acc, None),
                b.op("cast", f, dtype=I8, out=q8(1.0)), b.op("cast", f, dtype=I32, out=q32(1.0)),
                b.op("cast", x, dtype=F32), b.op("cast", acc, dtype=I16, out=QuantSpec.per_tensor(1.0, 0, I16))]
    b = GraphBuilder("t")
    graph = verify(b.build(build(b)))
    inputs = random_inputs(graph, 0)
    inputs[1] = inputs[1] * np.float32(1e3)  # saturate casts and int32 quantization both ways
    inputs[1][0, 0, :2] = [2.5e9, -2.5e9]
    inputs[3] = np.array([True, False, True])
    assert_cpu_matches_reference(graph, inputs)


def test_float_ops_are_bit_identical():
    def build(b):
        f = b.input("f", TensorType((3, 4, 5), F32))
        return [b.op(k, f) for k in ("sigmoid", "tanh", "exp", "erf", "reciprocal")] + [
            b.op("softmax", f, axis=2), b.op("softmax", f, axis=0)]
    check(build)


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
