"""Where each op of the catalogue runs on a target: the classifier behind the coverage sweep and benchmark.

An op case's IR ops are the ops of the optimised graph (``program.source``)
whose ``Origin.module`` is the case's op module (``op_catalog.OP_MODULE``),
without the plumbing around them: constants, ``quantize`` / ``dequantize``
(where the graph changes between float and codes) and the transposes at the
model's boundary (NCHW ↔ NHWC; Ethos-U keeps those on the host on purpose).
Their placement is one of:

- ``integer on target``: every one of them is integer and sits inside a
  delegate partition (for ``reference`` and ``cpu``, whose target *is* the
  host: every one is integer);
- ``host integer``: integer, but some run on the host (``program.decisions``
  names each with the backend's reason);
- ``host float``: one of them is a float fallback (``aten``) or a float IR op;
- ``refused``: the compile raised.

An op that the passes folded away entirely has no IR ops left; it counts as
``integer on target`` (it costs nothing anywhere) and ``Placement.folded`` says so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from qlower.api import lower_graph
from qlower.backends.registry import HOST_TARGETS
from qlower.frontend import FrontendResult, capture_and_import
from qlower.frontend.config import QuantConfig
from qlower.ir import Graph, Op
from qlower.partition import HostDecision
from qlower.passes import default_pipeline
from qlower.program import Program
from qlower.testing.op_catalog import OP_MODULE, OpCase

INTEGER_ON_TARGET = "integer on target"
HOST_INTEGER = "host integer"
HOST_FLOAT = "host float"
REFUSED = "refused"
CLASSES = (INTEGER_ON_TARGET, HOST_INTEGER, HOST_FLOAT, REFUSED)
PLUMBING = ("constant", "quantize", "dequantize")


@dataclass
class Prepared:
    """A case quantized, imported and optimised once; lowered per target with ``lower``."""

    case: OpCase
    inputs: tuple[torch.Tensor, ...]
    frontend: FrontendResult
    graph: Graph

    def lower(self, target: str) -> Program:
        prog = lower_graph(self.graph, target)
        prog.frontend = self.frontend
        return prog


def prepare(case: OpCase, quant: QuantConfig | None = None) -> Prepared:
    """PT2E-quantize (static int8 by default, calibrated on the case's batches), import and optimise."""
    inputs = case.inputs()
    front = capture_and_import(case.build(), inputs, quant or QuantConfig(), case.calibration(), progress=False)
    return Prepared(case, inputs, front, default_pipeline().run(front.graph))


def is_float_op(op: Op) -> bool:
    return op.kind == "aten" or any(r.dtype.is_float and r.quant is None for r in op.results)


def _boundary_transposes(graph: Graph) -> set[Op]:
    """Transposes that only move a graph input or output between PyTorch's layout and the IR's."""
    producers, users = graph.producers(), graph.users()
    inputs, outputs = set(graph.inputs), set(graph.outputs)

    def from_input(v) -> bool:
        p = producers.get(v)
        return v in inputs or (p is not None and p.kind == "quantize" and p.operands[0] in inputs)

    def to_output(v) -> bool:
        us = users.get(v, [])
        return (v in outputs or bool(us)) and all(u.kind == "dequantize" and u.result in outputs for u in us)

    return {op for op in graph.ops if op.kind == "transpose" and (from_input(op.operands[0]) or to_output(op.result))}


def case_ops(graph: Graph, module: str = OP_MODULE) -> list[Op]:
    """The ops of ``graph`` that compute the op under test (see the module docstring)."""
    boundary = _boundary_transposes(graph)
    mine = []
    for op in graph.ops:
        o = op.origin
        if op.kind in PLUMBING or op in boundary or o is None:
            continue
        if o.module == module or o.module.startswith(module + "."):
            mine.append(op)
    return mine


def _delegated_names(program: Program) -> set[str]:
    return {name for p in program.partitions for name in p.values}


def on_host(program: Program, op: Op) -> bool:
    if program.target in HOST_TARGETS:
        return True
    delegated = _delegated_names(program)
    return not all(r.name in delegated for r in op.results)


@dataclass(frozen=True)
class Placement:
    cls: str
    kinds: tuple[str, ...] = ()                    # the case's IR op kinds (source graph order)
    host: tuple[HostDecision | Op, ...] = ()       # its host ops: the decision naming each, or the bare op
    error: str = ""
    folded: bool = False

    @property
    def unnamed(self) -> list[Op]:
        """Host ops of the case that ``program.decisions`` does not name with a reason (should be none)."""
        return [h for h in self.host if isinstance(h, Op)]

    def describe(self) -> str:
        if self.cls == REFUSED:
            return f"{self.cls}: {self.error}"
        why = "; ".join(sorted({f"{h.op.kind}: {h.reason}" for h in self.host if isinstance(h, HostDecision)}))
        return f"{self.cls} [{', '.join(self.kinds) or 'folded'}]" + (f" — {why}" if why else "")


def classify(program: Program | BaseException, case: OpCase) -> Placement:
    """Where ``case``'s op runs in ``program`` (an exception: the compile raised)."""
    if isinstance(program, BaseException):
        text = " | ".join(line.strip() for line in f"{type(program).__name__}: {program}".splitlines() if line.strip())
        return Placement(REFUSED, error=text[:400])
    ops = case_ops(program.source)
    decisions = {id(d.op): d for d in program.decisions}
    host_ops = [op for op in ops if on_host(program, op)]
    if program.target in HOST_TARGETS:  # the host is the target: only float ops need a decision
        host_ops = [op for op in host_ops if is_float_op(op)]
    host = tuple(decisions.get(id(op), op) for op in host_ops)
    kinds = tuple(op.kind for op in ops)
    if any(is_float_op(op) for op in host_ops):
        cls = HOST_FLOAT
    elif host_ops:
        cls = HOST_INTEGER
    else:
        cls = INTEGER_ON_TARGET
    return Placement(cls, kinds, host, folded=not ops)


def op_shares(program: Program) -> dict:
    """Over a program's IR ops (constants, quantize and dequantize left out): how many, the share that
    is integer, and the share that runs inside delegate partitions (None for a graph without such ops).
    Every op counts, the transposes at the model's boundary too (Ethos-U keeps those on the host)."""
    ops = [op for op in program.source.ops if op.kind not in PLUMBING]
    if not ops:
        return {"ops": 0, "integer_share": None, "delegated_share": None, "float_fallbacks": 0,
                "fallback_targets": {}}
    delegated = _delegated_names(program)
    n_int = sum(not is_float_op(op) for op in ops)
    n_del = sum(all(r.name in delegated for r in op.results) for op in ops)
    return {"ops": len(ops), "integer_share": n_int / len(ops), "delegated_share": n_del / len(ops),
            "float_fallbacks": sum(op.kind == "aten" for op in ops),
            "fallback_targets": dict(Counter(str(op.attrs["target"]) for op in ops if op.kind == "aten"))}
