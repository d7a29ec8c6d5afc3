"""Proven bounds of integer values, so that a rescale of a narrow int32 range can be a table lookup.

``CodeRanges(graph).of(value)`` is an interval ``[lo, hi]`` that holds every
integer the value can take on any input: graph inputs and results nothing is
known about get their dtype's whole range; rescales, quantizes and tables their
declared output range; sums, products and differences interval arithmetic; data
movement and order ops their operands' union. The exporter uses it to write a
rescale of int32 values that span at most ``MAX_TABLE`` integers (the sum of a
global average pool, say) as one GATHER from the reference's own numbers,
instead of 64-bit arithmetic that XNNPACK can't delegate and Vela's TFLite
reader crashes on.
"""

from __future__ import annotations

import numpy as np

from qlower.ir import Graph, Op, Value, requant

MAX_TABLE = 1 << 16
_SAME_CODES = frozenset({"reshape", "transpose", "slice", "gather", "concat", "max_pool2d", "reduce_max",
                         "reduce_min", "pad", "minimum", "maximum", "select"})


class CodeRanges:
    def __init__(self, graph: Graph):
        self.producers = graph.producers()
        self._memo: dict[Value, tuple[int, int]] = {}

    def of(self, v: Value) -> tuple[int, int]:
        if v not in self._memo:
            op = self.producers.get(v)
            full = (v.dtype.min, v.dtype.max) if v.dtype.is_integer else (0, 0)
            rng = full if op is None else self._derive(op, v, full)
            self._memo[v] = (max(rng[0], full[0]), min(rng[1], full[1]))
        return self._memo[v]

    def _derive(self, op: Op, v: Value, full: tuple[int, int]) -> tuple[int, int]:
        if not v.dtype.is_integer or op.kind == "aten":
            return full
        k = op.kind
        if k == "constant":
            data = op.attrs["data"]
            return (int(data.min()), int(data.max())) if data.size else full
        if k == "rescale":
            return self._rescaled(op, v)
        if k == "quantize":
            return v.quant.qmin, v.quant.qmax
        if k == "table":
            return int(op.attrs["table"].min()), int(op.attrs["table"].max())
        if k == "clamp":
            lo, hi = self.of(op.operands[0])
            return min(max(lo, op.attrs["min"]), op.attrs["max"]), min(max(hi, op.attrs["min"]), op.attrs["max"])
        if k == "select":                        # the picked codes, not the condition
            operands = [self.of(op.operands[1]), self.of(op.operands[2])]
        elif k == "gather":                      # the gathered codes, not the indices
            operands = [self.of(op.operands[0])]
        else:
            operands = [self.of(u) for u in op.input_values()]
        if k in _SAME_CODES and operands:
            lo, hi = min(r[0] for r in operands), max(r[1] for r in operands)
            if k == "pad":
                lo, hi = min(lo, op.attrs["value"]), max(hi, op.attrs["value"])
            return lo, hi
        if k == "reduce_sum":
            n = op.operands[0].shape[op.attrs["axis"]]
            lo, hi = operands[0]
            return lo * n, hi * n
        if k in ("add", "sub") and len(operands) == 2:
            (a0, a1), (b0, b1) = operands
            return (a0 + b0, a1 + b1) if k == "add" else (a0 - b1, a1 - b0)
        if k == "mul" and len(operands) == 2 and op.attrs["shift"] == 0:
            (a0, a1), (b0, b1) = operands
            corners = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
            return min(corners), max(corners)
        return full


    def _rescaled(self, op: Op, v: Value) -> tuple[int, int]:
        """A rescale is non-decreasing in its input (multipliers are >= 0): the images of the input's bounds."""
        src, out = op.operands[0].type.quant, op.attrs["out"]
        lo, hi = self.of(op.operands[0])
        n = len(src.scale)
        codes = np.array([[lo] * n, [hi] * n], dtype=np.int64)
        try:
            mult = requant.requantize_ratio(np.asarray(src.scale), out.scale[0])
            ends = requant.rescale(codes, np.asarray(src.zero_point), out.zero_point[0], mult, out.qmin, out.qmax,
                                   axis=1 if src.is_per_channel else None, rounding=op.attrs["rounding"])
        except requant.RequantRangeError:   # bounds the rescale can't take: only its declared range is sure
            return out.qmin, out.qmax
        return int(ends.min()), int(ends.max())


def table_span(lo: int, hi: int) -> bool:
    """Whether ``[lo, hi]`` is narrow enough for a lookup table."""
    return hi - lo + 1 <= MAX_TABLE
