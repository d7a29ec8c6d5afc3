"""Constant folding with the reference interpreter's own kernels.

An op whose operands are all constants is evaluated by ``qlower.reference.run_op``
and replaced by a ``constant`` of exactly the op's result type (a quantized
result keeps its QuantSpec). Because the reference is the definition of every
op, the folded graph computes bit-identically what the unfolded one did; and
because each kernel reads each operand through that operand's own type (a
rescale its input scale, a concat each of its inputs), folding a concat of
differently quantized constants is exact (SCENARIOS.md S3).

Not folded, deliberately:

* ops with several results (``dynamic_quantize``): their run-time scale is the point;
* results with a dynamic QuantSpec (their meaning needs a run-time scale);
* ops the reference has no kernel for (e.g. ``delegate``);
* ``dequantize``: it is where codes leave the quantized program; folding it would
  turn an int8 constant into a float one four times its size, and a model that
  folds to a constant (S3) would no longer hand its codes to an integer backend;
* results larger than ``max_bytes``, except weight transforms (``transpose``,
  ``reshape``), which never grow the data and are always folded;
* ops whose evaluation fails (overflow, division by zero): the op is left in
  place, so the error surfaces where it would have without folding.
"""

from __future__ import annotations

import numpy as np

from qlower.errors import ExecutionError, IRError
from qlower.ir import Graph, GraphBuilder, Op, Value, rebuild
from qlower.ir.graph import Operand
from qlower.passes.manager import PassResult
from qlower.reference import KERNELS, run_op

WEIGHT_TRANSFORMS = frozenset({"transpose", "reshape"})
DEFAULT_MAX_BYTES = 4 * 2**20


def _flatten(operands: tuple[Operand, ...]) -> list[Value]:
    out: list[Value] = []
    for o in operands:
        if isinstance(o, tuple):
            out.extend(o)
        elif o is not None:
            out.append(o)
    return out


class FoldConstants:
    """The constant-folding pass; ``max_bytes`` bounds the size of a folded result."""

    name = "fold_constants"

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes

    def foldable(self, op: Op, inputs: list[Value], constants: dict[Value, np.ndarray]) -> bool:
        if op.kind in ("constant", "dequantize") or len(op.results) != 1 or op.kind not in KERNELS:
            return False
        if not inputs or any(v not in constants for v in inputs):
            return False
        t = op.result.type
        if (t.quant is not None and t.quant.dynamic) or any(v.quant is not None and v.quant.dynamic for v in inputs):
            return False
        return op.kind in WEIGHT_TRANSFORMS or t.nbytes <= self.max_bytes

    def __call__(self, graph: Graph) -> PassResult:
        constants: dict[Value, np.ndarray] = {}   # new value -> its data
        folded = 0

        def rewrite(b: GraphBuilder, op: Op, operands: tuple[Operand, ...]) -> tuple[Value, ...] | None:
            nonlocal folded
            inputs = _flatten(operands)
            if self.foldable(op, inputs, constants):
                data = self._evaluate(op, operands, constants)
                if data is not None:
                    folded += 1
                    new = b.op("constant", name=op.result.name, origin=op.origin, data=data,
                               quant=op.result.type.quant)
                    if new.type != op.result.type:
                        raise IRError(f"fold_constants: folding {op.kind} producing %{op.result.name} gave "
                                      f"{new.type}, expected {op.result.type}")
                    constants[new] = data
                    return (new,)
            new = b.emit(op, operands)
            if op.kind == "constant":
                constants[new[0]] = op.attrs["data"]
            return new

        result = rebuild(graph, rewrite)
        return PassResult(result, True) if folded else PassResult(graph, False)

    @staticmethod
    def _evaluate(op: Op, operands: tuple[Operand, ...], constants: dict[Value, np.ndarray]) -> np.ndarray | None:
        """Run ``op`` on the constant data of its (new) operands; None when evaluation fails."""
        probe = Op(op.kind, operands, op.attrs, op.results)
        env = {v: constants[v] for v in _flatten(operands)}
        try:
            run_op(probe, env)
        except ExecutionError:
            return None
        data = env[op.result]
        data.setflags(write=False)  # may be a view of an operand's (read-only) data: both stay immutable
        return data


fold_constants = FoldConstants()
