"""Running a partitioned program: host ops on a host executor, delegates on their backends."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qlower.backends.base import Backend
from qlower.errors import ExecutionError
from qlower.ir import Graph, Value
from qlower.partition import Partition
from qlower.reference import check_inputs, run_op


class Runner:
    """Executes a host graph whose ``delegate`` ops call compiled partitions.

    Host ops run on the reference interpreter's kernels (exact by definition).
    """

    def __init__(self, host: Graph, partitions: Sequence[Partition], backends: dict[str, Backend]) -> None:
        self.host = host
        self.partitions = {p.name: p for p in partitions}
        self.backends = backends

    def _run_delegate(self, op, env: dict[Value, np.ndarray], traces: dict[str, dict] | None) -> None:
        part = self.partitions[op.attrs["partition"]]
        backend = self.backends[part.backend]
        args = [env[v] for v in op.input_values()]
        if traces is not None:
            inner = backend.execute_traced(part.payload, args, list(part.payload.tensor_map))
            traces[part.name] = inner
        outs = backend.execute(part.payload, args)
        if len(outs) != len(op.results):
            raise ExecutionError(f"partition {part.name} returned {len(outs)} outputs, expected {len(op.results)}")
        for r, a in zip(op.results, outs):
            a = np.asarray(a)
            if a.dtype != r.type.dtype.numpy or tuple(a.shape) != r.shape:
                raise ExecutionError(f"partition {part.name} wrote {a.dtype}{list(a.shape)} for %{r.name}, "
                                     f"its boundary type is {r.type}")
            env[r] = a

    def run(self, inputs: Sequence[np.ndarray], trace: bool = False):
        env: dict[Value, np.ndarray] = dict(zip(self.host.inputs, check_inputs(self.host, inputs)))
        traces: dict[str, dict] | None = {} if trace else None
        for op in self.host.ops:
            if op.kind == "delegate":
                self._run_delegate(op, env, traces)
            else:
                run_op(op, env)
        outs = [env[v] for v in self.host.outputs]
        return (outs, env, traces) if trace else outs
