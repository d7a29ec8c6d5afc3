"""Running programs: the reference interpreter for target ``reference``, and for partitioned
programs host ops on the CPU plan with delegates calling their backends.

A traced run (for per-layer verification) executes exactly what ``run`` executes: the same
plan, fused kernels included, and the same payloads; it only keeps the values the plan
materializes and asks each backend for the tensors inside its partition as well.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence

import numpy as np

from qlower.contract import Backend
from qlower.errors import ExecutionError
from qlower.ir import Graph
from qlower.partition import Partition
from qlower.reference import check_inputs, run_graph

# the partition traces of the traced run under way in this thread (None: a plain run)
_TRACES: contextvars.ContextVar[dict[str, dict[str, np.ndarray]] | None] = contextvars.ContextVar(
    "qlower_partition_traces", default=None)


class ReferenceRunner:
    """Target ``reference``: the reference interpreter runs the program (the definition of every
    op, not a fast twin of it); ``threads`` don't apply."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return run_graph(self.graph, inputs)

    def run_traced(self, inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        _, env = run_graph(self.graph, inputs, keep_all=True)
        return {v.name: a for v, a in env.items()}


class Runner:
    """Executes a host graph whose ``delegate`` ops call compiled partitions: host ops on the CPU
    backend's kernels (bit-exact with the reference), delegates on the partitions' backends."""

    def __init__(self, host: Graph, partitions: Sequence[Partition], backends: dict[str, Backend],
                 threads: int | None = None) -> None:
        self.host = host
        self.partitions = {p.name: p for p in partitions}
        self.backends = backends
        self.threads = threads
        self._plan = None
        self._whole = self._whole_program()

    def _whole_program(self) -> Partition | None:
        """The partition when the host graph is one call of it on the graph's inputs, returning its outputs
        in order: then a run hands the inputs straight to its backend (the host plan would only pass them
        through, at tens of µs a call, which is a few per cent of a small model on an NPU or XNNPACK)."""
        ops = [op for op in self.host.ops if op.kind != "constant"]
        if len(ops) != 1 or ops[0].kind != "delegate":
            return None
        op = ops[0]
        operands = [v for o in op.operands for v in (o if isinstance(o, tuple) else (o,))]   # variadic
        if operands != list(self.host.inputs) or list(op.results) != list(self.host.outputs):
            return None
        return self.partitions.get(op.attrs["partition"])

    def _executor(self, part: Partition):
        backend = self.backends[part.backend]

        def execute(arrays: list[np.ndarray]) -> list[np.ndarray]:
            traces = _TRACES.get()
            if traces is not None:   # a traced run: also read the tensors inside the partition
                traces[part.name] = backend.execute_traced(part.payload, arrays, list(part.payload.tensor_map))
            return backend.execute(part.payload, arrays)
        return execute

    def _cpu_plan(self):
        if self._plan is None:
            from qlower.backends.cpu import prepare

            self._plan = prepare(self.host, threads=self.threads,
                                 delegates={name: self._executor(p) for name, p in self.partitions.items()})
        return self._plan

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self._whole is not None:
            return self._run_whole(self._whole, inputs)
        return self._cpu_plan().run(inputs)

    def _run_whole(self, part: Partition, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """What the plan computes for a one-call host graph, with the plan's checks: inputs as the graph
        types them (InputError naming the input), read-only to the backend, outputs of the declared types."""
        from qlower.backends.cpu.plan import partition_outputs_problem, read_only

        arrays = [read_only(x) for x in check_inputs(self.host, inputs)]
        outs = list(self.backends[part.backend].execute(part.payload, arrays))
        problem = partition_outputs_problem(part.name, outs, [v.type for v in self.host.outputs])
        if problem is not None:
            raise ExecutionError(problem)
        return [np.array(y, copy=True) for y in outs]   # the caller's own, as the plan returns them

    def run_traced(self, inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """What ``run`` computes, by value name: every value the host plan materializes (values
        inside a fused kernel don't exist, so they are absent) and, through each payload's tensor
        map, the tensors its backend exposes inside the partition."""
        traces: dict[str, dict[str, np.ndarray]] = {}
        token = _TRACES.set(traces)
        try:
            named = self._cpu_plan().run_traced(inputs)
        finally:
            _TRACES.reset(token)
        for name, inner in traces.items():
            tensor_map = self.partitions[name].payload.tensor_map
            for tensor, array in inner.items():
                value_name = tensor_map.get(tensor)
                if value_name is not None:
                    named[value_name] = array
        return named
