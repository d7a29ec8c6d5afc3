"""Structural equality of graphs: the same computation up to value names and op order.

Two graphs are the same structure when their inputs pair up by position with equal types,
their outputs pair up by position, and each pair of corresponding values is computed by ops of
the same kind, attributes (arrays by content) and result types from corresponding operands.
Before/after tests of a pass compare the pass's output with an expected text this way, so a
fresh name or a different topological order is not a failure.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qlower.ir.graph import Graph, Op, Operand, Value


def _same_attr(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_attr, a, b))
    return type(a) is type(b) and a == b


def graph_difference(got: Graph, want: Graph) -> str | None:
    """Where ``got`` first differs from ``want`` structurally (see the module docstring), or None."""
    if len(got.inputs) != len(want.inputs) or len(got.outputs) != len(want.outputs):
        return (f"{len(got.inputs)} inputs and {len(got.outputs)} outputs, expected {len(want.inputs)} "
                f"and {len(want.outputs)}")
    pairs: dict[Value, Value] = {}   # got value -> want value
    for i, (g, w) in enumerate(zip(got.inputs, want.inputs)):
        if g.type != w.type:
            return f"input {i} %{g.name} is {g.type}, expected {w.type}"
        pairs[g] = w
    got_ops, want_ops = got.producers(), want.producers()

    def match(g: Value, w: Value) -> str | None:
        if g in pairs:
            return None if pairs[g] is w else f"%{g.name} stands for %{pairs[g].name} and %{w.name}"
        if w in pairs.values():
            return f"%{w.name} is expected once, %{g.name} computes it again"
        og, ow = got_ops.get(g), want_ops.get(w)
        if og is None or ow is None:
            return f"%{g.name} is {'an input' if og is None else og.kind}, expected %{w.name} " \
                   f"({'an input' if ow is None else ow.kind})"
        problem = _match_op(og, ow)
        if problem is not None:
            return f"%{g.name} = {og.kind}, expected %{w.name} = {ow.kind}: {problem}"
        for rg, rw in zip(og.results, ow.results):
            pairs[rg] = rw
        for og_operand, ow_operand in zip(og.operands, ow.operands):
            problem = _match_operand(og_operand, ow_operand, match)
            if problem is not None:
                return problem
        return None

    for i, (g, w) in enumerate(zip(got.outputs, want.outputs)):
        problem = match(g, w)
        if problem is not None:
            return f"output {i}: {problem}"
    if len(got.ops) != len(want.ops):
        return f"{len(got.ops)} ops, expected {len(want.ops)} (ops no output reads)"
    return None


def _match_op(g: Op, w: Op) -> str | None:
    if g.kind != w.kind:
        return "another kind"
    if len(g.results) != len(w.results) or any(a.type != b.type for a, b in zip(g.results, w.results)):
        return f"result types {[str(r.type) for r in g.results]}, expected {[str(r.type) for r in w.results]}"
    if set(g.attrs) != set(w.attrs):
        return f"attributes {sorted(g.attrs)}, expected {sorted(w.attrs)}"
    differ = [k for k in sorted(g.attrs) if not _same_attr(g.attrs[k], w.attrs[k])]
    if differ:
        return ", ".join(f"{k}={g.attrs[k]!r}, expected {w.attrs[k]!r}" for k in differ)[:300]
    if len(g.operands) != len(w.operands):
        return "another number of operands"
    return None


def _match_operand(g: Operand, w: Operand, match) -> str | None:
    if g is None or w is None:
        return None if g is w else "an absent operand where one is expected (or the reverse)"
    if isinstance(g, tuple) != isinstance(w, tuple):
        return "a variadic operand where a single one is expected (or the reverse)"
    if isinstance(g, tuple):
        if len(g) != len(w):
            return f"{len(g)} variadic operands, expected {len(w)}"
        for a, b in zip(g, w):
            problem = match(a, b)
            if problem is not None:
                return problem
        return None
    return match(g, w)
