"""Building graphs. Result types are always inferred from the op registry, so a
value's type can't disagree with the op that defines it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from qlower.errors import IRError
from qlower.ir.graph import Graph, Op, Operand, Origin, TensorType, Value
from qlower.ir.opdefs import infer_types, normalize_attrs, op_def
from qlower.ir.quant import QuantSpec


def _operand_type(operand: Operand):
    if isinstance(operand, tuple):
        return tuple(v.type for v in operand)
    return None if operand is None else operand.type


class GraphBuilder:
    def __init__(self, name: str = "main") -> None:
        self.name = name
        self._inputs: list[Value] = []
        self._ops: list[Op] = []
        self._names: dict[str, int] = {}
        self._used: set[str] = set()

    def fresh_name(self, hint: str = "v") -> str:
        hint = hint or "v"
        n = self._names.get(hint, 0)
        name = hint if n == 0 else f"{hint}_{n}"
        while name in self._used:  # e.g. hint "a_1" after "a" was issued twice
            n += 1
            name = f"{hint}_{n}"
        self._names[hint] = n + 1
        self._used.add(name)
        return name

    def input(self, name: str, type: TensorType, origin: Origin | None = None) -> Value:
        v = Value(self.fresh_name(name), type, origin)
        self._inputs.append(v)
        return v

    def op(self, kind: str, *operands: Operand, name: str | None = None,
           origin: Origin | None = None, **attrs: Any) -> Value | tuple[Value, ...]:
        """Append an op; returns its result (or the tuple of results when it has several)."""
        attrs = normalize_attrs(kind, attrs)
        try:
            types = infer_types(kind, [_operand_type(o) for o in operands], attrs)
        except IRError as e:
            where = f" at {origin.describe()}" if origin else ""
            raise IRError(f"{e}{where}") from None
        hint = name or kind
        results = tuple(Value(self.fresh_name(hint), t, origin) for t in types)
        self._ops.append(Op(kind, tuple(operands), attrs, results))
        return results[0] if op_def(kind).results == 1 else results

    def constant(self, data: np.ndarray, quant: QuantSpec | None = None, name: str = "const",
                 origin: Origin | None = None) -> Value:
        data = np.array(data, copy=True)
        data.setflags(write=False)
        return self.op("constant", name=name, origin=origin, data=data, quant=quant)

    def emit(self, op: Op, operands: tuple[Operand, ...], **attr_overrides: Any) -> tuple[Value, ...]:
        """Re-emit ``op`` with new operands (types re-inferred); used by passes."""
        attrs = {**op.attrs, **attr_overrides}
        res = self.op(op.kind, *operands, name=op.results[0].name if op.results else None,
                      origin=op.origin, **attrs)
        return res if isinstance(res, tuple) else (res,)

    def build(self, outputs: Iterable[Value]) -> Graph:
        return Graph(tuple(self._inputs), tuple(self._ops), tuple(outputs), self.name)


def rebuild(graph: Graph, rewrite: Callable[[GraphBuilder, Op, tuple[Operand, ...]], tuple[Value, ...] | None],
            finish: Callable[[GraphBuilder, Value, Value], Value] | None = None) -> Graph:
    """Copy ``graph`` through a new builder, letting ``rewrite`` replace ops.

    ``rewrite(builder, op, mapped_operands)`` returns replacement values for
    ``op.results`` (emitting whatever ops it needs), or None to copy ``op`` as is.
    ``finish(builder, old_output, new_output)``, when given, returns the value that
    becomes that graph output (emitting ops after all others).
    Values are never mutated: every op is re-emitted and re-typed.
    """
    b = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {}
    for v in graph.inputs:
        nv = Value(b.fresh_name(v.name), v.type, v.origin)
        b._inputs.append(nv)
        mapping[v] = nv

    def m(operand: Operand) -> Operand:
        if isinstance(operand, tuple):
            return tuple(mapping[v] for v in operand)
        return None if operand is None else mapping[operand]

    for op in graph.ops:
        operands = tuple(m(o) for o in op.operands)
        new = rewrite(b, op, operands)
        if new is None:
            new = b.emit(op, operands)
        if len(new) != len(op.results):
            raise IRError(f"rewrite of {op.kind} returned {len(new)} values for {len(op.results)} results")
        mapping.update(zip(op.results, new))
    if finish is None:
        return b.build(mapping[v] for v in graph.outputs)
    return b.build([finish(b, v, mapping[v]) for v in graph.outputs])


def copy_ops(graph: Graph, ops: list[Op], name: str, used_outside: set[Value],
             producer: dict[Value, Op] | None = None) -> tuple[Graph, list[Value], list[Value]]:
    """Copy ``ops`` (plus the constants they read) into a graph of their own: what they read from
    other ops becomes its inputs, their results in ``used_outside`` its outputs. Returns the graph and
    the original values behind its inputs and outputs. ``producer``: ``graph.producers()``, passed in
    by a caller that copies many groups of one graph (computing it per group is quadratic)."""
    producer = graph.producers() if producer is None else producer
    inside = set(ops)
    b = GraphBuilder(name)
    mapping: dict[Value, Value] = {}
    boundary_in: list[Value] = []
    for op in ops:
        for v in op.input_values():
            if v in mapping:
                continue
            p = producer.get(v)
            if p is not None and p.kind == "constant":
                mapping[v] = b.emit(p, ())[0]
            elif p not in inside:
                mapping[v] = b.input(v.name, v.type, v.origin)
                boundary_in.append(v)
        operands = tuple(tuple(mapping[x] for x in o) if isinstance(o, tuple) else (None if o is None else mapping[o])
                         for o in op.operands)
        mapping.update(zip(op.results, b.emit(op, operands)))
    boundary_out = [r for op in ops for r in op.results if r in used_outside]
    return b.build(mapping[v] for v in boundary_out), boundary_in, boundary_out
