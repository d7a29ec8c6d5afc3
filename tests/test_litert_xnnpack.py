"""XNNPACK's arithmetic as the reference computes it, checked against LiteRT's real XNNPACK delegate.

Seeded random draws of what its kernels are sensitive to: for the float32 requantization of a fused
convolution, the scales, zero points and int32 accumulators (exact ties, the int32 extremes, values
above 2**24 where the int -> float32 conversion rounds); for its int8 ADD, the three scales and zero
points. Each model runs under the delegate at 1 and 2 threads, and each check also shows that the
data tells XNNPACK's rounding apart from TOSA's single rounding (so the test fails if the model is
wrong).
"""

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from qlower.backends.litert.export import export_tflite
from qlower.backends.litert.fused_add import TfliteAdd, canonical_adds
from qlower.backends.litert.xnnpack_add import XnnpackAdd, xnnpack_add_groups
from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, rebuild, verify_graph
from qlower.ir.add_domain import add_domain_scale
from qlower.reference import run_graph

SEED = 20261126
f32 = np.float32


def run_xnnpack(model: bytes, inputs, threads: int) -> tuple[list[np.ndarray], list[str]]:
    """Outputs under the default delegates, and the operators left to LiteRT's own kernels."""
    it = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.AUTO, num_threads=threads)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], np.ascontiguousarray(x))
    it.invoke()
    ops = [o["op_name"] for o in it._get_ops_details()]
    kept = ops[:len(ops) - ops.count("DELEGATE")] if "DELEGATE" in ops else ops
    outs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    return outs, (["DELEGATE"] if "DELEGATE" in ops else kept)


def _conv(rng, rounding: str, tie: bool):
    """x (one channel) -> 1x1 conv, one weight of 1 per output channel, a wide int32 bias, fused rescale.

    Every accumulator is ``x - zp + bias[c]``: the bias places it anywhere in int32."""
    b = GraphBuilder("xnn_conv")
    s_x = f32(rng.uniform(0.01, 0.1))
    zp = int(rng.integers(-20, 20))
    x = b.input("x", TensorType((1, 16, 16, 1), DType.INT8, QuantSpec.per_tensor(float(s_x), zp)))
    c = 8
    s_w = f32(rng.uniform(0.001, 0.02, c))
    w = b.constant(np.ones((c, 1, 1, 1), np.int8), QuantSpec.per_channel(s_w.astype(np.float64), axis=0,
                                                                           qmin=-127, qmax=127))
    spread = [2**8, 2**20, 2**26, 2**31 - 300]
    bias = np.concatenate([rng.integers(-m, m, 2) for m in spread]).astype(np.int64)
    bias[-1], bias[-2] = 2**31 - 200, -(2**31) + 200                 # the int32 extremes
    acc_q = QuantSpec.accumulator(x.quant, w.quant, axis=0)
    acc = b.op("conv2d", x, w, b.constant(bias.astype(np.int32), acc_q))
    acc_scale = np.float32(s_x) * s_w                                  # what XNNPACK multiplies in float32
    if tie:   # a power-of-two ratio: odd accumulators land exactly half-way
        s_out = float(acc_scale.astype(np.float64).max() * 2.0 ** int(rng.integers(1, 4)))
    else:     # the ratio that reaches the codes from the bias range, times noise
        s_out = float(f32(np.abs(bias).max() * acc_scale.max() / 100 * rng.uniform(0.5, 2)))
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(s_out, int(rng.integers(-30, 30))), rounding=rounding)
    return verify_graph(b.build([y]))


def test_fp32_requantization_is_xnnpacks_on_random_accumulators():
    rng = np.random.default_rng(SEED)
    differs_from_single = 0
    for trial in range(24):
        g = _conv(rng, "fp32", tie=trial % 2 == 1)
        x = rng.integers(-128, 128, (1, 16, 16, 1)).astype(np.int8)
        want = run_graph(g, [x])[0]
        model = export_tflite(g, native=True)
        for threads in (1, 2):
            (got,), kept = run_xnnpack(model, [x], threads)
            assert kept == ["DELEGATE"], kept
            np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}, {threads} threads")
        single = rebuild(g, lambda b, op, o: (b.op("rescale", *o, out=op.attrs["out"], rounding="single"),)
                         if op.kind == "rescale" else None)
        try:
            differs_from_single += int(np.count_nonzero(run_graph(single, [x])[0] != want))
        except ExecutionError:   # TOSA's REQUIRE: accumulators beyond its range at a large ratio
            pass
    assert differs_from_single > 0, "the data must tell float32 requantization from single rounding"


PAIRS = (1, 256, 256, 1)   # every pair of int8 codes once


def _every_pair() -> list[np.ndarray]:
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128), indexing="ij")
    return [a.astype(np.int8).reshape(PAIRS), b.astype(np.int8).reshape(PAIRS)]


def _add_graph(rng, s_a, s_b, s_out):
    """The frontend's int8 add: each operand rescaled once to the TFLite sum domain, added, rescaled."""
    b = GraphBuilder("xnn_add")
    za, zb, zo = (int(v) for v in rng.integers(-100, 100, 3))
    xa = b.input("a", TensorType(PAIRS, DType.INT8, QuantSpec.per_tensor(s_a, za)))
    xb = b.input("b", TensorType(PAIRS, DType.INT8, QuantSpec.per_tensor(s_b, zb)))
    domain = QuantSpec.per_tensor(add_domain_scale([s_a, s_b]), 0, DType.INT32)
    s = b.op("add", b.op("rescale", xa, out=domain), b.op("rescale", xb, out=domain))
    return verify_graph(b.build([b.op("rescale", s, out=QuantSpec.per_tensor(s_out, zo))]))


def test_add_in_xnnpacks_form_is_xnnpacks_add():
    """Every pair of codes: a multiplier one unit off changes some sums (fails the test)."""
    rng = np.random.default_rng(SEED)
    differs_from_tflite = 0
    inputs = _every_pair()
    for trial in range(16):
        s_a, s_b = (float(f32(v)) for v in rng.uniform(0.005, 0.1, 2))
        s_out = float(f32(max(s_a, s_b) * rng.uniform(0.3, 3)))
        if trial % 4 == 0:   # power-of-two ratios: sums land exactly half-way between codes
            s_a, s_b = (s_out * 2.0 ** int(k) for k in rng.integers(-3, 2, 2))
        g = _add_graph(rng, s_a, s_b, s_out)
        assert len(canonical_adds(g)) == 1
        mine = XnnpackAdd().apply(g).graph
        assert len(xnnpack_add_groups(mine)) == 1
        want = run_graph(mine, inputs)[0]
        for threads in (1, 2):
            (got,), kept = run_xnnpack(export_tflite(mine, native=True), inputs, threads)
            assert kept == ["DELEGATE"], kept
            np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}, {threads} threads")
        tflite_form = TfliteAdd().apply(g).graph
        differs_from_tflite += int(np.count_nonzero(run_graph(tflite_form, inputs)[0] != want))
    assert differs_from_tflite > 0, "the data must tell XNNPACK's ADD from TFLite's"


def test_an_add_xnnpack_refuses_keeps_tflites_form_and_stays_exact():
    """Operand/output ratios beyond XNNPACK's [2**-10, 2**8): the builtin ADD runs it, in TFLite's form."""
    rng = np.random.default_rng(SEED)
    g = _add_graph(rng, 0.5, 0.01, float(f32(0.0015)))   # 0.5 / 0.0015 > 256
    assert XnnpackAdd().apply(g).graph is g
    tflite_form = TfliteAdd().apply(g).graph
    inputs = _every_pair()
    (got,), _ = run_xnnpack(export_tflite(tflite_form, native=True), inputs, 1)
    np.testing.assert_array_equal(got, run_graph(tflite_form, inputs)[0])


def test_mean_in_xnnpacks_form_is_xnnpacks_mean():
    """Random planes, scales and zero points: the frontend's global mean in XnnpackMean's form is one
    MEAN the delegate takes, bit-exact; the pool form it replaces differs on some of them."""
    from qlower.backends.litert.xnnpack_mean import XnnpackMean, xnnpack_means

    rng = np.random.default_rng(SEED)
    differs_from_pool = 0
    for trial in range(30):
        h, w, c = int(rng.integers(1, 12)), int(rng.integers(1, 12)), int(rng.integers(16, 64))
        s_x, zp = float(f32(rng.uniform(0.005, 0.1))), int(rng.integers(-128, 128))
        b = GraphBuilder("xnn_mean")
        s_out = float(f32(s_x * rng.uniform(0.2, 2)))
        if trial % 2:   # a power-of-two plane and ratio: means land exactly half-way between codes
            h, w = (int(2 ** rng.integers(0, 4)) for _ in range(2))
            s_out = s_x * 2.0 ** int(rng.integers(-2, 2))
        x = b.input("x", TensorType((1, h, w, c), DType.INT8, QuantSpec.per_tensor(s_x, zp)))
        wide = b.op("rescale", x, out=QuantSpec.per_tensor(s_x / 128, 0, DType.INT16))   # as the frontend
        pool = b.op("avg_pool2d", wide, kernel=(h, w), stride=(1, 1))
        y = b.op("rescale", pool, out=QuantSpec.per_tensor(s_out, int(rng.integers(-100, 100))))
        g = verify_graph(b.build([y]))
        mine = XnnpackMean().apply(g).graph
        assert len(xnnpack_means(mine)) == 1
        data = rng.integers(-128, 128, (1, h, w, c)).astype(np.int8)
        want = run_graph(mine, [data])[0]
        (got,), kept = run_xnnpack(export_tflite(mine, native=True), [data], 1 + trial % 2)
        assert kept == ["DELEGATE"], kept
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")
        differs_from_pool += int(np.count_nonzero(run_graph(g, [data])[0] != want))
    assert differs_from_pool > 0, "the data must tell XNNPACK's MEAN from the pool form"


def test_a_gemm_xnnpack_refuses_stays_on_the_host():
    """A float32 requantization scale of 256 or more fails XNNPACK's setup and the whole model with it:
    the backend leaves that conv (and its rescale) to the host, and takes a conv below the limit."""
    from qlower.backends.litert.backend import LiteRtBackend
    from qlower.backends.litert.rounding import with_kernel_rounding

    rng = np.random.default_rng(SEED)
    for s_out, taken in ((2.0**-9, True), (2.0**-11, False)):   # ratios 0.25 / s_out: 128 and 512
        b = GraphBuilder("ratio")
        x = b.input("x", TensorType((1, 6, 6, 4), DType.INT8, QuantSpec.per_tensor(0.5, 0)))
        wq = QuantSpec.per_channel(np.full(4, 0.5), axis=0, qmin=-127, qmax=127)
        c = b.op("conv2d", x, b.constant(rng.integers(-2, 3, (4, 1, 1, 4)).astype(np.int8), wq), None)
        g = with_kernel_rounding(verify_graph(b.build([b.op("rescale", c, out=QuantSpec.per_tensor(s_out, 0))])),
                                 "xnnpack")
        backend = LiteRtBackend(kernels="xnnpack")
        backend.prepare(g)
        conv = next(op for op in g.ops if op.kind == "conv2d")
        verdict = backend.supports(conv, "litert")
        assert verdict.ok == taken and (taken or "256" in verdict.reason)
        if taken:
            data = rng.integers(-2, 3, (1, 6, 6, 4)).astype(np.int8)
            (got,), kept = run_xnnpack(export_tflite(g, native=True), [data], 1)
            assert kept == ["DELEGATE"]
            np.testing.assert_array_equal(got, run_graph(g, [data])[0])
