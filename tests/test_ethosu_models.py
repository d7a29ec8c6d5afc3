"""Zoo models compiled for Ethos-U through the frontend (SCENARIOS.md S4, MobileNetV2, ResNet-18).

Every NPU partition's boundary types must have the element size Vela reports for
that tensor, float consumers of NPU results must read them through an explicit
host dequantize, and the program (NPU partitions simulated on the TOSA reference
model) must be bit-exact with the reference interpreter running ``program.source``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import qlower
from qlower import zoo
from qlower.api import lower_graph
from qlower.backends.ethosu.backend import EXECUTION
from qlower.backends.ethosu.support import BOUNDARY_TRANSPOSE_REASON
from qlower.ir import DType
from qlower.reference import run_graph

U85, U55 = "ethos-u85-256", "ethos-u55-128"


def _compile(name: str, target: str, size: int | None = None):
    model, inputs, cfg, calib = zoo.get(name, size=size)
    prog = qlower.compile(model, inputs, target=target, quant=cfg, calibration=calib, progress=False)
    return prog, inputs


@functools.cache
def _optimised(name: str, size: int):
    """The model's optimised IR (the frontend runs once per model, not once per target)."""
    prog, inputs = _compile(name, "reference", size)
    return prog.source, inputs


def _check_program(prog, inputs) -> None:
    assert prog.partitions
    for p in prog.partitions:
        meta = p.payload.meta
        assert meta["accelerator"] == prog.target and meta["execution"] == EXECUTION
        assert meta["perf"]["npu_cycles"] > 0
        io = meta["io"]
        types = p.input_types + p.output_types
        assert [e["kind"] for e in io] == ["input"] * len(p.input_types) + ["output"] * len(p.output_types)
        for t, e in zip(types, io):
            assert t.dtype.itemsize == e["element_size"] and list(t.shape) == e["shape"]
            assert t.dtype is not DType.FLOAT32
    # no NPU result reaches a float op other than through an explicit dequantize
    users = prog.graph.users()
    for op in prog.graph.ops:
        if op.kind == "delegate":
            for r in op.results:
                for u in users.get(r, []):
                    assert u.kind in ("dequantize", "delegate") or not any(
                        x.dtype is DType.FLOAT32 for x in u.results), f"%{r.name} read by {u.kind}"
    got = prog.run(*inputs)
    want = run_graph(prog.source, [np.asarray(x) for x in inputs])
    assert len(got) == len(want)
    for a, e in zip(got, want):
        assert a.dtype == e.dtype
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("target", [U85, U55])
def test_s4_attention(target):
    prog, inputs = _compile("s4_attention", target)
    _check_program(prog, inputs)
    kinds = {op.kind for p in prog.partitions for op in p.subgraph.ops}
    assert {"matmul", "fully_connected"} <= kinds
    # U85 takes every integer op: one partition (q, k and v read the same host value, yet share it);
    # U55 splits around the host's division by the softmax's run-time sum (the int16 exp table is
    # int8 TABLEs there)
    assert len(prog.partitions) == (1 if target == U85 else 2)
    if target == U55:  # the division stays on the host, with Vela's reason
        reasons = {d.op.kind: d.reason for d in prog.decisions}
        assert "table" not in reasons
        assert reasons["intdiv"].startswith("Vela (ethos-u55-128): Non-passthrough operation")
        assert "Vela (ethos-u55-128)" in prog.explain()


@pytest.mark.slow
@pytest.mark.parametrize("target", [U85, U55])
@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18"])
def test_cnn_compiles_and_runs_exactly(name, target):
    source, inputs = _optimised(name, 32)
    prog = lower_graph(source, target)
    _check_program(prog, inputs)
    assert len(prog.partitions) == 1
    assert any(d.reason == BOUNDARY_TRANSPOSE_REASON for d in prog.decisions)
    # the whole network's MACs are on the NPU: Vela's count is at least the convolutions' and FC's
    macs = 0
    for op in prog.source.ops:
        if op.kind == "conv2d":
            n, oh, ow, oc = op.result.shape
            _, kh, kw, ic = op.operands[1].shape
            macs += n * oh * ow * oc * kh * kw * ic
        elif op.kind == "fully_connected":
            macs += int(np.prod(op.result.shape)) * op.operands[1].shape[1]
    assert prog.partitions[0].payload.meta["perf"]["macs"] >= macs > 0
