"""Integer inputs hold codes in their type's [qmin, qmax], the range the program was verified for
(a matmul's int32 bound is computed from it). ``Program.run`` refuses, on every target, an input
holding a code outside it, naming the input, the code, its index and the range (a target could
otherwise wrap where the reference refuses); the codes at the edges run and match the reference.
A delegate's payload refuses such codes too (``check_payload_inputs``: a .tflite with int8
interface fed by a caller)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import qlower
from qlower.api import lower_graph
from qlower.backends.registry import backend_for
from qlower.errors import InputError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference import run_graph
from qlower.testing.differential import check_against_reference

TARGETS = ("reference", "cpu", "litert", "tflm", "tosa-1.0+int")
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


def _refusal(what: str, code: int, index: tuple, lo: int, hi: int) -> str:
    return re.escape(f"{what} holds {code} at index {index}, outside [{lo}, {hi}]")


@pytest.mark.parametrize("target", TARGETS)
def test_codes_at_the_range_edges_run_and_match_the_reference(target):
    graph, rng = _matmul(), np.random.default_rng(11)
    x, y = _edge_codes(rng, (1, 2, 16), *X_RANGE), _edge_codes(rng, (1, 16, 3), *Y_RANGE)
    y[0, :, 0], y[0, :, 1] = Y_RANGE[1], Y_RANGE[0]             # extreme sums of both signs
    program = lower_graph(graph, target)
    assert target == "reference" or program.partitions or target == "cpu", program.explain()
    check_against_reference(graph, [x, y], target)
    np.testing.assert_array_equal(program.run(x, y)[0], run_graph(program.source, [x, y])[0])
    x16 = _edge_codes(rng, (1, 4, 4, 8), -32767, 32767, np.int16)
    check_against_reference(_int16(), [x16], target)


@pytest.mark.parametrize("target", TARGETS)
def test_an_out_of_range_code_is_refused_on_every_target(target):
    graph, rng = _matmul(), np.random.default_rng(12)
    x, y = _edge_codes(rng, (1, 2, 16), *X_RANGE), _edge_codes(rng, (1, 16, 3), *Y_RANGE)
    program = lower_graph(graph, target)
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
        lower_graph(_int16(), target).run(x16)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def _assert_payload_refuses_codes_outside(target: str, options: dict | None, part, partition: str, rng) -> None:
    """``part``'s payload runs codes at the edges of its first input's range as the reference runs its
    subgraph, and refuses a code one past the bottom, naming the partition's input."""
    backend = backend_for(target, options)
    codes = []
    for t in part.input_types:
        codes.append(_edge_codes(rng, t.shape, t.quant.qmin, t.quant.qmax))
    for g, w in zip(backend.execute(part.payload, codes), run_graph(part.subgraph, codes)):
        np.testing.assert_array_equal(g, w)
    q, index = part.input_types[0].quant, (0,) * (codes[0].ndim - 1) + (1,)
    codes[0][index] = q.qmin - 1
    with pytest.raises(InputError, match=_refusal(f"input 0 of {partition}", q.qmin - 1, index, q.qmin, q.qmax)):
        backend.execute(part.payload, codes)


def test_a_litert_payload_refuses_codes_outside_its_input_range():
    (part,) = lower_graph(_matmul(), "litert").partitions
    assert [(t.quant.qmin, t.quant.qmax) for t in part.input_types] == [X_RANGE, Y_RANGE]
    _assert_payload_refuses_codes_outside("litert", None, part, "the LiteRT partition", np.random.default_rng(14))


def test_a_tflm_payload_with_int8_interface_refuses_codes_outside_its_input_range():
    """Symmetric activations ([-127, 127]); with io=int8 the .tflite takes the codes themselves."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    example = (torch.randn(1, 3, 6, 6, generator=g),)
    calibration = [(torch.randn(1, 3, 6, 6, generator=g) * s,) for s in (0.5, 1.0, 2.0)]
    options = {"io": "int8"}
    program = qlower.compile(_Net().eval(), example, target="tflm", progress=False, calibration=calibration,
                             quant=qlower.QuantConfig(act_qmin=-127, act_qmax=127), backend_options=options)
    (part,) = program.partitions
    assert [(t.dtype, t.quant.qmin, t.quant.qmax) for t in part.input_types] == [(DType.INT8, -127, 127)]
    _assert_payload_refuses_codes_outside("tflm", options, part, "the TFLM partition", np.random.default_rng(13))
