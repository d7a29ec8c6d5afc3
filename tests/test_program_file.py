"""The program file: exact round trip of every IR construct, identical runs, clear errors on bad files.

Bad files are made here with plain struct/json/safetensors, independently of
the writer, so the loader's checks are exercised on files the writer would never
produce.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import struct

import numpy as np
import pytest
import safetensors.numpy

from qlower.backends import registry
from qlower.contract import Payload
from qlower.errors import InputError, InvalidProgramError, VerificationError
from qlower.ir import OPS, Graph, GraphBuilder, Op, QuantSpec, Value, print_graph, verify_graph
from qlower.partition import Partition
from qlower.program import Program
from qlower.program.fileformat import FORMAT_VERSION, inspect_program, load, program_from_bytes
from qlower.program.irjson import ATTR_CHECKS
from qlower.reference import run_graph
from qlower.testing.graph_checks import random_inputs
from qlower.testing.programs import BLOB_TARGET, conv_graph, sample_programs

PROGRAMS = sample_programs()
HEAD = struct.Struct("<8sIQ32s")


@pytest.fixture(autouse=True)
def blob_target(monkeypatch):
    """Make BLOB_TARGET known to the backend registry for this test only."""
    monkeypatch.setitem(registry._NPU_TARGETS, BLOB_TARGET, ("qlower.testing.programs", "BlobBackend"))


def _saved(prog: Program, tmp_path, name: str = "prog.qlower"):
    path = tmp_path / name
    prog.save(path)
    return path


# -- independent structural comparison ------------------------------------------------------

def _same_attr(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    if isinstance(a, float):  # bit for bit, so -0.0 and inf count
        return type(b) is float and struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_attr(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def assert_same_graph(g, h):
    assert g.name == h.name
    index_g = {v: i for i, v in enumerate(g.values())}
    index_h = {v: i for i, v in enumerate(h.values())}
    for v, w in zip(g.values(), h.values(), strict=True):
        assert (v.name, v.type, v.origin) == (w.name, w.type, w.origin)

    def shape_of(operand, index):
        if isinstance(operand, tuple):
            return tuple(index[v] for v in operand)
        return None if operand is None else index[operand]

    for op, oq in zip(g.ops, h.ops, strict=True):
        assert op.kind == oq.kind
        assert [shape_of(o, index_g) for o in op.operands] == [shape_of(o, index_h) for o in oq.operands]
        assert op.attrs.keys() == oq.attrs.keys()
        for k in op.attrs:
            assert _same_attr(op.attrs[k], oq.attrs[k]), (op.kind, k, op.attrs[k], oq.attrs[k])
    assert [index_g[v] for v in g.outputs] == [index_h[v] for v in h.outputs]
    assert print_graph(g, show_types=True) == print_graph(h, show_types=True)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_part_of_a_program_round_trips_exactly(name, tmp_path):
    prog = PROGRAMS[name]
    got = load(_saved(prog, tmp_path))
    assert got.target == prog.target
    assert_same_graph(prog.graph, got.graph)
    assert_same_graph(prog.source, got.source)
    assert (got.source is got.graph) == (prog.source is prog.graph)
    assert len(got.partitions) == len(prog.partitions)
    for p, q in zip(prog.partitions, got.partitions):
        assert (p.name, p.backend, p.target, p.values) == (q.name, q.backend, q.target, q.values)
        assert_same_graph(p.subgraph, q.subgraph)
        a, b = p.payload, q.payload
        assert (a.backend, a.target, a.input_types, a.output_types) == (b.backend, b.target, b.input_types,
                                                                       b.output_types)
        assert a.blobs == b.blobs and all(type(x) is bytes for x in b.blobs.values())
        assert a.tensor_map == b.tensor_map
        assert b.meta == json.loads(json.dumps(a.meta))
    source_index = {op: i for i, op in enumerate(prog.source.ops)}
    loaded_index = {op: i for i, op in enumerate(got.source.ops)}
    assert [(source_index[d.op], d.reason) for d in prog.decisions] == \
           [(loaded_index[d.op], d.reason) for d in got.decisions]


def test_program_meta_keeps_its_json_part():
    got = program_from_bytes(_bytes(PROGRAMS["partitioned"]))
    assert got.meta == {"threads": None, "lower_seconds": 0.5, "quant": "static"}  # not_json dropped
    assert program_from_bytes(_bytes(PROGRAMS["conv"])).meta == {"threads": 2, "quant": "static"}


def test_special_floats_and_list_attributes_round_trip_bit_for_bit():
    dyn = program_from_bytes(_bytes(PROGRAMS["dynamic"])).graph
    attrs = {op.results[0].name: op.attrs for op in dyn.ops}
    assert attrs["floor"]["max"] == math.inf and attrs["floor"]["min"] == -1.5
    assert math.copysign(1.0, attrs["padded"]["value"]) == -1.0
    b = GraphBuilder()
    x = b.input("x", PROGRAMS["dynamic"].graph.inputs[0].type)
    y = b.op("reshape", x, shape=[3, 4], name="listed")  # a list attribute stays a list
    z = b.op("clamp", y, min=float("nan"), max=1.0)
    g = verify_graph(b.build([z]))
    h = program_from_bytes(_bytes(Program("reference", g, g))).graph
    assert h.ops[0].attrs["shape"] == [3, 4] and type(h.ops[0].attrs["shape"]) is list
    assert math.isnan(h.ops[1].attrs["min"])


def test_values_are_referenced_by_position_so_names_need_not_be_unique():
    b = GraphBuilder()
    x = b.input("v", PROGRAMS["conv"].graph.inputs[0].type)
    y = b.op("rescale", x, out=QuantSpec.per_tensor(0.5, 0), name="w")
    z = b.op("rescale", y, out=QuantSpec.per_tensor(0.25, 0), name="z")
    first, second = b.build([z]).ops
    twin = Value("v", z.type)  # a hand-built graph may reuse a name: the verifier allows it
    g = verify_graph(Graph((x,), (first, Op(second.kind, (y,), second.attrs, (twin,))), (twin, x)))
    h = program_from_bytes(_bytes(Program("reference", g, g))).graph
    assert_same_graph(g, h)
    assert h.outputs[0] is h.ops[1].results[0] and h.outputs[1] is h.inputs[0]
    assert [v.name for v in h.values()] == ["v", "w", "v"]


def test_every_op_kind_and_attribute_is_covered():
    used = {op.kind for p in PROGRAMS.values() for g in (p.graph, p.source, *(q.subgraph for q in p.partitions))
            for op in g.ops}
    assert used == set(OPS), f"add {sorted(set(OPS) - used)} to qlower/testing/programs.py"
    for kind, d in OPS.items():
        assert set(ATTR_CHECKS.get(kind, {})) == set(d.attrs), f"ATTR_CHECKS for {kind} (qlower/program/irjson.py)"


def test_arrays_shared_between_graphs_are_stored_once():
    prog = PROGRAMS["partitioned_conv"]
    data = _bytes(prog)
    arrays = safetensors.numpy.load(data[HEAD.size:])
    # w, bias, dw, fc_w: each read by the source graph and copied into the partition: stored once
    constants = [k for k, a in arrays.items() if a.dtype != np.uint8]
    assert len(constants) == 4
    got = program_from_bytes(data)
    src = {op.results[0].name: op.attrs["data"] for op in got.source.ops if op.kind == "constant"}
    sub = {op.results[0].name: op.attrs["data"] for op in got.partitions[0].subgraph.ops if op.kind == "constant"}
    assert src.keys() == sub.keys() and all(src[k] is sub[k] for k in src)
    assert not src["w"].flags.writeable


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_loaded_program_runs_bit_for_bit_like_the_one_in_memory(name, tmp_path, blob_target):
    prog = PROGRAMS[name]
    got = load(_saved(prog, tmp_path))
    for seed in range(3):
        inputs = random_inputs(prog.source, seed)
        want, have = prog.run(*inputs), got.run(*inputs)
        # and both agree with the reference interpreter on the source graph
        ref = run_graph(prog.source, inputs)
        for w, h, r in zip(want, have, ref, strict=True):
            assert w.dtype == h.dtype == r.dtype and w.shape == h.shape == r.shape
            assert w.tobytes() == h.tobytes() == r.tobytes()


def test_a_wrong_input_shape_at_run_is_an_input_error(tmp_path):
    got = load(_saved(PROGRAMS["conv"], tmp_path))
    with pytest.raises(InputError, match=r"shape \(1, 4, 6, 6\), expected \(1, 6, 6, 4\)"):
        got.run(np.zeros((1, 4, 6, 6), np.int8))


def test_inspect_reports_without_running(tmp_path):
    prog = PROGRAMS["partitioned"]
    path = _saved(prog, tmp_path)
    info = inspect_program(path)
    assert info["file_size"] == path.stat().st_size and info["format_version"] == FORMAT_VERSION
    assert info["target"] == BLOB_TARGET and info["targets"] == [BLOB_TARGET]
    assert info["inputs"] == ["%x: int8[1x4x4x8] {s=0.05 zp=3}", "%y: int8[1x4x4x8] {s=0.08 zp=-1}"]
    last = prog.partitions[-1].name  # the output comes out of the last partition
    assert info["outputs"][0] == f"%{last}: uint8[1x2x1x8] {{s=0.3 zp=128}}" and len(info["outputs"]) == 3
    assert info["host_ops"] == prog.graph.count_ops()
    assert [d["kind"] for d in info["host_decisions"]] == [d.op.kind for d in prog.decisions]
    assert [p["name"] for p in info["partitions"]] == [p.name for p in prog.partitions]
    for entry, p in zip(info["partitions"], prog.partitions):
        assert entry["blobs"] == {k: len(v) for k, v in p.payload.blobs.items()}
        assert entry["bytes"] == sum(len(v) for v in p.payload.blobs.values()) and entry["blobs"]["empty.bin"] == 0
        assert entry["ops"] == p.subgraph.count_ops()


def test_saving_overwrites_atomically_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "p.qlower"
    path.write_bytes(b"old")
    PROGRAMS["conv"].save(path)
    assert [f.name for f in tmp_path.iterdir()] == ["p.qlower"]
    assert load(path).target == "reference"


def test_saving_refuses_what_it_could_not_load_back():
    g = conv_graph()
    part = PROGRAMS["partitioned_conv"].partitions[0]
    bad_meta = Payload("blob", BLOB_TARGET, {}, part.input_types, part.output_types, meta={"subgraph": g})
    prog = PROGRAMS["partitioned_conv"]
    with pytest.raises(InvalidProgramError, match="Payload.meta is not JSON"):
        Program(prog.target, prog.graph, prog.source,
                [Partition(part.name, part.backend, part.target, part.subgraph, bad_meta, part.values)]
                ).save("/nonexistent/x")
    b = GraphBuilder()
    x = b.input("x", g.inputs[0].type)
    broken = b.build([Value("ghost", x.type)])  # an output nothing defines
    with pytest.raises(VerificationError, match="ghost"):
        Program("reference", broken, broken).save("/nonexistent/x")


# -- bad files ---------------------------------------------------------------------------------

def _bytes(prog: Program) -> bytes:
    from qlower.program.fileformat import program_to_bytes

    return program_to_bytes(prog)


def _seal(body: bytes, version: int = 1) -> bytes:
    return HEAD.pack(b"\x89QLOWER\n", version, len(body), hashlib.sha256(body).digest()) + body


def _edit(data: bytes, header_fn=None, tensors_fn=None, raw_header: str | None = None) -> bytes:
    """Change the JSON header and/or the tensors of a file and re-seal it."""
    body = data[HEAD.size:]
    n = int.from_bytes(body[:8], "little")
    header = json.loads(json.loads(body[8:8 + n])["__metadata__"]["qlower"])
    arrays = dict(safetensors.numpy.load(body))
    if header_fn:
        header_fn(header)
    if tensors_fn:
        tensors_fn(arrays)
    text = raw_header if raw_header is not None else json.dumps(header)
    return _seal(safetensors.numpy.save(arrays, metadata={"qlower": text}))


def _op(header, graph: str, result_name: str) -> dict:
    return next(op for op in header[graph]["ops"] if op["results"][0]["name"] == result_name)


def _expect(data: bytes, *patterns: str) -> str:
    with pytest.raises(InvalidProgramError) as e:
        program_from_bytes(data, "f.qlower")
    msg = str(e.value)
    assert msg.startswith("f.qlower: ")
    for p in patterns:
        assert p in msg, f"{p!r} not in {msg!r}"
    return msg


CONV = _bytes(PROGRAMS["conv"])
PART = _bytes(PROGRAMS["partitioned"])


def test_truncated_files():
    _expect(b"", "truncated: only 0 bytes")
    _expect(CONV[:5], "truncated: only 5 bytes")
    _expect(CONV[:30], "truncated: 30 bytes, shorter than the 52-byte file header")
    _expect(CONV[:-1], f"truncated: the body has {len(CONV) - 53} of its {len(CONV) - 52} bytes")
    _expect(CONV + b"\0\0", "2 unexpected bytes after the end")


def test_foreign_files_are_named():
    _expect(b"PK\x03\x04" + bytes(60), "not a qlower program file: it looks like a zip archive")
    _expect(b"hello world, not a program", "not a qlower program file (it starts with b'hello wo')")
    _expect(CONV[HEAD.size:], "not a qlower program file")  # a bare safetensors file


def test_a_pickle_is_refused_without_being_run(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.qlower"
    path.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(InvalidProgramError, match="it looks like a Python pickle"):
        load(path)
    assert not marker.exists()


def test_a_newer_format_is_refused_with_both_versions():
    newer = _seal(CONV[HEAD.size:], version=FORMAT_VERSION + 1)
    _expect(newer, f"written by a newer qlower (format {FORMAT_VERSION + 1}, this qlower reads up to "
                   f"{FORMAT_VERSION}): upgrade qlower")
    _expect(_seal(CONV[HEAD.size:], version=0), "format version 0 does not exist")


def test_corruption_is_caught_by_the_checksum():
    damaged = bytearray(CONV)
    damaged[-3] ^= 0x10  # inside a constant's data
    _expect(bytes(damaged), "checksum mismatch")
    damaged = bytearray(PART)
    at = PART.index(b" bytes", HEAD.size + 8 + int.from_bytes(PART[HEAD.size:HEAD.size + 8], "little"))
    damaged[at] ^= 0x01  # inside the payload blob "notes.txt"
    _expect(bytes(damaged), "checksum mismatch")


def test_corrupt_tensor_section_and_json():
    body = bytearray(CONV[HEAD.size:])
    body[8:12] = b"\xff\xfe{{"  # invalid UTF-8 at the start of the safetensors header
    _expect(_seal(bytes(body)), "tensor section header: is not valid JSON")
    body = bytearray(CONV[HEAD.size:])
    body[0:8] = (10**9).to_bytes(8, "little")
    _expect(_seal(bytes(body)), "tensor section: its header claims 1000000000 bytes")
    _expect(_edit(CONV, raw_header='{"format": "qlower-program", '), "program header: is not valid JSON")
    _expect(_edit(CONV, raw_header="[" * 100000 + "]" * 100000), "program header: is not valid JSON")
    _expect(_edit(CONV, raw_header='{"a": 1, "a": 2}'), "duplicate key 'a'")
    _expect(_edit(CONV, raw_header='{"a": NaN}'), "non-standard JSON constant NaN")
    _expect(_edit(CONV, raw_header='{"a": ' + "9" * 5000 + "}"), "is not valid JSON")
    _expect(_seal(safetensors.numpy.save({"t0": np.zeros(3, np.int8)})), "has no qlower program header")


def test_missing_and_unknown_fields():
    _expect(_edit(CONV, lambda h: h.pop("host")), "program header: missing field(s) ['host']")
    _expect(_edit(CONV, lambda h: h.update(extra=1)), "program header: unknown field(s) ['extra']")
    _expect(_edit(CONV, lambda h: h.update(format="other")), "format is 'other', not 'qlower-program'")
    _expect(_edit(CONV, lambda h: h["host"]["inputs"][0].pop("type")), "host graph input #0: missing field(s)")


def test_inconsistent_types_are_refused():
    def wrong_type(h):
        _op(h, "host", "conv_rq")["results"][0]["type"]["quant"]["scale"] = [0.125]
    _expect(_edit(CONV, wrong_type), "host graph op #3 (rescale): inconsistent file: result %conv_rq is stored as "
                                     "int8[1x3x3x8] {s=0.125 zp=-2}, but its operands and attributes give "
                                     "int8[1x3x3x8] {s=0.1 zp=-2}")

    def wrong_input_quant(h):  # every op after it would be consistent: the chain breaks at conv2d's bias
        h["host"]["inputs"][0]["type"]["quant"]["scale"] = [0.5]
        h["source"] = None   # the host graph as the program's source (else its input differs from the source's)
    _expect(_edit(CONV, wrong_input_quant), "(conv2d): the op registry rejects it: conv2d: bias quantization")



def _input_only(h, quant):
    """The host graph reduced to its input, returned as is, with the input's quant replaced (and the
    program's source: else its input would differ from the source graph's, see test_program_file_inputs.py)."""
    h["host"]["inputs"][0]["type"]["quant"] = quant
    h["source"] = None
    h["host"]["ops"] = []
    h["host"]["outputs"] = [0]


def test_a_graph_failing_verification_is_refused_with_the_reason():
    _expect(_edit(CONV, lambda h: _input_only(h, None)), "host graph: fails verification",
            "%x (x) is int8 but carries no QuantSpec")
    negative = {"dtype": "int8", "scale": [-0.05], "zero_point": [3], "qmin": -128, "qmax": 127,
                "axis": None, "dynamic": None}
    _expect(_edit(CONV, lambda h: _input_only(h, negative)), "host graph: fails verification",
            "[quant-spec-valid] %x (x) has a non-positive or non-finite scale (-0.05,)")
    _expect(_edit(CONV, lambda h: _input_only(h, {**negative, "dynamic": "per_column"})),
            "host graph input #0 type quant: dynamic must be null, 'per_tensor' or 'per_row', got 'per_column'")


def test_unknown_op_kinds_and_bad_attributes():
    _expect(_edit(CONV, lambda h: _op(h, "host", "relu").update(kind="frobnicate")),
            "host graph op #4: unknown op kind 'frobnicate'")
    _expect(_edit(CONV, lambda h: _op(h, "host", "conv")["attrs"].update(stride="22")),
            "host graph op #2 (conv2d): attribute 'stride' must be 2 integers, got str")
    _expect(_edit(CONV, lambda h: _op(h, "host", "conv")["attrs"].update(stride={"tuple": [2, 2, 2]})),
            "attribute 'stride' must be 2 integers, got tuple")
    _expect(_edit(CONV, lambda h: _op(h, "host", "relu")["attrs"].update(min=True)),
            "attribute 'min' must be a number, got bool")
    _expect(_edit(CONV, lambda h: _op(h, "host", "conv_rq")["attrs"].update(out={"dtype": "int8"})),
            "attribute 'out' must be a QuantSpec, got DType")
    _expect(_edit(CONV, lambda h: _op(h, "host", "relu")["attrs"].update(min={"complex": 1})),
            "unknown attribute tag 'complex'")
    _expect(_edit(CONV, lambda h: _op(h, "host", "relu")["attrs"].update(colour=1)),
            "the op registry rejects it: clamp: unknown attribute(s) ['colour']")
    _expect(_edit(CONV, lambda h: _op(h, "host", "conv")["attrs"].update(stride={"tuple": [0, 1]})),
            "(conv2d): the op registry rejects it: ZeroDivisionError")
    _expect(_edit(CONV, lambda h: _op(h, "host", "conv")["attrs"].update(groups=10**40)),
            "integer (huge) is outside")
    deep = {"tuple": [1]}
    for _ in range(20):
        deep = {"tuple": [deep]}
    _expect(_edit(CONV, lambda h: _op(h, "host", "conv")["attrs"].update(stride=deep)), "nested deeper than 8")


def test_references_to_unknown_values_and_tensors():
    _expect(_edit(CONV, lambda h: _op(h, "host", "relu").update(operands=[99])),
            "host graph op #4 (clamp) operand 0: refers to value 99, which is not defined before it (values 0..4 are)")
    _expect(_edit(CONV, lambda h: _op(h, "host", "conv").update(operands=[0, 1, 3])),
            "refers to value 3, which is not defined before it")  # a value defined later
    _expect(_edit(CONV, lambda h: h["host"].update(outputs=[0, -1])), "output #1: refers to value -1")
    _expect(_edit(CONV, lambda h: _op(h, "host", "w")["attrs"].update(data={"tensor": "t99"})),
            "refers to tensor 't99', which the file doesn't contain")


def test_tensors_with_mismatched_shapes_or_dtypes():
    def reshape_w(arrays):
        arrays["t0"] = arrays["t0"].reshape(8, 36, 1, 1).copy()
    _expect(_edit(CONV, tensors_fn=reshape_w), "tensor 't0': is int8[8, 36, 1, 1] in the tensor section, "
                                               "but the header says int8[8, 3, 3, 4]")

    def consistently_reshaped(h, arrays=None):
        h["tensors"]["t0"]["shape"] = [8, 36, 1, 1]
    _expect(_edit(CONV, consistently_reshaped, reshape_w),
            "host graph op #0 (constant): inconsistent file: result %w is stored as int8[8x3x3x4]")

    def as_int64(arrays):
        arrays["t1"] = arrays["t1"].astype(np.int64)
    _expect(_edit(CONV, lambda h: h["tensors"]["t1"].update(dtype="int64"), as_int64),
            "(constant): the op registry rejects it: TypeError: no qlower dtype for numpy dtype int64")
    _expect(_edit(CONV, tensors_fn=lambda a: a.update(t9=np.zeros(2, np.int8)),
                  header_fn=lambda h: h["tensors"].update(t9={"dtype": "int8", "shape": [2]})),
            "holds tensors ['t9'] that nothing refers to")
    _expect(_edit(CONV, tensors_fn=lambda a: a.update(t9=np.zeros(2, np.float16)),
                  header_fn=lambda h: h["tensors"].update(t9={"dtype": "float16", "shape": [2]})),
            "tensor 't9': has dtype 'F16'")


def test_partition_and_decision_references_are_checked():
    last = PROGRAMS["partitioned"].partitions[-1].name
    _expect(_edit(PART, lambda h: h["partitions"].pop()), f"calls partition '{last}', which the file doesn't contain")

    def wrong_payload_boundary(h):
        h["partitions"][0]["payload"]["output_types"][0]["quant"]["zero_point"] = [5]
    _expect(_edit(PART, wrong_payload_boundary), "partition 'p0' payload: not the blob backend's lowering")

    def wrong_delegate_boundary(h):
        delegate = next(op for op in h["host"]["ops"] if op["kind"] == "delegate")
        delegate["attrs"]["in_types"]["tuple"][0]["type"]["quant"]["zero_point"] = [5]
    _expect(_edit(PART, wrong_delegate_boundary), "delegate: partition 'p0' reads", "zp=5")

    def blob_not_bytes(h):
        h["partitions"][0]["payload"]["blobs"]["graph.qlower"] = _op(h, "source", "k")["attrs"]["data"]["tensor"]
    _expect(_edit(PART, blob_not_bytes), "blob 'graph.qlower': must be a 1-D uint8 tensor, got int32[1, 1, 1, 8]")
    _expect(_edit(PART, lambda h: h["partitions"][0]["values"].append("nowhere")),
            "computes values ['nowhere'] that the source graph doesn't have")
    _expect(_edit(PART, lambda h: h["decisions"][0].update(op=0)), "host decision #0: names %lut, but op #0")
    _expect(_edit(PART, lambda h: h["decisions"][0].update(op=10**6)), "host decision #0 op: integer 1000000")
    _expect(_edit(PART, lambda h: h["meta"].update(threads="many")), "threads must be null or an integer")


def test_a_missing_file_is_an_invalid_program_error(tmp_path):
    with pytest.raises(InvalidProgramError, match="can't read program file"):
        load(tmp_path / "nope.qlower")
    with pytest.raises(InvalidProgramError, match="can't read program file"):
        inspect_program(tmp_path)
