"""int16 lookups on Ethos-U: TOSA's interpolated TABLE as the reference defines it (checked against
the TOSA reference model on every int16 code), taken only where it is proven within a step of the
exact table and Vela costs it lower, and bit-exact through the NPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import qlower
from qlower.api import lower_graph
from qlower.backends.ethosu import tables
from qlower.backends.ethosu.vela import vela_config
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference import run_graph

SEED = 20261125
ALL_CODES = tables.CODES.astype(np.int16).reshape(1, 256, 256, 1)
X16 = QuantSpec.per_tensor(2.2 / 32768, 0, DType.INT16)


def _interp_graph(knots: np.ndarray):
    b = GraphBuilder("interp")
    x = b.input("x", TensorType(ALL_CODES.shape, DType.INT16, X16))
    y = b.op("table_interp", x, table=knots.astype(np.int16), out=QuantSpec.per_tensor(1e-4 / 128, 0, DType.INT32))
    return b.build([y])


@pytest.mark.parametrize("kind", ["smooth", "steep", "flat ends"])
def test_the_reference_table_interp_is_tosas_on_every_int16_code(kind):
    """The IR's table_interp lowered to TOSA TABLE and run by the TOSA reference model: the same int32
    for all 65,536 codes (the interpolation, the fraction of negative codes, the last segment)."""
    rng = np.random.default_rng(SEED)
    knots = {"smooth": 32000 * np.sin(np.linspace(-2, 2, 513)),
             "steep": np.cumsum(rng.integers(-2**14, 2**14, 513)).clip(-2**15, 2**15 - 1),
             "flat ends": np.r_[np.full(100, -32768), np.linspace(-32768, 32767, 313), np.full(100, 32767)]}[kind]
    graph = _interp_graph(np.asarray(knots).astype(np.int16))
    want = run_graph(graph, [ALL_CODES])[0]
    prog = lower_graph(graph, "tosa-1.0+int")
    assert [op.kind for op in prog.graph.ops if op.kind != "constant"] == ["delegate"]
    np.testing.assert_array_equal(prog.run(ALL_CODES)[0], want)


def _hard(kind: str, out_scale: float):
    """A table of int16 codes as the frontend writes one: fake-quant's codes of hardswish / sigmoid."""
    x = tables.CODES * X16.scale[0]
    f = {"hardswish": x * np.clip(x + 3, 0, 6) / 6, "sigmoid": 1 / (1 + np.exp(-x)),
         "hardswish kink": x * np.clip(x + 1.5, 0, 6) / 6}[kind]
    table = np.clip(np.rint(f / out_scale), -32768, 32767).astype(np.int16)
    b = GraphBuilder("t")
    xv = b.input("x", TensorType(ALL_CODES.shape, DType.INT16, X16))
    y = b.op("table", xv, table=table, offset=32768, out=QuantSpec.per_tensor(out_scale, 0, DType.INT16))
    return b.build([y])


@pytest.mark.parametrize("kind, out_scale", [("hardswish", 7e-5), ("sigmoid", 1 / 32768), ("sigmoid", 3e-5)])
def test_a_proven_table_becomes_table_interp_within_one_step_of_every_code(kind, out_scale):
    graph = _hard(kind, out_scale)
    config = vela_config("ethos-u85-256", None, "Sram_Only")
    rewritten = tables.interpolated_tables(graph, config)
    kinds = [op.kind for op in rewritten.ops if op.kind != "constant"]
    assert "table_interp" in kinds and "table" not in kinds
    assert rewritten.outputs[0].name == graph.outputs[0].name, "the layer keeps its name for reports"
    exact = run_graph(graph, [ALL_CODES])[0].astype(np.int64)
    interp = run_graph(rewritten, [ALL_CODES])[0].astype(np.int64)
    diff = np.abs(interp - exact)
    assert diff.max() <= 1 and np.mean(diff == 0) > 0.5, (diff.max(), np.mean(diff == 0))
    # the NPU runs the interpolated form bit-exactly (simulated: the TOSA graph Vela compiled)
    prog = lower_graph(rewritten, "ethos-u85-256", backend_options={"memory_mode": "Sram_Only"})
    assert len(prog.partitions) == 1
    np.testing.assert_array_equal(prog.run(ALL_CODES)[0], interp)


def test_a_kink_between_knots_keeps_the_exact_table():
    """hardswish's corner at -1.5 falls between knots: up to many steps off when interpolated, so the
    exact lookup stays (proven per table, over every code)."""
    graph = _hard("hardswish kink", 7e-5)
    rewritten = tables.interpolated_tables(graph, vela_config("ethos-u85-256"))
    assert [op.kind for op in rewritten.ops] == ["table"]


class _HardSwish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x):
        return torch.nn.functional.hardswish(self.conv(x))


def test_a16w8_hardswish_on_ethos_u_uses_the_table_and_costs_less():
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 3, 16, 16, generator=gen)
    calibration = [(torch.randn(1, 3, 16, 16, generator=gen) * 0.5,) for _ in range(3)]
    quant = dataclasses.replace(qlower.QuantConfig(), act_dtype="int16")
    prog = qlower.compile(_HardSwish().eval(), (x,), target="ethos-u85-256", quant=quant, calibration=calibration,
                          progress=False)
    assert "table_interp" in [op.kind for op in prog.source.ops]
    np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x.numpy()])[0])
    report = qlower.verify(_HardSwish().eval(), (x,), target="ethos-u85-256", quant=quant, calibration=calibration,
                           progress=False)
    assert report.ok, report.problems


def test_a_saturating_table_keeps_the_exact_lookup():
    """sigmoid at a scale whose codes clip at 32767 mid-segment: a corner interpolation can't follow."""
    graph = _hard("sigmoid", 1.5e-5)
    assert [op.kind for op in tables.interpolated_tables(graph, vela_config("ethos-u85-256")).ops] == ["table"]
