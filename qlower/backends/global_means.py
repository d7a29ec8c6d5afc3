"""The frontend's global average, as backends find it in a graph.

The frontend writes a mean over H and W of int8 codes as a rescale to int16 (zero point removed,
x128), an unpadded ``avg_pool2d`` whose window is the whole plane, and a rescale to the output.
Backends that have a form of their own for it recognise it here: Ethos-U chooses between the
pool and a sum (``ethosu/means.py``), TFLM writes one MEAN (``tflm/mean.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from qlower.ir import DType, Graph, Op


@dataclass(frozen=True)
class GlobalMean:
    widen: Op      # rescale int8 -> int16 (zero point 0): the average's input
    pool: Op       # avg_pool2d over the whole plane
    final: Op      # the rescale to the output, the pool's only reader


def global_means(graph: Graph) -> list[GlobalMean]:
    """The frontend's global averages: a widening rescale read only by an unpadded average pool
    whose window is the whole plane, read only by a rescale; neither intermediate is a graph output
    (a backend's form of its own replaces both)."""
    producers, users = graph.producers(), graph.users()
    found = []
    for op in graph.ops:
        if op.kind != "avg_pool2d" or any(op.attrs["pad"]):
            continue
        w = op.operands[0]
        widen = producers.get(w)
        n, h, wd, c = w.shape
        if (widen is None or widen.kind != "rescale" or tuple(op.attrs["kernel"]) != (h, wd)
                or w.dtype is not DType.INT16 or widen.operands[0].dtype is not DType.INT8
                or widen.operands[0].quant.is_per_channel or len(users.get(w, [])) != 1 or w in graph.outputs):
            continue
        readers = users.get(op.result, [])
        if len(readers) != 1 or readers[0].kind != "rescale" or op.result in graph.outputs:
            continue
        found.append(GlobalMean(widen, op, readers[0]))
    return found
