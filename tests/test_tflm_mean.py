"""A global mean on tflm is TFLM's own int8 MEAN: ``TflmMean`` gives the program its rounding, the exporter
writes one MEAN, and tflite-micro's interpreter computes what the reference computes (random shapes, scales
and zero points, seeded)."""

import numpy as np
import pytest
import tflite
from tflite.BuiltinOperator import BuiltinOperator as B

from qlower.backends.tflm import runner
from qlower.backends.tflm.export import export_tflm
from qlower.backends.tflm.mean import TflmMean, tflm_mean
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference import run_graph


def _mean_graph(h, w, c, s_in, zp, s_out, zp_out):
    """The frontend's global average: widen x128 to int16, average pool over the plane, rescale."""
    b = GraphBuilder("mean")
    x = b.input("x", TensorType((1, h, w, c), DType.INT8, QuantSpec.per_tensor(s_in, zp, DType.INT8)))
    wide = b.op("rescale", x, out=QuantSpec.per_tensor(s_in / 128, 0, DType.INT16))
    pooled = b.op("avg_pool2d", wide, kernel=(h, w), stride=(h, w))
    return b.build([b.op("rescale", pooled, out=QuantSpec.per_tensor(s_out, zp_out, DType.INT8))])


def _opcodes(model: bytes) -> list[int]:
    m = tflite.Model.GetRootAsModel(model, 0)
    sg = m.Subgraphs(0)
    return [max(m.OperatorCodes(sg.Operators(i).OpcodeIndex()).BuiltinCode(),
                m.OperatorCodes(sg.Operators(i).OpcodeIndex()).DeprecatedBuiltinCode())
            for i in range(sg.OperatorsLength())]


def _cases(n: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(1, 20, 2))
        s_in = float(np.exp(rng.uniform(-7, 1)))
        yield rng, (h, w, 48, s_in, int(rng.integers(-128, 128)), s_in * float(np.exp(rng.uniform(-2, 2))),
                    int(rng.integers(-128, 128)))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_global_mean_is_one_tflm_mean_bit_exact(seed):
    for rng, case in _cases(4, seed):
        h, w, c, s_in, zp, s_out, zp_out = case
        canonical = _mean_graph(*case)
        form = TflmMean().apply(canonical)
        assert [op.kind for op in form.graph.ops][-4:] == ["rescale", "reduce_sum", "reduce_sum", "table"], case
        model = export_tflm(form.graph)
        assert _opcodes(model) == [B.MEAN], case   # one operator, no lookup table in flash
        arena = runner.smallest_arena(model, "mean")
        for codes in (rng.integers(-128, 128, size=(1, h, w, c)),
                      np.full((1, h, w, c), -128), np.full((1, h, w, c), 127),
                      # sums near every multiple of the plane: ties of the division
                      np.clip(rng.integers(-2, 3, size=(1, h, w, c)) + rng.integers(-120, 120, size=(1, 1, 1, c)),
                              -128, 127)):
            x = codes.astype(np.int8)
            got = runner.run(model, arena, [x], "mean")[0].astype(np.int64)
            want = run_graph(form.graph, [x])[0].astype(np.int64)
            np.testing.assert_array_equal(got, want, err_msg=str(case))
            # the reference's table is TFLM's arithmetic on the centered sums, and within a step of the pool form
            sums = (x.astype(np.int64) - zp).sum(axis=(1, 2), keepdims=True)
            np.testing.assert_array_equal(want, tflm_mean(sums, h * w, s_in, s_out, zp_out), err_msg=str(case))
            assert np.abs(want - run_graph(canonical, [x])[0].astype(np.int64)).max() <= 1, case


def test_a_plane_too_large_for_a_table_of_its_sums_keeps_the_pool_form_bit_exact():
    """34x34 taps: more sums than the rewrite writes a table of (MAX_ENTRIES), so the program keeps the
    frontend's form, and TFLM sums the plane (a float32 depthwise convolution of ones) and looks the result up,
    bit-exact."""
    canonical = _mean_graph(34, 34, 1, 0.02, -10, 0.01, 3)
    assert TflmMean().apply(canonical).graph is canonical
    model = export_tflm(canonical)
    ops = _opcodes(model)
    assert B.MEAN not in ops and B.DEPTHWISE_CONV_2D in ops and B.GATHER in ops, ops
    arena = runner.smallest_arena(model, "mean")
    rng = np.random.default_rng(3)
    for codes in (rng.integers(-128, 128, size=(1, 34, 34, 1)), np.full((1, 34, 34, 1), -128),
                  np.full((1, 34, 34, 1), 127)):
        x = codes.astype(np.int8)
        np.testing.assert_array_equal(runner.run(model, arena, [x], "mean")[0], run_graph(canonical, [x])[0])
