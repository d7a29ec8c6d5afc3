"""Compile an IR graph into a CpuPlan: a list of prepared kernel closures, then run it.

``prepare`` builds one kernel per op (weights packed here, once, through the
weights cache), fuses the chains listed in fusion.py, and lays the steps out on
slots so that a run is a loop over closures that frees each intermediate after
its last use. ``run`` executes the fused steps; ``run_traced`` executes the same
steps and returns every value they materialize (per-layer verification measures
what runs), or with ``each_op`` every op with its own kernel (kernel tests).
Both are bit-exact with ``qlower.reference.run_graph`` for integer values.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from qlower.backends.cpu import (  # noqa: F401
    aten_fallback,
    conv,
    data_movement,
    dynamic,
    elementwise,
    gemm,
    pooling,
    quantization,
    reductions,
)
from qlower.backends.cpu import native as native_mod
from qlower.backends.cpu.context import BuildContext, Kernel, build_kernel
from qlower.backends.cpu.conv import DirectConv, GemmConv
from qlower.backends.cpu.fusion import FusedGroup, find_groups
from qlower.backends.cpu.tensor_utils import execution_error, to_tensor, torch_dtype
from qlower.backends.threads import check_threads, torch_threads
from qlower.errors import ExecutionError, QlowerError, UnsupportedOpError
from qlower.ir import Graph, Op, Value
from qlower.reference import check_inputs

Delegate = Callable[[list[np.ndarray]], Sequence[np.ndarray]]
ArgSpec = int | None | tuple[int, ...]


@dataclass(frozen=True)
class Step:
    kernel: Kernel
    args: tuple[ArgSpec, ...]
    outs: tuple[int, ...]
    ops: tuple[Op, ...]
    free: tuple[int, ...] = ()


def _delegate_kernel(op: Op, delegates: Mapping[str, Delegate] | None) -> Kernel:
    name = op.attrs["partition"]
    if delegates is None or name not in delegates:
        raise UnsupportedOpError(f"delegate call to partition '{name}' needs an executor: pass "
                                 f"delegates={{'{name}': fn}} to qlower.backends.cpu.prepare")
    fn, types = delegates[name], op.attrs["out_types"]

    def run(xs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        outs = list(fn([read_only(x.numpy()) for x in xs]))   # the executor reads values the plan may still use
        problem = partition_outputs_problem(name, outs, types)
        if problem is not None:
            raise execution_error(op, problem)
        return tuple(to_tensor(np.asarray(y)) for y in outs)
    return run


def read_only(x: np.ndarray) -> np.ndarray:
    """A view of ``x`` that can't write it (what a partition's executor is handed)."""
    view = x.view()
    view.flags.writeable = False
    return view


def partition_outputs_problem(name: str, outs: Sequence, types: Sequence) -> str | None:
    """Why the arrays partition ``name`` returned are not of its declared output ``types``; None when they are."""
    if len(outs) != len(types):
        return f"partition '{name}' returned {len(outs)} arrays, expected {len(types)}"
    for i, (y, t) in enumerate(zip(outs, types)):
        y = np.asarray(y)
        if tuple(y.shape) != t.shape or y.dtype != t.dtype.numpy:
            return f"partition '{name}' output {i} is {y.dtype}{list(y.shape)}, expected {t}"
    return None


class CpuPlan:
    """A graph compiled for the CPU. Thread-safe to run concurrently (kernels hold no run state)."""

    def __init__(self, graph: Graph, threads: int | None, kernels: dict[Op, Kernel], groups: list[FusedGroup],
                 native: bool, uses_float32: bool = False) -> None:
        self.graph = graph
        self.threads = threads
        self.native = native
        self.fused = [g.label for g in groups]
        self.uses_float32 = uses_float32
        self._slot: dict[Value, int] = {v: i for i, v in enumerate(graph.values())}
        self._template: list[torch.Tensor | None] = [None] * len(self._slot)
        self._constants: set[int] = set()
        for op in graph.ops:
            if op.kind == "constant":
                i = self._slot[op.result]
                self._template[i] = kernels[op]()
                self._constants.add(i)
        position = {op: i for i, op in enumerate(graph.ops)}
        by_last = {max(position[o] for o in g.ops): g for g in groups}
        in_group = {o for g in groups for o in g.ops}
        steps, trace_steps = [], []
        for i, op in enumerate(graph.ops):
            if op.kind == "constant":
                continue
            trace_steps.append(self._step(kernels[op], op.operands, op.results, (op,)))
            if i in by_last:
                g = by_last[i]
                steps.append(self._step(g.kernel, g.inputs, g.outputs, g.ops))
            elif op not in in_group:
                steps.append(trace_steps[-1])
        self._fused_steps = steps
        self._steps = self._with_frees(steps)
        # torch's thread count is process-wide and setting it reshapes OpenMP's pool (hundreds of µs): a
        # plan whose every step hands its values to another runtime (a program that is one partition) keeps it
        self._host_compute = any(op.kind != "delegate" for s in steps for op in s.ops)
        self._trace_steps = trace_steps
        self._value_of = {i: v for v, i in self._slot.items()}

    def _spec(self, operand) -> ArgSpec:
        if operand is None:
            return None
        if isinstance(operand, tuple):
            return tuple(self._slot[v] for v in operand)
        return self._slot[operand]

    def _step(self, kernel: Kernel, operands, results, ops) -> Step:
        return Step(kernel, tuple(self._spec(o) for o in operands), tuple(self._slot[v] for v in results), ops)

    def _with_frees(self, steps: list[Step]) -> list[Step]:
        keep = {self._slot[v] for v in self.graph.outputs} | self._constants
        last: dict[int, int] = {}
        for i, s in enumerate(steps):
            for a in s.args:
                for slot in (a if isinstance(a, tuple) else () if a is None else (a,)):
                    last[slot] = i
        frees: dict[int, list[int]] = {}
        for slot, i in last.items():
            if slot not in keep:
                frees.setdefault(i, []).append(slot)
        return [Step(s.kernel, s.args, s.outs, s.ops, tuple(frees.get(i, ()))) for i, s in enumerate(steps)]

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        with torch_threads(self.threads if self._host_compute else None), torch.inference_mode():
            yield

    def _start(self, inputs: Sequence[np.ndarray]) -> list[torch.Tensor | None]:
        env = list(self._template)
        for v, x in zip(self.graph.inputs, check_inputs(self.graph, inputs)):
            env[self._slot[v]] = to_tensor(x)
        return env

    def _execute(self, steps: list[Step], env: list[torch.Tensor | None], check_types: bool) -> None:
        for step in steps:
            args = [None if a is None else [env[j] for j in a] if isinstance(a, tuple) else env[a] for a in step.args]
            try:
                res = step.kernel(*args)
            except QlowerError:
                raise
            except (RuntimeError, ValueError, ArithmeticError, IndexError) as e:
                raise execution_error(step.ops[-1], f"{type(e).__name__}: {e}") from e
            if isinstance(res, torch.Tensor):
                res = (res,)
            for slot, t in zip(step.outs, res):
                env[slot] = t
                value = self._value_of[slot]
                if check_types and (tuple(t.shape) != value.shape or t.dtype != torch_dtype(value.dtype)):
                    raise ExecutionError(f"cpu kernel for {step.ops[-1].kind} produced {t.dtype}{list(t.shape)} "
                                         f"for %{value.name}, typed {value.type}")
            for slot in step.free:
                env[slot] = None

    def _check_float32(self) -> None:
        if self.uses_float32 and not gemm.float32_is_ieee():
            raise ExecutionError("this plan computes exact integer sums with float32 GEMMs, but torch's float32 "
                                 "matmul/conv precision was lowered after prepare (bf16/tf32 would round): restore "
                                 "torch.set_float32_matmul_precision('highest') or prepare the graph again")

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the graph; raises InputError naming the input when ``inputs`` don't match it."""
        self._check_float32()
        env = self._start(inputs)
        with self._threads():
            self._execute(self._steps, env, check_types=False)
        return [np.array(env[self._slot[v]].numpy(), copy=True) for v in self.graph.outputs]

    def run_profiled(self, inputs: Sequence[np.ndarray]) -> list[tuple[str, float, float]]:
        """Run the steps ``run`` executes, timing each: ``(label, wall seconds, process CPU seconds)``
        per step in order, the label being its ops' kinds joined by '+' (e.g. ``conv2d+rescale+clamp``).
        Process CPU time counts every thread of the process (OpenMP workers included)."""
        self._check_float32()
        env = self._start(inputs)
        times = []
        with self._threads():
            for step in self._steps:
                w0, c0 = time.perf_counter(), time.process_time()
                self._execute([step], env, check_types=False)
                times.append(("+".join(op.kind for op in step.ops), time.perf_counter() - w0,
                              time.process_time() - c0))
        return times

    def trace_names(self) -> dict[Value, str]:
        """The key of each value in ``run_traced``: its name, or ``name#k`` for the k-th repeat of a name."""
        seen: dict[str, int] = {}
        names = {}
        for v in self._slot:
            k = seen.get(v.name, 0)
            seen[v.name] = k + 1
            names[v] = v.name if k == 0 else f"{v.name}#{k}"
        return names

    def run_traced(self, inputs: Sequence[np.ndarray], each_op: bool = False) -> dict[str, np.ndarray]:
        """IR values keyed as ``trace_names`` says, every result checked against its IR type.

        By default the steps ``run`` executes (fused kernels included): the values they
        materialize, inputs and constants included; a value inside a fused kernel never exists
        and is absent. With ``each_op``, every op runs by its own kernel and every value is there
        (for testing kernels one by one; not what ``run`` executes)."""
        self._check_float32()
        env = self._start(inputs)
        with self._threads():
            self._execute(self._trace_steps if each_op else self._fused_steps, env, check_types=True)
        return {name: np.array(env[self._slot[v]].numpy(), copy=True) for v, name in self.trace_names().items()
                if env[self._slot[v]] is not None}


def prepare(graph: Graph, threads: int | None = None, *, gemm_engine: str | None = None,
            native: bool = True, fuse: bool = True, delegates: Mapping[str, Delegate] | None = None) -> CpuPlan:
    """Compile ``graph`` for the CPU.

    ``threads``: torch intra-op threads for each run (None: leave as is).
    ``gemm_engine``: force "int8", "float32" or "float64" integer GEMMs where exact (tests).
    ``native``: use the compiled C kernels when they can be built.
    ``fuse``: run op chains as fused kernels (fusion.py).
    ``delegates``: executors for ``delegate`` ops, by partition name.
    """
    threads = check_threads(threads)
    ctx = BuildContext(graph, native=native_mod.load() if native else None, gemm_engine=gemm_engine)
    kernels: dict[Op, Kernel] = {}
    for op in graph.ops:
        kernels[op] = _delegate_kernel(op, delegates) if op.kind == "delegate" else build_kernel(op, ctx)
    groups = find_groups(graph, kernels, ctx) if fuse else []
    return CpuPlan(graph, threads, kernels, groups, ctx.native is not None, _uses_float32(kernels.values()))


def _uses_float32(kernels) -> bool:
    """Whether an integer kernel sums in float32 (its exactness needs IEEE float32 GEMMs)."""
    for k in kernels:
        if isinstance(k, GemmConv | DirectConv):
            packed = k.packed  # None: weights packed at run time, which may pick float32
            if packed is None or getattr(packed, "engine", getattr(packed, "mode", None)) == "float32":
                return True
    return False
