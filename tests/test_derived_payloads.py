"""Every byte of a loaded Ethos-U or VGF payload is derived again from its validated TOSA graph
(Vela, the ML SDK model converter) or the program is refused (issue 30)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from qlower.api import lower_graph
from qlower.backends.ethosu.vela import COMPILED, compile_tosa, vela_config
from qlower.backends.vgf.converter import CONVERSIONS, tosa_to_vgf
from qlower.errors import InvalidProgramError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.program import Program
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.reference import run_graph

Q = QuantSpec.per_tensor(0.05, 3)
X = np.random.default_rng(11).integers(-128, 128, (1, 6, 6, 4), dtype=np.int8)


def _graph(seed: int = 0):
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 6, 6, 4), DType.INT8, Q))
    w = b.constant(np.random.default_rng(seed).integers(-64, 64, (4, 2, 2, 4), dtype=np.int8),
                   QuantSpec.per_tensor(0.02))
    acc = b.op("conv2d", x, w, None, name="acc")
    return verify_graph(b.build([b.op("rescale", acc, out=QuantSpec.per_tensor(0.1, -2), name="y")]))


_PROGRAMS: dict[tuple[str, int], Program] = {}


def _program(target: str, seed: int = 0) -> Program:
    if (target, seed) not in _PROGRAMS:
        _PROGRAMS[target, seed] = lower_graph(_graph(seed), target)
    return _PROGRAMS[target, seed]


def _with(program: Program, blobs: dict | None = None, meta: dict | None = None) -> bytes:
    """The program file with its partition's blobs and metadata updated (a forger's edit: the
    file's own checksum is then right)."""
    p = program.partitions[0]
    payload = dataclasses.replace(p.payload, blobs={**p.payload.blobs, **(blobs or {})},
                                  meta={**p.payload.meta, **(meta or {})})
    return program_to_bytes(dataclasses.replace(program, partitions=[dataclasses.replace(p, payload=payload)]))


def _flip(blob: bytes, rng: random.Random) -> bytes:
    a = bytearray(blob)
    a[rng.randrange(len(a))] ^= 1 << rng.randrange(8)
    return bytes(a)


def test_vela_and_the_model_converter_are_deterministic():
    tosa = _program("ethos-u55-128").partitions[0].payload.blobs["graph.tosa"]
    config = vela_config("ethos-u55-128")
    first, second = compile_tosa(tosa, config), compile_tosa(tosa, config, per_layer=True)
    assert (first.command_stream, first.read_only) == (second.command_stream, second.read_only)
    vgf_tosa = _program("vgf+int").partitions[0].payload.blobs["graph.tosa"]
    assert tosa_to_vgf(vgf_tosa).vgf == tosa_to_vgf(vgf_tosa).vgf


@pytest.mark.parametrize("target", ["ethos-u55-128", "vgf+int"])
def test_an_unaltered_program_loads_and_runs_bit_exact(target):
    loaded = program_from_bytes(program_to_bytes(_program(target)))
    assert loaded.artifacts() == _program(target).artifacts()
    assert np.array_equal(loaded.run(X)[0], run_graph(_graph(), [X])[0])


@pytest.mark.parametrize("target,blob,says", [
    ("ethos-u55-128", "command_stream.bin", "is not what Vela makes"),
    ("ethos-u55-128", "read_only.bin", "is not what Vela makes"),
    ("vgf+int", "model.vgf", "is not what the ML SDK model converter"),
])
def test_every_flipped_compiler_byte_is_refused(target, blob, says):
    program, rng = _program(target), random.Random(f"{target}-{blob}")
    original = program.partitions[0].payload.blobs[blob]
    for _ in range(6):
        with pytest.raises(InvalidProgramError, match=says):
            program_from_bytes(_with(program, {blob: _flip(original, rng)}))


def test_forged_ethos_u_streams_are_refused():
    u55, u85 = _program("ethos-u55-128"), _program("ethos-u85-256")
    zeroed = bytes(len(u55.partitions[0].payload.blobs["command_stream.bin"]))
    with pytest.raises(InvalidProgramError, match="command_stream.bin is not what Vela makes"):
        program_from_bytes(_with(u55, {"command_stream.bin": zeroed}))
    foreign = {name: u85.partitions[0].payload.blobs[name] for name in ("command_stream.bin", "read_only.bin")}
    assert foreign["command_stream.bin"] != u55.partitions[0].payload.blobs["command_stream.bin"]
    with pytest.raises(InvalidProgramError, match="is not what Vela makes"):
        program_from_bytes(_with(u55, foreign))
    with pytest.raises(InvalidProgramError, match="accelerator"):   # the U85 config named in a U55 program
        program_from_bytes(_with(u55, foreign, {"accelerator": "ethos-u85-256"}))
    with pytest.raises(InvalidProgramError, match="scratch_size"):
        program_from_bytes(_with(u55, meta={"scratch_size": u55.partitions[0].payload.meta["scratch_size"] + 16}))
    with pytest.raises(InvalidProgramError, match="unexpected blob"):
        program_from_bytes(_with(u55, {"extra.bin": b"\0"}))


def test_forged_vgf_files_are_refused():
    program, other = _program("vgf+int"), _program("vgf+int", seed=1)
    transplanted = other.partitions[0].payload.blobs["model.vgf"]
    assert transplanted != program.partitions[0].payload.blobs["model.vgf"]
    with pytest.raises(InvalidProgramError, match="model.vgf is not what"):
        program_from_bytes(_with(program, {"model.vgf": transplanted}))
    io = [dict(row) for row in program.partitions[0].payload.meta["io"]]
    io[0]["shape"] = [1, 3, 12, 4]
    with pytest.raises(InvalidProgramError, match="metadata 'io'"):
        program_from_bytes(_with(program, meta={"io": io}))


@pytest.mark.parametrize("target,cache", [("ethos-u55-128", COMPILED), ("vgf+int", CONVERSIONS)])
def test_loading_twice_derives_once(target, cache):
    data = program_to_bytes(_program(target))
    cache.clear()
    before = cache.made
    program_from_bytes(data)
    assert cache.made == before + 1          # derived again, not taken from the file
    program_from_bytes(data)
    assert cache.made == before + 1          # the second load finds it by digest


def test_vela_estimates_and_words_are_written_again_at_load_never_read():
    """A forged cycle estimate, summary or source line loads as what Vela says of the validated
    graph: the file's words are replaced, so explain() and the view can't show a forger's numbers."""
    program = _program("ethos-u55-128")
    honest = program.partitions[0].payload.meta
    assert honest["per_layer"], "the fixture must have per-layer rows to forge"
    forged_rows = [dict(r, op_cycles=r["op_cycles"] * 7 + 1, source="forged.py:1") for r in honest["per_layer"]]
    loaded = program_from_bytes(_with(program, meta={
        "per_layer": forged_rows, "details": ["forged"], "summary": "0 total cycles",
        "execution": honest["execution"].split(":")[0] + ": on silicon"}))
    meta = loaded.partitions[0].payload.meta
    for key in ("per_layer", "details", "summary", "execution"):
        assert meta[key] == honest[key], key
