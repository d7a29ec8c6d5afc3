"""Which ops produce non-finite values on the calibration data, found before PT2E annotates the graph.

A lookup table (rules/pointwise.py) needs the op's result quantized, and an
observer that sees NaN or ±inf can't give it a scale (PT2E fails). Worse, a
NaN a later op relies on (``sqrt(x).nan_to_num()``) has no code. So ops that
can leave the finite numbers (sqrt, log, reciprocal, pow, ...) are quantized only
when none of their results on the calibration batches is NaN or infinite;
otherwise they, and every op reading such a result, stay float on the host,
where the NaN keeps its meaning.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.fx import GraphModule

aten = torch.ops.aten
MAY_LEAVE_FINITE = {aten.sqrt, aten.sqrt_, aten.rsqrt, aten.rsqrt_, aten.log, aten.log_, aten.reciprocal,
                    aten.reciprocal_, aten.pow, aten.pow_, aten.div, aten.div_}


def non_finite_nodes(gm: GraphModule, batches: Sequence[Sequence[torch.Tensor]]) -> set[str]:
    """Names of the nodes with a NaN or infinite result on some batch (looked for only in graphs with an
    op of ``MAY_LEAVE_FINITE``: elsewhere non-finite values are not expected, and the pass is skipped)."""
    if not any(n.op == "call_function" and getattr(n.target, "overloadpacket", None) in MAY_LEAVE_FINITE
               for n in gm.graph.nodes):
        return set()
    found: set[str] = set()

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.op == "call_function" and isinstance(out, torch.Tensor) and out.is_floating_point() \
                    and not bool(torch.isfinite(out).all()):
                found.add(n.name)
            return out

    with torch.no_grad():
        for batch in batches:
            Recorder(gm).run(*batch)
    return found
