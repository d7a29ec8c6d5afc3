"""Verdicts that survive partitioning.

Some TFLM forms span several IR ops (a fused GEMM and its rescale, an int8 ADD
and its five rescales, a global average) or read a range proven upstream (a
table lookup). Judged on the whole graph, each op of such a group is
supported; but when host ops split a group between two partitions, or put the
producer that proves a range on the host, a partition's own export has no form
for the piece it got (an int32 rescale of a wide range needs 64-bit integers,
which TFLM lacks). So the verdicts are settled before the partitioner uses
them: partition with the current verdicts (the partitioner's own greedy
assignment), export every partition on its own, and send to the host whatever
fails there; repeat until every partition exports. Each round only adds host
ops, so it ends.
"""

from __future__ import annotations

from qlower.backends.tflm.export import op_reasons
from qlower.contract import Verdict
from qlower.ir import Graph, copy_ops
from qlower.partition.partitioner import _assign


def settled_reasons(graph: Graph, fixed: dict[int, str] | None = None) -> dict[int, str]:
    """id(op) -> why it stays on the host, such that every partition of the rest exports for TFLM (``fixed``:
    ops kept on the host whatever TFLM could do, with their reasons)."""
    reasons = {**op_reasons(graph), **(fixed or {})}
    if not reasons:
        return reasons   # one partition, the whole graph: it exported above
    users, outputs = graph.users(), set(graph.outputs)
    while True:
        verdicts = {op: Verdict.no(reasons[id(op)]) if id(op) in reasons
                    else Verdict(op.kind != "aten", "a float fallback") for op in graph.ops}
        groups: dict[int, list] = {}
        for op, pid in _assign(graph, verdicts).items():
            groups.setdefault(pid, []).append(op)
        added = False
        for ops in groups.values():
            inside = set(ops)
            leaving = {r for op in ops for r in op.results
                       if r in outputs or any(u not in inside for u in users.get(r, []))}
            sub, _, _ = copy_ops(graph, ops, "settle", leaving)
            failed = op_reasons(sub)
            by_name = {op.results[0].name: op for op in ops}
            for op in sub.ops:
                if id(op) in failed and op.kind != "constant":
                    original = by_name[op.results[0].name]
                    reasons[id(original)] = f"{failed[id(op)]} (once host ops split it from the ops its TFLM form needs)"
                    added = True
        if not added:
            return reasons
