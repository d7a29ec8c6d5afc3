"""A program as a Model Explorer graph: its ops, where each runs, and why.

The graph is the program's ``source`` (the target's form of the optimised IR, before
partitioning), so every op a user wrote shows once, in the order it runs. Each NPU/CPU partition
is a group named for its backend and target (``p0 on ethos-u (ethos-u55-128)``), with the model's
module hierarchy inside it; host ops stand outside every group, with the backend's reason for
keeping them. Constants are not nodes: they are listed on the op that reads them.

Node ids are the IR value names of each op's first result, which is also what the verification
report and Vela's per-layer rows name (``qlower/view/overlays.py`` keys its data by them).
"""

from __future__ import annotations

from dataclasses import dataclass

from model_explorer import graph_builder as gb

from qlower.ir import Op, Value
from qlower.program import Program

HOST = "host"
# group colours per backend (partition groups), and the styles that mark host ops
_BACKEND_COLORS = {"ethos-u": "#e3f2fd", "tosa": "#e8f5e9", "vgf": "#f3e5f5", "litert": "#fff8e1",
                   "tflm": "#fff3e0", "cpu": "#eceff1"}
FLOAT_FALLBACK_STYLE = gb.GraphNodeStyle(backgroundColor="#ffcdd2", borderColor="#c62828",
                                         hoveredBorderColor="#b71c1c")
HOST_STYLE = gb.GraphNodeStyle(backgroundColor="#fff3e0", borderColor="#ef6c00", hoveredBorderColor="#e65100")
_MAX_ATTR_CHARS = 200


@dataclass(frozen=True)
class Placement:
    """Where one op of the source graph runs: a partition's group name, or the host with the reason."""

    group: str           # the partition's group name; HOST for host ops
    reason: str = ""     # the backend's reason for a host op
    float_fallback: bool = False


def partition_group(partition) -> str:
    """The group name of a partition: its name, backend and target (no '/': Model Explorer's separator)."""
    return f"{partition.name} on {partition.backend} ({partition.target})".replace("/", "∕")


def placements(program: Program) -> dict[str, Placement]:
    """Every non-constant source op's placement, keyed by its first result's name."""
    where = {name: partition_group(p) for p in program.partitions for name in p.values}
    reasons = {d.op.results[0].name: d.reason for d in program.decisions}
    out = {}
    for op in program.source.ops:
        if op.kind == "constant":
            continue
        name = op.results[0].name
        if name in where:
            out[name] = Placement(where[name])
        else:
            out[name] = Placement(HOST, reasons.get(name, ""), float_fallback=op.kind == "aten")
    return out


def program_graph(program: Program, graph_id: str = "qlower") -> gb.Graph:
    """The Model Explorer graph of ``program`` (see the module docstring)."""
    source = program.source
    placed = placements(program)
    producer: dict[Value, tuple[Op, int]] = {}
    for op in source.ops:
        for i, r in enumerate(op.results):
            producer[r] = (op, i)
    nodes: list[gb.GraphNode] = []
    for i, v in enumerate(source.inputs):
        nodes.append(gb.GraphNode(id=v.name, label="input", namespace="",
                                  attrs=[gb.KeyValue("input", str(i)), *_origin_attrs(v)],
                                  outputsMetadata=[_metadata("0", v)]))
    for op in source.ops:
        if op.kind == "constant":
            continue
        nodes.append(_op_node(op, producer, placed[op.results[0].name]))
    for i, v in enumerate(source.outputs):
        nodes.append(gb.GraphNode(id=f"output_{i}", label="output", namespace="",
                                  attrs=[gb.KeyValue("output", str(i))],
                                  incomingEdges=[_edge(v, producer, 0)] if v in producer or v in source.inputs
                                  else [], inputsMetadata=[_metadata("0", v)]))
    groups = sorted({p.group for p in placed.values() if p.group != HOST})
    backends = {partition_group(p): p.backend for p in program.partitions}
    configs = [gb.GroupNodeConfig(namespaceRegex=f"^{_regex_literal(g)}$",
                                  backgroundColor=_BACKEND_COLORS.get(backends.get(g, ""), "#f5f5f5"),
                                  borderColor="#1565c0")
               for g in groups]
    attributes = {g: {"partition": g.split(" ", 1)[0], "backend": backends.get(g, ""), "target": program.target}
                  for g in groups}
    return gb.Graph(id=graph_id, nodes=nodes, groupNodeAttributes=attributes or None,
                    groupNodeConfigs=configs or None)


def _op_node(op: Op, producer, placement: Placement) -> gb.GraphNode:
    result = op.results[0]
    module = result.origin.module if result.origin else ""
    namespace = "" if placement.group == HOST else "/".join([placement.group, *[m for m in module.split(".") if m]])
    attrs = [gb.KeyValue("op", op.kind), gb.KeyValue("runs on", placement.group), *_origin_attrs(result)]
    if placement.group == HOST:
        attrs.append(gb.KeyValue("why on the host", placement.reason or "-"))
    if placement.float_fallback:
        attrs.append(gb.KeyValue("float fallback", str(op.attrs.get("target", op.kind))))
    for key, value in op.attrs.items():
        attrs.append(gb.KeyValue(f"attr {key}", _short(value)))
    edges, inputs_meta = [], []
    k = 0
    for operand in op.input_values():
        made_by = producer.get(operand)
        if made_by is not None and made_by[0].kind == "constant":   # collapsed: listed, not drawn
            attrs.append(gb.KeyValue(f"constant {operand.name}", str(operand.type)))
            continue
        edges.append(_edge(operand, producer, k))
        inputs_meta.append(_metadata(str(k), operand))
        k += 1
    style = FLOAT_FALLBACK_STYLE if placement.float_fallback else HOST_STYLE if placement.group == HOST else None
    label = op.kind if op.kind != "aten" else f"{str(op.attrs.get('target', 'aten')).split('.')[1:2][0]} (float)"
    return gb.GraphNode(id=result.name, label=label, namespace=namespace, attrs=attrs, incomingEdges=edges,
                        outputsMetadata=[_metadata(str(i), r) for i, r in enumerate(op.results)],
                        inputsMetadata=inputs_meta, style=style)


def _edge(v: Value, producer, target_input: int) -> gb.IncomingEdge:
    op, index = producer.get(v, (None, 0))
    return gb.IncomingEdge(sourceNodeId=v.name if op is None else op.results[0].name,
                           sourceNodeOutputId=str(index), targetNodeInputId=str(target_input))


def _metadata(output_id: str, v: Value) -> gb.MetadataItem:
    t = v.type
    dims = "x".join(map(str, t.shape)) if t.shape else ""
    attrs = [gb.KeyValue("tensor_shape", f"{t.dtype.value}[{dims}]"), gb.KeyValue("__tensor_tag", v.name)]
    if t.quant is not None:
        q = t.quant
        scale = ", ".join(f"{s:.6g}" for s in q.scale[:4]) + (f", … ({len(q.scale)})" if len(q.scale) > 4 else "")
        zp = ", ".join(map(str, q.zero_point[:4])) + (f", … ({len(q.zero_point)})" if len(q.zero_point) > 4 else "")
        attrs += [gb.KeyValue("scale", scale), gb.KeyValue("zero_point", zp),
                  gb.KeyValue("range", f"[{q.qmin}, {q.qmax}]")]
        if q.axis is not None:
            attrs.append(gb.KeyValue("axis", str(q.axis)))
    return gb.MetadataItem(id=output_id, attrs=attrs)


def _origin_attrs(v: Value) -> list[gb.KeyValue]:
    o = v.origin
    if o is None:
        return [gb.KeyValue("source", "<no source>")]
    return [gb.KeyValue("source", o.source or "<no source>"), gb.KeyValue("module", o.module or "-"),
            gb.KeyValue("node", o.node or "-")]


def _short(value: object) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):   # an array attribute (a table, a shift): its type
        flat = list(getattr(value, "flat", []))[:8]
        return f"{value.dtype}[{'x'.join(map(str, value.shape))}] {flat}{' …' if value.size > 8 else ''}"
    text = str(value)
    return text if len(text) <= _MAX_ATTR_CHARS else text[:_MAX_ATTR_CHARS] + "…"


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in ".^$*+?{}[]\\|()" else c for c in text)

