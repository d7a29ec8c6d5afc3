"""The verifier: DESIGN.md's rules that can be checked on a graph, as a table.

Each rule is one function that yields messages; ``verify_graph`` runs them all and
raises one VerificationError listing every broken rule. Type-derivation rules
(accumulator scales, shapes, broadcasting, optional operands, concat domains)
are checked by re-inferring every op's result types from the registry, so the
rule and the builder can never drift apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from qlower.errors import IRError, VerificationError
from qlower.ir.dtypes import DType
from qlower.ir.graph import Graph, TensorType, Value
from qlower.ir.opdefs import OPS, infer_types, normalize_attrs
from qlower.registry import Registry

Rule = Callable[[Graph], Iterator[str]]
RULES: Registry[str, Rule] = Registry("IR verifier rules")


def rule(name: str):
    return RULES.register(name)


def _where(v: Value) -> str:
    return f"%{v.name}" + (f" ({v.origin.describe()})" if v.origin else "")


@rule("ssa")
def _ssa(graph: Graph) -> Iterator[str]:
    """Every value is defined once, before it is used; outputs are defined."""
    defined: set[Value] = set()
    for v in graph.inputs:
        if v in defined:
            yield f"{_where(v)} is a graph input twice"
        defined.add(v)
    for op in graph.ops:
        for v in op.input_values():
            if v not in defined:
                yield f"{op.kind} producing {_where(op.results[0])} uses {_where(v)}, which is not defined before it"
        for r in op.results:
            if r in defined:
                yield f"{_where(r)} is defined twice"
            defined.add(r)
    for v in graph.outputs:
        if v not in defined:
            yield f"graph output {_where(v)} is not defined"


def _is_complete(t: object) -> bool:
    return (isinstance(t, TensorType) and isinstance(t.dtype, DType)
            and all(isinstance(d, int) and d >= 0 for d in t.shape))


@rule("complete-types")
def _complete_types(graph: Graph) -> Iterator[str]:
    """Every value has a shape of non-negative ints and a DType."""
    for v in graph.values():
        t = v.type
        if not isinstance(t, TensorType) or not isinstance(t.dtype, DType):
            yield f"{_where(v)} has no complete type: {t!r}"
        elif any(not isinstance(d, int) or d < 0 for d in t.shape):
            yield f"{_where(v)} has an invalid shape {t.shape}"


def _typed_values(graph: Graph) -> Iterator[Value]:
    """Values with complete types (the others are complete-types' to report)."""
    return (v for v in graph.values() if _is_complete(v.type))


@rule("integers-are-quantized")
def _integers_quantized(graph: Graph) -> Iterator[str]:
    """Integer values hold codes and carry a QuantSpec of their dtype; floats carry none."""
    for v in _typed_values(graph):
        t = v.type
        if t.dtype.is_integer and t.quant is None:
            yield f"{_where(v)} is {t.dtype.value} but carries no QuantSpec"
        elif t.quant is not None and (t.dtype.is_float or t.dtype is DType.BOOL):
            yield f"{_where(v)} is {t.dtype.value} but carries a QuantSpec {t.quant}"
        elif t.quant is not None and t.quant.dtype is not t.dtype:
            yield f"{_where(v)} is {t.dtype.value} but its QuantSpec says {t.quant.dtype.value}"


@rule("quant-spec-valid")
def _quant_valid(graph: Graph) -> Iterator[str]:
    """Scales positive and finite; ranges within the dtype; per-channel specs match their axis."""
    for v in _typed_values(graph):
        q = v.type.quant
        if q is None:
            continue
        lo, hi = q.dtype.min, q.dtype.max
        if q.scale and not (all(map(math.isfinite, q.scale)) and min(q.scale) > 0):
            yield f"{_where(v)} has a non-positive or non-finite scale {q.scale}"
        if not lo <= q.qmin <= q.qmax <= hi:
            yield f"{_where(v)} has range [{q.qmin}, {q.qmax}] outside {q.dtype.value}"
        if q.zero_point and not lo <= min(q.zero_point) <= max(q.zero_point) <= hi:
            yield f"{_where(v)} has a zero point outside {q.dtype.value}: {q.zero_point}"
        if len(q.zero_point) != len(q.scale):
            yield f"{_where(v)} has {len(q.scale)} scales but {len(q.zero_point)} zero points"
        if q.axis is None:
            if len(q.scale) != 1:
                yield f"{_where(v)} has {len(q.scale)} scales but no channel axis"
        elif not 0 <= q.axis < v.type.rank:
            yield f"{_where(v)} has channel axis {q.axis} outside rank {v.type.rank}"
        elif len(q.scale) != v.type.shape[q.axis]:
            yield f"{_where(v)} has {len(q.scale)} scales for {v.type.shape[q.axis]} channels on axis {q.axis}"


@rule("types-match-registry")
def _types_match(graph: Graph) -> Iterator[str]:
    """Each op's attributes are known and its result types are exactly what the registry infers
    (accumulator scale s_in * s_w, shapes, broadcasting, optional operands, shared domains)."""
    for op in graph.ops:
        if op.kind not in OPS:
            yield f"unknown op kind '{op.kind}' producing {_where(op.results[0])}"
            continue
        if not all(_is_complete(v.type) for v in (*op.input_values(), *op.results)):
            continue
        try:
            missing = sorted(set(normalize_attrs(op.kind, dict(op.attrs))) - set(op.attrs))
            if missing:
                yield (f"{op.kind} producing {_where(op.results[0])} lacks attribute(s) {missing}: "
                       "build ops with GraphBuilder, which fills in defaults")
                continue
            operand_types = [tuple(v.type for v in o) if isinstance(o, tuple) else (None if o is None else o.type)
                             for o in op.operands]
            expected = infer_types(op.kind, operand_types, dict(op.attrs))
        except IRError as e:
            yield f"{op.kind} producing {_where(op.results[0])}: {e}"
            continue
        if len(expected) != len(op.results):
            yield f"{op.kind} has {len(op.results)} results, the registry says {len(expected)}"
            continue
        for r, t in zip(op.results, expected):
            if r.type != t:
                yield f"{op.kind} result {_where(r)} has type {r.type}, the registry infers {t}"


def verify_graph(graph: Graph, after: str | None = None) -> Graph:
    """Raise VerificationError naming every broken rule; return the graph when it is valid."""
    problems = [f"[{name}] {msg}" for name, fn in RULES.items() for msg in fn(graph)]
    if problems:
        head = f"graph '{graph.name}' is invalid" + (f" after {after}" if after else "")
        raise VerificationError(head + ":\n  " + "\n  ".join(problems[:20])
                                + (f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else ""))
    return graph
