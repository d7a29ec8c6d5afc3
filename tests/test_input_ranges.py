"""Integer inputs hold codes in their type's [qmin, qmax], the range the program was verified for
(a matmul's int32 bound is computed from it). ``Program.run`` refuses, on every target, an input
holding a code outside it, naming the input, the code, its index and the range (a target could
otherwise wrap where the reference refuses); the codes at the edges run and match the reference.
``qlower.verify`` applies the same check, with the same message. (A delegate's payload called directly keeps its
own meaning of such codes: tests/test_tosa_division.py.)"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import qlower
from qlower.api import lower_graph
from qlower.errors import InputError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference import run_graph
from qlower.testing.differential import check_against_reference
from qlower.verification import verify_program

TARGETS = ("reference", "cpu", "litert", "tflm", "tflm:io=int8", "tosa-1.0+int")
X_RANGE, Y_RANGE = (-127, 127), (-100, 100)   # narrower than int8: codes -128 and 101..127 are outside


def _matmul():
    """x @ y of two int8 run-time operands with narrow ranges (scales float32-exact, so that every
    target takes the matmul fused with its rescale)."""
    b = GraphBuilder("mm_ranges")
    x = b.input("x", TensorType((1, 2, 16), DType.INT8, QuantSpec.per_tensor(2**-6, 0, qmin=X_RANGE[0], qmax=X_RANGE[1])))
    y = b.input("y", TensorType((1, 16, 3), DType.INT8, QuantSpec.per_tensor(2**-5, 0, qmin=Y_RANGE[0], qmax=Y_RANGE[1])))
    return b.build([b.op("rescale", b.op("matmul", x, y, name="mm"), out=QuantSpec.per_tensor(2**-3, 0), name="rq")])


def _int16():
    b = GraphBuilder("a16")
    x = b.input("x", TensorType((1, 4, 4, 8), DType.INT16,
                                QuantSpec.per_tensor(2**-10, 0, DType.INT16, qmin=-32767, qmax=32767)))
    return b.build([b.op("rescale", x, out=QuantSpec.per_tensor(2**-4, 0))])


def _edge_codes(rng, shape, lo, hi, dtype=np.int8):
    """Random codes in [lo, hi] with both edges present in every row."""
    a = rng.integers(lo, hi, shape, endpoint=True).astype(dtype)
    a[..., 0], a[..., -1] = lo, hi
    return a


def _lower(graph, target: str):
    """``target`` or ``target:io=int8`` (the tflm option: the .tflite's interface is int8 codes)."""
    name, _, io = target.partition(":io=")
    return lower_graph(graph, name, backend_options={"io": io} if io else None)


def _refusal(what: str, code: int, index: tuple, lo: int, hi: int) -> str:
    return re.escape(f"{what} holds {code} at index {index}, outside [{lo}, {hi}]")


@pytest.mark.parametrize("target", TARGETS)
def test_codes_at_the_range_edges_run_and_match_the_reference(target):
    graph, rng = _matmul(), np.random.default_rng(11)
    x, y = _edge_codes(rng, (1, 2, 16), *X_RANGE), _edge_codes(rng, (1, 16, 3), *Y_RANGE)
    y[0, :, 0], y[0, :, 1] = Y_RANGE[1], Y_RANGE[0]             # extreme sums of both signs
    x16 = _edge_codes(rng, (1, 4, 4, 8), -32767, 32767, np.int16)
    for g, inputs in ((graph, [x, y]), (_int16(), [x16])):
        program = _lower(g, target)
        assert target in ("reference", "cpu") or program.partitions, program.explain()
        # the target computes its own form exactly, and that form is within its bounds of the graph
        np.testing.assert_array_equal(program.run(*inputs)[0], run_graph(program.source, inputs)[0])
        check_against_reference(g, inputs, target.partition(":")[0])


@pytest.mark.parametrize("target", TARGETS)
def test_an_out_of_range_code_is_refused_on_every_target(target):
    graph, rng = _matmul(), np.random.default_rng(12)
    x, y = _edge_codes(rng, (1, 2, 16), *X_RANGE), _edge_codes(rng, (1, 16, 3), *Y_RANGE)
    program = _lower(graph, target)
    bad_x = x.copy()
    bad_x[0, 1, 3] = -128
    with pytest.raises(InputError, match=_refusal("input 0 (%x)", -128, (0, 1, 3), *X_RANGE)):
        program.run(bad_x, y)
    bad_y = y.copy()
    bad_y[0, 5, 2] = 101
    with pytest.raises(InputError, match=_refusal("input 1 (%y)", 101, (0, 5, 2), *Y_RANGE)):
        program.run(x, bad_y)
    x16 = _edge_codes(rng, (1, 4, 4, 8), -32767, 32767, np.int16)
    x16[0, 2, 1, 4] = -32768
    with pytest.raises(InputError, match=_refusal("input 0 (%x)", -32768, (0, 2, 1, 4), -32767, 32767)):
        _lower(_int16(), target).run(x16)


class _ImageAndCount(torch.nn.Module):
    """A float image and a plain integer tensor (int32 codes in the IR: PyTorch's integer semantics)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x, n):
        return self.conv(x), torch.clamp(n, -5, 5) + 1


def test_verify_refuses_an_out_of_range_integer_as_run_does():
    """``qlower.verify`` runs the runner and the interpreters directly: it applies ``Program.run``'s check
    first, with the same message (before any stage runs), and takes the codes in range."""
    torch.manual_seed(0)
    model, x = _ImageAndCount(), torch.randn(1, 3, 4, 4)
    n = torch.tensor([[-9, 0, 3, 7], [2, -1, 6, -6]], dtype=torch.int64)
    report = qlower.verify(model, (x, n), "cpu", progress=False)
    assert report.ok, report.problems
    bad = n.clone()
    bad[1, 2] = 2**40
    message = re.escape(f"input 1 (%n) holds {2**40} at index (1, 2), outside int32 [{-2**31}, {2**31 - 1}]")
    program = qlower.compile(model, (x, n), "cpu", progress=False, trace=True)
    with pytest.raises(InputError, match=message):
        program.run(x, bad)
    with pytest.raises(InputError, match=message):
        qlower.verify(model, (x, n), "cpu", inputs=[(x, n), (x, bad)], progress=False)


@pytest.mark.parametrize("target", ("reference", "tflm"))
def test_verify_refuses_an_int8_code_outside_a_narrow_input_range(target):
    graph, rng = _matmul(), np.random.default_rng(13)
    x, y = _edge_codes(rng, (1, 2, 16), *X_RANGE), _edge_codes(rng, (1, 16, 3), *Y_RANGE)
    program = lower_graph(graph, target, trace=True)
    # a stand-in for the PyTorch model: any stage that ran before the check would fail on it
    program.frontend = SimpleNamespace()
    x[0, 1, 3] = -128
    with pytest.raises(InputError, match=_refusal("input 0 (%x)", -128, (0, 1, 3), *X_RANGE)):
        verify_program(program, [(x, y)])
