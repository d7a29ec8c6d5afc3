"""Activation fusion, only where it is exact.

An activation clamp (a quantized relu / relu6 is ``clamp(min=zp, ...)``) can go
only when it can't change a single code:

* a ``clamp`` whose ``[min, max]`` contains every code its input can hold is
  removed. The codes an input can hold are those its producer guarantees: the
  ``[qmin, qmax]`` of a rescale's or quantize's output type, a table's entries, a
  constant's data, a previous clamp's bounds, carried through data movement.
  Values whose producer guarantees nothing narrower (graph inputs, casts,
  integer arithmetic, pooling averages) get their dtype's whole range.
  Example: a relu ``clamp(min=-127)`` after a rescale to ``qmin=-127``.
* ``clamp(clamp(x, a, b), c, d)`` becomes one clamp of ``x`` with the
  intersected bounds (or, if the ranges are disjoint, the single bound the
  codes all land on).

Otherwise the clamp stays, explicit (SCENARIOS.md S1: relu's output zero point
is -111, qmin is -127). This pass never changes a value's QuantSpec to absorb a
clamp: every consumer, e.g. a concat that shares its domain across operands,
keeps seeing the same type.
"""

from __future__ import annotations

from qlower.ir import Graph, GraphBuilder, Op, Value, rebuild
from qlower.ir.graph import Operand
from qlower.passes.manager import PassResult

CodeRange = tuple[int, int]
# Ops whose integer result codes are a subset (or a rearrangement) of their integer operands' codes.
_CODE_PRESERVING = frozenset({"transpose", "reshape", "slice", "concat", "max_pool2d", "reduce_max", "pad"})


def _codes_of(kind: str, attrs: dict, results: tuple[Value, ...],
              operand_ranges: list[CodeRange | None]) -> list[CodeRange | None]:
    """Guaranteed code range of each result of an op (None for non-integer results)."""
    out: list[CodeRange | None] = []
    for r in results:
        t = r.type
        if not t.dtype.is_integer:
            out.append(None)
            continue
        full = (t.dtype.min, t.dtype.max)
        rng = full
        if kind == "constant":
            data = attrs["data"]
            rng = (int(data.min()), int(data.max())) if data.size else full
        elif kind in ("rescale", "quantize", "dynamic_quantize") and t.quant is not None:
            rng = (t.quant.qmin, t.quant.qmax)
        elif kind == "table":
            table = attrs["table"]
            rng = (int(table.min()), int(table.max()))
        elif kind == "clamp" and operand_ranges[0] is not None:
            lo, hi, mn, mx = *operand_ranges[0], attrs["min"], attrs["max"]
            rng = (min(max(lo, mn), mx), min(max(hi, mn), mx))
        elif kind in _CODE_PRESERVING and operand_ranges and all(operand_ranges):
            rng = (min(lo for lo, _ in operand_ranges), max(hi for _, hi in operand_ranges))
            if kind == "pad":
                rng = (min(rng[0], attrs["value"]), max(rng[1], attrs["value"]))
        out.append((max(int(rng[0]), full[0]), min(int(rng[1]), full[1])))
    return out


def _flatten(operands: tuple[Operand, ...]) -> list[Value]:
    return [v for o in operands for v in (o if isinstance(o, tuple) else (o,)) if v is not None]


def merge_clamps(inner: tuple[float, float], outer: tuple[float, float]) -> tuple[float, float]:
    """Bounds of one clamp equal to ``clamp(clamp(x, *inner), *outer)``."""
    (a, b), (c, d) = inner, outer
    lo, hi = max(a, c), min(b, d)
    if lo <= hi:
        return lo, hi
    v = c if b < c else d  # disjoint: every code lands on the outer bound nearest the inner range
    return v, v


def fuse_activations(graph: Graph) -> PassResult:
    """Remove clamps that can't change a code and merge consecutive clamps (see the module doc)."""
    ranges: dict[Value, CodeRange | None] = {}
    clamps: dict[Value, tuple[Value, float, float]] = {}   # new clamp result -> (its input, min, max)
    rewrites = 0

    def range_of(v: Value) -> CodeRange | None:
        if v in ranges:
            return ranges[v]
        return (v.dtype.min, v.dtype.max) if v.dtype.is_integer else None  # a graph input

    def rewrite(b: GraphBuilder, op: Op, operands: tuple[Operand, ...]) -> tuple[Value, ...]:
        nonlocal rewrites
        attrs = dict(op.attrs)
        if op.kind == "clamp":
            x = operands[0]
            if x in clamps:
                x, a, c = clamps[x]
                attrs["min"], attrs["max"] = merge_clamps((a, c), (attrs["min"], attrs["max"]))
                rewrites += 1
            rng = range_of(x)
            if rng is not None and attrs["min"] <= rng[0] and rng[1] <= attrs["max"]:
                rewrites += 1
                return (x,)
            operands = (x,)
        new = b.emit(op, operands, **attrs)
        if op.kind == "clamp":
            clamps[new[0]] = (operands[0], attrs["min"], attrs["max"])
        ranges.update(zip(new, _codes_of(op.kind, attrs, new, [range_of(v) for v in _flatten(operands)])))
        return new

    result = rebuild(graph, rewrite)
    return PassResult(result, True) if rewrites else PassResult(graph, False)
