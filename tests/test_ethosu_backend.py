"""The Ethos-U backend on IR graphs: verdicts with Vela's reasons, boundary types from
Vela's IO description, boundary transposes on the host, simulated runs bit-exact
with the reference interpreter, and the C header export."""

from __future__ import annotations

import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch

import qlower
from qlower.api import lower_graph
from qlower.backends.ethosu import EthosUBackend, c_header
from qlower.backends.ethosu.backend import EXECUTION, aliased_outputs, boundary_type, materialize_aliased_outputs
from qlower.backends.ethosu.support import BOUNDARY_TRANSPOSE_REASON
from qlower.backends.ethosu.vela import IOTensor
from qlower.errors import CompileError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, Value, verify_graph
from qlower.partition import partition
from qlower.reference import run_graph
from qlower.runtime.runner import Runner

XQ = QuantSpec.per_tensor(0.05, 3)
U85, U55 = "ethos-u85-256", "ethos-u55-128"


def conv_block(b: GraphBuilder, x: Value, cout: int, seed: int, name: str, out: QuantSpec | None = None,
               requant: bool = True) -> Value:
    """3x3 conv (per-channel int8 weights, int32 bias), then a rescale to ``out`` unless ``requant`` is off."""
    rng = np.random.default_rng(seed)
    cin = x.shape[3]
    wq = QuantSpec.per_channel(rng.uniform(0.004, 0.01, cout), axis=0)
    w = b.constant(rng.integers(-127, 128, (cout, 3, 3, cin)).astype(np.int8), wq, name=f"{name}_w")
    bias = b.constant(rng.integers(-3000, 3000, cout).astype(np.int32), QuantSpec.accumulator(x.quant, wq, axis=0),
                      name=f"{name}_b")
    acc = b.op("conv2d", x, w, bias, pad=(1, 1, 1, 1), name=name)
    if not requant:
        return acc
    return b.op("rescale", acc, out=out or QuantSpec.per_tensor(0.1, -2), name=f"{name}_rq")


def float_in_the_middle():
    """int8 conv -> dequantize -> sigmoid (float: host) -> quantize -> conv -> int8, plus a float output."""
    b = GraphBuilder("mid")
    x = b.input("x", TensorType((1, 8, 8, 4), DType.INT8, XQ))
    a = conv_block(b, x, 8, 0, "c1")
    s = b.op("sigmoid", b.op("dequantize", a, None, name="a_f"), name="sig")
    q = b.op("quantize", s, out=QuantSpec.per_tensor(1 / 256, -128), name="sig_q")
    c = conv_block(b, q, 8, 1, "c2", out=QuantSpec.per_tensor(0.02, 5))
    return verify_graph(b.build([c, b.op("dequantize", c, None, name="c_f")]))


def intdiv_in_the_middle(runtime_divisor: bool = True):
    """int8 conv -> int32 accumulator // (a value computed at run time in [1, 100], Vela: not on
    U55; or the constant 7, multiplies and shifts on U55) -> rescale -> int8."""
    b = GraphBuilder("div")
    x = b.input("x", TensorType((1, 8, 8, 4), DType.INT8, XQ))
    acc = conv_block(b, x, 8, 2, "c1", requant=False)
    one = QuantSpec.per_tensor(1.0, 0, DType.INT32)
    seven = b.constant(np.full((1, 1, 1, 1), 7, np.int32), one, name="seven")
    acc_t = b.op("rescale", acc, out=QuantSpec.per_tensor(1e-4, 0, DType.INT32), name="acc_t")
    divisor = seven
    if runtime_divisor:
        divisor = b.op("clamp", b.op("rescale", acc, out=one, name="acc_1"), min=1, max=100, name="divisor")
    d = b.op("intdiv", acc_t, divisor, name="div")
    return verify_graph(b.build([b.op("rescale", d, out=QuantSpec.per_tensor(0.01, 0), name="y")]))


def _inputs(g, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(v.dtype.min, v.dtype.max + 1, v.shape).astype(v.dtype.numpy) for v in g.inputs]


def _op(g, name):
    return next(op for op in g.ops if op.results and op.results[0].name == name)


def _partition_and_run(g, target, seeds=(0, 1)):
    be = EthosUBackend()
    be.prepare(g)
    res = partition(g, be, target)
    runner = Runner(res.host, res.partitions, {be.name: be})
    for seed in seeds:
        xs = _inputs(g, seed)
        got, want = runner.run(xs), run_graph(g, xs)
        assert len(got) == len(want)
        for a, e in zip(got, want):
            assert a.dtype == e.dtype
            np.testing.assert_array_equal(a, e)
    return res


def _check_boundaries_are_vela_s(res):
    """Every partition boundary type has Vela's element size for that tensor."""
    for p in res.partitions:
        io = p.payload.meta["io"]
        ins = [e for e in io if e["kind"] == "input"]
        outs = [e for e in io if e["kind"] == "output"]
        assert len(ins) == len(p.input_types) and len(outs) == len(p.output_types)
        for t, e in zip(p.input_types + p.output_types, ins + outs):
            assert t.dtype.itemsize == e["element_size"] and list(t.shape) == e["shape"]


# -- verdicts ---------------------------------------------------------------------------------

def test_intdiv_is_rejected_by_vela_on_u55_only():
    g = intdiv_in_the_middle()
    be = EthosUBackend()
    be.prepare(g)
    div = _op(g, "div")
    no = be.supports(div, U55)
    assert not no and no.reason == ("Vela (ethos-u55-128): Non-passthrough operation (Equal) could not run on NPU "
                                    "(intdiv lowers to TOSA ADD, EQUAL, INTDIV, MUL, SELECT)")
    assert be.supports(div, U85)
    assert be.supports(_op(g, "c1"), U55) and be.supports(_op(g, "y"), U55)


def test_float_ops_stay_on_the_host_with_the_tosa_reason():
    g = float_in_the_middle()
    be = EthosUBackend()
    for name in ("a_f", "sig", "sig_q"):
        v = be.supports(_op(g, name), U85)
        assert not v and v.reason.startswith("not in TOSA-1.0+INT")


def _transposes_graph():
    """float NCHW input -> quantize -> transpose to NHWC (boundary) -> conv -> transpose (inner) -> conv
    -> transpose to NCHW (boundary: only a dequantize follows, into the output)."""
    b = GraphBuilder("nchw")
    x = b.input("x", TensorType((1, 4, 8, 8), DType.FLOAT32))
    q = b.op("quantize", x, out=XQ, name="xq")
    t0 = b.op("transpose", q, perm=(0, 2, 3, 1), name="to_nhwc")
    a = conv_block(b, t0, 8, 3, "c1")
    t1 = b.op("transpose", a, perm=(0, 2, 1, 3), name="inner")
    c = conv_block(b, t1, 8, 4, "c2")
    back = b.op("transpose", c, perm=(0, 3, 1, 2), name="to_nchw")
    return verify_graph(b.build([b.op("dequantize", back, None, name="out")]))


def test_boundary_transpose_stays_on_the_host_once_the_graph_is_known():
    g = _transposes_graph()
    be = EthosUBackend()
    assert be.supports(_op(g, "to_nhwc"), U85)  # without the graph, nothing marks it as the boundary
    be.prepare(g)
    v = be.supports(_op(g, "to_nhwc"), U85)
    assert not v and v.reason == BOUNDARY_TRANSPOSE_REASON
    assert be.supports(_op(g, "inner"), U85)
    assert be.supports(_op(g, "to_nchw"), U85).reason == BOUNDARY_TRANSPOSE_REASON


def test_boundary_transpose_runs_on_the_host_and_the_program_is_exact():
    g = _transposes_graph()
    rng = np.random.default_rng(5)
    be = EthosUBackend()
    res = partition(g, be, U85)  # the partitioner hands the graph to prepare() itself
    assert [op.kind for op in res.host.ops if op.kind != "constant"] == ["quantize", "transpose", "delegate",
                                                                         "transpose", "dequantize"]
    assert [d.op.kind for d in res.decisions if d.reason == BOUNDARY_TRANSPOSE_REASON] == ["transpose"] * 2
    x = rng.normal(size=(1, 4, 8, 8)).astype(np.float32)
    out = Runner(res.host, res.partitions, {be.name: be}).run([x])
    np.testing.assert_array_equal(out[0], run_graph(g, [x])[0])


# -- partitions and boundary types --------------------------------------------------------------

def test_float_in_the_middle_on_u85():
    g = float_in_the_middle()
    res = _partition_and_run(g, U85)
    assert len(res.partitions) == 2
    _check_boundaries_are_vela_s(res)
    for p in res.partitions:
        assert all(t.dtype is DType.INT8 and t.dtype.itemsize == 1 for t in p.output_types)
        meta = p.payload.meta
        assert meta["execution"] == EXECUTION and meta["accelerator"] == U85
        assert meta["perf"]["npu_cycles"] > 0 and meta["perf"]["macs"] == 8 * 8 * 8 * 3 * 3 * (4 if p.name == "p0"
                                                                                                else 8)
        assert set(p.payload.blobs) == {"graph.tosa", "command_stream.bin", "read_only.bin"}
        assert p.payload.blobs["command_stream.bin"][:4] == b"COP1"
        # what the device spends heads the summary explain() prints: total cycles, then the NPU's part
        perf = meta["perf"]
        assert perf["total_cycles"] >= perf["npu_cycles"]
        assert f"{perf['total_cycles']:,} total cycles ({perf['npu_cycles']:,} NPU," in meta["summary"]
        assert "Ethos_U85_SYS_DRAM_Mid / Dedicated_Sram_384KB, Vela's own defaults for ethos-u85)" in meta["summary"]
    # the host turns each int8 delegate result into float with an explicit dequantize
    users = res.host.users()
    for op in res.host.ops:
        if op.kind == "delegate":
            for r in op.results:
                assert r.type.dtype is DType.INT8
                assert {u.kind for u in users[r]} <= {"dequantize", "delegate"}
    assert sum(op.kind == "dequantize" for op in res.host.ops) == 2


def test_int32_boundary_on_u55_keeps_vela_s_four_byte_elements():
    g = intdiv_in_the_middle()
    res = _partition_and_run(g, U55)
    assert len(res.partitions) == 2
    _check_boundaries_are_vela_s(res)
    assert [t.dtype for t in res.partitions[0].output_types] == [DType.INT32, DType.INT32]  # dividend, divisor
    assert [d.op.kind for d in res.decisions] == ["intdiv"]
    assert "Non-passthrough operation (Equal)" in res.decisions[0].reason
    res85 = _partition_and_run(g, U85, seeds=(0,))
    assert len(res85.partitions) == 1 and not res85.decisions
    explained = lower_graph(g, U55).explain()
    assert "%div = intdiv  at <no source>: Vela (ethos-u55-128): Non-passthrough operation (Equal)" in explained


def test_intdiv_by_a_constant_runs_on_u55_as_multiplies_and_shifts():
    g = intdiv_in_the_middle(runtime_divisor=False)
    res = _partition_and_run(g, U55, seeds=(0, 1, 2))
    assert len(res.partitions) == 1 and not res.decisions
    tosa_ops = lower_graph(g, U55).partitions[0].payload.meta["tosa"]["tosa_ops"]
    assert "INTDIV" not in tosa_ops and tosa_ops["RESCALE"] >= 2


def test_boundary_type_refuses_to_reinterpret():
    v = Value("x", TensorType((1, 4), DType.INT8, XQ))
    ok = IOTensor("input-0", "INT8", (1, 4), (1, 1, 1, 1, 1, 4), 1, 4, 1, 0)
    assert boundary_type(ok, v, "input") == v.type
    with pytest.raises(CompileError, match="4 byte\\(s\\) per element for a INT8"):
        boundary_type(IOTensor("input-0", "INT8", (1, 4), (1, 4), 4, 16, 1, 0), v, "input")
    with pytest.raises(CompileError, match="refusing to reinterpret"):
        boundary_type(IOTensor("input-0", "INT32", (1, 4), (1, 4), 4, 16, 1, 0), v, "input")
    with pytest.raises(CompileError, match="refusing to reinterpret"):
        boundary_type(IOTensor("input-0", "INT8", (4, 1), (4, 1), 1, 4, 1, 0), v, "input")


def test_per_layer_option_and_meta_is_json():
    import json

    g = float_in_the_middle()
    be = EthosUBackend(per_layer=True)
    be.prepare(g)
    res = partition(g, be, U55)
    meta = res.partitions[0].payload.meta
    json.dumps(meta)
    assert [row["source_operator"] for row in meta["per_layer"] if row["macs"]] == ["Conv2D"]
    assert meta["per_layer"][0]["macs"] == 8 * 8 * 8 * 3 * 3 * 4
    assert (meta["system_config"], meta["memory_mode"]) == ("Ethos_U55_High_End_Embedded", "Shared_Sram")


# -- C header ---------------------------------------------------------------------------------

_DUMP_C = r"""
#include <stdio.h>
#include <stdint.h>
#include "part.h"
static void dump(const uint8_t *p, unsigned n) { fwrite(p, 1, n, stdout); }
int main(void) {
    unsigned hdr[6] = {P0_COMMAND_STREAM_SIZE, P0_READ_ONLY_SIZE, P0_SCRATCH_SIZE, P0_INPUT_0_OFFSET,
                       P0_OUTPUT_0_SIZE, (unsigned)(((uintptr_t)p0_command_stream | (uintptr_t)p0_read_only) % 16)};
    fwrite(hdr, sizeof hdr, 1, stdout);
    dump(p0_command_stream, P0_COMMAND_STREAM_SIZE);
    dump(p0_read_only, P0_READ_ONLY_SIZE);
    fputs(P0_ACCELERATOR "|" P0_INPUT_0_VALUE "|" P0_OUTPUT_0_VALUE "|" P0_OUTPUT_0_NAME, stdout);
    return 0;
}
"""


def test_c_header_compiles_and_holds_the_payload(tmp_path):
    assert shutil.which("gcc"), "gcc is needed to compile the header (scripts/setup_compiler.sh installs it)"
    g = float_in_the_middle()
    be = EthosUBackend()
    res = partition(g, be, U85)
    payload = res.partitions[0].payload
    (tmp_path / "part.h").write_text(c_header(payload, "p0"))
    subprocess.run(["gcc", "-fsyntax-only", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-x", "c",
                    str(tmp_path / "part.h")], check=True)
    (tmp_path / "dump.c").write_text(_DUMP_C)
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-I", str(tmp_path), "-o", str(tmp_path / "dump"),
                    str(tmp_path / "dump.c")], check=True)
    out = subprocess.run([str(tmp_path / "dump")], check=True, capture_output=True).stdout
    cs, ro = payload.blobs["command_stream.bin"], payload.blobs["read_only.bin"]
    io = payload.meta["io"]
    assert struct.unpack("<6I", out[:24]) == (len(cs), len(ro), payload.meta["scratch_size"], io[0]["offset"],
                                              io[1]["size"], 0)
    assert out[24:24 + len(cs) + len(ro)] == cs + ro
    out_value = res.partitions[0].subgraph.outputs[0].name
    assert out[24 + len(cs) + len(ro):].decode() == f"{U85}|x|{out_value}|{io[1]['name']}"
    assert out_value == "c1_rq"


def test_c_header_escapes_names():
    from qlower.contract import Payload

    meta = {"accelerator": U55, "scratch_size": 16, "scratch_fast_size": 0,
            "io": [{"kind": "input", "value": 'we"ird\\name\n', "name": "input-0", "shape": [4], "region": 1,
                    "offset": 0, "size": 4, "element_size": 1}]}
    payload = Payload("ethos-u", U55, {"command_stream.bin": b"COP1", "read_only.bin": b""}, (), (), {}, meta)
    text = c_header(payload, "9 weird-name")
    assert "static const uint8_t _9_weird_name_read_only[1]" in text and "_9_WEIRD_NAME_READ_ONLY_SIZE 0u" in text
    assert '"we\\042ird\\134name\\012"' in text


@pytest.mark.parametrize("how", ["partition", "option"])
def test_traced_simulation_reaches_inside_the_partitions(how):
    g = float_in_the_middle()
    be = EthosUBackend(trace=how == "option")
    res = partition(g, be, U85, trace=how == "partition")
    xs = _inputs(g, 3)
    traced = Runner(res.host, res.partitions, {be.name: be}).run_traced(xs)
    _, env = run_graph(g, xs, keep_all=True)
    by_name = {v.name: a for v, a in env.items()}
    compared = 0
    for p in res.partitions:
        assert "trace.tosa" in p.payload.blobs
        computed = set(p.payload.tensor_map.values()) - {v.name for v in p.subgraph.inputs}
        for name in computed & set(traced):
            np.testing.assert_array_equal(traced[name], by_name[name])
            compared += 1
    # each partition exposes its int32 accumulator and its int8 result at least
    assert compared >= 4


def test_int16_table_needs_gather_which_u55_lacks():
    """An int16 lookup over all 65536 codes is a TOSA GATHER: Vela runs it on U85, not on U55."""
    q16 = QuantSpec.per_tensor(1e-3, 0, DType.INT16)
    b = GraphBuilder("t16")
    x = b.input("x", TensorType((1, 4, 4, 8), DType.INT16, q16))
    table = (np.arange(-32768, 32768) // 3).astype(np.int16)
    g = verify_graph(b.build([b.op("table", x, table=table, offset=32768, out=q16, name="lut")]))
    be = EthosUBackend()
    lut = _op(g, "lut")
    no = be.supports(lut, U55)
    assert not no and no.reason.startswith("Vela (ethos-u55-128): Non-passthrough operation (Gather) could not run")
    assert "GATHER" in no.reason
    assert be.supports(lut, U85)
    res = _partition_and_run(g, U85, seeds=(0,))
    assert len(res.partitions) == 1
    _check_boundaries_are_vela_s(res)
    assert [t.dtype.itemsize for t in res.partitions[0].input_types] == [2]


def test_program_file_round_trip_runs_the_same():
    from qlower.program.fileformat import program_from_bytes, program_to_bytes

    g = float_in_the_middle()
    prog = lower_graph(g, U85)
    loaded = program_from_bytes(program_to_bytes(prog))
    assert [p.payload.blobs for p in loaded.partitions] == [p.payload.blobs for p in prog.partitions]
    assert loaded.partitions[0].payload.meta["execution"] == EXECUTION
    xs = _inputs(g, 7)
    for got, want in zip(loaded.run(*xs), run_graph(g, xs)):
        np.testing.assert_array_equal(got, want)


def test_a_partition_without_outputs_is_a_clear_error():
    b = GraphBuilder("dead")
    x = b.input("x", TensorType((1, 4, 4, 8), DType.INT8, XQ))
    b.op("rescale", x, out=QuantSpec.per_tensor(0.1, 0))
    with pytest.raises(CompileError, match="has no outputs"):
        EthosUBackend().lower(b.build([]), U85)


def test_an_output_that_only_reshapes_an_input_gets_its_own_buffer():
    """Vela compiles a reshape to nothing, so an output that merely reshapes the partition's input
    (or another output) would vanish from the command stream; the backend copies it with an
    identity RESCALE instead and the partition keeps all its outputs (fuzzer case 76e0489d9860adf6)."""
    b = GraphBuilder("alias")
    x = b.input("x", TensorType((4, 2), DType.INT8, XQ))
    r = b.op("reshape", x, shape=(1, 4, 1, 2), name="r")
    conv = conv_block(b, r, 4, 3, "c")
    g = verify_graph(b.build([r, conv, b.op("reshape", conv, shape=(1, 4, 4), name="conv_flat")]))
    assert {v.name for v in aliased_outputs(g)} == {"r", "conv_flat"}
    copied = materialize_aliased_outputs(g)
    assert [v.name for v in copied.outputs] == ["r_copy", "c_rq", "conv_flat_copy"]
    assert [v.type for v in copied.outputs] == [v.type for v in g.outputs]
    for target in (U85, U55):
        res = _partition_and_run(g, target)
        assert len(res.partitions) == 1
        payload = res.partitions[0].payload
        assert [io["value"] for io in payload.meta["io"] if io["kind"] == "output"] == [
            "r_copy", "c_rq", "conv_flat_copy"]


def _dropped_output_graph(step, consumer):
    """A strided slice that is a partition output and is read inside the partition (the fuzzer's
    counter-example of issue 14: Vela folded the slice's final RESHAPE into the TRANSPOSE reading
    it, and the output vanished from the command stream)."""
    q = QuantSpec.per_tensor(0.05, 3)
    b = GraphBuilder("dropped")
    x = b.input("x", TensorType((1, 1, 3, 2), DType.FLOAT32))
    c = b.op("clamp", b.op("quantize", x, out=q, name="q"), min=-100, max=100, name="c")
    p = b.op("pad", c, pads=(0, 0, 1, 1, 0, 1, 0, 0), value=3, name="p")
    s = b.op("slice", p, start=(0, 0, 0, 0), stop=p.type.shape, step=step, name="s")
    t = b.op("transpose", s, perm=(0, 3, 1, 2), name="t") if consumer == "transpose" else \
        b.op("concat", (s, s), axis=3, name="t")
    r = b.op("reshape", t, shape=(1, t.type.numel), name="r")
    return verify_graph(b.build([b.op("dequantize", r, None, name="d"), s]))


@pytest.mark.parametrize("target", [U85, U55])
@pytest.mark.parametrize("step, consumer", [((1, 2, 2, 1), "transpose"), ((1, 1, 2, 1), "transpose"),
                                            ((1, 2, 2, 1), "concat")])
def test_outputs_vela_would_drop_get_their_own_buffer(target, step, consumer):
    g = _dropped_output_graph(step, consumer)
    prog = lower_graph(g, target)
    assert prog.partitions, "the ops must run on the NPU for this test to mean anything"
    x = np.random.default_rng(1).standard_normal((1, 1, 3, 2)).astype(np.float32)
    for got, want in zip(prog.run(x), run_graph(g, [x]), strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_aliasing_pattern_the_rules_miss_is_caught_by_compiling_again(monkeypatch):
    """Without the movement rule, Vela drops the output; lower notices and copies every output."""
    import qlower.backends.ethosu.backend as ethosu_backend

    monkeypatch.setattr(ethosu_backend, "MOVEMENT_KINDS", frozenset())
    g = _dropped_output_graph((1, 2, 2, 1), "transpose")
    prog = lower_graph(g, U85)
    copies = [op for p in prog.partitions for op in p.subgraph.ops if op.kind == "rescale"]
    assert not copies   # the partition's own subgraph is unchanged: the copies live in its lowering
    assert prog.partitions[0].payload.meta["tosa"]["tosa_ops"].get("RESCALE", 0) >= 2
    x = np.random.default_rng(2).standard_normal((1, 1, 3, 2)).astype(np.float32)
    for got, want in zip(prog.run(x), run_graph(g, [x]), strict=True):
        np.testing.assert_array_equal(got, want)
    from qlower.program.fileformat import program_from_bytes, program_to_bytes

    monkeypatch.undo()
    assert program_from_bytes(program_to_bytes(prog)).partitions   # the loader accepts the copied form


def _mean_graph(pool_is_output: bool):
    b = GraphBuilder("mean")
    x = b.input("x", TensorType((1, 4, 4, 8), DType.INT8, QuantSpec.per_tensor(0.1, 3)))
    wide = b.op("rescale", x, out=QuantSpec.per_tensor(0.1 / 128, 0, DType.INT16))
    pooled = b.op("avg_pool2d", wide, kernel=(4, 4), stride=(1, 1))
    y = b.op("rescale", pooled, out=QuantSpec.per_tensor(0.05, -2))
    return verify_graph(b.build([y, pooled] if pool_is_output else [y]))


@pytest.mark.parametrize("pool_is_output", [False, True])
def test_a_global_mean_whose_pool_is_an_output_keeps_its_form(pool_is_output):
    """The sum that replaces a pool (ethosu/means.py), or LiteRT's MEAN, would drop the pooled codes
    a graph output reads."""
    from qlower.backends.global_means import global_means

    graph = _mean_graph(pool_is_output)
    means = global_means(graph)
    assert [(m.widen.kind, m.pool.kind, m.final.kind) for m in means] == \
        ([] if pool_is_output else [("rescale", "avg_pool2d", "rescale")])


class _GlobalMean(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, channels, 1)
        self.fc = torch.nn.Linear(channels, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("target,pooled", [("ethos-u85-256", True), ("ethos-u55-128", False)])
def test_a_global_mean_takes_the_form_vela_runs_fastest(target, pooled):
    """ethos-u85 runs a wide 7x7 mean fastest as one AVG_POOL2D, ethos-u55 as a sum and a multiply
    (Vela's estimates of the two forms, measured per mean); either way the program means what the
    NPU computes (bit-exact) and stays within a step of fake-quant per layer."""
    from qlower.backends.ethosu.means import _cycles, global_means

    torch.manual_seed(0)
    x = torch.randn(1, 8, 7, 7)
    model, calibration = _GlobalMean(512).eval(), [(x,), (x * 1.3,)]
    prog = qlower.compile(model, (x,), target=target, calibration=calibration, progress=False)
    kinds = prog.source.count_ops()
    assert ("avg_pool2d" in kinds, "reduce_sum" in kinds) == (pooled, not pooled), kinds
    (mean,) = global_means(prog.frontend.graph)
    out = mean.final.attrs["out"]
    config = EthosUBackend().config(target)
    costs = [_cycles(mean.widen.operands[0].type, mean.widen.attrs["out"], out, form, config) for form in (True, False)]
    assert (costs[0] <= costs[1]) == pooled, costs
    np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x.numpy()])[0])
    report = qlower.verify(model, (x,), target=target, calibration=calibration, progress=False)
    assert report.ok, report.problems


def test_a_mean_wider_than_vela_pools_is_split_by_the_backend_not_the_frontend():
    """The frontend writes a global mean over a 1x300 plane as one average pool on every target;
    Ethos-U's declared rewrite ``ethosu.pool_limit`` makes it the sum form Vela takes (bit-exact
    with that form, within its declared step of the canonical program), while TOSA keeps the pool."""
    torch.manual_seed(0)
    x = torch.randn(1, 8, 1, 300)
    model, calibration = _GlobalMean(16).eval(), [(x,), (x * 1.3,)]
    prog = qlower.compile(model, (x,), target="ethos-u55-128", calibration=calibration, progress=False)
    assert "avg_pool2d" in prog.frontend.graph.count_ops()
    kinds = prog.source.count_ops()
    assert "avg_pool2d" not in kinds and "reduce_sum" in kinds, kinds
    assert not {d.op.kind for d in prog.decisions} & {"avg_pool2d", "reduce_sum", "mul"}, prog.explain()
    assert [r.name for r in prog.rewrites] == ["ethosu.pool_limit"]
    np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x.numpy()])[0])
    report = qlower.verify(model, (x,), target="ethos-u55-128", calibration=calibration, progress=False)
    assert report.ok, report.problems
    tosa = qlower.compile(model, (x,), target="tosa-1.0+int", calibration=calibration, progress=False)
    assert "avg_pool2d" in tosa.source.count_ops() and not tosa.rewrites
