"""Frontend checks: an imported IR graph against the fake-quant PyTorch model it came from.

The comparison is the one users run: ``qlower.verification`` on the imported graph
as a program for target ``reference`` (``fake_quant_agreement``), summarised from
the report's rows into three views, all in quantization steps:
- ``outputs``: each output that dequantizes static codes, the reference against
  fake-quant (``OutputRow.ref_vs_fake_quant``);
- ``layers``: every quantized layer run alone on fake-quant's inputs
  (``LayerRow.isolated_vs_fake_quant``: each op's own rounding; the IR's contract is
  at most one step per op);
- ``drift``: every quantized layer end to end (``LayerRow.ref_vs_fake_quant``; a
  1-step difference early on propagates, so deep models drift by more).
``counterpart_share`` is the share of layers whose value found a PyTorch
counterpart: a mapping that matches few layers compares almost nothing, so the
assertions require most of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from qlower.ir import Graph
from qlower.reference import run_graph
from qlower.verification import VerificationReport, run_stages
from qlower.verification.metrics import Comparison

MIN_COUNTERPART_SHARE = 0.8   # of the layers of a graph, found in the fake-quant model


@dataclass(frozen=True)
class StepStats:
    """Over a set of report rows: the most steps, the share of exact elements, how many elements."""

    max_step: float
    exact_share: float
    total: int

    @classmethod
    def of(cls, rows: Sequence[tuple[Comparison | None, int]]) -> StepStats:
        """``rows``: (comparison, elements compared) pairs; rows without a comparison or a step size
        (a float output) are left out."""
        made = [(c, n) for c, n in rows if c is not None and not math.isnan(c.max_steps)]
        total = sum(n for _, n in made)
        if not total:
            return cls(0.0, 1.0, 0)
        return cls(max(c.max_steps for c, _ in made), sum(c.exact_share * n for c, n in made) / total, total)

    def __str__(self) -> str:
        return f"max {self.max_step:g} step(s), {100 * self.exact_share:.2f}% exact of {self.total}"


@dataclass(frozen=True)
class Agreement:
    report: VerificationReport   # every row the worst over the batches
    outputs: StepStats
    layers: StepStats
    drift: StepStats

    @property
    def counterpart_share(self) -> float:
        rows = self.report.layers
        return sum(r.ref_vs_fake_quant is not None for r in rows) / len(rows) if rows else 1.0

    def __str__(self) -> str:
        return (f"outputs: {self.outputs} | layers (isolated): {self.layers} | drift: {self.drift} | "
                f"{100 * self.counterpart_share:.0f}% of {len(self.report.layers)} layers matched")


def fake_quant_agreement(result, batches: Sequence[Sequence[torch.Tensor]],
                         outputs: Sequence[int] | None = None) -> Agreement:
    """``qlower.verification`` on the imported graph of ``result`` (a FrontendResult) for target
    ``reference`` over ``batches``; the statistics count the elements of every batch's rows, so an
    exact share is exact elements over all elements compared. ``outputs``: the model outputs to count
    (default all). Fails unless MIN_COUNTERPART_SHARE of the layers found their PyTorch counterpart."""
    from qlower.api import lower_graph  # the testing helpers sit above the API

    graph = result.graph
    program = lower_graph(graph, "reference")
    program.frontend = result
    reports = [run_stages(program, tuple(b)) for b in batches]
    size = {v.name: int(np.prod(v.shape, dtype=np.int64)) for op in graph.ops for v in op.results}
    out_size = [int(np.prod(v.shape, dtype=np.int64)) for v in graph.outputs]
    agreement = Agreement(
        VerificationReport.worst_of(reports),
        StepStats.of([(o.ref_vs_fake_quant, out_size[o.index]) for r in reports for o in r.outputs
                      if outputs is None or o.index in outputs]),
        StepStats.of([(row.isolated_vs_fake_quant, size[row.value]) for r in reports for row in r.layers]),
        StepStats.of([(row.ref_vs_fake_quant, size[row.value]) for r in reports for row in r.layers]))
    assert agreement.counterpart_share >= MIN_COUNTERPART_SHARE, f"too few layers compared: {agreement}"
    return agreement


def float_error(result, model: torch.nn.Module, batches: Sequence[Sequence[torch.Tensor]]) -> float:
    """Largest ``max|IR - eager| / max|eager|`` over batches and outputs (float32 graphs)."""
    worst = 0.0
    for batch in batches:
        batch = tuple(batch)
        outs = run_graph(result.graph, [x.numpy() for x in batch])
        with torch.no_grad():
            ref = model(*batch)
        ref = ref if isinstance(ref, (tuple, list)) else (ref,)
        for o, r in zip(outs, ref):
            r = r.numpy()
            worst = max(worst, float(np.abs(o - r).max()) / max(float(np.abs(r).max()), 1e-12))
    return worst


# ops allowed to hold floats (or just move codes) at the edge of an integer program
FLOAT_BOUNDARY = frozenset({"quantize", "dequantize", "constant", "delegate", "transpose", "reshape"})


def assert_integer_program(graph: Graph, kinds: set[str], name: str = "") -> None:
    """No float fallback, the expected op kinds present, and every op between the boundary
    quantize / dequantize producing integers."""
    ops = graph.count_ops()
    assert "aten" not in ops, [op.attrs["target"] for op in graph.ops if op.kind == "aten"]
    assert kinds <= set(ops), ops
    for op in graph.ops:
        if op.kind not in FLOAT_BOUNDARY:
            assert all(r.dtype.is_integer for r in op.results), f"{name}: float {op.kind}"


def assert_targets_bit_exact(name: str, graph: Graph, inputs: Sequence[torch.Tensor], targets: Sequence[str],
                             host_allowed: frozenset[str] = frozenset()) -> None:
    """``graph`` lowered for each target runs bit-exact with the reference interpreter; on TOSA targets
    nothing but the boundary ops (and ``host_allowed``) stays on the host."""
    from qlower.api import lower_graph  # the testing helpers sit above the API

    want = run_graph(graph, [t.numpy() for t in inputs])
    for target in targets:
        lowered = lower_graph(graph, target)
        got = lowered.run(*inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w, err_msg=f"{name} on {target}")
        if target.startswith("tosa"):
            host = [d.op.kind for d in lowered.decisions]
            assert not set(host) - FLOAT_BOUNDARY - host_allowed, f"{name}: left on the host on {target}: {host}"
            assert lowered.partitions
