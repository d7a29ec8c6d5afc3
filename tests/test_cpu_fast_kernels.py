"""The native fast paths (fastrq's requantization in qgemm and the VNNI depthwise kernel, the NCHW -> NHWC
transpose) against the reference: seeded random shapes off every vector width, zero points and weights at the
int8 extremes, power-of-two scale ratios (so that rounding ties are frequent), both clamp sides.

Where the machine has a kernel (this project's machines do), each test checks that it ran.
"""

import numpy as np
import pytest

from qlower.backends.cpu import fastrq, native
from qlower.backends.cpu.quantization import rescale_params
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, requant, verify_graph
from qlower.testing.cpu_checks import assert_cpu_matches_reference

I8 = DType.INT8


@pytest.fixture
def calls(monkeypatch):
    """Native entry points run, by name (counting only where this build has the kernel)."""
    kernels = native.load()
    ran: dict[str, int] = {}
    if kernels is None:
        return None
    for name in ("dwconv_fast", "qgemm", "qgemm_amx", "nchw_to_nhwc"):
        original = getattr(type(kernels), name)

        def spy(self, *args, _name=name, _original=original):
            ran[_name] = ran.get(_name, 0) + 1
            return _original(self, *args)
        monkeypatch.setattr(type(kernels), name, spy)
    return ran


def _pow2_conv(x_shape, o, k, groups, stride, dilation, pad, x_zp, out_zp, clamp, rng, w_values=None):
    """conv2d -> rescale -> clamp whose scale ratios are powers of two: 2**-(3 + j) per channel j % 4."""
    ci = x_shape[3] // groups
    b = GraphBuilder("conv")
    x = b.input("x", TensorType(x_shape, I8, QuantSpec.per_tensor(2.0**-4, x_zp)))
    w_scales = 2.0 ** -(5 + np.arange(o) % 4)
    w_data = (rng.choice(np.asarray(w_values, np.int8), (o, k, k, ci)) if w_values is not None
              else rng.integers(-127, 128, (o, k, k, ci)).astype(np.int8))
    w = b.constant(w_data, QuantSpec.per_channel(w_scales), name="w")
    acc_q = QuantSpec.accumulator(x.quant, w.quant, axis=0)
    bias = b.constant(rng.integers(-3000, 3000, o).astype(np.int32), acc_q, name="bias")
    acc = b.op("conv2d", x, w, bias, stride=stride, dilation=dilation, pad=pad, groups=groups, name="acc")
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(2.0**-6, out_zp), rounding="single", name="y")
    y = b.op("clamp", y, min=clamp[0], max=clamp[1], name="relu")
    return verify_graph(b.build([y]))


DW_CASES = [  # channels: under, at and over the 32-channel block; taps: odd and even counts
    dict(x_shape=(1, 7, 6, 17), k=3, stride=(1, 1), dilation=(1, 1), pad=(1, 1, 1, 1), x_zp=-128, out_zp=127),
    dict(x_shape=(2, 9, 8, 32), k=3, stride=(2, 2), dilation=(1, 1), pad=(0, 1, 0, 1), x_zp=127, out_zp=-128),
    dict(x_shape=(1, 8, 9, 70), k=5, stride=(1, 2), dilation=(1, 1), pad=(2, 2, 2, 2), x_zp=0, out_zp=3),
    dict(x_shape=(1, 10, 7, 33), k=2, stride=(1, 1), dilation=(2, 1), pad=(1, 0, 0, 1), x_zp=-5, out_zp=-128),
    dict(x_shape=(1, 3, 3, 96), k=3, stride=(1, 1), dilation=(1, 1), pad=(2, 2, 2, 2), x_zp=127, out_zp=0),
    dict(x_shape=(1, 12, 12, 2), k=3, stride=(1, 1), dilation=(1, 1), pad=(1, 1, 1, 1), x_zp=-128, out_zp=5),
]


@pytest.mark.parametrize("case", range(len(DW_CASES)))
def test_fast_depthwise_matches_reference(calls, case):
    rng = np.random.default_rng(100 + case)
    c = dict(DW_CASES[case])
    channels = c["x_shape"][3]
    graph = _pow2_conv(c.pop("x_shape"), channels, c.pop("k"), channels, clamp=(-100, 120), rng=rng,
                       w_values=(-128, 127, -127, 0, 1, -1, 64), **c)
    shape = graph.inputs[0].shape
    inputs = [rng.choice(np.array([-128, 127, 0, -1, 1, 64, -64], np.int8), shape)]
    inputs.append(rng.integers(-128, 128, shape).astype(np.int8))
    for x in inputs:
        assert_cpu_matches_reference(graph, [x], configs=({},), trace=False)
    if calls is not None and native.load().has_dwconv_fast:
        assert calls.get("dwconv_fast"), "the fast depthwise kernel did not run"


GEMM_CASES = [  # (m, k, n, kernel): VNNI below 16 rows, AMX from 16 (where the machine has it)
    # VNNI: row, K and channel tails, 64-channel rows stored whole (n = 64, 96) or masked (n = 120)
    (5, 7, 17, "qgemm"), (9, 16, 64, "qgemm"), (6, 24, 120, "qgemm"), (13, 40, 96, "qgemm"), (1, 1000, 33, "qgemm"),
    # AMX: row tails (M % 16), K steps of 64 with and without a tail, 64-column blocks whole, masked and partial
    (16, 64, 64, "qgemm_amx"), (37, 96, 120, "qgemm_amx"), (50, 200, 24, "qgemm_amx"), (17, 448, 70, "qgemm_amx"),
    (16, 4, 16, "qgemm_amx"),
]


@pytest.mark.parametrize("m, k, n, kernel", GEMM_CASES)
def test_fused_gemm_matches_reference(calls, m, k, n, kernel):
    rng = np.random.default_rng(m * 1000 + k * 7 + n)
    graph = _pow2_conv((1, 1, m, k), n, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), x_zp=int(rng.choice([-128, 127, 3])),
                       out_zp=int(rng.choice([-128, 127, 0])), clamp=(-120, 100), rng=rng)
    for x in (rng.choice(np.array([-128, 127, 0, 1, -1], np.int8), (1, 1, m, k)),
              rng.integers(-128, 128, (1, 1, m, k)).astype(np.int8)):
        assert_cpu_matches_reference(graph, [x], configs=({},), trace=False)
    kernels = native.load()
    if calls is not None and (kernels.has_amx if kernel == "qgemm_amx" else kernels.has_qgemm):
        assert calls.get(kernel), f"{kernel} did not run"


@pytest.mark.parametrize("c, k, stride, x_zp", [(3, 3, 2, -128), (3, 7, 2, 127), (5, 3, 1, 0)])
def test_amx_gemm_over_columns_padded_to_4_matches_reference(calls, c, k, stride, x_zp):
    """A stem-like conv whose K = k * k * c is not a multiple of 4: im2col pads its rows with zero columns."""
    rng = np.random.default_rng(c * k)
    pad = k // 2
    graph = _pow2_conv((1, 11, 10, c), 24, k, 1, (stride, stride), (1, 1), (pad, pad, pad, pad), x_zp=x_zp,
                       out_zp=-128, clamp=(-128, 127), rng=rng)
    x = rng.choice(np.array([-128, 127, 0, 1, -1], np.int8), (1, 11, 10, c))
    assert_cpu_matches_reference(graph, [x], configs=({},), trace=False)
    if calls is not None and native.load().has_amx:
        assert calls.get("qgemm_amx"), "the AMX GEMM did not run"


def test_fast_requantization_formula_matches_apply_scale_32():
    """fastrq's folded arithmetic (emulated in int64 here, wrapping as the kernel's lanes) against the reference
    rescale, for accumulators at the int32 extremes, near every tie, and random ones; shifts 32..54."""
    rng = np.random.default_rng(7)
    n = 48
    ratio = np.ldexp(rng.uniform(0.5, 1.0, n), -rng.integers(1, 23, n))   # shifts 32..53
    ratio[:6] = np.ldexp(1.0, -np.arange(2, 8))   # powers of two: v = odd * 2**(s - 31) is an exact tie
    spec_in = QuantSpec.per_channel(ratio * 0.01, axis=1)
    for out_zp, clamp in ((-128, None), (127, (-3, 9)), (5, (50, 40))):
        params = rescale_params(spec_in, QuantSpec.per_tensor(0.01, out_zp))
        assert fastrq.applies(params, 2, 2**31 - 1)
        offset = rng.integers(-(2**31), 2**31, n)
        acc_true = np.concatenate([np.array([[-(2**31)] * n, [2**31 - 1] * n]),
                                   rng.integers(-(2**31), 2**31, (200, n)),
                                   (rng.integers(-9, 9, (40, 1)) * 2 + 1) << ((params.shift - 31) % 31)[None, :]])
        acc_true = np.clip(acc_true, -(2**31), 2**31 - 1)
        raw = acc_true - offset   # what the kernel's int32 lanes hold: acc = v - off, may leave int32 in this
        rows = fastrq.parameters(offset, params, np.arange(n))   # emulation; the int64 algebra is the same
        m = np.empty(n, np.int64)
        r = np.empty(n, np.int64)
        s = np.empty(n, np.int64)
        for g in range(n // 16):
            m[16 * g:16 * g + 16:2], m[16 * g + 1:16 * g + 16:2] = rows[g, 0], rows[g, 1]
            r[16 * g:16 * g + 16:2], r[16 * g + 1:16 * g + 16:2] = rows[g, 2], rows[g, 3]
            s[16 * g:16 * g + 16:2], s[16 * g + 1:16 * g + 16:2] = rows[g, 4], rows[g, 5] + 32
        with np.errstate(over="ignore"):
            v = (raw * m + r) >> s
        a, b = fastrq.clamp_bounds(params, clamp)
        got = np.minimum(np.maximum(v, a), b)
        want = requant.rescale(acc_true, 0, out_zp, requant.Multiplier(params.mult, params.shift), -128, 127, axis=1)
        if clamp is not None:
            want = np.clip(want, *clamp) if clamp[0] <= clamp[1] else np.full_like(want, clamp[1])
        np.testing.assert_array_equal(got, want)


def test_fast_requantization_refuses_what_it_cannot_prove():
    base = rescale_params(QuantSpec.per_channel(np.full(4, 1e-5), axis=1), QuantSpec.per_tensor(0.01, 0))
    assert fastrq.applies(base, 2, 2**31 - 1)
    assert not fastrq.applies(base, 2, 2**31)                       # accumulators beyond int32
    double = rescale_params(QuantSpec.per_channel(np.full(4, 1e-5), axis=1), QuantSpec.per_tensor(0.01, 0), "double")
    assert not fastrq.applies(double, 2, 100)                       # sign-dependent rounding term
    shift31 = rescale_params(QuantSpec.per_channel(np.full(4, 0.007), axis=1), QuantSpec.per_tensor(0.01, 0))
    assert int(shift31.shift.min()) == 31 and not fastrq.applies(shift31, 2, 100)   # REQUIRE could fail
    tiny = rescale_params(QuantSpec.per_channel(np.full(4, 1e-19), axis=1), QuantSpec.per_tensor(0.01, 0))
    assert int(tiny.shift.max()) > fastrq.MAX_SHIFT and not fastrq.applies(tiny, 2, 100)   # V could pass 2**63
    zp_in = rescale_params(QuantSpec.per_channel(np.full(4, 1e-5), np.full(4, 3), axis=1), QuantSpec.per_tensor(0.01, 0))
    assert not fastrq.applies(zp_in, 2, 100)


@pytest.mark.parametrize("n, c, h, w", [(1, 3, 9, 23), (2, 3, 8, 16), (1, 5, 4, 7), (1, 3, 1, 1)])
def test_nchw_to_nhwc_transpose_matches_reference(calls, n, c, h, w):
    """Three channels go 64 pixels per vector (9 * 23 = 207: three vectors and a tail), others element-wise."""
    b = GraphBuilder("t")
    x = b.input("x", TensorType((n, c, h, w), I8, QuantSpec.per_tensor(0.1, 0)))
    graph = verify_graph(b.build([b.op("transpose", x, perm=(0, 2, 3, 1))]))
    codes = np.random.default_rng(c * h * w).integers(-128, 128, (n, c, h, w)).astype(np.int8)
    assert_cpu_matches_reference(graph, [codes], configs=({},), trace=False)
    if calls is not None:
        assert calls.get("nchw_to_nhwc")
