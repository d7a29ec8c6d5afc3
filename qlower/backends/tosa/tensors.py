"""The boundary and trace tensor names of a TOSA graph, read from a payload's metadata.

A TOSA payload keeps them in its own ``meta``; a payload that wraps one (Ethos-U, VGF: see
``consumer.py``) nests the TOSA metadata under ``meta["tosa"]``. Execution reads tensors by
these names, so a program file's payload is checked here before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qlower.contract import Payload

BACKEND = "tosa"   # the TOSA backend's name: its payloads hold the TOSA metadata themselves


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


def tosa_meta(payload: Payload) -> dict[str, Any]:
    """The metadata of the TOSA graph ``payload`` runs: its own for a TOSA payload, the nested
    ``meta["tosa"]`` for a payload that wraps one."""
    return payload.meta if payload.backend == BACKEND else payload.meta.get("tosa", {})


def tosa_tensors(payload: Payload) -> TosaTensors:
    return TosaTensors.of(tosa_meta(payload), len(payload.input_types), len(payload.output_types))


def tensors_problem(payload: Payload) -> str | None:
    """Why the TOSA tensor names of ``payload`` (a program file's) can't be read, or None."""
    try:
        tosa_tensors(payload)
    except ValueError as e:
        return str(e)
    return None
