"""The ``cpu`` backend plug-in: every op kind except ``delegate`` runs on the host kernels.

The CPU doesn't lower partitions to payloads: the program layer runs the host
graph itself with ``qlower.backends.cpu.prepare``, so ``lower`` and ``execute``
say so instead of producing a payload.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qlower.backends.cpu.context import BUILDERS
from qlower.contract import Backend, Payload, Verdict
from qlower.ir import DType, Graph, Op

_DIRECT = "cpu runs the host graph directly: use qlower.backends.cpu.prepare(graph)"


class CpuBackend(Backend):
    name = "cpu"
    targets = ("cpu",)

    def supports(self, op: Op, target: str = "cpu") -> Verdict:
        if target not in self.targets:
            return Verdict.no(f"the cpu backend compiles for target 'cpu', not '{target}'")
        if op.kind == "delegate":
            return Verdict.no("a delegate call runs a compiled partition; the host calls its executor")
        if op.kind not in BUILDERS:
            return Verdict.no(f"no cpu kernel for '{op.kind}'")
        if op.kind == "cast" and op.result.dtype is DType.BOOL:
            return Verdict.no("cast to bool is not supported")
        if op.kind == "clamp" and op.result.dtype.is_integer and not all(
                float(op.attrs[k]).is_integer() for k in ("min", "max")):
            return Verdict.no("clamp of integer codes needs integer bounds")
        return Verdict.yes()

    def lower(self, subgraph: Graph, target: str) -> Payload:
        raise NotImplementedError(_DIRECT)

    def check_loaded(self, subgraph: Graph, payload: Payload) -> str | None:
        return "cpu programs have no partitions: the host graph runs on the cpu kernels"

    def execute(self, payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError(_DIRECT)

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        raise NotImplementedError(_DIRECT)
