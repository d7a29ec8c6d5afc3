"""What a loaded program may cost, bounded before it runs.

A few hundred bytes of graph can declare a tensor of terabytes (a pad, a broadcast, an
``aten.full``) or hours of work (a chain of 8192^3 ``aten.mm``). A loaded program's cost
is estimated from its shapes alone (nothing runs) and refused when it exceeds a limit the
user can raise for a file they trust:

- ``QLOWER_MAX_TENSOR_BYTES`` (default 1 GiB): the bytes of any one value;
- ``QLOWER_MAX_PROGRAM_MEMORY`` (default 4 GiB): the bytes the program holds at once, the
  peak over its ops of the values alive (defined and still to be read), summed over the host
  graph and every partition's subgraph (each may hold its own copy at a boundary);
- ``QLOWER_MAX_PROGRAM_MACS`` (default 2**40, about 10^12): the work of one run, in
  multiply-accumulates for the GEMM-like ops (conv2d, fully_connected, matmul, and the ATen
  ops mm, bmm, addmm, convolution, _cdist_forward) and one step per element read or
  written for every other op.

``check_program`` raises an InvalidProgramError naming the value or the total and the
variable that raises the limit.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from qlower.errors import InvalidProgramError
from qlower.ir import Graph, Op

MAX_TENSOR_BYTES_ENV = "QLOWER_MAX_TENSOR_BYTES"
MAX_PROGRAM_MEMORY_ENV = "QLOWER_MAX_PROGRAM_MEMORY"
MAX_PROGRAM_MACS_ENV = "QLOWER_MAX_PROGRAM_MACS"
DEFAULT_MAX_TENSOR_BYTES = 1 << 30
DEFAULT_MAX_PROGRAM_MEMORY = 4 << 30
DEFAULT_MAX_PROGRAM_MACS = 1 << 40


def _limit(env: str, default: int) -> int:
    raw = os.environ.get(env, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else default


def max_tensor_bytes() -> int:
    """The largest tensor a loaded program may compute (env QLOWER_MAX_TENSOR_BYTES, default 1 GiB)."""
    return _limit(MAX_TENSOR_BYTES_ENV, DEFAULT_MAX_TENSOR_BYTES)


def max_program_memory() -> int:
    return _limit(MAX_PROGRAM_MEMORY_ENV, DEFAULT_MAX_PROGRAM_MEMORY)


def max_program_macs() -> int:
    return _limit(MAX_PROGRAM_MACS_ENV, DEFAULT_MAX_PROGRAM_MACS)


def _bytes(t) -> int:
    return math.prod(t.shape) * t.dtype.itemsize   # Python ints: exact, no wrap-around


def _numel(shape) -> int:
    return math.prod(shape)


def _aten_macs(op: Op) -> int | None:
    """Multiply-accumulates of the GEMM-like ATen ops (None for the others)."""
    name = str(op.attrs.get("target", "")).split(".")
    name = name[1] if len(name) == 3 else ""
    ins = [v.type.shape for v in op.input_values()]
    outs = [t.shape for t in op.attrs.get("out_types", ())]
    if not outs:
        return None
    if name in ("mm", "bmm", "addmm") and len(ins) >= 2:
        k = ins[-2][-1] if ins[-2] else 1   # addmm(bias, a, b): a is the second-to-last operand
        return _numel(outs[0]) * k
    if name == "convolution" and len(ins) >= 2 and len(ins[1]) >= 2:
        # weight [O, I/groups, *kernel], or [I, O/groups, *kernel] transposed: a bound for either
        return max(_numel(outs[0]), _numel(ins[0])) * _numel(ins[1][1:])
    if name == "_cdist_forward" and len(ins) >= 2:
        return _numel(outs[0]) * (ins[0][-1] if ins[0] else 1)
    return None


def op_work(op: Op) -> int:
    """The work of one op: multiply-accumulates of a GEMM, else the elements it reads and writes."""
    if op.kind in ("constant", "delegate"):
        return 0
    out = op.results[0].type.shape if op.results else ()
    if op.kind == "conv2d":
        w = op.operands[1].type.shape                # OHWI: KH * KW * (C / groups) per output element
        return _numel(out) * _numel(w[1:])
    if op.kind == "fully_connected":
        return _numel(out) * op.operands[1].type.shape[1]
    if op.kind == "matmul":
        return _numel(out) * op.operands[0].type.shape[-1]
    if op.kind == "aten":
        macs = _aten_macs(op)
        if macs is not None:
            return macs
    return (sum(_numel(v.type.shape) for v in op.input_values())
            + sum(_numel(r.type.shape) for r in op.results))


@dataclass(frozen=True)
class Cost:
    macs: int           # work of one run (see op_work)
    peak_bytes: int     # bytes of the values alive at once, at the worst op
    largest: tuple[str, int] | None   # the largest value: name, bytes


def graph_cost(graph: Graph) -> Cost:
    """The cost of running ``graph`` once, from its shapes (values freed after their last use)."""
    last_use: dict[object, int] = {}
    for i, op in enumerate(graph.ops):
        for v in op.input_values():
            last_use[v] = i
    end = len(graph.ops)
    for v in graph.outputs:
        last_use[v] = end
    live = sum(_bytes(v.type) for v in graph.inputs)
    peak, macs, largest = live, 0, None
    for v in graph.inputs:
        if largest is None or _bytes(v.type) > largest[1]:
            largest = (v.name, _bytes(v.type))
    for i, op in enumerate(graph.ops):
        macs += op_work(op)
        for r in op.results:
            size = _bytes(r.type)
            live += size
            if largest is None or size > largest[1]:
                largest = (r.name, size)
        peak = max(peak, live)
        freed = {v for v in op.input_values() if last_use.get(v) == i}
        freed |= {r for r in op.results if r not in last_use}    # never read: dropped at once
        live -= sum(_bytes(v.type) for v in freed)
    return Cost(macs, peak, largest)


def check_tensor_sizes(graph: Graph, where: str) -> None:
    """Refuse a graph with a value larger than ``max_tensor_bytes()``."""
    limit = max_tensor_bytes()
    for v in graph.values():
        size = _bytes(v.type)
        if size > limit:
            raise InvalidProgramError(
                f"{where}: value %{v.name[:40]} ({v.type}) takes {size:,} bytes, more than the {limit:,} a loaded "
                f"program may allocate for one tensor; set {MAX_TENSOR_BYTES_ENV} to raise the limit if the file "
                "is trusted")


def check_program(graphs: list[tuple[str, Graph]]) -> Cost:
    """Refuse a program whose run would take more memory or work than the limits; its cost otherwise.
    ``graphs``: the graphs that run (the host graph and each partition's subgraph), with where they are."""
    for where, g in graphs:
        check_tensor_sizes(g, where)
    costs = [graph_cost(g) for _, g in graphs]
    macs = sum(c.macs for c in costs)
    peak = sum(c.peak_bytes for c in costs)
    limit = max_program_macs()
    if macs > limit:
        worst = max(range(len(costs)), key=lambda i: costs[i].macs)
        raise InvalidProgramError(
            f"one run takes about {macs:,} multiply-accumulates (most in {graphs[worst][0]}), more than the "
            f"{limit:,} a loaded program may do; set {MAX_PROGRAM_MACS_ENV} to raise the limit if the file is "
            "trusted")
    limit = max_program_memory()
    if peak > limit:
        raise InvalidProgramError(
            f"one run holds up to {peak:,} bytes of tensors at once, more than the {limit:,} a loaded program may "
            f"use; set {MAX_PROGRAM_MEMORY_ENV} to raise the limit if the file is trusted")
    return Cost(macs, peak, max((c.largest for c in costs if c.largest), key=lambda x: x[1], default=None))
