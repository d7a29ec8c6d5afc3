"""Lowerings of the order reductions: reduce_min (REDUCE_MIN), argmax (ARGMAX) and argmin.

TOSA's ARGMAX drops the reduced axis and the IR keeps it: a RESHAPE puts it
back. TOSA 1.0 has no ARGMIN: the codes are complemented first (``~x = -x - 1``),
a bijection of int8 / int16 that reverses their order, so the first largest
complement is exactly the first smallest code. int8 complements with NEGATE
(output zero point -1; Vela runs it on Ethos-U55, where it rejects BITWISE_NOT),
int16 with BITWISE_NOT (NEGATE takes no int16 zero points).
"""

from __future__ import annotations

import tosa_serializer as ts

from qlower.backends.tosa.lowering import Lowerer, lowering
from qlower.backends.tosa.serializer import DT, Tensor, attr
from qlower.ir import Op

Op_ = ts.Op


@lowering("reduce_min")
def _reduce_min(lw: Lowerer, op: Op) -> Tensor:
    x = lw.t(op.operands[0])
    return lw.emit(Op_.REDUCE_MIN, [x], op.result.shape, x.dtype,
                   attr("ReduceMin", op.attrs["axis"] % x.rank, ts.NanPropagationMode.PROPAGATE))


@lowering("argmax", "argmin")
def _arg_reduce(lw: Lowerer, op: Op) -> Tensor:
    x = lw.t(op.operands[0])
    axis = op.attrs["axis"] % x.rank
    if op.kind == "argmin" and x.dtype == DT.INT8:  # -x - 1 as NEGATE with output zero point -1
        x = lw.emit(Op_.NEGATE, [x, lw.zero_point(x, 0), lw.zero_point(x, -1)], x.shape, x.dtype, attr("Negate"))
    elif op.kind == "argmin":
        x = lw.emit(Op_.BITWISE_NOT, [x], x.shape, x.dtype, attr("BitwiseNot"))
    if x.rank == 1:  # keep ARGMAX's result at rank >= 1
        x, axis = lw.reshape(x, (1,) + x.shape), 1
    reduced = tuple(d for i, d in enumerate(x.shape) if i != axis)
    index = lw.emit(Op_.ARGMAX, [x], reduced, DT.INT32, attr("ArgMax", axis, ts.NanPropagationMode.PROPAGATE))
    return lw.reshape(index, op.result.shape)
