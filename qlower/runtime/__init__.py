"""Executing compiled programs: which executor runs a program, and the inputs it accepts.

``qlower/program`` holds what a program is (graphs, partitions, payloads, the file); this
package holds how it runs, so the program layer never reaches into backends to execute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from qlower.errors import InputError
from qlower.ir import Graph
from qlower.partition import Partition
from qlower.runtime.runner import ReferenceRunner, Runner

__all__ = ["ReferenceRunner", "Runner", "as_numpy", "runner_for"]


def runner_for(target: str, graph: Graph, partitions: Sequence[Partition], threads: int | None = None):
    """The executor of a program for ``target``: the reference interpreter for ``reference``, the CPU
    plan for ``cpu``, else host ops on the CPU plan with each partition on its target's backend."""
    if target == "cpu":
        from qlower.backends.cpu import prepare

        return prepare(graph, threads=threads)
    if target == "reference":
        return ReferenceRunner(graph)
    from qlower.backends.registry import backend_for

    backends = {}
    for p in partitions:
        if p.backend not in backends:
            backends[p.backend] = backend_for(p.target)
    return Runner(graph, partitions, backends, threads=threads)


def as_numpy(x: Any, what: str = "input") -> np.ndarray:
    """Torch tensors and array-likes as NumPy arrays (no copy when possible); an InputError naming
    ``what`` for a tensor NumPy can't hold (bfloat16, a meta or other non-CPU device)."""
    if hasattr(x, "detach"):
        device = getattr(getattr(x, "device", None), "type", "cpu")
        if device != "cpu":
            raise InputError(f"{what} is a tensor on device '{device}'; qlower runs on CPU tensors or NumPy arrays")
        try:
            return x.detach().numpy()
        except (TypeError, RuntimeError) as e:   # bfloat16 and other dtypes NumPy lacks
            raise InputError(f"{what} is a {getattr(x, 'dtype', type(x).__name__)} tensor, which NumPy can't "
                             f"hold ({e}); pass float32") from None
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as e:
        raise InputError(f"{what} can't be read as an array: {e}") from None
