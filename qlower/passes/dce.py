"""Dead code elimination: drop every op none of whose results reaches a graph output.

Liveness is transitive, computed backwards from the outputs in one sweep over
the (topologically ordered) ops. Graph inputs always stay, used or not: they are
the program's signature. The kept ops are the same immutable ``Op`` objects, in
the same order: no value or type is touched, so nothing needs re-inferring.
"""

from __future__ import annotations

from qlower.ir import Graph, Value
from qlower.passes.manager import PassResult


def eliminate_dead_code(graph: Graph) -> PassResult:
    """Keep only the ops whose results the outputs (transitively) need."""
    live: set[Value] = set(graph.outputs)
    kept = []
    for op in reversed(graph.ops):
        if any(r in live for r in op.results):
            kept.append(op)
            live.update(op.input_values())
    if len(kept) == len(graph.ops):
        return PassResult(graph, False)
    return PassResult(Graph(graph.inputs, tuple(reversed(kept)), graph.outputs, graph.name), True)
