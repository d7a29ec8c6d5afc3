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

    Host ops run on the CPU backend's kernels (bit-exact with the reference; the
    delegate ops call back into the partitions' backends). A traced run uses the
    reference interpreter's kernels for host ops and records every value,
    including those inside partitions, for per-layer verification.
    """

    def __init__(self, host: Graph, partitions: Sequence[Partition], backends: dict[str, Backend],
                 threads: int | None = None) -> None:
        self.host = host
        self.partitions = {p.name: p for p in partitions}
        self.backends = backends
        self.threads = threads
        self._plan = None

    def _executor(self, part: Partition):
        backend = self.backends[part.backend]
        return lambda arrays: backend.execute(part.payload, arrays)

    def _cpu_plan(self):
        if self._plan is None:
            from qlower.backends.cpu import prepare

            self._plan = prepare(self.host, threads=self.threads,
                                 delegates={name: self._executor(p) for name, p in self.partitions.items()})
        return self._plan

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
        if not trace:
            return self._cpu_plan().run(inputs)
        env: dict[Value, np.ndarray] = dict(zip(self.host.inputs, check_inputs(self.host, inputs)))
        traces: dict[str, dict] | None = {} if trace else None
        for op in self.host.ops:
            if op.kind == "delegate":
                self._run_delegate(op, env, traces)
            else:
                run_op(op, env)
        outs = [env[v] for v in self.host.outputs]
        return (outs, env, traces) if trace else outs
