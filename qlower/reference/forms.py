"""How far one form of a program is from another, op by op, on given inputs.

``form_steps(before, after, inputs, bounds)`` checks a rewrite's declaration (``qlower.ir.rewrite``)
with the reference interpreter. The two graphs share a value when both have one of that name and
type. ``after`` runs once, in order, with every shared value it computes *replaced by
``before``'s codes* before anything reads it: so a shared value's number is the distance its own
ops (from the nearest shared values) put between the forms, never a difference carried from
earlier ops. Each shared value gets the largest difference in codes (a float value: 0 when
identical, else infinity) and its bound: the declared steps of the rewrites that name it, else
0. End to end the outputs may drift further; ``output_steps`` measures that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qlower.errors import ExecutionError
from qlower.ir import Graph, Value
from qlower.reference.interpreter import check_inputs, run_graph, run_op


@dataclass(frozen=True)
class ValueSteps:
    """One shared value: the most its codes differ between the forms with its inputs forced to
    ``before``'s codes, the bound it is allowed, and the rewrites that declared it."""

    name: str
    steps: float
    bound: int
    rewrites: tuple[str, ...] = ()

    @property
    def within(self) -> bool:
        return self.steps <= self.bound


def _steps(a: np.ndarray, b: np.ndarray, v: Value) -> float:
    if a.shape != b.shape:
        return float("inf")
    if v.quant is not None and a.dtype.kind in "iu":
        return float(np.abs(a.astype(np.int64) - b.astype(np.int64)).max(initial=0))
    return 0.0 if np.array_equal(a, b, equal_nan=a.dtype.kind == "f") else float("inf")


def shared_values(before: Graph, after: Graph) -> dict[Value, Value]:
    """``after``'s value -> ``before``'s, for the values both graphs have (same name and type)."""
    named = {v.name: v for v in before.values()}
    return {v: named[v.name] for v in after.values() if v.name in named and named[v.name].type == v.type}


def form_steps(before: Graph, after: Graph, inputs: Sequence[np.ndarray],
               bounds: Mapping[str, tuple[int, tuple[str, ...]]] | None = None,
               before_values: Mapping[Value, np.ndarray] | None = None) -> list[ValueSteps]:
    """Every value ``after`` shares with ``before`` (graph inputs aside), in ``after``'s order,
    with its op-by-op distance (module docstring). ``bounds``: value name -> (steps allowed,
    rewrites responsible). ``before_values``: ``before``'s values on these inputs, when already run.
    A value ``after`` can't compute from ``before``'s codes (e.g. an accumulator overflows on
    them) counts as infinitely far."""
    bounds = bounds or {}
    if before_values is None:
        before_values = run_graph(before, inputs, keep_all=True)[1]
    shared = shared_values(before, after)
    env: dict[Value, np.ndarray] = dict(zip(after.inputs, check_inputs(after, inputs)))
    rows = []
    failed: set[Value] = set()
    for op in after.ops:
        if failed & set(op.input_values()):
            failed.update(op.results)
        else:
            try:
                run_op(op, env)
            except ExecutionError:
                failed.update(op.results)
        if op.kind == "constant":   # a constant is part of its readers: its own data, never forced
            continue
        for r in op.results:
            if r not in shared:
                continue
            want = before_values[shared[r]]
            steps = float("inf") if r in failed else _steps(env[r], want, r)
            allowed, names = bounds.get(r.name, (0, ()))
            rows.append(ValueSteps(r.name, steps, allowed, names))
            env[r] = want   # what reads it reads the canonical codes
            failed.discard(r)
    return rows


def output_steps(before: Graph, after: Graph, before_outputs: Sequence[np.ndarray],
                 after_outputs: Sequence[np.ndarray]) -> list[float]:
    """Per output, end to end: the largest difference in codes (quantized outputs), in steps of
    the dequantized codes (float outputs of a static ``dequantize``), else 0 / infinity."""
    out = []
    for v_b, v_a, a, b in zip(before.outputs, after.outputs, after_outputs, before_outputs):
        if a.shape != b.shape or v_a.type != v_b.type:
            out.append(float("inf"))
            continue
        step = _dequantized_step(after, v_a)
        if v_a.quant is not None and a.dtype.kind in "iu":
            out.append(float(np.abs(a.astype(np.int64) - b.astype(np.int64)).max(initial=0)))
        elif step is not None:
            out.append(round(float(np.abs(a.astype(np.float64) - b).max(initial=0.0)) / step, 2))
        else:
            out.append(0.0 if np.array_equal(a, b, equal_nan=a.dtype.kind == "f") else float("inf"))
    return out


def _dequantized_step(graph: Graph, v: Value) -> float | None:
    op = graph.producers().get(v)
    if op is not None and op.kind == "dequantize" and op.operands[1] is None:
        q = op.operands[0].quant
        return q.scale[0] if q is not None and len(q.scale) == 1 else None
    return None


def declared_bounds(rewrites) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Value name -> (steps allowed, rewrites responsible) from a program's applied rewrites
    (``qlower.ir.rewrite.AppliedRewrite``): a value several rewrites name gets the sum of their steps.
    A later rewrite of a value only an earlier one made (not in the canonical program) is not
    counted here: the shared value downstream of both gets the earlier one's bound only (no backend
    chains its rewrites so today: each rewrites other ops)."""
    out: dict[str, tuple[int, tuple[str, ...]]] = {}
    for r in rewrites:
        for name in r.values:
            steps, names = out.get(name, (0, ()))
            out[name] = (steps + r.steps, (*names, r.name))
    return out


def upstream_rewrites(graph: Graph, bounds: Mapping[str, tuple[int, tuple[str, ...]]]) -> dict[Value, tuple[str, ...]]:
    """For every value of ``graph`` (a rewritten form), the rewrites of it or of a value it depends
    on: those that can explain its distance from the canonical program end to end."""
    out: dict[Value, tuple[str, ...]] = {}
    for op in graph.ops:
        names: dict[str, None] = {}
        for v in op.input_values():
            names.update(dict.fromkeys(out.get(v, ())))
        for r in op.results:
            out[r] = tuple({**names, **dict.fromkeys(bounds.get(r.name, (0, ()))[1])})
    return out
