"""Ethos-U channel widening: which tensors form a run, that zero channels change no code, that
Vela decides (and is right), and that a widened program traces, saves and loads like any other."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import qlower
from qlower.backends.ethosu.channels import candidate_width, runs, widen
from qlower.errors import InvalidProgramError
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.reference import run_graph

SEED = 20261125
U85, U55 = "ethos-u85-256", "ethos-u55-128"


class Bottleneck(torch.nn.Module):
    """A 24-channel tensor written by two convolutions (one through a residual add), read by two:
    the depth MobileNetV2's bottlenecks have, which Vela's U85 estimate runs at half speed."""

    def __init__(self, tap: str | None = None):
        super().__init__()
        self.c1, self.c2, self.c3 = torch.nn.Conv2d(8, 24, 1), torch.nn.Conv2d(24, 24, 1), torch.nn.Conv2d(24, 64, 1)
        self.tap = tap

    def forward(self, x):
        y = self.c1(x)
        y = y + self.c2(y)
        out = torch.relu(self.c3(y))
        if self.tap == "output":
            return out, y
        if self.tap == "pool":
            return out, torch.nn.functional.max_pool2d(y, 2)
        return out


def _compile(target=U85, tap=None, side=28, **options):
    torch.manual_seed(SEED)
    model = Bottleneck(tap).eval()
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 8, side, side, generator=gen)
    calibration = [(torch.randn(1, 8, side, side, generator=gen),) for _ in range(2)]
    prog = qlower.compile(model, (x,), target=target, calibration=calibration, progress=False,
                          backend_options={"memory_mode": "Sram_Only" if target == U85 else "Shared_Sram", **options})
    return prog, x


@pytest.fixture(scope="module")
def widened():
    return _compile()


def test_a_run_is_the_tensors_tied_by_per_element_ops_between_convolutions(widened):
    prog, _ = widened
    (run,) = runs(prog.partitions[0].subgraph)
    assert run.channels == 24
    assert [op.result.name for op in run.writers] == ["conv2d", "conv2d_1_1"]
    assert [op.result.name for op in run.readers] == ["conv2d_1_1", "conv2d_2"]


@pytest.mark.parametrize("tap", ["output", "pool"])
def test_a_tensor_read_otherwise_or_leaving_the_partition_is_never_widened(tap):
    prog, _ = _compile(tap=tap)
    for p in prog.partitions:
        assert not [r for r in runs(p.subgraph) if r.channels == 24]
        assert p.payload.meta["widened"] == {}


@pytest.mark.parametrize("width", [25, 40, 64, 96])
def test_zero_channels_change_no_code_of_any_tensor(widened, width):
    """The reference interpreter on the widened graph: every tensor's own channels hold exactly the
    codes of the original graph, on random inputs spanning the whole int8 range."""
    graph = widened[0].partitions[0].subgraph
    wide = widen(graph, {runs(graph)[0].name: width})
    rng = np.random.default_rng(SEED)
    for _ in range(4):
        x = rng.integers(-128, 128, graph.inputs[0].shape, dtype=np.int8)
        want, env = run_graph(graph, [x], keep_all=True)
        got, wide_env = run_graph(wide, [x], keep_all=True)
        np.testing.assert_array_equal(got[0], want[0])
        by_name = {v.name: a for v, a in wide_env.items()}
        constants = {op.result for op in graph.ops if op.kind == "constant"}
        widened_values = 0
        for v, a in env.items():
            if v in constants:   # weights grow along O or I: their own block is unchanged
                b = by_name[v.name]
                np.testing.assert_array_equal(b[tuple(slice(0, d) for d in a.shape)], a)
                continue
            b = by_name[v.name]
            if b.shape != a.shape:
                widened_values += 1
                assert b.shape[:3] == a.shape[:3] and b.shape[3] == width
            np.testing.assert_array_equal(b[..., :a.shape[-1]] if b.ndim == 4 else b, a)
        assert widened_values >= 5   # two convolutions, their rescales, the add's operands and result


def test_widths_that_are_no_run_or_out_of_bounds_are_refused(widened):
    graph = widened[0].partitions[0].subgraph
    with pytest.raises(ValueError, match="names no run"):
        widen(graph, {"conv2d_2": 40})
    for bad in (16, 24 * 4 + 1, "40"):
        with pytest.raises(ValueError, match="can't be"):
            widen(graph, {"conv2d": bad})


def test_candidates_cross_the_next_power_of_two():
    assert [candidate_width(c) for c in (8, 16, 24, 32, 64, 96, 160)] == [None, 24, 40, 40, 72, 136, None]


def test_vela_decides_and_widening_lowers_the_total(widened):
    """Widened only where Vela costs it lower: on U85 Sram_Only the 24-channel run, never on U55 here;
    and the widened program's total is below the same program compiled without widening."""
    prog, x = widened
    meta = prog.partitions[0].payload.meta
    assert meta["widened"] == {"conv2d": 40}
    assert set(meta["narrowed"]) >= {"conv2d", "conv2d_1", "add_2"} and set(meta["narrowed"].values()) == {24}
    assert "channels widened" in prog.explain()
    plain, _ = _compile(widen_channels=False)
    assert plain.partitions[0].payload.meta["widened"] == {}
    assert meta["perf"]["total_cycles"] < plain.partitions[0].payload.meta["perf"]["total_cycles"]
    u55, _ = _compile(target=U55)
    assert u55.partitions[0].payload.meta["widened"] == {}
    for p in (prog, plain, u55):
        np.testing.assert_array_equal(p.run(x)[0], run_graph(p.source, [x.numpy()])[0])


def _verify_bottleneck():
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, 8, 28, 28, generator=gen)
    calibration = [(torch.randn(1, 8, 28, 28, generator=gen),) for _ in range(2)]
    return qlower.verify(Bottleneck().eval(), (x,), target=U85, calibration=calibration, progress=False,
                         backend_options={"memory_mode": "Sram_Only"})


def test_a_traced_tensor_of_another_shape_fails_verification(monkeypatch):
    """Without cutting the zero channels off, the widened tensors reach the report at 40 channels:
    a failure, not a comparison quietly left out."""
    import qlower.backends.ethosu.backend as backend

    monkeypatch.setattr(backend, "unpad_traced", lambda value, channels: value)
    report = _verify_bottleneck()
    assert not report.ok
    wrong = [r for r in report.layers if r.target_vs_ref is not None and r.target_vs_ref.max_steps == float("inf")]
    assert {"conv2d_1", "add_3"} <= {r.value for r in wrong}


def test_a_widened_program_verifies_per_layer_saves_and_loads(widened):
    report = _verify_bottleneck()
    assert report.ok, report.problems
    inside = [r for r in report.layers if r.inside_partition]
    assert {"conv2d_1", "add_3"} <= {r.value for r in inside}, "the widened tensors are among the layers"
    assert all(r.target_vs_ref is not None and r.target_vs_ref.max_steps == 0 for r in inside), inside
    prog, x = widened
    again = program_from_bytes(program_to_bytes(prog))
    np.testing.assert_array_equal(again.run(x)[0], prog.run(x)[0])


def _with_meta(prog, **meta):
    part = prog.partitions[0]
    payload = dataclasses.replace(part.payload, meta={**part.payload.meta, **meta})
    return dataclasses.replace(prog, partitions=[dataclasses.replace(part, payload=payload)], _runner=None)


@pytest.mark.parametrize("meta, reason", [
    ({"widened": {}}, "narrowed tensors"),
    ({"widened": {"conv2d": 48}}, "not what qlower writes|differs"),
    ({"widened": {"conv2d_2": 40}}, "names no run"),
    ({"widened": {"conv2d": 10**9}}, "can't be"),
    ({"widened": ["conv2d"]}, "not a table"),
    ({"narrowed": {"conv2d": 3}}, "narrowed tensors"),
])
def test_forged_widening_metadata_is_refused_at_load(widened, meta, reason):
    with pytest.raises(InvalidProgramError, match=reason):
        program_from_bytes(program_to_bytes(_with_meta(widened[0], **meta)))
