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
class Payload:
    """A lowered partition.

    ``blobs``: the backend's artifacts by file name (e.g. ``"graph.tosa"``).
    ``input_types`` / ``output_types``: what the payload really reads and writes,
    in the order of the subgraph's inputs and outputs.
    ``tensor_map``: payload tensor name -> name of the subgraph value it holds,
    so per-layer comparison reaches inside the partition.
    ``meta``: JSON-serialisable facts (profile, op counts, performance estimates).
    """

    backend: str
    target: str
    blobs: dict[str, bytes]
    input_types: tuple[TensorType, ...]
    output_types: tuple[TensorType, ...]
    tensor_map: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class Backend(ABC):
    """One code generator. ``targets`` lists the target names it compiles for."""

    name: str
    targets: tuple[str, ...]

    def rewrite(self, graph: Graph, target: str) -> Graph:
        """The graph a program for ``target`` means, before partitioning (the default: ``graph``).

        A backend whose kernels compute an op's numbers one definite way may give the graph's ops
        that meaning here (LiteRT: the rounding of its fused requantization); the result is the
        program's source, so the reference interpreter computes the same numbers."""
        return graph

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

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        """Run a payload and also return the named internal tensors (keys of ``tensor_map``).

        Backends that can't look inside a payload return only what they can.
        """
        return {}


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
