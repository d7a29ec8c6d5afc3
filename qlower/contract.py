"""The backend plug-in interface (DESIGN.md "Backends are plug-ins").

A backend answers ``supports(op)`` with a Verdict (users read the reasons),
lowers a partition subgraph to a Payload whose boundary types are the ones the
backend really reads and writes (DESIGN.md rule 6), and executes payloads on
NumPy arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
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


EXECUTION_KINDS = ("simulated", "vulkan", "approximate")


@dataclass(frozen=True)
class Execution:
    """How a payload runs on this machine when that is not simply the target computing its own
    numbers; reports and ``qlower run`` print it.

    ``kind``: "simulated" (another engine computes the target's numbers, e.g. an Ethos-U
    partition on the TOSA reference model), "vulkan" (a VGF on a Vulkan device) or
    "approximate" (a runtime known to differ from the reference, with the bound in ``detail``).
    """

    kind: str
    detail: str

    def __post_init__(self) -> None:
        if self.kind not in EXECUTION_KINDS:
            raise ValueError(f"execution kind {self.kind[:40]!r} is not one of {', '.join(EXECUTION_KINDS)}")

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
class TosaTensors:
    """The tensor names of a TOSA graph's inputs and outputs, and of the intermediates its trace
    graph appends to the outputs (``trace.tosa``), in order."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    trace: tuple[str, ...] = ()

    @classmethod
    def of(cls, meta: Any, n_inputs: int, n_outputs: int) -> TosaTensors:
        """From a TOSA payload's metadata; ValueError unless it names one tensor per boundary value."""
        if not isinstance(meta, dict):
            raise ValueError("the TOSA metadata is not an object")
        names = []
        for key in ("input_tensors", "output_tensors", "trace_outputs"):
            value = meta.get(key, [])
            if not isinstance(value, (list, tuple)) or not all(isinstance(n, str) for n in value):
                raise ValueError(f"TOSA {key} must be a list of names")
            names.append(tuple(value))
        if (len(names[0]), len(names[1])) != (n_inputs, n_outputs):
            raise ValueError(f"the TOSA graph names {len(names[0])} inputs and {len(names[1])} outputs, the "
                             f"payload has {n_inputs} and {n_outputs}")
        return cls(*names)


@dataclass(frozen=True)
class Payload:
    """A lowered partition.

    ``blobs``: the backend's artifacts by file name (e.g. ``"graph.tosa"``).
    ``input_types`` / ``output_types``: what the payload really reads and writes,
    in the order of the subgraph's inputs and outputs.
    ``tensor_map``: payload tensor name -> name of the subgraph value it holds,
    so per-layer comparison reaches inside the partition.
    ``meta``: JSON-serialisable facts (profile, op counts, performance estimates); the
    facts behaviour depends on are read through the typed views below, which ``check``
    validates when a program file is loaded.
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

    @property
    def tosa_meta(self) -> dict[str, Any]:
        """The metadata of the TOSA graph this payload runs: its own for a TOSA payload, the
        nested ``meta["tosa"]`` for a payload that wraps one (Ethos-U, VGF)."""
        return self.meta if self.backend == "tosa" else self.meta.get("tosa", {})

    @property
    def tosa_tensors(self) -> TosaTensors:
        return TosaTensors.of(self.tosa_meta, len(self.input_types), len(self.output_types))

    def check(self) -> str | None:
        """Why the typed views of ``meta`` can't be read (a program file's payload), or None."""
        try:
            _ = self.execution
            if self.backend == "tosa" or "tosa" in self.meta:
                _ = self.tosa_tensors
        except ValueError as e:
            return str(e)
        return None


class Backend(ABC):
    """One code generator. ``targets`` lists the target names it compiles for."""

    name: str
    targets: tuple[str, ...]

    def rewrites(self, target: str) -> Sequence[Rewrite]:
        """The rewrites that give a program for ``target`` its form, in order (the default: none).

        A backend whose kernels compute an op's numbers one definite way may give the graph's ops
        that meaning (LiteRT: the rounding of its fused requantization), or choose a cheaper form
        (Ethos-U: a mean's form, an interpolated table). Each rewrite declares its bound against the
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


def check_payload_inputs(payload: Payload, inputs: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
    """``inputs`` as contiguous arrays of the payload's input types (float inputs converted);
    an InputError naming ``what`` (e.g. "the TOSA partition") and the input otherwise."""
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
