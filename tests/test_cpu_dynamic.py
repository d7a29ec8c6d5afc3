"""Dynamic quantization on the CPU: fused dynamic_quantize -> GEMM -> dequantize [-> add bias] kernels.

The contract (DESIGN.md) is 1e-5 relative to the reference; the fused kernels do
the reference's float32 operations in the reference's order, so these tests hold
them to bit identity (and check the 1e-5 contract explicitly too).
"""

import numpy as np
import pytest

from qlower.backends.cpu import prepare
from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph
from qlower.testing.cpu_checks import assert_cpu_matches_reference
from qlower.testing.graph_checks import random_inputs

F32 = DType.FLOAT32


def _weights(b, rng, shape, name="w"):
    return b.constant(rng.integers(-127, 128, shape).astype(np.int8),
                      QuantSpec.per_channel(rng.uniform(0.002, 0.02, shape[0])), name=name)


def _bias(b, rng, n, rank, name="bias"):
    return b.constant(rng.standard_normal((1,) * (rank - 1) + (n,)).astype(np.float32), name=name)


def _check(graph, fused, seed=0):
    inputs = random_inputs(graph, seed)
    expected = run_graph(graph, inputs)
    plans = assert_cpu_matches_reference(graph, inputs)  # bit-identical, every config, traced
    for e, g in zip(expected, plans[0].run(inputs)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=0)
    assert plans[0].fused == fused
    return plans


CONV_CASES = {  # granularity, kernel, groups, pad, bias: None / "after" / "before"
    "conv3x3_per_tensor_no_bias": ("per_tensor", 3, 1, (1, 1, 1, 1), None),
    "conv1x1_per_row_bias": ("per_row", 1, 1, (0, 0, 0, 0), "after"),
    "conv3x3_same_per_row": ("per_row", 3, 1, (1, 1, 1, 1), None),
    "depthwise_per_tensor_bias_first": ("per_tensor", 3, 8, (1, 1, 1, 1), "before"),
    "conv3x3_valid_per_tensor_bias": ("per_tensor", 3, 1, (0, 0, 0, 0), "after"),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_dynamic_conv(case):
    granularity, k, groups, pad, bias = CONV_CASES[case]
    rng = np.random.default_rng(0)
    b = GraphBuilder("dyn_conv")
    x = b.input("x", TensorType((1, 6, 7, 8), F32))
    codes, scale = b.op("dynamic_quantize", x, granularity=granularity)
    o = 8 if groups == 8 else 12
    acc = b.op("conv2d", codes, _weights(b, rng, (o, k, k, 8 // groups)), None, pad=pad, groups=groups)
    y = b.op("dequantize", acc, scale)
    if bias == "after":
        y = b.op("add", y, _bias(b, rng, o, 4))
    elif bias == "before":
        y = b.op("add", _bias(b, rng, o, 4), y)
    graph = verify_graph(b.build([y]))
    _check(graph, ["dynamic_quantize+conv2d+dequantize" + ("+add" if bias else "")])


@pytest.mark.parametrize("granularity", ["per_tensor", "per_row"])
@pytest.mark.parametrize("shape", [(4, 33), (2, 3, 33)])
def test_dynamic_fully_connected(granularity, shape):
    rng = np.random.default_rng(1)
    b = GraphBuilder("dyn_fc")
    x = b.input("x", TensorType(shape, F32))
    codes, scale = b.op("dynamic_quantize", x, granularity=granularity)
    y = b.op("dequantize", b.op("fully_connected", codes, _weights(b, rng, (10, 33)), None), scale)
    y = b.op("add", y, _bias(b, rng, 10, len(shape)))
    graph = verify_graph(b.build([y]))
    _check(graph, ["dynamic_quantize+fully_connected+dequantize+add"])


def test_shared_codes_feed_two_gemms():
    """One dynamic_quantize read by q and k projections: it runs once, each GEMM chain is fused."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("qk")
    x = b.input("x", TensorType((5, 16), F32))
    codes, scale = b.op("dynamic_quantize", x, granularity="per_row")
    q = b.op("add", b.op("dequantize", b.op("fully_connected", codes, _weights(b, rng, (16, 16), "wq"), None),
                         scale), _bias(b, rng, 16, 2, "bq"))
    k = b.op("dequantize", b.op("fully_connected", codes, _weights(b, rng, (8, 16), "wk"), None), scale)
    graph = verify_graph(b.build([q, k]))
    _check(graph, ["fully_connected+dequantize+add", "fully_connected+dequantize"])


def test_int16_dynamic_codes():
    rng = np.random.default_rng(3)
    b = GraphBuilder("dyn16")
    x = b.input("x", TensorType((1, 5, 5, 4), F32))
    codes, scale = b.op("dynamic_quantize", x, dtype=DType.INT16, qmax=32767)
    y = b.op("dequantize", b.op("conv2d", codes, _weights(b, rng, (6, 3, 3, 4)), None, pad=(1, 1, 1, 1)), scale)
    graph = verify_graph(b.build([y]))
    _check(graph, ["dynamic_quantize+conv2d+dequantize"])


def test_observed_intermediates_are_not_fused():
    rng = np.random.default_rng(4)
    b = GraphBuilder("observed")
    x = b.input("x", TensorType((3, 12), F32))
    codes, scale = b.op("dynamic_quantize", x)
    acc = b.op("fully_connected", codes, _weights(b, rng, (7, 12)), None)
    graph = verify_graph(b.build([b.op("dequantize", acc, scale), acc, scale]))
    _check(graph, [])


def test_per_channel_binary_op_first_in_line():
    """S2's shape: ``x * c`` and ``x + c`` with per-channel constants feed dynamic conv chains; x also feeds
    another branch."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("s2")
    x = b.input("x", TensorType((1, 6, 6, 4), F32))
    c = b.constant(rng.uniform(0.5, 1.5, (1, 1, 1, 4)).astype(np.float32), name="c")
    branches = []
    for i, h in enumerate((b.op("mul", x, c), b.op("add", x, c), x)):
        codes, scale = b.op("dynamic_quantize", h)
        acc = b.op("conv2d", codes, _weights(b, rng, (5, 3, 3, 4), f"w{i}"), None, pad=(1, 1, 1, 1))
        branches.append(b.op("add", b.op("dequantize", acc, scale), _bias(b, rng, 5, 4, f"b{i}")))
    graph = verify_graph(b.build(branches))
    _check(graph, ["dynamic_quantize+conv2d+dequantize+add"] * 3)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # the reference's cast
def test_nan_input_is_an_execution_error():
    rng = np.random.default_rng(6)
    b = GraphBuilder("nan")
    x = b.input("x", TensorType((2, 8), F32))
    codes, scale = b.op("dynamic_quantize", x)
    graph = verify_graph(b.build([b.op("dequantize", b.op("fully_connected", codes, _weights(b, rng, (3, 8)), None),
                                 scale)]))
    bad = [np.full((2, 8), np.nan, np.float32)]
    with pytest.raises(ExecutionError):
        run_graph(graph, bad)
    for cfg in ({}, {"fuse": False}):
        with pytest.raises(ExecutionError, match="NaN"):
            prepare(graph, **cfg).run(bad)
