"""A program file's graph inputs declare the types the program was compiled and verified for.

``Program.run`` refuses integer codes outside an input type's [qmin, qmax] (tests/test_input_ranges.py),
trusting the loaded host graph's types. So loading refuses a host graph input declared otherwise than
the source graph (the program's verified form) reads it, and a graph input a delegate reads as it is
declared otherwise than its partition's subgraph was lowered for: a .tflite payload holds scale and
zero point only, so widening every other record of the range (host, source, delegate, payload types)
would run codes the partition was never verified for. A file widened everywhere, subgraph included,
is the program of the widened graph: re-verified at load (a matmul's int32 bound refuses what no
longer fits) and computing its own reference exactly."""

from __future__ import annotations

import re

import numpy as np
import pytest

from qlower.api import lower_graph
from qlower.errors import InputError, InvalidProgramError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.reference import run_graph
from qlower.testing.hostile import edit_header

NARROW, WIDE = "int8[1x2x16] {s=0.015625 zp=0 q=[-127,127]}", "int8[1x2x16] {s=0.015625 zp=0} (codes [-128, 127])"


def _matmul(k: int = 16, x_range: tuple[int, int] = (-127, 127)):
    b = GraphBuilder("mm")
    x = b.input("x", TensorType((1, 2, k), DType.INT8, QuantSpec.per_tensor(2**-6, 0, qmin=x_range[0], qmax=x_range[1])))
    y = b.input("y", TensorType((1, k, 3), DType.INT8, QuantSpec.per_tensor(2**-5, 0)))
    return b.build([b.op("rescale", b.op("matmul", x, y, name="mm"), out=QuantSpec.per_tensor(2**-3, 0), name="rq")])


def _widen(*places: str):
    """Declare input x with every int8 code, [-128, 127], in ``places`` of the file."""
    def types(h):
        if "host" in places:
            yield h["host"]["inputs"][0]["type"]
        if "source" in places and h["source"] is not None:
            yield h["source"]["inputs"][0]["type"]
        for op in h["host"]["ops"]:
            if "delegate" in places and op["kind"] == "delegate":
                yield op["attrs"]["in_types"]["tuple"][0]["type"]
        for p in h["partitions"]:
            if "payload" in places:
                yield p["payload"]["input_types"][0]
            if "subgraph" in places:
                yield p["subgraph"]["inputs"][0]["type"]

    def change(h):
        for t in types(h):
            t["quant"]["qmin"] = -128
    return change


def _codes(rng, k: int = 16):
    x, y = rng.integers(-128, 128, (1, 2, k), dtype=np.int8), rng.integers(-128, 128, (1, k, 3), dtype=np.int8)
    x[0, 0, 0] = -128
    return x, y



@pytest.mark.parametrize("target", ["litert", "tflm"])
def test_a_range_widened_everywhere_but_in_the_partition_is_refused(target):
    """The payload of these targets holds no range of its own: only the partition's subgraph tells."""
    data = program_to_bytes(lower_graph(_matmul(), target))
    x, y = _codes(np.random.default_rng(1))
    with pytest.raises(InputError, match="holds -128 at index"):
        program_from_bytes(data).run(x, y)
    message = ("partition 'p0' payload: its boundary types differ from its subgraph's: input #0 is declared "
               f"{WIDE.split(' (')[0]}, the subgraph's %x is {NARROW}")   # the backend's own load check
    with pytest.raises(InvalidProgramError, match=re.escape(message)):
        program_from_bytes(edit_header(data, _widen("host", "source", "delegate", "payload")))


@pytest.mark.parametrize("target", ["tflm", "tosa-1.0+int"])
def test_a_host_graph_input_declared_otherwise_than_the_source_graph_is_refused(target):
    data = program_to_bytes(lower_graph(_matmul(), target))
    for widened, declared, source in (("host", WIDE, NARROW), ("source", NARROW, WIDE)):
        with pytest.raises(InvalidProgramError, match=re.escape(
                f"host graph input #0 %x: is declared {declared}, but the source graph (the program as compiled "
                f"and verified) reads {source}")):
            program_from_bytes(edit_header(data, _widen(widened)))


def test_a_range_widened_everywhere_is_the_widened_program():
    """Every record widened, subgraph included: the .tflite is byte for byte what qlower writes for the
    widened graph, and the loaded program computes that graph's reference exactly at -128."""
    forged = edit_header(program_to_bytes(lower_graph(_matmul(), "tflm")),
                   _widen("host", "source", "delegate", "payload", "subgraph"))
    program = program_from_bytes(forged)
    assert program.graph.inputs[0].type.quant.qmin == -128
    x, y = _codes(np.random.default_rng(2))
    np.testing.assert_array_equal(program.run(x, y)[0], run_graph(program.source, [x, y])[0])


def test_a_widening_that_breaks_a_bound_the_range_kept_is_refused_at_load():
    """140,000 products of codes up to 100 x 128 fit int32; up to 128 x 128 they don't."""
    k = 140_000
    data = program_to_bytes(lower_graph(_matmul(k, (-100, 100)), "reference"))
    with pytest.raises(InvalidProgramError, match="(?s)host graph: fails verification.*up to 128 x 128 .* beyond the int32 accumulator"):
        program_from_bytes(edit_header(data, _widen("host")))
