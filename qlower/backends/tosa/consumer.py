"""The base of backends that compile a TOSA graph for an accelerator (Ethos-U through Vela, VGF).

Such a backend lowers a partition with the TOSA backend first, hands ``graph.tosa`` to the
accelerator's compiler, and packages both: its payload keeps the TOSA graph (and trace graph)
beside the compiler's files, the TOSA metadata nested under ``meta["tosa"]``. Where the
accelerator can't run here, the same TOSA graph runs on the TOSA reference model and the
payload's ``Execution`` says "simulated". A loaded payload is checked the TOSA way: its TOSA
graph must be exactly qlower's lowering of the subgraph. A new TOSA-consuming compiler is a
subclass with ``tosa_profile``, ``lower`` (TOSA, then its compiler, then ``wrap``) and the
names of the blobs its compiler writes.
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from qlower.backends.tosa.backend import GRAPH_BLOB, TRACE_BLOB, TosaBackend
from qlower.backends.tosa.tensors import tensors_problem, tosa_meta
from qlower.contract import Backend, Execution, Payload
from qlower.errors import ExecutionError
from qlower.ir import Graph, TensorType

SIMULATOR = "TOSA reference model"
SIMULATED = "simulated"   # the execution kind of a payload run on SIMULATOR


def simulated(reason: str | None = None) -> Execution:
    """The execution of a payload whose TOSA graph runs on the TOSA reference model instead."""
    return Execution(SIMULATED, SIMULATOR + (f" (reason: {reason})" if reason else ""))


class TosaConsumer(Backend):
    """A backend whose payloads wrap a TOSA payload (see the module docstring)."""

    title: str                                    # the accelerator, for messages ("Ethos-U", "VGF")
    execution_kinds: tuple[str, ...] = (SIMULATED,)
    compiler_blobs: tuple[str, ...] = ()          # what its compiler writes beside graph.tosa

    @functools.cached_property
    def tosa(self) -> TosaBackend:
        """The TOSA backend this one lowers through (and simulates on)."""
        return TosaBackend()

    @abstractmethod
    def tosa_profile(self, target: str) -> str:
        """The TOSA profile (a TOSA backend target) the accelerator ``target`` consumes."""

    def wrap(self, target: str, tosa: Payload, blobs: dict[str, bytes], input_types: tuple[TensorType, ...],
             output_types: tuple[TensorType, ...], meta: dict[str, Any]) -> Payload:
        """The payload: the TOSA graph (and its trace graph) with the compiler's ``blobs``, the
        boundary types the compiler really reads and writes, ``meta`` with the TOSA metadata nested."""
        kept = {name: tosa.blobs[name] for name in (GRAPH_BLOB, TRACE_BLOB) if name in tosa.blobs}
        return Payload(self.name, target, {**kept, **blobs}, input_types, output_types, dict(tosa.tensor_map),
                       {**meta, "tosa": tosa.meta})

    def tosa_part(self, payload: Payload) -> Payload:
        """The TOSA payload inside ``payload`` (what the TOSA reference model runs)."""
        if GRAPH_BLOB not in payload.blobs:
            raise ExecutionError(f"the {self.title} payload for {payload.target} has no {GRAPH_BLOB} to simulate it "
                                 "with; recompile the program")
        blobs = {name: payload.blobs[name] for name in (GRAPH_BLOB, TRACE_BLOB) if name in payload.blobs}
        return Payload(self.tosa.name, self.tosa_profile(payload.target), blobs, payload.input_types,
                       payload.output_types, dict(payload.tensor_map), dict(tosa_meta(payload)))

    def check_meta(self, payload: Payload) -> str | None:
        """Also the names of the nested TOSA graph's tensors, which simulation reads."""
        return super().check_meta(payload) or tensors_problem(payload)

    def check_loaded(self, subgraph: Graph, payload: Payload) -> str | None:
        """Every blob must be there, and the TOSA graph that may run here must be exactly qlower's
        lowering of ``subgraph`` (the compiler's files are only written out or run in a process
        of their own, never parsed by native code in this one)."""
        missing = [b for b in (GRAPH_BLOB, *self.compiler_blobs) if b not in payload.blobs]
        if missing:
            return f"the {self.title} payload has no {', '.join(missing)}"
        return self.check_loaded_tosa(subgraph, self.tosa_part(payload))

    def check_loaded_tosa(self, subgraph: Graph, tosa: Payload) -> str | None:
        """Whether ``tosa`` is what ``lower`` makes of ``subgraph`` (a backend that rewrites the
        subgraph before lowering it says so here)."""
        return self.tosa.check_loaded(subgraph, tosa)

    def execute(self, payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Simulated: the partition's TOSA graph on the TOSA reference model."""
        return self.tosa.execute(self.tosa_part(payload), inputs)

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        return self.tosa.execute_traced(self.tosa_part(payload), inputs, tensors)
