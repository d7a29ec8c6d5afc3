"""CPU conv2d / fully_connected / matmul kernels are bit-exact with the reference interpreter.

Each graph runs under every configuration of ``qlower.testing.cpu_checks.CONFIGS``
(native kernels on and off, the int8 / float32-split / float64 GEMM engines,
fusion off), unfused (the accumulator is an output) and fused with the following
rescale and clamp.
"""

import numpy as np
import pytest
import torch

from qlower.backends.cpu import gemm, prepare
from qlower.errors import ExecutionError, VerificationError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph
from qlower.testing.cpu_checks import assert_cpu_matches_reference
from qlower.testing.graph_checks import random_inputs


def conv_graph(x_shape, o, k, stride=(1, 1), dilation=(1, 1), pad=(0, 0, 0, 0), groups=1, x_zp=5,
               x_dtype=DType.INT8, per_channel=True, w_zp=0, bias=True, runtime_weights=False,
               output="requant", seed=0):
    rng = np.random.default_rng(seed)
    kh, kw = (k, k) if isinstance(k, int) else k
    ci = x_shape[3] // groups
    b = GraphBuilder("conv")
    s_x = 0.02
    x = b.input("x", TensorType(x_shape, x_dtype, QuantSpec.per_tensor(s_x, x_zp, x_dtype)))
    w_scales = rng.uniform(0.002, 0.01, o)
    w_q = (QuantSpec.per_channel(w_scales, np.broadcast_to(w_zp, (o,)), axis=0) if per_channel
           else QuantSpec.per_tensor(float(w_scales[0]), int(np.asarray(w_zp).reshape(-1)[0])))
    w_data = rng.integers(-128, 128, (o, kh, kw, ci)).astype(np.int8)
    if runtime_weights:
        w = b.input("w", TensorType(w_data.shape, DType.INT8, w_q))
    else:
        w = b.constant(w_data, w_q, name="w")
    acc_q = QuantSpec.accumulator(x.quant, w.quant, axis=0 if per_channel else None)
    bias_v = b.constant(rng.integers(-5000, 5000, o).astype(np.int32), acc_q, name="bias") if bias else None
    acc = b.op("conv2d", x, w, bias_v, stride=stride, dilation=dilation, pad=pad, groups=groups, name="acc")
    outputs = [acc]
    if output == "requant":
        k_total = kh * kw * ci
        s_out = s_x * float(w_scales.mean()) * np.sqrt(k_total) * 74 * 74 / 40
        y = b.op("rescale", acc, out=QuantSpec.per_tensor(s_out, -10), name="y")
        outputs = [b.op("clamp", y, min=-10, max=100, name="relu")]
    return verify_graph(b.build(outputs)), (w_data if runtime_weights else None)


CASES = {
    "pointwise": dict(x_shape=(1, 5, 7, 16), o=24, k=1),
    "pointwise_stride2_odd_batch2": dict(x_shape=(2, 7, 9, 8), o=12, k=1, stride=(2, 2)),
    "conv3x3_pad1": dict(x_shape=(1, 9, 11, 6), o=10, k=3, pad=(1, 1, 1, 1)),
    "conv3x3_strided_dilated_asym_pad": dict(x_shape=(1, 10, 9, 5), o=7, k=3, stride=(2, 1), dilation=(2, 3),
                                             pad=(0, 2, 1, 0)),
    "conv5x3_stride3x2": dict(x_shape=(1, 13, 12, 3), o=4, k=(5, 3), stride=(3, 2), pad=(2, 2, 1, 1)),
    "conv7x7_stride2_pad3": dict(x_shape=(1, 16, 16, 3), o=8, k=7, stride=(2, 2), pad=(3, 3, 3, 3)),
    "conv3x3x512_large_k": dict(x_shape=(1, 5, 5, 512), o=8, k=3, pad=(1, 1, 1, 1)),
    "depthwise_stride2": dict(x_shape=(1, 9, 9, 12), o=12, k=3, groups=12, stride=(2, 2), pad=(1, 1, 1, 1)),
    # the native depthwise kernel's 64-channel register blocks: full blocks and a 16-channel tail
    "depthwise_144ch_stride2_x_zp_min": dict(x_shape=(1, 7, 6, 144), o=144, k=3, groups=144, stride=(2, 2),
                                             pad=(0, 1, 0, 1), x_zp=-128),
    "depthwise_5x5_128ch": dict(x_shape=(1, 6, 7, 128), o=128, k=5, groups=128, pad=(2, 2, 2, 2), x_zp=127),
    "depthwise_multiplier2": dict(x_shape=(1, 8, 7, 4), o=8, k=3, groups=4, pad=(1, 1, 1, 1)),
    "depthwise_dilated_asym_pad": dict(x_shape=(1, 11, 10, 6), o=6, k=5, groups=6, dilation=(2, 2),
                                       pad=(4, 2, 3, 1)),
    "grouped2": dict(x_shape=(1, 6, 6, 8), o=6, k=3, groups=2, pad=(1, 1, 1, 1)),
    "grouped4_1x3": dict(x_shape=(1, 5, 5, 12), o=8, k=(1, 3), groups=4),
    "per_tensor_weights_with_zp": dict(x_shape=(1, 6, 6, 7), o=5, k=3, per_channel=False, w_zp=3),
    "per_channel_weight_zps": dict(x_shape=(1, 6, 5, 4), o=3, k=3, w_zp=(2, -1, 0), pad=(1, 1, 1, 1)),
    "depthwise_weight_zps": dict(x_shape=(1, 6, 5, 3), o=3, k=3, groups=3, w_zp=(2, -1, 0)),
    "x_zp_min": dict(x_shape=(1, 6, 6, 9), o=5, k=3, x_zp=-128, pad=(1, 1, 1, 1)),
    "x_zp_max": dict(x_shape=(1, 6, 6, 9), o=5, k=3, x_zp=127, pad=(2, 0, 0, 2)),
    "depthwise_x_zp_max": dict(x_shape=(1, 6, 6, 9), o=9, k=3, groups=9, x_zp=127, pad=(1, 1, 1, 1)),
    "int16_input": dict(x_shape=(1, 6, 6, 5), o=4, k=3, x_dtype=DType.INT16, x_zp=0, pad=(1, 1, 1, 1)),
    "no_bias": dict(x_shape=(1, 6, 6, 5), o=4, k=3, bias=False),
    "depthwise_no_bias": dict(x_shape=(1, 6, 6, 5), o=5, k=3, groups=5, bias=False),
    "runtime_weights": dict(x_shape=(1, 6, 6, 5), o=4, k=3, runtime_weights=True, pad=(1, 1, 1, 1)),
    "depthwise_runtime_weights": dict(x_shape=(1, 6, 6, 5), o=5, k=3, groups=5, runtime_weights=True),
}


@pytest.mark.parametrize("output", ["acc", "requant"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_conv2d_matches_reference(case, output):
    graph, w_data = conv_graph(output=output, **CASES[case])
    inputs = random_inputs(graph, seed=1)
    if w_data is not None:
        inputs[1] = w_data
    plans = assert_cpu_matches_reference(graph, inputs)
    if output == "requant":
        assert "conv2d+rescale+clamp" in plans[0].fused


def test_large_k_exercises_the_float32_reduction_split():
    """K = 3*3*512 with random int8 weights needs several float32 chunks; each chunk respects 2**24."""
    graph, _ = conv_graph(**CASES["conv3x3x512_large_k"])
    w = graph.constant_data(graph.ops[1].operands[1] if graph.ops[1].kind == "conv2d"
                            else next(op for op in graph.ops if op.kind == "conv2d").operands[1])
    w2d = w.reshape(w.shape[0], -1)
    p = gemm.pack(w2d, QuantSpec.per_tensor(1.0), None, None, DType.INT8, 5, "float32", cache=False)
    assert p.engine == "float32" and len(p.chunks) > 1
    assert p.chunks[0][0] == 0 and p.chunks[-1][1] == w2d.shape[1]
    assert all(a1 == b0 for (_, a1), (b0, _) in zip(p.chunks, p.chunks[1:]))
    amax = 128 + 5  # int8 codes minus zero point 5: -128 - 5
    for a, b in p.chunks:
        assert amax * int(np.abs(w2d[:, a:b].astype(np.int64)).sum(axis=1).max()) <= 2**24


def test_float32_chunks_of_worst_case_weights_hold_513_columns():
    """All |w| = 128 and |x - x_zp| up to 255: a chunk holds floor(2**24 / (255 * 128)) = 514 columns
    (514 * 32640 = 16776960 <= 2**24 < 515 * 32640)."""
    w_abs = np.full((3, 2000), 128, np.int64)
    chunks = gemm._f32_chunks(w_abs, 255)
    assert [b - a for a, b in chunks] == [514, 514, 514, 458]


def test_fully_connected_matches_reference():
    rng = np.random.default_rng(2)
    for per_row_shape, bias in (((2, 3, 37), True), ((5, 300), False), ((1, 1), True)):
        b = GraphBuilder("fc")
        k = per_row_shape[-1]
        x = b.input("x", TensorType(per_row_shape, DType.INT8, QuantSpec.per_tensor(0.03, -3)))
        w = b.constant(rng.integers(-128, 128, (11, k)).astype(np.int8),
                       QuantSpec.per_channel(rng.uniform(0.001, 0.01, 11)), name="w")
        acc_q = QuantSpec.accumulator(x.quant, w.quant, axis=0)
        bv = b.constant(rng.integers(-900, 900, 11).astype(np.int32), acc_q, name="b") if bias else None
        acc = b.op("fully_connected", x, w, bv)
        y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.03 * 0.005 * np.sqrt(k) * 74 * 74 / 40, 4))
        for outputs in ([acc], [y]):
            graph = verify_graph(b.build(outputs))
            assert_cpu_matches_reference(graph, random_inputs(graph, 3))


@pytest.mark.parametrize("zps", [(0, 0), (-7, 12), (127, -128)])
def test_int_matmul_matches_reference(zps):
    b = GraphBuilder("mm")
    a = b.input("a", TensorType((3, 5, 33), DType.INT8, QuantSpec.per_tensor(0.1, zps[0])))
    c = b.input("c", TensorType((3, 33, 6), DType.INT8, QuantSpec.per_tensor(0.2, zps[1])))
    acc = b.op("matmul", a, c)
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.1 * 0.2 * 60, 0))
    graph = verify_graph(b.build([acc, y]))
    assert_cpu_matches_reference(graph, random_inputs(graph, 4))


def test_float_gemms_match_reference_to_float64_rounding():
    rng = np.random.default_rng(5)
    b = GraphBuilder("float")
    x = b.input("x", TensorType((1, 7, 6, 4), DType.FLOAT32))
    w = b.constant(rng.standard_normal((5, 3, 3, 4)).astype(np.float32), name="w")
    bias = b.constant(rng.standard_normal(5).astype(np.float32), name="bias")
    y = b.op("conv2d", x, w, bias, stride=(2, 1), pad=(1, 0, 1, 1))
    dw = b.op("conv2d", y, b.constant(rng.standard_normal((5, 3, 3, 1)).astype(np.float32)), None, groups=5)
    flat = b.op("reshape", dw, shape=(1, int(np.prod(dw.shape))))
    fc = b.op("fully_connected", flat, b.constant(rng.standard_normal((3, flat.shape[1])).astype(np.float32)), None)
    m = b.op("matmul", b.op("reshape", fc, shape=(1, 3, 1)), b.op("reshape", fc, shape=(1, 1, 3)))
    graph = verify_graph(b.build([m]))
    assert_cpu_matches_reference(graph, random_inputs(graph, 6), float_rtol=1e-6)


def test_accumulator_overflow_raises_like_the_reference():
    b = GraphBuilder("overflow")
    x = b.input("x", TensorType((1, 1, 1, 1), DType.INT8, QuantSpec.per_tensor(1.0, -128)))
    w = b.constant(np.full((1, 1, 1, 1), 127, np.int8), QuantSpec.per_tensor(1.0), name="w")
    acc_q = QuantSpec.accumulator(x.quant, w.quant, None)
    bias = b.constant(np.array([2**31 - 100], np.int32), acc_q, name="b")
    acc = b.op("conv2d", x, w, bias, name="acc")
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(2.0**20, 0), name="y")
    inputs = [np.full((1, 1, 1, 1), 127, np.int8)]  # (127 + 128) * 127 + 2**31 - 100 > 2**31 - 1
    for outputs in ([acc], [y]):
        graph = b.build(outputs)
        with pytest.raises(VerificationError, match="beyond the int32 accumulator"):   # refused statically too
            verify_graph(graph)
        with pytest.raises(ExecutionError, match="overflow"):
            run_graph(graph, inputs)
        for cfg in ({}, {"native": False}, {"gemm_engine": "float64"}):
            with pytest.raises(ExecutionError, match="overflow"):
                prepare(graph, **cfg).run(inputs)


def test_float32_engine_only_while_torch_float32_is_ieee():
    graph, _ = conv_graph(**CASES["conv3x3_pad1"])
    inputs = random_inputs(graph, 1)
    expected = run_graph(graph, inputs)
    plan = prepare(graph, gemm_engine="float32", native=False)
    assert plan.uses_float32
    try:
        torch.set_float32_matmul_precision("medium")  # lets oneDNN use bf16 for float32 GEMMs
        with pytest.raises(ExecutionError, match="precision"):
            plan.run(inputs)
        fallback = prepare(graph, gemm_engine="float32", native=False)
        assert not fallback.uses_float32  # float64 instead: still exact
        np.testing.assert_array_equal(fallback.run(inputs)[0], expected[0])
    finally:
        torch.set_float32_matmul_precision("highest")
    np.testing.assert_array_equal(plan.run(inputs)[0], expected[0])


@pytest.mark.parametrize("engine", [None, "int8"] if gemm.int_mm_exact() else [None])
def test_one_channel_pointwise_conv_reads_a_transposed_view_exactly(engine):
    """NCHW codes with one channel transposed to NHWC are a view whose size-1 channel dim keeps a
    stride of H*W: it counts as contiguous, and torch._int_mm used to read garbage from it."""
    b = GraphBuilder("one_channel")
    x = b.input("x", TensorType((2, 1, 4, 8), DType.INT8, QuantSpec.per_tensor(0.02, -30)))
    nhwc = b.op("transpose", x, perm=(0, 2, 3, 1))
    w = b.constant(np.array([[[[-127]]]], np.int8), QuantSpec.per_channel([6e-5], axis=0, qmin=-127, qmax=127))
    acc = b.op("conv2d", nhwc, w, None)
    out = b.op("rescale", acc, out=QuantSpec.per_tensor(0.002, -128))
    graph = verify_graph(b.build([out]))
    inputs = random_inputs(graph, 7)
    want = run_graph(graph, inputs)[0]
    plan = prepare(graph, gemm_engine=engine)
    for _ in range(5):  # the bad read was of uninitialised memory: it varied from run to run
        np.testing.assert_array_equal(plan.run(inputs)[0], want)
