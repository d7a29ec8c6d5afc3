"""A matmul of two run-time operands (issue 30): no constant bounds its sums, so the codes' ranges
do. At the edge (K * span_a * span_b = the largest sum that fits int32) every target computes the
reference's numbers with codes at their extremes; one product more and every target refuses the
graph at compile, naming the op (the reference refused such a sum at run time, TFLite's int32
BATCH_MATMUL wraps it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qlower
from qlower.api import lower_graph
from qlower.errors import QlowerError, VerificationError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.reference import run_graph

# the targets that take an int8 matmul fused with its rescale (litert's BATCH_MATMUL, TFLM's, TOSA's MATMUL)
TARGETS = ("reference", "cpu", "litert", "tflm", "tosa-1.0+int")
SPAN = 128                                   # codes in [-128, 127], zero point 0
EDGE = (2**31 - 1) // (SPAN * SPAN)          # 131,071 products of -128 x -128 fit int32; one more doesn't


def _matmul(k: int):
    q = QuantSpec.per_tensor(0.01, 0)
    b = GraphBuilder("mm_edge")
    x = b.input("x", TensorType((1, 2, k), DType.INT8, q))
    y = b.input("y", TensorType((1, k, 2), DType.INT8, q))
    acc = b.op("matmul", x, y, name="mm")
    return b.build([b.op("rescale", acc, out=QuantSpec.per_tensor(2**31 * 1e-4 / 127, 0), name="rq")])


@pytest.mark.slow
def test_matmul_sums_at_the_int32_edge_agree_on_every_target():
    graph = _matmul(EDGE)
    rng = np.random.default_rng(30)
    x = np.full((1, 2, EDGE), -128, np.int8)          # row 0 at the extreme: the sum is 2,147,467,264
    x[0, 1] = rng.integers(-128, 128, EDGE)
    y = np.full((1, EDGE, 2), -128, np.int8)
    y[0, :, 1] = rng.integers(-128, 128, EDGE)
    want = run_graph(graph, [x, y])[0]
    assert want[0, 0, 0] == 127, "the extreme sum must reach the top of the output range"
    for target in TARGETS:
        prog = lower_graph(graph, target)
        assert np.array_equal(prog.run(x, y)[0], want), target
    over = _matmul(EDGE + 1)
    with pytest.raises(VerificationError, match=r"matmul producing %mm: its sum of 131,072 products .* beyond the "
                                                r"int32 accumulator"):
        verify_graph(over)
    for target in TARGETS:   # a program holding one, as a forged file would: refused on every target
        with pytest.raises(QlowerError, match="beyond the int32 accumulator"):
            program_from_bytes(program_to_bytes(lower_graph(over, target)))


class _Matmul(torch.nn.Module):
    def forward(self, x, y):
        return x @ y


def test_the_frontend_keeps_a_matmul_that_can_overflow_in_float():
    """Past the bound the importer writes the matmul as a float op on the host (rule 8), never an
    integer matmul the verifier refuses; below it, an integer matmul."""
    for k, integer in ((64, True), (EDGE + 1, False)):
        rng = torch.Generator().manual_seed(k)
        example = (torch.randn(1, 2, k, generator=rng), torch.randn(1, k, 2, generator=rng))
        prog = qlower.compile(_Matmul(), example, target="reference", progress=False)
        codes = [op.operands[0].type.dtype.value for op in prog.graph.ops if op.kind == "matmul"]
        assert codes == (["int8"] if integer else ["float32"]), codes
        got = prog.run(*example)[0]
        assert np.allclose(got, (example[0] @ example[1]).numpy(), rtol=0.05, atol=0.05 * k ** 0.5)
