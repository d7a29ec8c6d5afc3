"""Per-node numbers over the program's graph: Model Explorer node data.

Each overlay is one metric per node, coloured by thresholds so that a glance finds where the
error grows or the cycles go:
- from ``qlower.verify`` (a VerificationReport, or its JSON): steps end to end and isolated
  against the fake-quant model, SQNR against fp32, and the share of codes the target computes
  exactly like the reference;
- from the program alone: Vela's per-layer cycles (Ethos-U partitions) and, for float fallbacks,
  how many elements they compute in float (the work that left the integer program).

Keys are the IR value names the graph's nodes carry (``qlower/view/graph.py``). Values JSON
cannot hold (NaN: no step size; ±inf: identical, or nothing alike) are left out or clamped to
``CLAMP`` so the browser can parse them; the node's attributes still say what they were.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from model_explorer import node_data_builder as ndb

from qlower.program import Program

CLAMP = 1e9
GREEN, YELLOW, ORANGE, RED = "#a5d6a7", "#fff59d", "#ffcc80", "#ef9a9a"


@dataclass(frozen=True)
class Overlay:
    """One named metric per node."""

    name: str
    values: dict[str, float]
    thresholds: list[ndb.ThresholdItem]

    def node_data(self, graph_id: str) -> ndb.ModelNodeData:
        results = {k: ndb.NodeDataResult(value=v) for k, v in self.values.items()}
        return ndb.ModelNodeData(graphsData={graph_id: ndb.GraphNodeData(results=results,
                                                                          thresholds=self.thresholds)})


# colour scales: a node takes the colour of the first threshold its value does not exceed
_STEPS = [ndb.ThresholdItem(0, GREEN), ndb.ThresholdItem(1, YELLOW), ndb.ThresholdItem(4, ORANGE),
          ndb.ThresholdItem(CLAMP, RED)]
_SQNR = [ndb.ThresholdItem(10, RED), ndb.ThresholdItem(20, ORANGE), ndb.ThresholdItem(30, YELLOW),
         ndb.ThresholdItem(CLAMP, GREEN)]
_EXACT = [ndb.ThresholdItem(90, RED), ndb.ThresholdItem(99.999, ORANGE), ndb.ThresholdItem(100, GREEN)]


def report_overlays(report: Any) -> list[Overlay]:
    """The verification overlays of ``report`` (a VerificationReport or the dict of its JSON)."""
    data = report if isinstance(report, Mapping) else report.as_dict()
    layers = data.get("layers", [])

    def metric(comparison: str, field: str, scale: float = 1.0) -> dict[str, float]:
        out = {}
        for row in layers:
            c = row.get(comparison)
            x = None if c is None else c.get(field)
            if x is None or (isinstance(x, float) and math.isnan(x)):
                continue
            out[row["value"]] = _finite(float(x) * scale)
        return out

    overlays = [
        Overlay("steps end to end (reference vs fake-quant)", metric("ref_vs_fake_quant", "max_steps"), _STEPS),
        Overlay("steps isolated (the layer alone vs fake-quant)", metric("isolated_vs_fake_quant", "max_steps"),
                _STEPS),
        Overlay("SQNR dB (reference vs fp32)", metric("ref_vs_fake_quant", "sqnr_db"), _SQNR),
        Overlay("exact % (target vs reference)", metric("target_vs_ref", "exact_share", 100.0), _EXACT),
    ]
    return [o for o in overlays if o.values]


def program_overlays(program: Program) -> list[Overlay]:
    """Overlays the program itself carries: Vela's per-layer cycles, and float fallbacks' work."""
    cycles: dict[str, float] = {}
    for p in program.partitions:
        for row in p.payload.meta.get("per_layer") or []:
            if isinstance(row, Mapping) and row.get("value"):
                cycles[row["value"]] = cycles.get(row["value"], 0.0) + float(row.get("op_cycles", 0))
    overlays = []
    if cycles:
        top = max(cycles.values())
        overlays.append(Overlay("cycles (Vela's estimate per layer)", cycles, _relative(top)))
    fallback_work = {op.results[0].name: float(sum(r.type.numel for r in op.results))
                     for op in program.graph.ops if op.kind == "aten"}
    if fallback_work:
        overlays.append(Overlay("float fallback: elements computed in float", fallback_work,
                                _relative(max(fallback_work.values()))))
    return overlays


def overlays_for(program: Program, report: Any = None) -> list[Overlay]:
    """Every overlay for ``program``: the program's own, then the report's when given."""
    return program_overlays(program) + ([] if report is None else report_overlays(report))


def _relative(top: float) -> list[ndb.ThresholdItem]:
    """Colours by share of the largest value: a quarter, a half, three quarters, the rest."""
    edges: list[tuple[float, str]] = [(0.25, GREEN), (0.5, YELLOW), (0.75, ORANGE)]
    return [*(ndb.ThresholdItem(top * f, c) for f, c in edges), ndb.ThresholdItem(CLAMP, RED)]


def _finite(x: float) -> float:
    return max(-CLAMP, min(CLAMP, x))

