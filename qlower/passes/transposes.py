"""Transpose cancellation and sinking.

The importer keeps one layout (NHWC) and inserts explicit transposes only where
an op's meaning depends on the order (DESIGN.md rule 4). This pass removes the
ones that cancel:

* an identity transpose is removed;
* ``transpose(transpose(x, p), q)`` becomes one transpose of ``x`` with the
  composed permutation, or ``x`` itself when that is the identity;
* a transpose is sunk through a chain of ops that don't care about element
  order until it meets the next transpose, where the two compose. Order-blind
  ops: rescale, clamp, table, quantize, dequantize (static), cast, the float
  unary ops, and add/sub/mul/intdiv whose other operand is a constant (that
  constant is permuted at compile time);
* ``reshape(transpose(x, p))`` reads ``x`` directly when ``p`` only moves
  size-1 dims (the row-major element order is then unchanged);
* ``reshape(reshape(x))`` reads ``x`` directly, and a reshape to its input's
  own shape is removed (Vela, for one, compiles a lone reshape to nothing and
  then reports no output for it).

Guarantees: no rewrite adds a transpose, and every one removes a use of one; a
transpose is only moved when it then meets and composes with another (a lone
transpose stays where the importer put it, e.g. at the model's boundary); ops
are only re-laid-out when their results have no other user, so nothing is
duplicated. Per-channel quantization follows the data: the builder re-infers the
channel axis of every moved value, and a per-channel ``out`` attribute
(quantize, cast, table) has its axis remapped. Results are bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qlower.errors import IRError
from qlower.ir import Graph, GraphBuilder, Op, Value, rebuild
from qlower.ir.graph import Operand
from qlower.ir.opdefs import infer_types
from qlower.passes.manager import PassResult

ORDER_BLIND_UNARY = frozenset({"rescale", "clamp", "table", "table_interp", "quantize", "cast",
                               "sigmoid", "tanh", "exp", "erf", "reciprocal"})
ORDER_BLIND_BINARY = frozenset({"add", "sub", "mul", "intdiv"})


def compose(p: tuple[int, ...], q: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation of ``transpose(transpose(x, p), q)``."""
    return tuple(p[j] for j in q)


def inverse(p: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(p)
    for i, j in enumerate(p):
        inv[j] = i
    return tuple(inv)


def is_identity(p: tuple[int, ...]) -> bool:
    return tuple(p) == tuple(range(len(p)))


def moves_only_unit_dims(shape: tuple[int, ...], p: tuple[int, ...]) -> bool:
    """True when ``transpose(x, p)`` keeps x's row-major element order (it is a reshape)."""
    kept = [j for j in p if shape[j] != 1]
    return kept == sorted(kept)


@dataclass(frozen=True)
class _Chain:
    """``first`` (transpose) -> ``links`` (order-blind ops, in order) -> ``last`` (transpose)."""

    first: Op
    links: tuple[Op, ...]
    last: Op

    @property
    def perm(self) -> tuple[int, ...]:
        return tuple(self.first.attrs["perm"])


class _Analysis:
    def __init__(self, graph: Graph) -> None:
        self.producers = graph.producers()
        self.users = graph.users()
        self.outputs = set(graph.outputs)

    def single_use(self, v: Value) -> bool:
        return v not in self.outputs and len(self.users.get(v, [])) == 1

    def is_constant(self, v: Value | None) -> bool:
        return v is not None and v in self.producers and self.producers[v].kind == "constant"

    def chain_operand(self, op: Op) -> int | None:
        """Index of the operand through which a transpose can sink past ``op``, if any."""
        if op.kind in ORDER_BLIND_UNARY or (op.kind == "dequantize" and op.operands[1] is None):
            return 0
        if op.kind in ORDER_BLIND_BINARY:
            a, b = op.operands
            if a is not b and self.is_constant(b):
                return 0
            if a is not b and self.is_constant(a):
                return 1
        return None

    def chain_ending_at(self, last: Op) -> _Chain | None:
        v = last.operands[0]
        links: list[Op] = []
        while True:
            prod = self.producers.get(v)
            if prod is None:
                return None
            if prod.kind == "transpose":
                if links and not self.single_use(v):
                    return None
                return _Chain(prod, tuple(reversed(links)), last)
            index = self.chain_operand(prod)
            if index is None or not self.single_use(v):
                return None
            links.append(prod)
            v = prod.operands[index]

    def plan(self, graph: Graph) -> tuple[list[_Chain], dict[Op, Op]]:
        """Non-overlapping chains, and reshapes that can bypass their transpose."""
        claimed: set[Op] = set()
        chains: list[_Chain] = []
        for op in graph.ops:
            if op.kind != "transpose" or op in claimed:
                continue
            chain = self.chain_ending_at(op)
            if chain is None or chain.first in claimed:
                continue
            chains.append(chain)
            claimed.update((chain.first, chain.last, *chain.links))
        bypass: dict[Op, Op] = {}
        for op in graph.ops:
            t = self.producers.get(op.operands[0]) if op.kind == "reshape" else None
            if t is not None and t.kind == "transpose" and t not in claimed and not is_identity(t.attrs["perm"]) \
                    and moves_only_unit_dims(t.operands[0].shape, tuple(t.attrs["perm"])):
                bypass[op] = t
        return chains, bypass


def _permuted_constant(b: GraphBuilder, const: Op, perm: tuple[int, ...]) -> Value:
    data = np.ascontiguousarray(np.transpose(const.attrs["data"], perm))
    data.setflags(write=False)
    (t,) = infer_types("transpose", [const.result.type], {"perm": perm})
    return b.op("constant", name=const.result.name + "_t", origin=const.origin, data=data, quant=t.quant)


def _remap_out_axis(op: Op, perm: tuple[int, ...]) -> dict:
    out = op.attrs.get("out")
    if out is not None and out.is_per_channel:
        return {"out": out.with_axis(perm[out.axis])}
    return {}


def _sweep(graph: Graph) -> tuple[Graph, bool]:
    a = _Analysis(graph)
    chains, bypass = a.plan(graph)
    identities = [op for op in graph.ops if op.kind == "transpose" and is_identity(op.attrs["perm"])]
    reshapes = {op for op in graph.ops if op.kind == "reshape" and (
        op.operands[0].shape == op.result.shape
        or (op.operands[0] in a.producers and a.producers[op.operands[0]].kind == "reshape"))}
    if not chains and not bypass and not identities and not reshapes:
        return graph, False
    chain_of_first = {c.first: c for c in chains if c.links}
    chain_of_last = {c.last: c for c in chains}
    link_index = {op: a.chain_operand(op) for c in chains for op in c.links}
    perm_of_link = {op: c.perm for c in chains for op in c.links}
    source: dict[Op, Value] = {}  # transpose -> its operand in the new graph
    reshaped: dict[Op, Value] = {}  # reshape -> the value (new graph) with its elements in the same order

    def rewrite(b: GraphBuilder, op: Op, operands: tuple[Operand, ...]) -> tuple[Value, ...] | None:
        if op.kind == "transpose":
            source[op] = operands[0]
            chain = chain_of_last.get(op)
            if chain is not None:
                x = operands[0] if chain.links else source[chain.first]
                perm = compose(chain.perm, tuple(op.attrs["perm"]))
                new = x if is_identity(perm) else b.op("transpose", x, name=op.result.name,
                                                       origin=op.origin, perm=perm)
                if new.type != op.result.type:
                    raise IRError(f"cancel_transposes: rewriting %{op.result.name} gave {new.type}, "
                                  f"expected {op.result.type}")
                return (new,)
            if op in chain_of_first or is_identity(op.attrs["perm"]):
                return (operands[0],)
            return None
        if op in link_index:
            perm, index = perm_of_link[op], link_index[op]
            new_operands = list(operands)
            if op.kind in ORDER_BLIND_BINARY:
                const = a.producers[op.operands[1 - index]]
                new_operands[1 - index] = _permuted_constant(b, const, inverse(perm))
            return b.emit(op, tuple(new_operands), **_remap_out_axis(op, perm))
        if op in bypass:
            reshaped[op] = source[bypass[op]]
            return b.emit(op, (reshaped[op],))
        if op.kind == "reshape":
            inner = a.producers.get(op.operands[0])
            reshaped[op] = reshaped[inner] if inner is not None and inner.kind == "reshape" else operands[0]
            if op in reshapes:  # (reshape takes only per-tensor quantization: the type carries over)
                x = reshaped[op]
                return (x,) if x.shape == op.result.shape else b.emit(op, (x,))
        return None

    return rebuild(graph, rewrite), True


def cancel_transposes(graph: Graph) -> PassResult:
    """Repeat sweeps until nothing cancels (a sweep handles every non-overlapping chain at once)."""
    changed = False
    for _ in range(len(graph.ops) + 1):
        graph, swept = _sweep(graph)
        if not swept:
            break
        changed = True
    return PassResult(graph, changed)
