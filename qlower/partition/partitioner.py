"""Partitioning: which ops a backend takes, and why the rest stay on the host.

Supported ops are grouped greedily in topological order. An op joins a
producer's partition only when no path from that partition reaches the op
through an op outside it (which would make the partition depend on itself
through the host). Constants are copied into every partition that reads them.

After lowering, the host graph calls each partition through a ``delegate`` op
whose boundary types are the payload's (DESIGN.md rule 6); where they differ
from the host's types, explicit ``quantize``/``dequantize``/``rescale`` ops are
inserted on the host. Bytes are never reinterpreted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from qlower.contract import Backend, Payload, Verdict
from qlower.errors import CompileError
from qlower.ir import Graph, GraphBuilder, Op, TensorType, Value, copy_ops
from qlower.progress import progress_bar
from qlower.reference.aten_fallback import fallback_reason


@dataclass(frozen=True)
class Partition:
    name: str
    backend: str
    target: str
    subgraph: Graph
    payload: Payload
    # names of the source-graph values this partition computes, in order
    values: tuple[str, ...] = ()

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        return self.payload.input_types

    @property
    def output_types(self) -> tuple[TensorType, ...]:
        return self.payload.output_types


@dataclass(frozen=True)
class HostDecision:
    """An op left on the host and the backend's reason."""

    op: Op
    reason: str


@dataclass
class PartitionResult:
    host: Graph
    partitions: list[Partition]
    decisions: list[HostDecision] = field(default_factory=list)


def _assign(graph: Graph, verdicts: dict[Op, Verdict]) -> dict[Op, int]:
    """Partition index of every supported non-constant op (cycle-free greedy grouping).

    Sets of partitions are bit masks (bit ``p``: partition ``p``), so that each op costs a few
    integer operations over the partitions, not a walk of the partition graph per candidate:
    linear in the graph for a bounded number of partitions (it was cubic with many: 2,563 ops in
    372 partitions took 5 minutes)."""
    producer = graph.producers()
    part_of: dict[Op, int] = {}
    # ext[v]: partitions that v depends on through at least one op outside that partition
    ext: dict[Value, int] = defaultdict(int)
    # needs[p]: the partitions p reads from, directly or through the host; reach[p]: those p waits
    # for, transitively (needs is acyclic, so p is never in reach[p]). A partition runs as one call,
    # so an op joining p makes all of p wait for what that op reads: p must not join a partition
    # that already waits for p (the values' ext alone can't see that, it is per value)
    needs: list[int] = []
    reach: list[int] = []

    def producer_part(v: Value) -> int | None:
        p = producer.get(v)
        return part_of.get(p) if p is not None else None

    def wait_for(chosen: int, reads: int) -> None:
        """``chosen`` now also needs ``reads``: it, and every partition waiting for it, waits for
        them and for all they wait for."""
        added = reads & ~needs[chosen] & ~(1 << chosen)
        if not added:
            return
        needs[chosen] |= added
        gained = added
        rest = added
        while rest:
            low = rest & -rest
            gained |= reach[low.bit_length() - 1]
            rest ^= low
        reach[chosen] |= gained
        bit = 1 << chosen
        for q in range(len(reach)):
            if reach[q] & bit:
                reach[q] |= reach[chosen]

    for op in graph.ops:
        if op.kind == "constant":
            continue
        inputs = list(op.input_values())
        producers = [producer_part(v) for v in inputs]
        if verdicts[op].ok:
            outside = 0          # partitions the op reads through the host: it can't join them
            reads = 0
            for v, pp in zip(inputs, producers):
                outside |= ext[v]
                reads |= ext[v] | (0 if pp is None else 1 << pp)
            waited = 0           # partitions that a partition the op reads waits for
            rest = reads
            while rest:
                low = rest & -rest
                waited |= reach[low.bit_length() - 1]
                rest ^= low
            barred = outside | waited
            # a producer's partition first, then any other (newest first): an op whose inputs all
            # come from the host (q, k and v projections of one input) needn't open a partition
            chosen = next((c for c in producers if c is not None and not barred >> c & 1), None)
            if chosen is None:
                free = ~barred & ((1 << len(needs)) - 1)
                chosen = free.bit_length() - 1 if free else None
            if chosen is None:
                chosen = len(needs)
                needs.append(0)
                reach.append(0)
            part_of[op] = chosen
            wait_for(chosen, reads)
        mine = part_of.get(op)
        deps = 0
        for v, pp in zip(inputs, producers):
            deps |= ext[v]
            if pp is not None and pp != mine:
                deps |= 1 << pp
        for r in op.results:
            ext[r] = deps
    return part_of


def convert_type(b: GraphBuilder, v: Value, want: TensorType) -> Value:
    """An explicit host op taking ``v`` to ``want`` (same shape): never a reinterpretation."""
    have = v.type
    if have == want:
        return v
    if have.shape != want.shape:
        raise CompileError(f"partition boundary: %{v.name} is {have}, the backend expects {want}")
    if have.dtype.is_float and want.quant is not None:
        return b.op("quantize", v, out=want.quant, origin=v.origin, name=f"{v.name}_q")
    if have.quant is not None and want.dtype.is_float:
        return b.op("dequantize", v, None, origin=v.origin, name=f"{v.name}_dq")
    if have.quant is not None and want.quant is not None:
        return b.op("rescale", v, out=want.quant, origin=v.origin, name=f"{v.name}_rq")
    raise CompileError(f"partition boundary: no conversion from {have} to {want} for %{v.name}")


def _assign_output_constants(graph: Graph, backend: Backend, target: str, part_of: dict[Op, int]) -> None:
    """A constant that a host op turns straight into a graph output (a model folded to a
    constant, SCENARIOS.md S3) is emitted by the backend: the payload then holds the result."""
    users = graph.users()
    outputs = set(graph.outputs)
    n = max(part_of.values(), default=-1) + 1
    for op in graph.ops:
        if op.kind != "constant" or not backend.supports(op, target):
            continue
        readers = users.get(op.result, [])
        if readers and all(u not in part_of and any(r in outputs for r in u.results) for u in readers):
            part_of[op], n = n, n + 1


def partition(graph: Graph, backend: Backend, target: str, prefix: str = "p", trace: bool = False,
              progress: bool = False) -> PartitionResult:
    """Place every op (``progress``: a bar over the verdicts, then over the partitions' lowering,
    which is where Vela and the model converter spend their time)."""
    with progress_bar(progress, total=len(graph.ops), desc=f"{target}: placing ops", unit="step") as bar:
        return _partition(graph, backend, target, prefix, trace, bar)


def _partition(graph: Graph, backend: Backend, target: str, prefix: str, trace: bool, bar: tqdm) -> PartitionResult:
    backend.prepare(graph)
    verdicts = {}
    for op in graph.ops:
        if op.kind == "constant":
            verdicts[op] = Verdict.yes()
        elif op.kind == "aten":
            verdicts[op] = Verdict.no(fallback_reason(op.attrs["target"]))
        else:
            verdicts[op] = backend.supports(op, target)
        bar.update()
    part_of = _assign(graph, verdicts)
    _assign_output_constants(graph, backend, target, part_of)
    groups: dict[int, list[Op]] = defaultdict(list)
    for op in graph.ops:
        if op in part_of:
            groups[part_of[op]].append(op)
    bar.total += len(groups)

    users = graph.users()
    producers = graph.producers()
    outputs = set(graph.outputs)

    def used_outside(group: list[Op]) -> set[Value]:
        inside = set(group)
        return {r for op in group for r in op.results
                if r in outputs or any(u not in inside for u in users.get(r, []))}

    partitions: list[Partition] = []
    boundaries: dict[int, tuple[list[Value], list[Value]]] = {}
    for idx, (pid, ops) in enumerate(sorted(groups.items())):
        name = f"{prefix}{idx}"
        sub, bin_, bout = copy_ops(graph, ops, name, used_outside(ops), producers)
        bar.set_description(f"{target}: lowering {name}")
        try:
            payload = backend.lower(sub, target, trace=trace)
        except CompileError as e:
            raise CompileError(f"partition {name} ({len(ops)} ops) failed to lower for {target}: {e}") from e
        partitions.append(Partition(name, backend.name, target, sub, payload,
                                    tuple(r.name for op in ops for r in op.results)))
        boundaries[pid] = (bin_, bout)
        bar.update()
    bar.set_description(f"{target}: lowered")
    host = _host_graph(graph, part_of, groups, partitions, boundaries)
    decisions = [HostDecision(op, verdicts[op].reason) for op in graph.ops
                 if op.kind != "constant" and not verdicts[op].ok]
    return PartitionResult(host, partitions, decisions)


_FLOAT_BOUNDARY = frozenset({"constant", "quantize", "dequantize", "dynamic_quantize", "cast", "delegate"})


def float_fallbacks(graph: Graph) -> list[HostDecision]:
    """The ops of a program that runs wholly on the host that compute in float, with their reason:
    the float fallbacks, and IR ops whose operands the model leaves unquantized."""
    decisions = []
    for op in graph.ops:
        if op.kind == "aten":
            decisions.append(HostDecision(op, fallback_reason(op.attrs["target"])))
        elif op.kind not in _FLOAT_BOUNDARY and any(r.dtype.is_float for r in op.results):
            decisions.append(HostDecision(op, f"float {op.kind}: its operands are not quantized here (float or "
                                              "dynamic quantization, or a float fallback upstream)"))
    return decisions


def _host_graph(graph: Graph, part_of: dict[Op, int], groups: dict[int, list[Op]],
                partitions: list[Partition], boundaries) -> Graph:
    """Host ops and one delegate op per partition, in a topological order of the contracted graph."""
    producer = graph.producers()
    pid_to_part = dict(zip(sorted(groups), partitions))
    # units: host ops (including constants used by host ops) and partitions
    unit_of: dict[Op, object] = {op: ("p", part_of[op]) if op in part_of else ("h", op) for op in graph.ops}
    order: list[object] = []
    seen: set[object] = set()
    deps: dict[object, set[object]] = defaultdict(set)
    for op in graph.ops:
        u = unit_of[op]
        for v in op.input_values():
            p = producer.get(v)
            if p is not None and unit_of[p] != u and not (p.kind == "constant" and u[0] == "p"):
                deps[u].add(unit_of[p])
    # Kahn's algorithm keeping the original op order as the tie-break
    first_pos: dict[object, int] = {}
    for i, op in enumerate(graph.ops):
        first_pos.setdefault(unit_of[op], i)
    pending = sorted(first_pos, key=first_pos.get)
    while pending:
        for u in pending:
            if deps[u] <= seen:
                order.append(u)
                seen.add(u)
                pending.remove(u)
                break
        else:
            raise CompileError("partitioning produced a cycle between host and partitions")

    b = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {v: b.input(v.name, v.type, v.origin) for v in graph.inputs}
    host_constants_needed = {v for op in graph.ops if op not in part_of and op.kind != "constant"
                             for v in op.input_values()} | set(graph.outputs)
    for u in order:
        if u[0] == "h":
            op = u[1]
            if op.kind == "constant" and not any(r in host_constants_needed for r in op.results):
                continue
            operands = tuple(tuple(mapping[x] for x in o) if isinstance(o, tuple) else (None if o is None else mapping[o])
                             for o in op.operands)
            mapping.update(zip(op.results, b.emit(op, operands)))
            continue
        part = pid_to_part[u[1]]
        bin_, bout = boundaries[u[1]]
        args = tuple(convert_type(b, mapping[v], t) for v, t in zip(bin_, part.input_types))
        res = b.op("delegate", args, name=part.name, partition=part.name,
                   in_types=tuple(part.input_types), out_types=tuple(part.output_types))
        res = res if isinstance(res, tuple) else (res,)
        for v, r in zip(bout, res):
            mapping[v] = convert_type(b, r, v.type)
    return b.build(mapping[v] for v in graph.outputs)
