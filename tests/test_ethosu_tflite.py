"""An Ethos-U program exported as one .tflite for TFLM: NPU partitions as Vela's ``ethos-u``
custom operators holding exactly Vela's output, host ops as TFLM builtins.

Nothing here runs an Ethos-U: the file is cut at its custom operators, the builtin pieces run on
TFLM's own interpreter and each custom operator on the simulated executor of the payload whose
bytes it holds; the result must be bit-exact with ``prog.run`` and the reference.
"""

import functools
from pathlib import Path

import numpy as np
import pytest

import qlower
from qlower import cli, zoo
from qlower.api import lower_graph
from qlower.backends.ethosu import tflite_export
from qlower.backends.ethosu.backend import EthosUBackend
from qlower.backends.ethosu.tflite_check import npu_offsets, payload_of, read_npu_tflite, run_split
from qlower.backends.tflm import runner
from qlower.errors import ExecutionError, InvalidProgramError, UnsupportedOpError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph

# reduced sizes and no cost-driven channel widening: the file's layout is the same at any size
OPTIONS = {"widen_channels": False, "per_layer": False}


@functools.cache
def _compiled(name: str, target: str):
    size = 32 if zoo.default_size(name) else None
    model, example, cfg, calibration = zoo.get(name, size=size)
    prog = qlower.compile(model, example, target=target, quant=cfg, calibration=calibration, progress=False,
                          backend_options=OPTIONS)
    return prog, [x.detach().numpy() for x in example]


def _exported(name: str, target: str, tmp_path: Path):
    prog, example = _compiled(name, target)
    return prog, example, Path(prog.export(tmp_path / f"{name}.tflite", format="tflite")).read_bytes()


def _inputs(example, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=x.shape).astype(x.dtype) for x in example]


CASES = [pytest.param("ds_cnn_kws", "ethos-u55-128"), pytest.param("ds_cnn_kws", "ethos-u85-256"),
         pytest.param("mobilenet_v2", "ethos-u55-128", marks=pytest.mark.slow),
         pytest.param("mobilenet_v2", "ethos-u85-256", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, target", CASES)
def test_custom_operators_hold_vela_s_output_and_the_file_runs_bit_exact(name, target, tmp_path):
    prog, example, data = _exported(name, target, tmp_path)
    model, calls = read_npu_tflite(data)
    payloads = [p.payload for p in prog.partitions]
    assert len(calls) == len(payloads) >= 1
    sg = model.subgraphs[0]
    offsets = npu_offsets(data)
    for call in calls:
        p = payload_of(call, payloads)
        assert call.command_stream == p.blobs["command_stream.bin"] and call.command_stream[:4] == b"COP1"
        assert call.flash == p.blobs["read_only.bin"]
        scratch = sg.operators[call.index].inputs[2]
        assert list(sg.tensors[scratch].shape) == [p.meta["scratch_size"]]
        # Vela addresses IFMs and OFMs inside the scratch area: the file places them there
        ios = p.meta["io"]
        for t, io in zip((*call.inputs, *call.outputs), [i for i in ios if i["kind"] == "input"]
                         + [i for i in ios if i["kind"] == "output"]):
            assert offsets[t] == offsets[scratch] + io["offset"]
    builtins = len(sg.operators) - len(calls)
    assert builtins > 0, "the boundary quantize/transpose/dequantize are TFLM builtins"
    assert "Arm's FVP" in prog.export_note("tflite")
    for seed in range(2):
        inputs = example if seed == 0 else _inputs(example, seed)
        got = run_split(data, payloads, inputs, EthosUBackend().execute)
        want = prog.run(*inputs)
        for g, w, r in zip(got, want, run_graph(prog.source, inputs)):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(g, r)


def test_a_custom_operator_is_matched_to_its_payload_byte_for_byte(tmp_path):
    prog, _, data = _exported("ds_cnn_kws", "ethos-u55-128", tmp_path)
    (call,) = read_npu_tflite(data)[1]
    payload = prog.partitions[0].payload
    other = type(payload)(**{**payload.__dict__, "blobs": {**payload.blobs, "read_only.bin":
                                                            payload.blobs["read_only.bin"][:-1] + b"\x00"}})
    with pytest.raises(InvalidProgramError, match="no payload's Vela output"):
        payload_of(call, [other])


def test_a_corrupt_file_is_rejected_with_a_reason(tmp_path):
    prog, example, data = _exported("ds_cnn_kws", "ethos-u55-128", tmp_path)
    payloads = [p.payload for p in prog.partitions]
    for bad in (b"", data[:100], data[:4] + b"XXXX" + data[8:], data[: len(data) // 2]):
        with pytest.raises(InvalidProgramError):
            read_npu_tflite(bad)
    rng = np.random.default_rng(0)
    rejected = 0
    for _ in range(40):   # flipped bytes: rejected, or a model that still reads (never a crash)
        buf = bytearray(data)
        for i in rng.integers(0, len(buf), 4):
            buf[i] ^= 0xFF
        try:
            read_npu_tflite(bytes(buf))
        except InvalidProgramError:
            rejected += 1
    assert rejected > 0
    # a custom operator that isn't Vela's NPU op
    i = data.index(tflite_export.NPU_OP_OPTIONS)
    with pytest.raises(InvalidProgramError, match="NPU-op layout"):
        read_npu_tflite(data[:i] + b"\x02" + data[i + 1:])
    with pytest.raises(ExecutionError, match="takes 1 inputs"):
        run_split(data, payloads, [], EthosUBackend().execute)


def test_a_host_op_without_a_tflm_form_is_named_with_its_source_line(tmp_path, monkeypatch):
    prog, _ = _compiled("ds_cnn_kws", "ethos-u55-128")
    real = tflite_export.TflmExport.emit

    def refuse_transpose(self, op):
        if op.kind == "transpose":
            raise tflite_export.NotExact("no TFLM kernel (test)")
        return real(self, op)

    monkeypatch.setattr(tflite_export.TflmExport, "emit", refuse_transpose)
    with pytest.raises(UnsupportedOpError, match=r"transpose producing %x_2 at x.*no TFLM kernel \(test\)"):
        prog.export(tmp_path / "m.tflite", format="tflite")


def test_cli_writes_the_ethos_u_tflite(tmp_path, capsys):
    path = tmp_path / "tiny.tflite"
    assert cli.main(["compile", "zoo:tiny_cnn", "--size", "16", "--target", "ethos-u55-128", "--format", "tflite",
                     "-o", str(path)]) == 0
    assert "Arm's FVP" in capsys.readouterr().out
    _, calls = read_npu_tflite(path.read_bytes())
    assert len(calls) == 1


def _conv(b, x, cout, seed, name, out):
    rng = np.random.default_rng(seed)
    wq = QuantSpec.per_channel(rng.uniform(0.004, 0.01, cout), axis=0)
    w = b.constant(rng.integers(-127, 128, (cout, 3, 3, x.shape[3])).astype(np.int8), wq, name=f"{name}_w")
    bias = b.constant(rng.integers(-3000, 3000, cout).astype(np.int32), QuantSpec.accumulator(x.quant, wq, axis=0),
                      name=f"{name}_b")
    return b.op("rescale", b.op("conv2d", x, w, bias, pad=(1, 1, 1, 1), name=name), out=out, name=f"{name}_rq")


def _two_partitions(host_op: str):
    """conv (NPU) -> float ``host_op`` (host) -> conv (NPU); the first conv's result is an output too."""
    b = GraphBuilder("mid")
    x = b.input("x", TensorType((1, 8, 8, 4), DType.INT8, QuantSpec.per_tensor(0.05, 3)))
    a = _conv(b, x, 8, 0, "c1", QuantSpec.per_tensor(0.1, -2))
    f = b.op("dequantize", a, None, name="a_f")
    f = b.op("clamp", f, min=0.0, max=0.5, name="mid") if host_op == "clamp" else b.op(host_op, f, name="mid")
    q = b.op("quantize", f, out=QuantSpec.per_tensor(1 / 256, -128), name="mid_q")
    c = _conv(b, q, 8, 1, "c2", QuantSpec.per_tensor(0.02, 5))
    return lower_graph(verify_graph(b.build([c, b.op("dequantize", c, None, name="c_f"), a])), "ethos-u85-256")


def test_two_partitions_get_scratch_areas_of_their_own_and_run_bit_exact(tmp_path):
    prog = _two_partitions("clamp")
    assert prog.graph.count_ops()["delegate"] == 2
    data = Path(prog.export(tmp_path / "m.tflite")).read_bytes()
    model, calls = read_npu_tflite(data)
    offsets, sg = npu_offsets(data), model.subgraphs[0]
    areas = sorted((offsets[sg.operators[c.index].inputs[2]], sg.tensors[sg.operators[c.index].inputs[2]].shape[0])
                   for c in calls)
    assert len(areas) == 2 and areas[0][0] + areas[0][1] <= areas[1][0], "disjoint scratch areas"
    payloads = [p.payload for p in prog.partitions]
    for seed in range(2):
        x = [np.random.default_rng(seed).integers(-128, 128, (1, 8, 8, 4)).astype(np.int8)]
        for g, w in zip(run_split(data, payloads, x, EthosUBackend().execute), run_graph(prog.source, x)):
            np.testing.assert_array_equal(g, w)


def test_a_float_host_op_tflite_has_no_form_of_is_named(tmp_path):
    prog = _two_partitions("sigmoid")
    with pytest.raises(UnsupportedOpError, match="sigmoid producing %mid can't be exported"):
        prog.export(tmp_path / "m.tflite")


def test_a_tensor_two_partitions_read_is_copied_to_the_second_s_place(tmp_path):
    """Vela places each partition's IFMs in its own scratch area: the model input both partitions read
    can't be in both places, so the second reads a copy."""
    xq = QuantSpec.per_tensor(0.05, 3)
    b = GraphBuilder("shared")
    x = b.input("x", TensorType((1, 8, 8, 4), DType.INT8, xq))
    a = _conv(b, x, 4, 0, "c1", QuantSpec.per_tensor(0.1, -2))
    f = b.op("clamp", b.op("dequantize", a, None, name="a_f"), min=0.0, max=0.5, name="mid")
    y = b.op("maximum", b.op("quantize", f, out=xq, name="mid_q"), x, name="y")
    prog = lower_graph(verify_graph(b.build([y])), "ethos-u85-256")
    assert [len(p.subgraph.inputs) for p in prog.partitions] == [1, 2]
    data = Path(prog.export(tmp_path / "m.tflite")).read_bytes()
    model, calls = read_npu_tflite(data)
    sg, offsets = model.subgraphs[0], npu_offsets(data)
    names = [sg.tensors[t].name for c in calls for t in c.inputs]
    assert names == [b"x", b"mid_q", b"x/npu"]
    for c in calls:   # every IFM inside its own partition's scratch area
        area = sg.operators[c.index].inputs[2]
        for t in c.inputs:
            assert offsets[area] <= offsets[t] < offsets[area] + sg.tensors[area].shape[0]
    x0 = [np.random.default_rng(0).integers(-128, 128, (1, 8, 8, 4)).astype(np.int8)]
    (got,) = run_split(data, [p.payload for p in prog.partitions], x0, EthosUBackend().execute)
    np.testing.assert_array_equal(got, run_graph(prog.source, x0)[0])


@pytest.mark.parametrize("rounding", ["single", "double"])
def test_a_host_gemm_fuses_only_where_it_rounds_as_tflm_s_kernel(rounding):
    """An Ethos-U program's host GEMM rounds as TOSA (single): TFLM's fused CONV_2D (double) would differ
    by a step somewhere (7 of 4,096 here), so it is refused by name; one that rounds twice is exact."""
    rng = np.random.default_rng(0)
    xq = QuantSpec.per_tensor(0.0625, 3)
    b = GraphBuilder("host_gemm")
    x = b.input("x", TensorType((1, 16, 16, 8), DType.INT8, xq))
    wq = QuantSpec.per_channel(rng.uniform(0.004, 0.01, 16).astype(np.float32).astype(np.float64), axis=0)
    w = b.constant(rng.integers(-127, 128, (16, 3, 3, 8)).astype(np.int8), wq, name="w")
    bias = b.constant(rng.integers(-3000, 3000, 16).astype(np.int32), QuantSpec.accumulator(xq, wq, axis=0),
                      name="bias")
    acc = b.op("conv2d", x, w, bias, pad=(1, 1, 1, 1), name="c")
    g = verify_graph(b.build([b.op("rescale", acc, out=QuantSpec.per_tensor(0.125, -2), rounding=rounding,
                                   name="y")]))
    if rounding == "single":
        with pytest.raises(UnsupportedOpError, match="conv2d producing %c.*%y rounds single"):
            tflite_export.export_ethosu_tflite(g, {}, "host gemm")
        return
    data = tflite_export.export_ethosu_tflite(g, {}, "host gemm")
    xs = [rng.integers(-128, 128, (1, 16, 16, 8)).astype(np.int8)]
    np.testing.assert_array_equal(runner.run(data, runner.smallest_arena(data), xs)[0], run_graph(g, xs)[0])
