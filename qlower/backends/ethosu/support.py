"""Which IR ops the Ethos-U backend takes on one accelerator, and why not when it doesn't.

An op goes to the NPU only when all of these hold, checked in this order:

1. TOSA-1.0+INT takes it (the TOSA backend's verdict): Vela compiles TOSA
   graphs and has no CPU fallback, so float ops and anything else outside the
   integer profile stay on the host with the TOSA backend's reason.
2. It is not a boundary transpose (see ``GraphFacts``): a transpose that reads
   the model's input (or its quantized form), or that produces the model's
   output (directly or through a dequantize), stays on the host. Such layout
   changes (NCHW input -> NHWC) are pure data movement that the NPU does slowly:
   measured with Vela on MobileNetV2 at 224x224, the input transpose is 10.8%
   of the NPU cycles on ethos-u85-256 (1.3% on ethos-u55-128). The host does
   it while copying the input in, or the caller passes NHWC data.
3. Vela accepts it on that accelerator. Vela reports a rejected TOSA graph by
   exception, often naming only the operator type, so each op is compiled as a
   one-op TOSA graph (about 1 ms) and Vela's own message becomes the reason
   ("Vela (ethos-u55-128): Non-passthrough operation (Div) could not run on NPU").
   Before that, ops of a pattern that crashes Vela (a segmentation fault: no
   exception to turn into a verdict, the process dies) are refused with the
   reason measured (``vela_crash``); the one-op graph alone would not show it.

Verdicts are cached per (accelerator, op kind, operand and result types, which
operands are constant and their data, attributes), so asking again is free.
Constant operands are compiled with their real data when the graph was given
to ``GraphFacts`` (Vela checks some weight-value limits); otherwise a weight or
bias operand is compiled as a zero constant of its type and any other operand
as a graph input.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qlower.backends.ethosu.vela import VelaConfig, VelaRejection, compile_tosa
from qlower.contract import Verdict
from qlower.errors import CompileError, UnsupportedOpError
from qlower.ir import Graph, GraphBuilder, Op, Value
from qlower.ir.opdefs import op_def

BOUNDARY_TRANSPOSE_REASON = "boundary transpose: kept on the host (costs ~11% of NPU cycles on MobileNetV2)"
_CONSTANT_ROLES = ("weight", "bias")


@dataclass(frozen=True)
class GraphFacts:
    """What ``supports`` needs to know about the whole graph an op lives in.

    ``boundary_inputs``: the graph's inputs and values that only quantize one;
    ``boundary_outputs``: the graph's outputs and values a dequantize turns into one;
    ``constants``: the data of every constant op's result.
    """

    constants: dict[Value, np.ndarray] = field(default_factory=dict)
    boundary_inputs: frozenset[Value] = frozenset()
    boundary_outputs: frozenset[Value] = frozenset()

    @staticmethod
    def of(graph: Graph) -> GraphFacts:
        inputs, outputs = set(graph.inputs), set(graph.outputs)
        constants = {op.result: op.attrs["data"] for op in graph.ops if op.kind == "constant"}
        quantized_inputs = {op.result for op in graph.ops
                            if op.kind == "quantize" and op.operands[0] in inputs}
        users = graph.users()
        dequantized_outputs = {v for v, us in users.items()
                               if us and all(u.kind == "dequantize" and u.result in outputs for u in us)}
        return GraphFacts(constants, frozenset(inputs | quantized_inputs), frozenset(outputs | dequantized_outputs))


def is_boundary_transpose(op: Op, facts: GraphFacts) -> bool:
    return op.kind == "transpose" and (op.operands[0] in facts.boundary_inputs
                                       or op.result in facts.boundary_outputs)


# -- one-op graphs -----------------------------------------------------------------------------

def _role(op: Op, i: int) -> str:
    return op_def(op.kind).operands[i].rstrip("?*")


def _constant_data(op: Op, i: int, v: Value, facts: GraphFacts) -> np.ndarray | None:
    if v in facts.constants:
        return facts.constants[v]
    if _role(op, i) in _CONSTANT_ROLES:
        return np.zeros(v.shape, v.dtype.numpy)
    return None


def one_op_graph(op: Op, facts: GraphFacts) -> Graph:
    """``op`` alone: constant operands as constants, the others as graph inputs, its results as outputs."""
    b = GraphBuilder(f"{op.kind}_alone")

    def operand(i: int, v: Value) -> Value:
        data = _constant_data(op, i, v, facts)
        if data is None:
            return b.input(v.name, v.type)
        return b.constant(data, v.quant, name=v.name)

    operands = tuple(
        tuple(operand(i, x) for x in o) if isinstance(o, tuple) else (None if o is None else operand(i, o))
        for i, o in enumerate(op.operands))
    return b.build(b.emit(op, operands))


def _digest(a: np.ndarray) -> tuple[str, tuple[int, ...], str]:
    a = np.ascontiguousarray(a)
    return (a.dtype.str, a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest())


def _freeze(x: Any) -> Hashable:
    if isinstance(x, np.ndarray):
        return ("ndarray", *_digest(x))
    if isinstance(x, list | tuple):
        return tuple(_freeze(e) for e in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    return x


def signature(op: Op, facts: GraphFacts) -> Hashable:
    """Everything of ``op`` that its one-op graph depends on."""
    def operand(i: int, v: Value) -> Hashable:
        data = _constant_data(op, i, v, facts)
        return (v.type, None if data is None else _digest(data))

    operands = tuple(
        tuple(operand(i, x) for x in o) if isinstance(o, tuple) else (None if o is None else operand(i, o))
        for i, o in enumerate(op.operands))
    return (op.kind, operands, _freeze(dict(op.attrs)), tuple(r.type for r in op.results))


# -- verdicts ----------------------------------------------------------------------------------

LowerToTosa = Callable[[Graph], tuple[bytes, list[str]]]  # -> (flatbuffer, TOSA operators emitted)
TosaVerdict = Callable[[Op], Verdict]
_CACHE: dict[tuple[Hashable, Hashable], Verdict] = {}


def vela_verdict(op: Op, config: VelaConfig, facts: GraphFacts, lower: LowerToTosa,
                 variant: Hashable = None) -> Verdict:
    """Vela's verdict on ``op`` alone (step 3 of the module docstring), cached; ``variant`` names
    the TOSA forms ``lower`` writes (part of the cache key)."""
    key = ((config.accelerator, config.system_config, config.memory_mode, variant), signature(op, facts))
    if key in _CACHE:
        return _CACHE[key]
    try:
        tosa, tosa_ops = lower(one_op_graph(op, facts))
    except (CompileError, UnsupportedOpError) as e:
        verdict = Verdict.no(f"TOSA lowering of the op alone failed: {e}")
    else:
        try:
            compile_tosa(tosa, config)
            verdict = Verdict.yes()
        except VelaRejection as e:
            # Vela names TOSA operators (in its own spelling): say which ones this op became
            verdict = Verdict.no(f"{e} ({op.kind} lowers to TOSA {', '.join(tosa_ops) or 'constants only'})")
    _CACHE[key] = verdict
    return verdict


def vela_crash(op: Op, config: VelaConfig) -> str | None:
    """Why Vela 5.2 would crash compiling a partition holding ``op``, or None (measured).

    A grouped convolution (groups > 1, not depthwise: TOSA lowers it to one CONV2D per group
    and a CONCAT) with batch > 1, followed by its per-channel requantization, segfaults
    Vela on Ethos-U55 and U65 (every MAC configuration); U85 compiles it. The convolution
    alone (int32 result) compiles, which is why the one-op check can't see it."""
    if op.kind != "conv2d" or not config.accelerator.startswith(("ethos-u55", "ethos-u65")):
        return None
    x, w = op.operands[0], op.operands[1]
    groups = op.attrs["groups"]
    depthwise = groups == x.shape[3] and w.shape[3] == 1
    if groups > 1 and not depthwise and x.shape[0] > 1:
        return (f"Vela 5.2 crashes (segmentation fault) on a grouped convolution with batch {x.shape[0]} "
                f"and its requantization for {config.accelerator}: kept on the host")
    return None


def ethosu_verdict(op: Op, config: VelaConfig, facts: GraphFacts, tosa_verdict: TosaVerdict,
                   lower: LowerToTosa, variant: Hashable = None) -> Verdict:
    """The Ethos-U backend's answer for ``op`` (the three steps of the module docstring)."""
    tosa = tosa_verdict(op)
    if not tosa:
        return Verdict.no(f"not in TOSA-1.0+INT, the only input Vela compiles: {tosa.reason}")
    if is_boundary_transpose(op, facts):
        return Verdict.no(BOUNDARY_TRANSPOSE_REASON)
    crash = vela_crash(op, config)
    if crash is not None:
        return Verdict.no(crash)
    return vela_verdict(op, config, facts, lower, variant)
