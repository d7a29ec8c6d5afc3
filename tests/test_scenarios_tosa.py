"""SCENARIOS.md S1 and S3 end to end on the TOSA targets.

S1: the relu whose output domain the concat owns keeps an explicit clamp, and
the TOSA program is bit-exact with the reference interpreter in both profiles.
S3: the folded constant is read back from the emitted .tosa flatbuffer (its
CONST tensor) and equals the eager quantized model exactly.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import qlower
from qlower import zoo
from qlower.reference import run_graph
from qlower.zoo.scenarios import s3_variant

os.environ.setdefault("TOSA_MODEL_NO_BACKTRACE", "1")


@pytest.mark.parametrize("target", ["tosa-1.0+int", "tosa-1.0+int+fp"])
def test_s1_relu_owned_by_concat_is_bit_exact_on_tosa(target):
    model, example, cfg, calib = zoo.get("s1_conv_relu_cat")
    prog = qlower.compile(model, example, target=target, quant=cfg, calibration=calib, progress=False)
    clamps = [op for op in prog.source.ops if op.kind == "clamp"]
    assert len(clamps) == 1, "relu must stay an explicit clamp"
    relu = clamps[0]
    q = relu.operands[0].quant
    assert (q.qmin, q.qmax) == (-127, 127)
    assert relu.attrs["min"] == q.zero_point[0] != q.qmin  # zero point about -111: not foldable into the conv
    assert q.zero_point[0] == -111
    assert prog.partitions and "p0/graph.tosa" in prog.artifacts()
    assert not any(op.kind == "clamp" for op in prog.graph.ops), "the clamp runs inside the TOSA partition"
    rng = np.random.default_rng(0)
    for _ in range(4):
        inputs = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in example]
        inputs[1] = rng.random(tuple(example[1].shape)).astype(np.float32) - 0.065
        np.testing.assert_array_equal(prog.run(*inputs)[0], run_graph(prog.source, inputs)[0])


def _tosa_constants(blob: bytes) -> list[np.ndarray]:
    """The int8 CONST tensors of a TOSA flatbuffer, decoded with the schema's own Python module."""
    import tosa.TosaGraph as tosa_graph

    block = tosa_graph.TosaGraph.GetRootAs(blob, 0).Regions(0).Blocks(0)
    out = []
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        if t.DataLength():
            out.append(t.DataAsNumpy().view(np.int8).reshape(t.ShapeAsNumpy()))
    return out


def _eager_codes(model) -> np.ndarray:
    with torch.no_grad():
        out = model()
    return np.clip(np.rint(out.numpy().astype(np.float64) * 127), -127, 127).astype(int)


def test_s3_folded_constant_is_read_back_from_the_tosa_file():
    model, example, cfg, calib = zoo.get("s3_const_cat")
    prog = qlower.compile(model, example, target="tosa-1.0+int", quant=cfg, calibration=calib, progress=False)
    (codes,) = _tosa_constants(prog.artifacts()["p0/graph.tosa"])
    assert codes.shape == (1, 2, 4, 5)
    for row in codes[0, 0]:
        assert row.tolist() == [-102, -51, 0, 51, 102]
    for col in codes[0, 1].T:
        assert col.tolist() == [-95, -32, 32, 95]
    assert np.abs(codes.astype(int) - _eager_codes(model)).max() == 0
    np.testing.assert_array_equal(prog.run()[0], codes.astype(np.float32) * np.float32(1 / 127))


@pytest.mark.parametrize("kind", ["hh", "vh", "three_scales"])
def test_s3_variants_fold_exactly(kind):
    model, example, cfg, calib = s3_variant(kind)
    prog = qlower.compile(model, example, target="tosa-1.0+int", quant=cfg, calibration=calib, progress=False)
    (codes,) = _tosa_constants(prog.artifacts()["p0/graph.tosa"])
    assert np.abs(codes.astype(int) - _eager_codes(model)).max() == 0


def test_s3_variant_with_a_runtime_input_folds_only_the_constant():
    model, example, cfg, calib = s3_variant("const_runtime")
    prog = qlower.compile(model, example, target="tosa-1.0+int", quant=cfg, calibration=calib, progress=False)
    assert any(op.kind == "concat" for p in prog.partitions for op in p.subgraph.ops)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.uniform(-1, 1, tuple(example[0].shape)).astype(np.float32)
        np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x])[0])
