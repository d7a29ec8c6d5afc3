"""The backend plug-in interface (DESIGN.md "Backends are plug-ins").

A backend answers ``supports(op)`` with a Verdict (users read the reasons),
lowers a partition subgraph to a Payload whose boundary types are the ones the
backend really reads and writes (DESIGN.md rule 6), and executes payloads on
NumPy arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qlower.errors import InputError
from qlower.ir import Graph, Op, TensorType
from qlower.ir.rewrite import Rewrite, Rewritten, apply_rewrites


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""

    @staticmethod
    def yes() -> Verdict:
        return Verdict(True)

    @staticmethod
    def no(reason: str) -> Verdict:
        return Verdict(False, reason)

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class Execution:
    """How a payload runs on this machine when that is not simply the target computing its own
    numbers; reports and ``qlower run`` print it.

    ``kind``: one word, one of the kinds the payload's backend declares (``Backend.execution_kinds``),
    e.g. a partition simulated by another engine, or a runtime known to differ from the reference
    (with the bound in ``detail``).
    """

    kind: str
    detail: str

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind.isidentifier() or len(self.kind) > 40:
            raise ValueError(f"execution kind {str(self.kind)[:40]!r} is not a word")

    @classmethod
    def parse(cls, text: Any) -> Execution:
        """The ``Execution`` a payload's metadata spells ``"<kind>: <detail>"``; ValueError otherwise."""
        if not isinstance(text, str) or ": " not in text:
            raise ValueError(f"execution must be a string '<kind>: <detail>', got {str(text)[:60]!r}")
        kind, detail = text.split(": ", 1)
        return cls(kind, detail)

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class Payload:
    """A lowered partition.

    ``blobs``: the backend's artifacts by file name (e.g. ``"graph.bin"``).
    ``input_types`` / ``output_types``: what the payload really reads and writes,
    in the order of the subgraph's inputs and outputs.
    ``tensor_map``: payload tensor name -> name of the subgraph value it holds,
    so per-layer comparison reaches inside the partition.
    ``meta``: JSON-serialisable facts (profile, op counts, performance estimates); the
    facts behaviour depends on are read through typed views (``execution`` here, the backend's
    own elsewhere), which ``check`` and the backend's ``check_meta`` validate when a program
    file is loaded.
    """

    backend: str
    target: str
    blobs: dict[str, bytes]
    input_types: tuple[TensorType, ...]
    output_types: tuple[TensorType, ...]
    tensor_map: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def execution(self) -> Execution | None:
        """How it runs here, when that is not the target computing its own numbers."""
        text = self.meta.get("execution")
        return None if text is None else Execution.parse(text)

    def check(self) -> str | None:
        """Why the backend-independent views of ``meta`` can't be read (a program file's payload),
        or None; its backend checks the rest (``Backend.check_meta``)."""
        try:
            _ = self.execution
        except ValueError as e:
            return str(e)
        return None


@dataclass(frozen=True)
class LayerCost:
    """One operator of a payload in an estimator's cost report, in execution order."""

    operator: str            # the target's operator
    cycles: int              # what the device spends on it (compute and waiting on memory)
    compute_cycles: int      # its compute part
    value: str = ""          # the IR value it computes ("" for a tensor of the target's own)
    source: str = ""         # that value's model source line
    tensor: str = ""         # the target's name of its output tensor


# The kinds of memory every cost report may state, in bytes, the same for every backend, so reports
# show and total them without knowing the target; a backend may add kinds of its own.
DEVICE_MEMORY = {
    "arena": "read-write memory the runtime must be given for an inference (tensor arena, scratch)",
    "flash": "read-only bytes the device stores (the model, weights, command streams)",
    "sram": "on-chip SRAM in use at peak",
}


@dataclass(frozen=True)
class CostReport:
    """What a payload costs its device per inference, as its backend's estimator says (reports name
    the estimator: these are estimates, or measurements where the estimator is a runtime).
    ``cycles``: None when it estimates no time (memory only). ``memory_bytes``: bytes by kind of
    memory, the ``DEVICE_MEMORY`` kinds it knows and any of its own (e.g. a compiler's regions)."""

    estimator: str
    cycles: int | None
    compute_cycles: int | None
    memory_bytes: dict[str, int] = field(default_factory=dict)
    layers: tuple[LayerCost, ...] = ()
    clock_hz: float | None = None

    @property
    def seconds(self) -> float | None:
        return None if not self.clock_hz or self.cycles is None else self.cycles / self.clock_hz

    @property
    def device_memory(self) -> dict[str, int]:
        """The ``DEVICE_MEMORY`` kinds it states, in that order."""
        return {k: self.memory_bytes[k] for k in DEVICE_MEMORY if k in self.memory_bytes}


# Writes a whole program as one deployable file: (the program's source graph, its partitions'
# payloads, a description to embed) -> the file's bytes; UnsupportedOpError names an op it can't write.
Exporter = Callable[[Graph, Sequence[Payload], str], bytes]


@dataclass(frozen=True)
class HostGraphExporter:
    """An exporter that writes the program as partitioned (a file holding each partition's payload as
    such, e.g. as a compiler's custom operators): ``write(host graph, payloads by partition name, description)``,
    the host graph's ``delegate`` ops naming their partitions. ``Program.export`` calls it so."""

    write: Callable[[Graph, Mapping[str, Payload], str], bytes]


class Backend(ABC):
    """One code generator. ``targets`` lists the target names it compiles for."""

    name: str
    targets: tuple[str, ...]
    # the ``Execution`` kinds this backend's payloads may declare (a program file's others are refused)
    execution_kinds: tuple[str, ...] = ()

    def rewrites(self, target: str) -> Sequence[Rewrite]:
        """The rewrites that give a program for ``target`` its form, in order (the default: none).

        A backend whose kernels compute an op's numbers one definite way may give the graph's ops
        that meaning (the rounding of its fused requantization), or choose a cheaper form (a mean's
        form, an interpolated table). Each rewrite declares its bound against the
        graph it receives (``qlower.ir.rewrite``); ``lower_graph`` verifies the IR after each and the
        program keeps both forms, so verification compares the target with its own form (exactly)
        and that form with the canonical program (within the declared bounds).

        A backend that overrides ``rewrite`` instead (the contract before declared rewrites) gets
        that one rewrite, declaring nothing: it is checked as exact."""
        if type(self).rewrite is not Backend.rewrite:
            return (_Undeclared(self, target),)
        return ()

    def rewrite(self, graph: Graph, target: str) -> Graph:
        """The graph a program for ``target`` means, before partitioning: ``graph`` through
        ``rewrites(target)``, each verified (the result is the program's source)."""
        return apply_rewrites(graph, self.rewrites(target))[0]

    @abstractmethod
    def supports(self, op: Op, target: str) -> Verdict:
        """Whether ``op`` (with its operand and result types) can run in this backend."""

    @abstractmethod
    def lower(self, subgraph: Graph, target: str, trace: bool = False) -> Payload:
        """Compile a partition subgraph (its constants included as constant ops).

        With ``trace``, the payload also lets ``execute_traced`` read the tensors
        of ``tensor_map`` (for per-layer verification); it may be larger."""

    @abstractmethod
    def execute(self, payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run a payload; inputs and outputs have the payload's boundary types."""

    @classmethod
    def exporters(cls, target: str) -> Mapping[str, Exporter | HostGraphExporter]:
        """The file formats a program compiled for ``target`` exports to (``Program.export``), format
        name -> exporter. The default: none of its own (a format some backend writes for programs
        of any target still applies, see ``qlower.backends.registry.exporter_for``)."""
        return {}

    @classmethod
    def export_note(cls, target: str, format: str, source: Graph) -> str:
        """One line for the user about the file its ``format`` exporter writes of ``source`` (what
        runs it, whether it computes the program's numbers exactly); default: the format's name."""
        return format

    @classmethod
    def cost_report(cls, payload: Payload) -> CostReport | None:
        """What ``payload`` costs its device, when this backend's compiler estimates it (default:
        None); ValueError when its metadata (a program file's) can't be read as one."""
        return None

    def check_meta(self, payload: Payload) -> str | None:
        """Why the typed facts of ``payload``'s metadata, read from a program file, can't be read
        (run before ``check_loaded``); None when they can. The default checks the execution kind
        against ``execution_kinds``; a backend whose execution reads more of ``meta`` checks it too."""
        problem = payload.check()
        if problem is None and payload.execution is not None and payload.execution.kind not in self.execution_kinds:
            problem = (f"execution kind {payload.execution.kind!r} is not one of the kinds backend {self.name!r} "
                       f"declares ({', '.join(self.execution_kinds) or 'none'})")
        return problem

    @abstractmethod
    def check_loaded(self, subgraph: Graph, payload: Payload) -> str | None:
        """Why ``payload``, read from a program file, must not run as the lowering of ``subgraph``;
        None when it may.

        A file's payload bytes reach native code (reference models, interpreters, drivers) that
        may crash on bytes it did not expect, and a checksum stops accidents, not forgers. So a
        backend accepts only what it would emit itself for ``subgraph`` (re-lowering when that is
        cheap) or what its own validation proves harmless to execute."""

    @abstractmethod
    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        """Run a payload and also return the named internal tensors (keys of ``tensor_map``).

        A backend returns what it can see: the tensors of the payload it can't look inside are
        simply absent (per-layer verification then shows no target column for them).
        """

    def prepare(self, graph: Graph) -> None:
        """Called with the whole graph before partitioning it, so that ``supports`` may judge an
        op by facts beyond its own types (the graph's inputs, outputs and constant data). The
        default needs none."""
        return None


class _Undeclared(Rewrite):
    """A backend's own ``rewrite`` override as a rewrite that declares no change (exact)."""

    steps = 0
    what = "the backend's rewrite (it declares no bound: checked as exact)"

    def __init__(self, backend: Backend, target: str):
        self.backend, self.target = backend, target
        self.name = f"{backend.name}.rewrite"

    def apply(self, graph: Graph) -> Rewritten:
        return Rewritten(self.backend.rewrite(graph, self.target))


def boundary_types_problem(subgraph: Graph, payload: Payload) -> str | None:
    """Why a loaded ``payload``'s declared input/output types are not its ``subgraph``'s, or None. A
    .tflite holds scales and zero points but no codes' range, so a widened range passes every byte check."""
    for side, declared, values in (("input", payload.input_types, subgraph.inputs),
                                   ("output", payload.output_types, subgraph.outputs)):
        if len(declared) != len(values):
            return f"its boundary types differ from its subgraph's: {len(declared)} {side}s, the subgraph has {len(values)}"
        for i, (t, v) in enumerate(zip(declared, values)):
            if t != v.type:
                return (f"its boundary types differ from its subgraph's: {side} #{i} is declared {t}, the subgraph's "
                        f"%{v.name} is {v.type} (a .tflite holds no codes' range to tell)")
    return None


def check_payload_inputs(payload: Payload, inputs: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
    """``inputs`` as contiguous arrays of the payload's input types (float inputs converted);
    an InputError naming ``what`` (e.g. "the partition") and the input otherwise."""
    types = payload.input_types
    if len(inputs) != len(types):
        raise InputError(f"{what} takes {len(types)} input(s), got {len(inputs)}")
    out = []
    for i, (x, t) in enumerate(zip(inputs, types)):
        x = np.asarray(x)
        if tuple(x.shape) != t.shape:
            raise InputError(f"input {i} of {what} has shape {tuple(x.shape)}, expected {t.shape}")
        if x.dtype != t.dtype.numpy:
            if not (t.dtype.is_float and x.dtype.kind == "f"):
                raise InputError(f"input {i} of {what} has dtype {x.dtype}, expected {t.dtype.numpy}")
            x = x.astype(t.dtype.numpy)
        out.append(np.ascontiguousarray(x))
    return out


def check_codes(x: np.ndarray, t: TensorType, what: str) -> None:
    """An InputError unless the integer array ``x``, given to ``Program.run`` for a graph input of type
    ``t``, holds only codes in ``t``'s [qmin, qmax]: the range the program was compiled and verified
    for (a matmul's int32 bound, a table's domain), outside which a target may wrap where the
    reference refuses. The message names ``what``, the first offending code, its index and the range.
    Float arrays (the program quantizes them itself) and arrays whose dtype has no code outside the
    range pass without a look: otherwise one min and one max over the array. (A payload called
    directly keeps its own meaning of such codes, e.g. a table's nearest entry.)"""
    q = t.quant
    if q is None or x.dtype.kind not in "iu" or not x.size:
        return
    if x.dtype == t.dtype.numpy and (q.qmin, q.qmax) == (t.dtype.min, t.dtype.max):
        return
    low, high = x.min(), x.max()
    if low >= q.qmin and high <= q.qmax:
        return
    flat = int(np.argmin(x)) if low < q.qmin else int(np.argmax(x))
    index = tuple(int(j) for j in np.unravel_index(flat, x.shape))
    bounds = f"[{q.qmin}, {q.qmax}]"
    if (q.qmin, q.qmax) == (t.dtype.min, t.dtype.max):
        bounds = f"{t.dtype.value} {bounds}"
    raise InputError(f"{what} holds {x.flat[flat]} at index {index}, outside {bounds}, the codes of its type {t} "
                     f"that the program was verified for; clamp the input to that range (or pass floats where "
                     f"the program quantizes them)")
