"""Running a TOSA flatbuffer on the official TOSA reference model, in processes of its own.

The reference model is native code: on some graphs it aborts or crashes, and
the serialization library prints "WARNING: Different TOSA spec in flatbuffer"
to file descriptor 1 on every read of a 1.0.0 flatbuffer. In the caller's
process the first kills the caller and the second needs a process-wide swap of
fd 1 and 2 that no other thread can share. So graphs run in worker processes
(``worker.py``): a crash there is an ExecutionError naming the signal, the
caller's descriptors are never touched, and threads run at once, each on a
worker of its own. Workers are reused and bounded (``QLOWER_TOSA_WORKERS``,
default: the number of cores, at least 2); a thread waits when all are busy.

Anything but TOSA_VALID is an ExecutionError: TOSA_ERROR (an ERROR_IF failed)
and TOSA_UNPREDICTABLE (a REQUIRE failed, e.g. a RESCALE input out of range for
its shift) mean the outputs are not defined; the reference model's diagnostics
(its fd 2 in the worker) are quoted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from qlower.backends.frames import from_npy, to_npy
from qlower.backends.workers import WorkerDied, WorkerPool, close_at_exit, crashed_on
from qlower.errors import ExecutionError

_MAX_DIAGNOSTIC_CHARS = 1500
_WORKER_SCRIPT = Path(__file__).with_name("worker.py")
def new_pool() -> WorkerPool:
    """A pool of reference-model workers (the module keeps one; tests build fresh ones)."""
    return WorkerPool(_WORKER_SCRIPT)


_POOL = close_at_exit(new_pool())


def _summary(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    keep = [line for line in lines if "fails AT" in line or line.startswith("Op") or "ERROR" in line]
    text = "\n".join(keep or lines)
    return text[-_MAX_DIAGNOSTIC_CHARS:]


def run(flatbuffer: bytes, inputs: Sequence[np.ndarray], what: str = "TOSA graph") -> list[np.ndarray]:
    """Run ``flatbuffer`` on ``inputs`` (dtypes and order exactly as the graph's inputs)."""
    request = [b"run", bytes(flatbuffer), *(to_npy(np.ascontiguousarray(x)) for x in inputs)]
    try:
        answer = _POOL.call(request)
    except WorkerDied as e:
        raise ExecutionError(crashed_on("the TOSA reference model", what, e)) from None
    if answer[0] == b"error":
        text = answer[1].decode(errors="replace")
        raise ExecutionError(f"the TOSA reference model rejected {what}: {_summary(text)}")
    status, diagnostics = answer[1].decode(), answer[2].decode(errors="replace")
    if status != "TOSA_VALID":
        raise ExecutionError(
            f"the TOSA reference model ran {what} with status {status}: the outputs are undefined "
            f"(an ERROR_IF or REQUIRE check failed, e.g. an integer overflow or a value out of a "
            f"RESCALE's range). Reference model says:\n{_summary(diagnostics)}")
    return [from_npy(part) for part in answer[3:]]
