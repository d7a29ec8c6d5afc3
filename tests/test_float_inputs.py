"""Non-finite float inputs on the runtimes that check them (qlower/backends/float_inputs.py).

Where a partition only quantizes a float input, TFLM's QUANTIZE and the VGF emulation layer saturate
±inf, ±FLT_MAX and values just beyond the quantization range exactly as the reference does (measured
here, int8 and int16, on TFLM's interpreter and on Vulkan), so those run. NaN has no code: refused.
±inf going into a float op first is refused: there the reference refuses the NaN that ``inf - inf``
makes, and the emulation layer reads it as -inf (a silent -128). A program file can't claim more
saturating inputs than its subgraph has."""

from __future__ import annotations

import numpy as np
import pytest

from qlower.api import lower_graph
from qlower.backends.float_inputs import SATURATING
from qlower.errors import InputError, InvalidProgramError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.reference import run_graph
from qlower.testing.hostile import edit_header

F32 = np.float32
TARGETS = ("tflm", "vgf")
SPECS = (QuantSpec.per_tensor(0.05, 3), QuantSpec.per_tensor(1 / 256, -128, qmin=-127),
         QuantSpec.per_tensor(2**-10, 0, DType.INT16, qmin=-32767, qmax=32767), QuantSpec.per_tensor(1e-3, 7, DType.INT16))


def _quantized():
    """x_i (float) -> quantize with SPECS[i] -> an integer op: every float input is only quantized."""
    b = GraphBuilder("quantized")
    outs = []
    for i, q in enumerate(SPECS):
        x = b.input(f"x{i}", TensorType((1, 2, 4, 4), DType.FLOAT32))
        y = b.op("quantize", x, out=q, name=f"q{i}")
        outs.append(b.op("max_pool2d", y, kernel=(1, 1), stride=(1, 1), pad=(0, 0, 0, 0), name=f"m{i}"))
    return b.build(outs)


def _subtracted():
    """x - x (float) -> quantize: ±inf makes NaN inside the partition."""
    b = GraphBuilder("subtracted")
    x = b.input("x", TensorType((1, 2, 4, 4), DType.FLOAT32))
    return b.build([b.op("quantize", b.op("sub", x, x, name="d"), out=SPECS[0], name="q")])


def _extremes(q: QuantSpec) -> np.ndarray:
    """±inf, ±FLT_MAX, the half-steps beyond qmax / qmin and their neighbours on both sides, huge
    finite values, and a few ordinary ones."""
    s, zp = q.scale[0], q.zero_point[0]
    hi, lo = F32((q.qmax - zp + 0.5) * s), F32((q.qmin - zp - 0.5) * s)
    big = F32(np.finfo(F32).max)
    edges = [np.inf, -np.inf, big, -big, hi, lo, np.nextafter(hi, F32(np.inf)), np.nextafter(lo, F32(-np.inf)),
             np.nextafter(hi, F32(0)), np.nextafter(lo, F32(0)), 1e30, -1e30, 2.0**31 * s, -(2.0**31) * s]
    ordinary = np.random.default_rng(5).uniform((q.qmin - zp) * s, (q.qmax - zp) * s, 32 - len(edges))
    return np.array(edges + list(ordinary), F32).reshape(1, 2, 4, 4)


def _lower(graph, target: str):
    program = lower_graph(graph, target)
    assert [op.kind for op in program.graph.ops] == ["delegate"], program.explain()
    if target == "vgf":
        assert program.partitions[0].payload.execution.kind == "vulkan", program.partitions[0].payload.execution
    return program


@pytest.fixture(scope="module", params=TARGETS)
def subtracted(request):
    return _lower(_subtracted(), request.param)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # the reference's x / scale
@pytest.mark.parametrize("target", TARGETS)
def test_an_input_only_quantized_saturates_as_the_reference(target):
    program = _lower(_quantized(), target)
    xs = [_extremes(q) for q in SPECS]
    want = run_graph(program.source, xs)
    for q, w in zip(SPECS, want):
        assert w.min() == q.qmin and w.max() == q.qmax
    for got, w, q in zip(program.run(*xs), want, SPECS):
        np.testing.assert_array_equal(got, w, err_msg=f"{target}, {q}")
    xs[2][0, 1, 2, 3] = np.nan
    with pytest.raises(InputError, match="input 2 of the .* partition holds NaN, which has no quantized code"):
        program.run(*xs)


def test_infinity_into_a_float_op_is_refused(subtracted):
    x = np.random.default_rng(6).uniform(-5, 5, (1, 2, 4, 4)).astype(F32)
    np.testing.assert_array_equal(subtracted.run(x)[0], run_graph(subtracted.source, [x])[0])
    for value in (np.inf, -np.inf):
        x[0, 0, 1, 1] = value
        with pytest.raises(InputError, match="input 0 of the .* partition holds infinity and goes into float ops"):
            subtracted.run(x)


def test_a_file_cant_claim_an_input_saturates(subtracted):
    data = program_to_bytes(subtracted)
    assert program_from_bytes(data).partitions[0].payload.meta[SATURATING] == []

    def claim(h):
        h["partitions"][0]["payload"]["meta"][SATURATING] = [0]
    with pytest.raises(InvalidProgramError, match=r"partition 'p0' payload: its metadata 'saturating_inputs' \[0\] "
                                                  r"is not the float inputs its subgraph only quantizes \(\[\]\)"):
        program_from_bytes(edit_header(data, claim))
