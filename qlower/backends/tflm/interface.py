"""The program's interface on the device: float32 (quantize/dequantize inside the .tflite) or int8 codes.

A .tflite that takes float32 holds the quantization of its inputs and the
dequantization of its outputs as TFLM operators: a float32 copy of every input
in the arena and a dozen small operators (their tensors and node structures in
the arena's tail). With ``io="int8"`` (the ``tflm`` target's option) the file
takes and returns the quantized codes instead, their scale and zero point in
the tensors' quantization parameters -- the interface litert-torch's files
have, and what a device whose input already arrives as int8 (a microphone
front end, a camera pipeline) feeds. The boundary ops stay on qlower's host,
so the program still takes and returns floats and computes the same numbers.

A boundary op is a static int8/int16 ``quantize`` that is a float graph input's
only reader, or a ``dequantize`` of per-tensor codes whose result is only a
graph output.
"""

from __future__ import annotations

from typing import Literal

from qlower.ir import DType, Graph, GraphBuilder, Op, Value

Io = Literal["float32", "int8"]
REASON = ("the tflm program's interface is int8 (option io=int8): the .tflite takes and returns the quantized "
          "codes, their quantization in its tensors; the caller quantizes and dequantizes")


def _per_tensor_codes(v: Value) -> bool:
    q = v.type.quant
    return v.dtype in (DType.INT8, DType.INT16) and q is not None and not q.dynamic and not q.is_per_channel


def boundary_ops(graph: Graph) -> tuple[dict[Value, Op], dict[Value, Op]]:
    """(graph input -> the quantize that is its only reader, graph output -> the dequantize writing it)."""
    users, producers = graph.users(), graph.producers()
    quantizes, dequantizes = {}, {}
    for v in graph.inputs:
        readers = users.get(v, [])
        if (len(readers) == 1 and readers[0].kind == "quantize" and v.dtype is DType.FLOAT32
                and _per_tensor_codes(readers[0].result) and readers[0].result not in graph.outputs):
            quantizes[v] = readers[0]
    for v in graph.outputs:
        op = producers.get(v)
        if (op is not None and op.kind == "dequantize" and not users.get(v) and graph.outputs.count(v) == 1
                and _per_tensor_codes(op.operands[0]) and op.operands[0] not in graph.inputs):
            dequantizes[v] = op
    return quantizes, dequantizes


def boundary_reasons(graph: Graph) -> dict[int, str]:
    """id(op) -> why it stays on the host, for the boundary ops of an int8 interface."""
    quantizes, dequantizes = boundary_ops(graph)
    return {id(op): REASON for op in (*quantizes.values(), *dequantizes.values())}


def int8_interface(graph: Graph) -> Graph:
    """``graph`` without its boundary ops: its inputs the codes they quantized to (in the same order), its
    outputs the codes they dequantized."""
    quantizes, dequantizes = boundary_ops(graph)
    if not quantizes and not dequantizes:
        return graph
    dropped = {id(op) for op in (*quantizes.values(), *dequantizes.values())}
    b = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {}
    for v in graph.inputs:
        q = quantizes.get(v)
        w = v if q is None else q.result
        mapping[w] = b.input(w.name, w.type, w.origin)
    for op in graph.ops:
        if id(op) in dropped:
            continue
        operands = tuple(tuple(mapping[x] for x in o) if isinstance(o, tuple) else (None if o is None else mapping[o])
                         for o in op.operands)
        mapping.update(zip(op.results, b.emit(op, operands)))
    outs = [dequantizes[v].operands[0] if v in dequantizes else v for v in graph.outputs]
    return b.build(mapping[v] for v in outs)
