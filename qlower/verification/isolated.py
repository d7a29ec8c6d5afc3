"""Per-layer comparison in isolation: each layer fed with fake-quant's own inputs.

Run end to end, the reference and the fake-quant model each feed a layer with
their own previous results, so a one-step rounding difference early in a deep
network is amplified by every later layer (a randomly initialised MobileNetV2
turns single steps into tens). That drift says nothing about whether a layer
means the same thing in both. Here every layer's IR ops — from the previous
layers' values up to this one — are re-run on fake-quant's values of those
previous layers (quantized with the IR types), so each layer's number is its
own error: at most one step when qlower and PyTorch agree on its semantics.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qlower.errors import ExecutionError
from qlower.ir import Graph, Op, Value
from qlower.reference import run_op


def _layer_ops(graph: Graph, v: Value, stops: set[Value], producer: dict[Value, Op], position: dict[Op, int]
               ) -> tuple[list[Op], list[Value]]:
    """The ops computing ``v`` from the nearest stop values (or graph inputs), in graph order."""
    ops: set[Op] = set()
    boundary: list[Value] = []
    seen: set[Value] = set()
    frontier = [v]
    while frontier:
        u = frontier.pop()
        if u in seen:
            continue
        seen.add(u)
        p = producer.get(u)
        if p is None or (u is not v and u in stops):
            boundary.append(u)
            continue
        ops.add(p)
        frontier.extend(p.input_values())
    return sorted(ops, key=position.__getitem__), boundary


def isolated_codes(graph: Graph, layers: list[Value], graph_inputs: dict[Value, np.ndarray],
                   fake_quant_of: Callable[[Value], np.ndarray | None]) -> dict[Value, np.ndarray]:
    """For each layer whose inputs all have PyTorch counterparts (``fake_quant_of``: a value's
    counterpart in its own domain, codes for quantized values): its codes computed from them."""
    producer = graph.producers()
    position = {op: i for i, op in enumerate(graph.ops)}
    stops = set(layers)
    out: dict[Value, np.ndarray] = {}
    for v in layers:
        ops, boundary = _layer_ops(graph, v, stops, producer, position)
        env: dict[Value, np.ndarray] = {}
        for u in boundary:
            if u in graph_inputs:
                env[u] = graph_inputs[u]
                continue
            t = fake_quant_of(u)
            if t is None:
                break
            env[u] = t
        else:
            try:
                for op in ops:
                    run_op(op, env)
            except ExecutionError:  # e.g. fake-quant's inputs overflow an accumulator: not comparable
                continue
            out[v] = env[v]
    return out
