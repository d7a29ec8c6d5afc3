"""The TFLite export, op by op: every exported graph runs in the stock LiteRT interpreter with its
reference kernels (BUILTIN_REF) and gives exactly the reference interpreter's codes.

The integer forms that TFLite has no single op for (rescale, a rounding multiply, tables,
quantize) are written as exact plain-integer arithmetic; the cases below hit their edges: wide
int32 results that need two limbs, per-channel multipliers, shifts near 62, ratio-1 rescales,
ties of the float rounding. ``requant.apply_scale_high_mul`` (the rounding of LiteRT's optimized
kernels) is checked against an independent big-integer statement of gemmlowp's arithmetic.
"""

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from qlower.backends.litert.export import export_tflite, unsupported_reason
from qlower.backends.litert.verify import builtin_counts
from qlower.errors import UnsupportedOpError
from qlower.ir import DType, GraphBuilder, Origin, QuantSpec, TensorType, rebuild, requant, verify_graph
from qlower.reference import run_graph

RNG_SEED = 20261123
I32 = DType.INT32


def run_litert(model: bytes, inputs, kernels=OpResolverType.BUILTIN_REF) -> list[np.ndarray]:
    it = Interpreter(model_content=model, experimental_op_resolver_type=kernels)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], np.ascontiguousarray(x))
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def assert_exact(graph, inputs):
    want = run_graph(graph, inputs)
    got = run_litert(export_tflite(graph), inputs)
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def int_input(rng, b, name, shape, dtype=DType.INT8, quant=None, low=None, high=None):
    info = np.iinfo(dtype.numpy)
    quant = quant or QuantSpec.per_tensor(0.05, 3, dtype)
    data = rng.integers(info.min if low is None else low, (info.max if high is None else high) + 1, shape)
    data = data.astype(dtype.numpy)
    return b.input(name, TensorType(shape, dtype, quant)), data


def f32(x):
    """Scales as PyTorch stores them: float32 values (TFLite derives its multipliers from those)."""
    return tuple(float(v) for v in np.float32(np.atleast_1d(x)))


def test_fused_gemms_and_activations_match_the_reference():
    """conv (stride, pad) with per-channel weights, relu clamp, max pool with padding, dilated depthwise
    without bias, fully connected, matmul: fused TFLite kernels. LiteRT's reference kernels round
    conv and matmul twice (TOSA DOUBLE_ROUND) and fully connected once, so the IR says so here."""
    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("gemms")
    q_in = QuantSpec.per_tensor(f32(0.05)[0], 3)
    x = b.input("x", TensorType((1, 6, 6, 4), DType.INT8, q_in))
    wq = QuantSpec.per_channel(f32(np.linspace(0.01, 0.02, 8)), axis=0, qmin=-127, qmax=127)
    w = b.constant(rng.integers(-127, 128, (8, 3, 3, 4)).astype(np.int8), wq)
    bias = b.constant(rng.integers(-500, 500, 8).astype(np.int32), QuantSpec.accumulator(q_in, wq, axis=0))
    c = b.op("conv2d", x, w, bias, stride=(2, 2), pad=(1, 1, 1, 1))
    r = b.op("rescale", c, out=QuantSpec.per_tensor(f32(0.1)[0], -2), rounding="double")
    cl = b.op("clamp", r, min=-2, max=127)
    mp = b.op("max_pool2d", cl, kernel=(2, 2), stride=(1, 1), pad=(0, 1, 0, 1))
    dw_q = QuantSpec.per_tensor(f32(0.03)[0], 0, qmin=-127, qmax=127)
    dw = b.constant(rng.integers(-127, 128, (8, 2, 2, 1)).astype(np.int8), dw_q)
    d = b.op("conv2d", mp, dw, None, groups=8, dilation=(2, 2))
    d8 = b.op("rescale", d, out=QuantSpec.per_tensor(f32(0.2)[0], 0, qmin=0, qmax=127), rounding="double")
    flat = b.op("reshape", d8, shape=(1, 8))
    fw = b.constant(rng.integers(-127, 128, (5, 8)).astype(np.int8), dw_q)
    fc = b.op("rescale", b.op("fully_connected", flat, fw, None), out=QuantSpec.per_tensor(f32(0.25)[0], 1))
    a3 = b.op("reshape", mp, shape=(1, 9, 8))
    mm = b.op("matmul", a3, b.op("transpose", a3, perm=(0, 2, 1)))
    mm8 = b.op("rescale", mm, out=QuantSpec.per_tensor(f32(2.5)[0], -4), rounding="double")
    g = verify_graph(b.build([fc, mp, mm8]))
    assert_exact(g, [rng.integers(-128, 128, (1, 6, 6, 4)).astype(np.int8)])
    assert export_tflite(g).count(b"CONV") == 0   # names aren't stored: the fused kernels are counted below
    ops = builtin_counts(export_tflite(g))
    assert ops["CONV_2D"] == 1 and ops["DEPTHWISE_CONV_2D"] == 1 and ops["FULLY_CONNECTED"] == 1
    assert ops["BATCH_MATMUL"] == 1


def test_a_gemm_whose_scales_give_another_multiplier_is_refused_not_approximated():
    """Scales that float32 can't hold (1/3, 1/7, 1/11): TFLite would requantize with another multiplier."""
    b = GraphBuilder("thirds")
    q_in = QuantSpec.per_tensor(1 / 3, 0)
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, q_in))
    wq = QuantSpec.per_tensor(1 / 7, 0)
    c = b.op("conv2d", x, b.constant(np.ones((3, 1, 1, 2), np.int8), wq), None, name="conv",
             origin=Origin("conv", "features.0", "model.py:12"))
    g = verify_graph(b.build([b.op("rescale", c, out=QuantSpec.per_tensor(1 / 11, 0))]))
    with pytest.raises(UnsupportedOpError, match=r"conv2d producing %conv at .*model.py:12.*multiplier"):
        export_tflite(g)


@pytest.mark.parametrize("ratio,in_dtype,out_dtype", [
    (0.37, DType.INT32, DType.INT8),          # a GEMM-like accumulator, single limb
    (3.0e-10, DType.INT32, DType.INT8),       # shift near its cap
    (0.7, DType.INT32, DType.INT32),          # an int32 result: two limbs
    (12.5, DType.INT8, DType.INT32),          # widening with a fractional ratio
    (1.0, DType.INT8, DType.INT32),           # zero-point removal only (integer path)
    (64.0, DType.INT16, DType.INT32),         # integer ratio 2**6
    (0.25, DType.INT16, DType.INT16),
])
def test_rescale_forms_are_exact(ratio, in_dtype, out_dtype):
    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("rescale")
    in_scale = 0.001
    zp_in = 0 if in_dtype is I32 else -3
    x, data = int_input(rng, b, "x", (2, 3, 5, 7), in_dtype, QuantSpec.per_tensor(in_scale, zp_in, in_dtype),
                        low=-(2**20) if in_dtype is I32 else None, high=2**20 if in_dtype is I32 else None)
    out_zp = 0 if out_dtype is I32 else 5
    y = b.op("rescale", x, out=QuantSpec.per_tensor(in_scale / ratio, out_zp, out_dtype))
    data.flat[:4] = [np.iinfo(in_dtype.numpy).min, np.iinfo(in_dtype.numpy).max, 0, zp_in]
    if in_dtype is I32:
        data.flat[:2] = [-(2**20), 2**20]
    assert_exact(verify_graph(b.build([y])), [data])


def test_per_channel_rescale_and_narrow_output_range_are_exact():
    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("per_channel")
    scales = np.geomspace(1e-5, 3e-3, 16)
    x = b.input("acc", TensorType((1, 4, 4, 16), I32, QuantSpec.per_channel(scales, axis=3, dtype=I32)))
    y = b.op("rescale", x, out=QuantSpec.per_tensor(0.02, -7, qmin=-100, qmax=90))
    data = rng.integers(-(2**22), 2**22, (1, 4, 4, 16)).astype(np.int32)
    assert_exact(verify_graph(b.build([y])), [data])


def test_quantize_rounds_half_to_even_like_the_reference():
    b = GraphBuilder("quantize")
    x = b.input("x", TensorType((1, 2, 2, 8), DType.FLOAT32))
    q = b.op("quantize", x, out=QuantSpec.per_tensor(0.5, -3))
    qc = b.op("quantize", x, out=QuantSpec.per_channel(np.linspace(0.25, 2.0, 8), np.arange(-4, 4), axis=3))
    # ties at every half step, values beyond the range, -0.0, tiny values
    data = (np.arange(32, dtype=np.float32).reshape(1, 2, 2, 8) - 16.0) * np.float32(0.25)
    data.flat[:5] = [1e6, -1e6, -0.0, 1e-30, 63.75]
    assert_exact(verify_graph(b.build([q, qc])), [data])


def test_int32_arithmetic_tables_and_casts_are_exact():
    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("arith")
    s32 = QuantSpec.per_tensor(0.01, 0, I32)
    a, da = int_input(rng, b, "a", (1, 3, 4, 6), I32, s32, low=-50000, high=50000)
    c, dc = int_input(rng, b, "c", (1, 3, 4, 6), I32, s32, low=-40000, high=40000)
    k = b.constant(np.full((1, 1, 1, 6), 7, np.int32), QuantSpec.per_tensor(0.5, 0, I32))
    mul = b.op("mul", a, k, shift=3)
    prod = b.op("mul", a, c, shift=11)
    div = b.op("intdiv", b.op("add", a, c), k)
    mm = b.op("minimum", b.op("sub", a, c), c)
    cl = b.op("clamp", mm, min=-1000, max=2000)
    x8, d8 = int_input(rng, b, "x8", (1, 3, 4, 6))
    table = np.random.default_rng(1).integers(-(2**20), 2**20, 256).astype(np.int32)
    lut = b.op("table", x8, table=table, offset=128, out=QuantSpec.per_tensor(1e-4, 0, I32))
    as_f = b.op("cast", x8, dtype=DType.FLOAT32)
    back = b.op("cast", b.op("mul", as_f, b.constant(np.full((1, 1, 1, 1), 2.5, np.float32))), dtype=DType.INT8,
                out=QuantSpec.per_tensor(1.0, 0))
    narrow = b.op("cast", cl, dtype=DType.INT8, out=QuantSpec.per_tensor(1.0, 0))
    rs = b.op("reduce_sum", prod, axis=2)
    g = verify_graph(b.build([mul, prod, div, cl, lut, back, narrow, rs]))
    assert_exact(g, [da, dc, d8])


def test_movement_comparisons_and_reductions_are_exact():
    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("movement")
    q = QuantSpec.per_tensor(0.1, 2)
    x, dx = int_input(rng, b, "x", (1, 4, 5, 6), quant=q)
    y, dy = int_input(rng, b, "y", (1, 4, 5, 6), quant=q)
    cat = b.op("concat", (x, y), axis=3)
    tr = b.op("transpose", cat, perm=(0, 3, 1, 2))
    p = b.op("pad", tr, pads=(0, 0, 1, 0, 0, 2, 3, 1), value=-9)
    s = b.op("slice", p, start=(0, 1, 0, 1), stop=(1, 13, 6, 9), step=(1, 3, 2, 2))
    order = b.constant(np.array([3, 0, 2, 2], np.int32), QuantSpec(I32, (1.0,), (0,), 0, 3))
    gat = b.op("gather", s, order, axis=1)
    r = b.op("reshape", gat, shape=(4, 3, 4))
    mp = b.op("max_pool2d", x, kernel=(3, 2), stride=(2, 1), pad=(1, 1, 0, 1))
    rmax, rmin = b.op("reduce_max", x, axis=2), b.op("reduce_min", x, axis=1)
    am, an = b.op("argmax", x, axis=3), b.op("argmin", y, axis=2)
    gt, ge, eq = (b.op(kind, x, y) for kind in ("greater", "greater_equal", "equal"))
    logic = b.op("logical_xor", b.op("logical_or", b.op("logical_and", gt, ge), eq), b.op("logical_not", gt))
    pick = b.op("select", logic, b.op("minimum", x, y), b.op("maximum", x, y))
    g = verify_graph(b.build([r, mp, rmax, rmin, am, an, pick]))
    dy[0, 0, 0] = dx[0, 0, 0]   # ties for equal and the arg reductions
    assert_exact(g, [dx, dy])


def test_export_is_deterministic():
    g = verify_graph(_small_conv())
    assert export_tflite(g) == export_tflite(g)


@pytest.mark.parametrize("kernel,stride,pad,shape", [
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 6, 6, 5)),
    ((3, 3), (1, 2), (1, 1, 1, 0), (2, 7, 5, 3)),     # padding: counts differ at the borders
    ((5, 4), (5, 4), (0, 0, 0, 0), (1, 5, 4, 8)),     # global
])
def test_integer_average_pooling_is_exact(kernel, stride, pad, shape):
    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("avg")
    x, data = int_input(rng, b, "x", shape, quant=QuantSpec.per_tensor(0.1, -7))
    y = b.op("avg_pool2d", x, kernel=kernel, stride=stride, pad=pad)
    assert_exact(verify_graph(b.build([y])), [data])


def test_an_op_without_tflite_form_is_named_with_its_source_line():
    b = GraphBuilder("pool")
    x = b.input("x", TensorType((1, 4, 4, 2), DType.FLOAT32))
    y = b.op("avg_pool2d", x, kernel=(2, 2), stride=(2, 2), name="avg",
             origin=Origin("avg", "pool", "model.py:7"))
    g = verify_graph(b.build([y]))
    with pytest.raises(UnsupportedOpError, match=r"avg_pool2d producing %avg at .*model.py:7.*TFLite.*order"):
        export_tflite(g)
    assert "avg_pool2d" in unsupported_reason(g.ops[0]) or "order" in unsupported_reason(g.ops[0])
    b2 = GraphBuilder("soft")
    f = b2.input("f", TensorType((2, 5), DType.FLOAT32))
    s = b2.op("softmax", f, axis=1)
    assert "softmax" in unsupported_reason(verify_graph(b2.build([s])).ops[0])


def _small_conv():
    b = GraphBuilder("small")
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, QuantSpec.per_tensor(f32(0.1)[0], 0)))
    wq = QuantSpec.per_tensor(f32(0.02)[0], 0)
    c = b.op("conv2d", x, b.constant(np.ones((3, 1, 1, 2), np.int8), wq), None)
    return b.build([b.op("rescale", c, out=QuantSpec.per_tensor(f32(0.3)[0], 0))])


def _srdhm(a: int, b: int) -> int:
    """gemmlowp SaturatingRoundingDoublingHighMul on Python integers (int32 a, b)."""
    if a == b == -(2**31):
        return 2**31 - 1
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    q = abs(ab + nudge) >> 31
    return q if ab + nudge >= 0 else -q


def _half_up_shift(x: int, e: int) -> int:
    return (x + (1 << (e - 1))) >> e if e > 0 else x


def test_optimized_kernel_rounding_matches_gemmlowp_arithmetic():
    rng = np.random.default_rng(RNG_SEED)
    values = np.concatenate([rng.integers(-(2**24), 2**24, 3000), [0, 1, -1, 2**24 - 1, -(2**24)]])
    for ratio in (0.000123, 0.0131, 0.49999, 0.5, 0.75, 1.9, 3.0):
        m = requant.quantize_multiplier(ratio)
        mult, shift = int(m.multiplier[0]), int(m.shift[0])
        left = max(31 - shift, 0)
        vals = values if left == 0 else values // (1 << (left + 1))
        got = requant.apply_scale_high_mul(vals, m.multiplier, m.shift)
        want = [_half_up_shift(_srdhm(int(v) << left, mult), max(shift - 31, 0)) for v in vals]
        np.testing.assert_array_equal(got, want, err_msg=f"ratio {ratio}")
    with pytest.raises(requant.RequantRangeError):
        requant.apply_scale_high_mul(np.array([2**30]), np.array([2**30]), np.array([29]))


def test_the_optimized_kernels_rounding_is_an_ir_rounding_every_host_backend_runs():
    """``double_half_up`` (the rescale rounding of LiteRT's builtin kernels) means the same on the cpu
    backend as in the reference; TOSA has no such RESCALE and keeps it on the host."""
    from qlower.api import lower_graph
    from qlower.backends.tosa.support import PROFILES, check

    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("half_up")
    x = b.input("acc", TensorType((1, 16, 16, 16), I32, QuantSpec.per_channel(np.geomspace(1e-5, 1e-3, 16), axis=3,
                                                                               dtype=I32)))
    y = b.op("rescale", x, out=QuantSpec.per_tensor(0.1, 3), rounding="double_half_up")
    g = verify_graph(b.build([y]))
    data = rng.integers(-(2**14), 2**14, (1, 16, 16, 16)).astype(np.int32)
    want = run_graph(g, [data])[0]
    np.testing.assert_array_equal(lower_graph(g, "cpu").run(data)[0], want)
    single = run_graph(verify_graph(rebuild(g, lambda b, op, o: (b.op("rescale", *o, out=op.attrs["out"]),))), [data])[0]
    assert np.any(single != want), "the data must tell the roundings apart"
    assert "double_half_up" in check(g.ops[0], PROFILES["tosa-1.0+int"])


@pytest.mark.parametrize("in_dtype", [DType.INT32, DType.INT8])
def test_double_rounding_rescale_is_exact(in_dtype):
    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("double")
    wide = in_dtype is I32
    x, data = int_input(rng, b, "x", (1, 8, 8, 16), in_dtype,
                        QuantSpec.per_tensor(0.005, 0 if wide else 4, in_dtype),   # shift 32: DOUBLE_ROUND acts
                        low=-400 if wide else None, high=400 if wide else None)
    y = b.op("rescale", x, out=QuantSpec.per_tensor(0.0173, -3), rounding="double")
    g = verify_graph(b.build([y]))
    assert_exact(g, [data])
    single = run_graph(verify_graph(rebuild(g, lambda b, op, o: (b.op("rescale", *o, out=op.attrs["out"]),))), [data])[0]
    assert not wide or np.any(single != run_graph(g, [data])[0]), "the data must tell the roundings apart"


@pytest.mark.parametrize("kernels,resolver", [("reference", OpResolverType.BUILTIN_REF),
                                              ("builtin", OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES),
                                              ("xnnpack", OpResolverType.AUTO)])
def test_each_kernel_family_is_exact_with_its_rounding_only(kernels, resolver):
    """One conv, one fully connected, one matmul with 10**4+ outputs each: the rounding table of
    rounding.py makes each family exact, and the other families' roundings would not be."""
    from qlower.backends.litert.rounding import KERNEL_ROUNDING, with_kernel_rounding

    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("family")
    q_in = QuantSpec.per_tensor(f32(0.05)[0], 3)
    x = b.input("x", TensorType((1, 24, 24, 16), DType.INT8, q_in))
    wq = QuantSpec.per_channel(f32(np.linspace(0.002, 0.01, 32)), axis=0, qmin=-127, qmax=127)
    c = b.op("conv2d", x, b.constant(rng.integers(-127, 128, (32, 3, 3, 16)).astype(np.int8), wq), None,
             pad=(1, 1, 1, 1))
    y = b.op("rescale", c, out=QuantSpec.per_tensor(f32(0.11)[0], -1))
    fq = QuantSpec.per_channel(f32(np.linspace(0.003, 0.006, 24)), axis=0, qmin=-127, qmax=127)
    f = b.op("rescale", b.op("fully_connected", y, b.constant(rng.integers(-127, 128, (24, 32)).astype(np.int8), fq),
                             None), out=QuantSpec.per_tensor(f32(0.09)[0], 2))
    a = b.op("reshape", f, shape=(24, 24, 24))
    m = b.op("rescale", b.op("matmul", a, a), out=QuantSpec.per_tensor(f32(1.7)[0], 0))
    g = verify_graph(b.build([y, f, m]))
    data = rng.integers(-128, 128, (1, 24, 24, 16)).astype(np.int8)
    mine = with_kernel_rounding(g, kernels)
    got = run_litert(export_tflite(mine), [data], resolver)
    for w, o in zip(run_graph(mine, [data]), got):
        np.testing.assert_array_equal(o, w)
    for other in KERNEL_ROUNDING:
        if KERNEL_ROUNDING[other] != KERNEL_ROUNDING[kernels]:
            theirs = with_kernel_rounding(g, other)
            assert any(np.any(o != w) for w, o in zip(run_graph(theirs, [data]), got)), other


def test_padding_that_is_tflite_same_is_written_as_same_and_stays_exact():
    """Stride-1 3x3 conv and depthwise conv with pad 1, and a 3x3 max pool with pad 1: TFLite's SAME
    padding (no PADV2); a stride-2 pad-1 conv on an even size is not SAME (TFLite pads 0 before, 1 after)."""
    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("same")
    q_in = QuantSpec.per_tensor(f32(0.05)[0], -9)
    x = b.input("x", TensorType((1, 8, 8, 4), DType.INT8, q_in))
    wq = QuantSpec.per_channel(f32(np.linspace(0.01, 0.02, 4)), axis=0, qmin=-127, qmax=127)
    c = b.op("conv2d", x, b.constant(rng.integers(-127, 128, (4, 3, 3, 4)).astype(np.int8), wq), None,
             pad=(1, 1, 1, 1))
    y = b.op("rescale", c, out=QuantSpec.per_tensor(f32(0.1)[0], 3), rounding="double")
    d = b.op("conv2d", y, b.constant(rng.integers(-127, 128, (4, 3, 3, 1)).astype(np.int8), wq), None, groups=4,
             pad=(1, 1, 1, 1))
    z = b.op("rescale", d, out=QuantSpec.per_tensor(f32(0.2)[0], -1), rounding="double")
    mp = b.op("max_pool2d", z, kernel=(3, 3), stride=(1, 1), pad=(1, 1, 1, 1))
    s2 = b.op("conv2d", mp, b.constant(rng.integers(-127, 128, (4, 3, 3, 4)).astype(np.int8), wq), None,
              stride=(2, 2), pad=(1, 1, 1, 1))
    out = b.op("rescale", s2, out=QuantSpec.per_tensor(f32(0.3)[0], 0), rounding="double")
    g = verify_graph(b.build([mp, out]))
    model = export_tflite(g)
    assert builtin_counts(model)["PADV2"] == 1   # only the stride-2 conv's
    assert_exact(g, [rng.integers(-128, 128, (1, 8, 8, 4)).astype(np.int8)])


def test_a_rescale_of_a_proven_narrow_int32_range_is_one_table_lookup():
    """A global average pool's sum spans 255 * N integers: its rescale is a GATHER from the reference's
    numbers (no 64-bit arithmetic, which XNNPACK can't delegate and Vela's TFLite reader crashes on)."""
    rng = np.random.default_rng(RNG_SEED)
    b = GraphBuilder("pool_sum")
    q = QuantSpec.per_tensor(f32(0.04)[0], -6)
    x = b.input("x", TensorType((1, 7, 7, 16), DType.INT8, q))
    wide = b.op("rescale", x, out=QuantSpec.per_tensor(q.scale[0], 0, I32))
    s = b.op("reduce_sum", b.op("reduce_sum", wide, axis=1), axis=2)
    mean = b.op("mul", s, b.constant(np.ones((1, 1, 1, 1), np.int32), QuantSpec.per_tensor(1 / 49, 0, I32)))
    y = b.op("rescale", mean, out=QuantSpec.per_tensor(f32(0.03)[0], 2))
    g = verify_graph(b.build([y]))
    model = export_tflite(g)
    counts = builtin_counts(model)
    assert "FLOOR_MOD" not in counts and counts["GATHER"] == 2
    data = rng.integers(-128, 128, (1, 7, 7, 16)).astype(np.int8)
    data[0, :, :, 0], data[0, :, :, 1] = -128, 127     # the ends of the proven range
    assert_exact(g, [data])
