"""Ethos-U program files written before the Vela goal was recorded (issue 30): a payload's
``optimise`` entered its metadata with the byte-for-byte check of Vela's files, so an older
file has none. Such a file compiled with optimise=Size holds Size's command stream; loading
derives Vela's files again for each goal and accepts the one they equal, recording it."""

from __future__ import annotations

import numpy as np
import pytest

from qlower.api import lower_graph
from qlower.errors import InvalidProgramError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.testing.hostile import edit_header

TARGET = "ethos-u55-128"
Q = QuantSpec.per_tensor(0.05, 0)


def _convs():
    """Three 3x3 convolutions of 16 channels: Vela schedules them differently for Size and Performance."""
    b = GraphBuilder("convs")
    x = b.input("x", TensorType((1, 16, 16, 16), DType.INT8, Q))
    rng = np.random.default_rng(4)
    wq = QuantSpec.per_tensor(0.02, 0, qmin=-127, qmax=127)
    for i in range(3):
        w = b.constant(rng.integers(-3, 4, (16, 3, 3, 16)).astype(np.int8), wq, name=f"w{i}")
        x = b.op("rescale", b.op("conv2d", x, w, None, pad=(1, 1, 1, 1), name=f"conv{i}"), out=Q, name=f"rq{i}")
    return verify_graph(b.build([x]))


def _set_goal(value):
    def change(header: dict) -> None:
        for p in header["partitions"]:
            if value is None:
                p["payload"]["meta"].pop("optimise")   # as files were written before the goal was recorded
            else:
                p["payload"]["meta"]["optimise"] = value
    return change


@pytest.fixture(scope="module")
def programs():
    size = lower_graph(_convs(), TARGET, backend_options={"optimise": "Size"})
    perf = lower_graph(_convs(), TARGET)
    stream = "command_stream.bin"
    assert size.partitions[0].payload.blobs[stream] != perf.partitions[0].payload.blobs[stream], \
        "the goals must give different command streams for this test to mean anything"
    return size, perf


def test_an_old_size_file_loads_as_size_and_runs_the_same(programs):
    size, perf = programs
    x = np.random.default_rng(0).integers(-128, 128, (1, 16, 16, 16)).astype(np.int8)
    for prog, goal in ((size, "Size"), (perf, "Performance")):
        old = edit_header(program_to_bytes(prog), _set_goal(None))
        loaded = program_from_bytes(old)
        assert loaded.partitions[0].payload.meta["optimise"] == goal
        assert loaded.artifacts() == prog.artifacts()
        assert np.array_equal(loaded.run(x)[0], prog.run(x)[0])
    # a goal spelled in another case (as the option text is parsed) is normalised
    loaded = program_from_bytes(edit_header(program_to_bytes(size), _set_goal("size")))
    assert loaded.partitions[0].payload.meta["optimise"] == "Size"


def test_an_old_file_is_still_derived_byte_for_byte(programs):
    size, perf = programs

    def forged(header: dict, arrays: dict) -> None:   # Size's bytes with one flipped
        key = header["partitions"][0]["payload"]["blobs"]["command_stream.bin"]
        arrays[key] = arrays[key].copy()
        arrays[key][40] ^= 1
    with pytest.raises(InvalidProgramError, match="command_stream.bin is not what Vela makes"):
        program_from_bytes(edit_header(program_to_bytes(size), _set_goal(None), forged))
    # Size's file stating Performance, and goals Vela doesn't have, are refused
    with pytest.raises(InvalidProgramError, match="optimise Performance"):
        program_from_bytes(edit_header(program_to_bytes(size), _set_goal("Performance")))
    for bad in ("Fastest", 1, "Size\n[compiler]"):
        with pytest.raises(InvalidProgramError, match="not a valid one"):
            program_from_bytes(edit_header(program_to_bytes(perf), _set_goal(bad)))
