"""The VGF backend on IR graphs: each graph is lowered to TOSA, converted to VGF, run for real
on Vulkan (ML SDK scenario runner + ML emulation layer on Mesa's lavapipe) and compared with
the reference interpreter, bit-exact for integer results. Also: the simulated fallback says so
in the payload, and a payload made for Vulkan never silently falls back."""

from __future__ import annotations

import re

import numpy as np
import pytest

from qlower.backends.registry import backend_for, targets
from qlower.backends.vgf import VgfBackend
from qlower.backends.vgf import backend as vgf_backend
from qlower.backends.vgf import runner as vgf_runner
from qlower.backends.vgf.runner import VulkanUnavailable
from qlower.errors import CompileError, ExecutionError, InputError, UnsupportedOpError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.partition import partition
from qlower.reference import run_graph
from qlower.runtime.runner import Runner


@pytest.fixture(scope="module")
def vulkan() -> str:
    """The Vulkan device VGF runs on; fails (never skips) when this machine can't run VGF."""
    ok, detail = vgf_backend.vulkan_status()
    if not ok:
        pytest.fail(f"VGF can't run on Vulkan here ({detail}); scripts/setup_vulkan.sh installs what it needs")
    return detail


def act(shape, scale=0.05, zp=0, dtype=DType.INT8):
    return TensorType(shape, dtype, QuantSpec.per_tensor(scale, zp, dtype))


def codes(rng, shape, dtype=np.int8, lo=None, hi=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dtype)


def conv_chain(rng):
    """conv (stride 2, per-channel) -> rescale -> depthwise -> double-round rescale -> reshape -> FC."""
    b = GraphBuilder("conv_chain")
    x = b.input("x", act((1, 7, 7, 6), 0.05, -3))
    wq = QuantSpec.per_channel(rng.uniform(0.005, 0.03, 8), (0,) * 8)
    bias = b.constant(rng.integers(-3000, 3000, 8).astype(np.int32), QuantSpec.accumulator(x.quant, wq, axis=0))
    c = b.op("conv2d", x, b.constant(codes(rng, (8, 3, 3, 6), lo=-127), wq), bias, stride=(2, 2), pad=(1, 1, 1, 1))
    r = b.op("rescale", c, out=QuantSpec.per_tensor(0.1, 5))
    dq = QuantSpec.per_channel(rng.uniform(0.005, 0.03, 8), (0,) * 8)
    d = b.op("conv2d", r, b.constant(codes(rng, (8, 3, 3, 1), lo=-127), dq), None, pad=(1, 1, 1, 1), groups=8)
    d8 = b.op("rescale", d, out=QuantSpec.per_tensor(0.2, -1), rounding="double")
    f = b.op("reshape", d8, shape=(1, 128))
    fc = b.op("fully_connected", f, b.constant(codes(rng, (5, 128), lo=-127), QuantSpec.per_tensor(0.01, 0)), None)
    return b.build([b.op("rescale", fc, out=QuantSpec.per_tensor(0.3, 2)), r]), [codes(rng, (1, 7, 7, 6))]


def int32_arithmetic(rng):
    """Broadcasting add/sub and a shifted mul on int32, rescaled back to int8."""
    b = GraphBuilder("int32_arith")
    x = b.input("x", act((2, 3, 8), 0.05, 3))
    y = b.input("y", act((2, 1, 8), 0.07, -2))
    i32 = QuantSpec.per_tensor(0.05 / 2**16, 0, DType.INT32)
    xa, ya = b.op("rescale", x, out=i32), b.op("rescale", y, out=i32)
    m = b.op("mul", b.op("rescale", x, out=QuantSpec.per_tensor(0.05, 0, DType.INT32)),
             b.op("rescale", y, out=QuantSpec.per_tensor(0.07, 0, DType.INT32)), shift=3)
    outs = [b.op("rescale", v, out=QuantSpec.per_tensor(s, 0)) for v, s in
            ((b.op("add", xa, ya), 0.1), (b.op("sub", xa, ya), 0.1), (m, 0.01))]
    return b.build(outs), [codes(rng, (2, 3, 8)), codes(rng, (2, 1, 8))]


def pools_and_layout(rng):
    """max/avg pool (padded), concat, table, pad, slice, transpose, reshape."""
    b = GraphBuilder("layout")
    x = b.input("x", act((1, 8, 8, 4), 0.05, 3))
    m = b.op("max_pool2d", x, kernel=(3, 3), stride=(2, 2), pad=(1, 1, 1, 1))
    a = b.op("avg_pool2d", x, kernel=(3, 3), stride=(2, 2), pad=(1, 1, 1, 1))
    cat = b.op("concat", (m, a), axis=3)
    table = np.clip(np.arange(-128, 128) // 2 + 7, -128, 127).astype(np.int8)
    t = b.op("table", cat, table=table, offset=128, out=QuantSpec.per_tensor(0.1, 0))
    p = b.op("pad", t, pads=(0, 0, 1, 2, 0, 1, 0, 0), value=3)
    s = b.op("slice", p, start=(0, 1, 0, 1), stop=(1, 7, 5, 8))
    tr = b.op("transpose", s, perm=(0, 3, 1, 2))
    return b.build([cat, b.op("reshape", tr, shape=(7, 30))]), [codes(rng, (1, 8, 8, 4))]


def matmul_reduce_int16(rng):
    """matmul int8 -> int32, reduce_sum / reduce_max, an int16 rescale + clamp, an int32 clamp."""
    b = GraphBuilder("matmul")
    a = b.input("a", act((2, 4, 6), 0.1, 9))
    c = b.input("c", act((2, 6, 3), 0.2, -4))
    y = b.op("matmul", a, c)
    h = b.op("clamp", b.op("rescale", a, out=QuantSpec.per_tensor(0.0007, 0, DType.INT16)), min=-900, max=3000)
    outs = [y, b.op("reduce_sum", y, axis=2), b.op("reduce_max", a, axis=1),
            b.op("rescale", h, out=QuantSpec.per_tensor(0.1, 5)), b.op("clamp", y, min=-700, max=1234)]
    return b.build(outs), [codes(rng, (2, 4, 6)), codes(rng, (2, 6, 3))]


GRAPHS = {"conv_chain": conv_chain, "int32_arithmetic": int32_arithmetic, "pools_and_layout": pools_and_layout,
          "matmul_reduce_int16": matmul_reduce_int16}


def assert_exact(got, want, float_rtol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=float_rtol, atol=0)
        else:
            np.testing.assert_array_equal(g, w)


def test_targets_are_registered():
    assert {"vgf", "vgf+int"} <= set(targets())
    assert isinstance(backend_for("vgf"), VgfBackend) and isinstance(backend_for("vgf+int"), VgfBackend)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_runs_on_vulkan_bit_exact(name, vulkan):
    rng = np.random.default_rng(sorted(GRAPHS).index(name))
    g, xs = GRAPHS[name](rng)
    g = verify_graph(g)
    be = VgfBackend()
    p = be.lower(g, "vgf+int")
    assert p.meta["execution"].startswith("vulkan:") and vulkan in p.meta["execution"]
    assert set(p.blobs) == {"graph.tosa", "model.vgf"} and p.blobs["model.vgf"][:4] == b"VGF1"
    assert p.input_types == tuple(v.type for v in g.inputs)
    assert p.output_types == tuple(v.type for v in g.outputs)
    assert_exact(be.execute(p, xs), run_graph(g, xs))


def test_float_ops_in_the_vgf_target(vulkan):
    """int8 -> dequantize -> sigmoid -> quantize (TOSA-1.0+INT+FP): int8 result exact, float within 1e-5."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("fp")
    x = b.input("x", act((1, 4, 4, 8), 0.05, 3))
    s = b.op("sigmoid", b.op("dequantize", x, None))
    g = verify_graph(b.build([b.op("quantize", s, out=QuantSpec.per_tensor(1 / 256, -128)), s]))
    be = VgfBackend()
    with pytest.raises(UnsupportedOpError, match="float op"):  # float ops are not TOSA-1.0+INT
        be.lower(g, "vgf+int")
    p = be.lower(g, "vgf")
    assert p.meta["profile"] == "TOSA-1.0+INT+FP" and p.meta["execution"].startswith("vulkan:")
    xs = [codes(rng, (1, 4, 4, 8))]
    assert_exact(be.execute(p, xs), run_graph(g, xs))


def test_outputs_that_share_a_tensor(vulkan):
    """An output that is the graph's input, and one output listed twice: the converter gives them the
    binding of the tensor they are; both come back with the right values."""
    b = GraphBuilder("aliases")
    x = b.input("x", act((2, 3)))
    y = b.op("clamp", x, min=0, max=5)
    g = verify_graph(b.build([x, y, y]))
    xs = [np.arange(-3, 3, dtype=np.int8).reshape(2, 3)]
    be = VgfBackend()
    got = be.execute(be.lower(g, "vgf+int"), xs)
    assert [a.tolist() for a in got] == [[[-3, -2, -1], [0, 1, 2]], [[0, 0, 0], [0, 1, 2]], [[0, 0, 0], [0, 1, 2]]]


def test_partitioned_program_around_a_host_op(vulkan):
    """vgf+int: float sigmoid stays on the host between two VGF partitions; whole program exact."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("mid")
    x = b.input("x", act((1, 6, 6, 4), 0.05, 3))
    wq = QuantSpec.per_tensor(0.01, 0)
    c1 = b.op("rescale", b.op("conv2d", x, b.constant(codes(rng, (8, 3, 3, 4), lo=-127), wq), None, pad=(1, 1, 1, 1)),
              out=QuantSpec.per_tensor(0.1, -2))
    s = b.op("sigmoid", b.op("dequantize", c1, None))
    q = b.op("quantize", s, out=QuantSpec.per_tensor(1 / 256, -128))
    c2 = b.op("rescale", b.op("conv2d", q, b.constant(codes(rng, (4, 1, 1, 8), lo=-127), wq), None),
              out=QuantSpec.per_tensor(0.02, 5))
    g = verify_graph(b.build([c2]))
    be = VgfBackend()
    res = partition(g, be, "vgf+int")
    assert len(res.partitions) == 2
    assert {d.op.kind for d in res.decisions} == {"dequantize", "sigmoid", "quantize"}
    for p in res.partitions:
        assert p.payload.meta["execution"].startswith("vulkan:")
        io = p.payload.meta["io"]
        assert [e["shape"] for e in io] == [list(t.shape) for t in p.input_types + p.output_types]
    xs = [codes(rng, (1, 6, 6, 4))]
    assert_exact(Runner(res.host, res.partitions, {be.name: be}).run(xs), run_graph(g, xs))


def test_simulated_payload_says_so_and_is_exact():
    rng = np.random.default_rng(8)
    g, xs = int32_arithmetic(rng)
    be = VgfBackend("simulate")
    p = be.lower(verify_graph(g), "vgf+int")
    assert p.meta["execution"] == ("simulated: TOSA reference model (reason: VGF execution mode 'simulate' "
                                   "was requested)")
    assert set(p.blobs) == {"graph.tosa", "model.vgf"}
    assert_exact(be.execute(p, xs), run_graph(g, xs))


def test_auto_falls_back_with_the_exact_reason(monkeypatch):
    reason = "ExecutionError: vk::raii::PhysicalDevice::createDevice: ErrorFeatureNotPresent"
    monkeypatch.setattr(vgf_backend, "vulkan_status", lambda: (False, reason))
    rng = np.random.default_rng(9)
    g, xs = int32_arithmetic(rng)
    p = VgfBackend("auto").lower(verify_graph(g), "vgf+int")
    assert p.meta["execution"] == f"simulated: TOSA reference model (reason: {reason})"
    assert_exact(VgfBackend().execute(p, xs), run_graph(g, xs))
    with pytest.raises(CompileError, match="mode 'vulkan' was requested.*ErrorFeatureNotPresent"):
        VgfBackend("vulkan").lower(verify_graph(g), "vgf+int")


def test_vulkan_payload_never_falls_back_silently(monkeypatch, vulkan):
    rng = np.random.default_rng(10)
    g, xs = int32_arithmetic(rng)
    p = VgfBackend().lower(verify_graph(g), "vgf+int")

    def missing():
        raise VulkanUnavailable("the ML SDK scenario runner (scenario-runner) is not installed")
    monkeypatch.setattr(vgf_runner, "scenario_runner_path", missing)
    with pytest.raises(ExecutionError, match="compiled to run on Vulkan, which can't run here: the ML SDK scenario "
                                             "runner .* not installed.*Compile again"):
        VgfBackend().execute(p, xs)


def test_bad_execution_mode():
    with pytest.raises(ValueError, match="'gpu': expected one of auto, vulkan, simulate"):
        VgfBackend("gpu")


def test_io_description_is_checked_before_running(vulkan):
    """A payload whose meta["io"] lost its binding numbers (e.g. an edited program file) is refused."""
    import dataclasses

    b = GraphBuilder("c")
    x = b.input("x", act((2, 3)))
    g = verify_graph(b.build([b.op("clamp", x, min=0, max=5)]))
    p = VgfBackend().lower(g, "vgf+int")
    broken = dataclasses.replace(p, meta={**p.meta, "io": [{"kind": "input", "binding": "0"}, p.meta["io"][1]]})
    with pytest.raises(ExecutionError, match="IO description does not list 1 input\\(s\\) and 1 output"):
        VgfBackend().execute(broken, [np.zeros((2, 3), np.int8)])
    io = [dict(e) for e in p.meta["io"]]
    io[1]["shape"] = [3, 2]
    with pytest.raises(ExecutionError, match="says VK_FORMAT_R8_SINT\\[3, 2\\] where the payload's boundary type"):
        VgfBackend().execute(dataclasses.replace(p, meta={**p.meta, "io": io}), [np.zeros((2, 3), np.int8)])


@pytest.mark.parametrize("mode", ["vulkan", "simulate"])
def test_traced_intermediates_match_the_reference(mode, vulkan):
    """With trace, every mapped intermediate comes back (from trace.vgf on Vulkan, or from the
    TOSA reference model when simulated) and equals the reference interpreter's value."""
    rng = np.random.default_rng(11)
    g, xs = conv_chain(rng)
    g = verify_graph(g)
    be = VgfBackend(mode)
    p = be.lower(g, "vgf+int", trace=True)
    assert {"trace.tosa", "trace.vgf"} <= set(p.blobs)
    traced = be.execute_traced(p, xs, list(p.tensor_map))
    want, env = run_graph(g, xs, keep_all=True)
    by_name = {v.name: a for v, a in env.items()}
    inner = {p.tensor_map[t] for t in p.meta["tosa"]["trace_outputs"]}
    assert len(inner) >= 4 and inner <= {p.tensor_map[t] for t in traced}
    for tensor, array in traced.items():
        np.testing.assert_array_equal(array, by_name[p.tensor_map[tensor]], err_msg=tensor)
    assert_exact(be.execute(p, xs), want)
    # without trace: the partition's inputs and outputs only
    plain = be.lower(g, "vgf+int")
    assert "trace.vgf" not in plain.blobs
    shown = be.execute_traced(plain, xs, list(plain.tensor_map))
    assert {plain.tensor_map[t] for t in shown} == {v.name for v in g.inputs + g.outputs}
    for tensor, array in shown.items():
        np.testing.assert_array_equal(array, by_name[plain.tensor_map[tensor]], err_msg=tensor)


def test_wrong_inputs_are_input_errors_naming_the_partition(vulkan):
    g, xs = int32_arithmetic(np.random.default_rng(9))
    be = VgfBackend("vulkan")
    p = be.lower(verify_graph(g), "vgf+int")
    bad_shape = np.zeros(tuple(d + 1 for d in xs[0].shape), xs[0].dtype)
    with pytest.raises(InputError, match=re.escape(f"input 0 of the VGF partition has shape {bad_shape.shape}")):
        be.execute(p, [bad_shape, *xs[1:]])
    with pytest.raises(InputError, match="input 0 of the VGF partition has dtype float64"):
        be.execute(p, [xs[0].astype(np.float64), *xs[1:]])
    with pytest.raises(InputError, match=f"the VGF partition takes {len(xs)} input"):
        be.execute(p, [*xs, xs[0]])
