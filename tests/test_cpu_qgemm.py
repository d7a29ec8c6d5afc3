"""The fused int8 GEMM + requantization (qgemm.py, AVX-512 VNNI) against the reference, at its edges.

Where the machine has the kernel (this project's machines do), each test checks that it ran;
each compares every output code with the reference interpreter.
"""

import numpy as np
import pytest

from qlower.backends.cpu import gemm, native, qgemm
from qlower.backends.cpu.quantization import rescale_params
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.testing.cpu_checks import assert_cpu_matches_reference

I8 = DType.INT8


@pytest.fixture
def qgemm_calls(monkeypatch):
    """How many times the native kernel ran (None when this machine has no VNNI build)."""
    kernels = native.load()
    if kernels is None or not kernels.has_qgemm:
        return None
    calls = []
    original = type(kernels).qgemm

    def spy(self, *args):
        calls.append(args[0].shape)
        return original(self, *args)
    monkeypatch.setattr(type(kernels), "qgemm", spy)
    return calls


def _fc_graph(m, k, n, w, x_zp, out_ratio, rounding="single", clamp=None, seed=0):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("fc")
    x = b.input("x", TensorType((m, k), I8, QuantSpec.per_tensor(0.03, x_zp)))
    wv = b.constant(w, QuantSpec.per_channel(rng.uniform(0.001, 0.01, n)), name="w")
    acc_q = QuantSpec.accumulator(x.quant, wv.quant, axis=0)
    bias = b.constant(rng.integers(-2000, 2000, n).astype(np.int32), acc_q, name="b")
    acc = b.op("fully_connected", x, wv, bias)
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.03 * 0.005 * out_ratio, -7), rounding=rounding)
    if clamp is not None:
        y = b.op("clamp", y, min=clamp[0], max=clamp[1])
    return verify_graph(b.build([y]))


def _extreme_inputs(shape, seed):
    rng = np.random.default_rng(seed)
    return [rng.choice(np.array([-128, 127, 0, -1, 1], np.int8), shape)]


@pytest.mark.parametrize("rounding", ["single", "double"])
@pytest.mark.parametrize("m, k, n", [(5, 7, 17), (4, 16, 64), (9, 33, 70), (1, 1, 1)])
def test_tails_of_rows_channels_and_k_are_exact(qgemm_calls, rounding, m, k, n):
    """Row, channel and K counts off the 4 x 64 tile and the 4-byte dot product; int8 extremes in x and w."""
    rng = np.random.default_rng(m * 1000 + k)
    w = rng.choice(np.array([-128, 127, -127, 5, 0], np.int8), (n, k))
    graph = _fc_graph(m, k, n, w, x_zp=-128 if k % 2 else 127, out_ratio=np.sqrt(k) * 40, rounding=rounding,
                      clamp=(-100, 90))
    assert_cpu_matches_reference(graph, _extreme_inputs((m, k), k), configs=({}, {"fuse": False}), trace=False)
    if qgemm_calls is not None:
        assert qgemm_calls, "the fused VNNI kernel did not run"


def test_k_at_the_exactness_edge():
    """K * 255 * 128 < 2**31 is the kernel's bound: K = 65793 packs, 65794 does not."""
    assert 65793 * qgemm.DOT_MAX < 2**31 <= 65794 * qgemm.DOT_MAX
    params = rescale_params(QuantSpec.per_channel(np.full(4, 1e-4), axis=1), QuantSpec.per_tensor(0.05, 0))
    for k, packs in ((65793, True), (65794, False)):
        w = np.zeros((4, k), np.int8)
        w[:, ::4096] = 127   # small l1: the accumulator bound stays in int32
        p = gemm.pack(w, QuantSpec.per_channel(np.full(4, 0.01)), None, None, I8, -128, None, cache=False)
        assert p.engine == "int8" or not gemm.int_mm_exact()
        assert (qgemm.pack(p, params, 2, None, max_k=k) is not None) == (packs and p.engine == "int8")
        assert qgemm.pack(p, params, 2, None) is None   # past MAX_K: oneDNN's GEMM is faster there


@pytest.mark.slow
def test_long_k_at_the_edge_is_exact(qgemm_calls, monkeypatch):
    k = 65793
    monkeypatch.setattr(qgemm, "MAX_K", k)
    w = np.zeros((16, k), np.int8)
    w[:, ::2048] = -128
    w[:, 1::2048] = 127
    graph = _fc_graph(4, k, 16, w, x_zp=127, out_ratio=400.0)
    x = [np.full((4, k), -128, np.int8)]
    x[0][1] = 127
    assert_cpu_matches_reference(graph, x, configs=({},), trace=False)
    if qgemm_calls is not None:
        assert qgemm_calls


def test_a_shift_below_32_is_left_to_the_checked_requantizer(qgemm_calls):
    """A scale ratio >= 1/2 gives shifts <= 31, where REQUIRE can fail for int32 inputs: not this kernel."""
    rng = np.random.default_rng(4)
    w = rng.integers(-128, 128, (8, 12)).astype(np.int8)
    graph = _fc_graph(3, 12, 8, w, x_zp=0, out_ratio=0.001)
    rescale = graph.ops[-1]
    assert int(rescale_params(rescale.operands[0].type.quant, rescale.attrs["out"]).shift.min()) < qgemm.MIN_SHIFT
    x = [rng.integers(-2, 3, (3, 12)).astype(np.int8)]
    assert_cpu_matches_reference(graph, x, configs=({},), trace=False)
    if qgemm_calls is not None:
        assert not qgemm_calls


@pytest.mark.parametrize("rounding", ["single", "double"])
def test_rounding_at_shift_32_in_even_and_odd_channels(qgemm_calls, rounding):
    """Scale ratios in [1/4, 1/2) give shift 32, where DOUBLE_ROUND's +-2**30 moves half of all results:
    small accumulators of both signs (no clamp hides them) in 37 channels (even and odd lanes, a tail)."""
    rng = np.random.default_rng(21)
    m, k, n = 6, 8, 37
    b = GraphBuilder("fc")
    x = b.input("x", TensorType((m, k), I8, QuantSpec.per_tensor(0.03, 0)))
    w_scales = rng.uniform(0.0013, 0.0024, n)   # ratio w_scale / 0.005 in [0.26, 0.48): shift 32
    wv = b.constant(rng.integers(-9, 10, (n, k)).astype(np.int8), QuantSpec.per_channel(w_scales), name="w")
    acc_q = QuantSpec.accumulator(x.quant, wv.quant, axis=0)
    bias = b.constant(rng.integers(-40, 40, n).astype(np.int32), acc_q, name="b")
    acc = b.op("fully_connected", x, wv, bias)
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.03 * 0.005, 3), rounding=rounding)
    graph = verify_graph(b.build([y]))
    params = rescale_params(acc.quant, y.quant)
    assert set(params.shift.tolist()) == {qgemm.MIN_SHIFT}
    assert_cpu_matches_reference(graph, [rng.integers(-6, 7, (m, k)).astype(np.int8)], configs=({},), trace=False)
    if qgemm_calls is not None:
        assert qgemm_calls, "the fused VNNI kernel did not run"
