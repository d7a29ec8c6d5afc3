"""Running a .tflite on TFLM's interpreter, in worker processes (``worker.py``).

TFLM is native code: a model it did not expect may crash it. In a worker
process a crash is an ExecutionError naming the signal, and the caller lives
on. Workers are reused and bounded like the TOSA reference model's
(``QLOWER_TOSA_WORKERS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from qlower.backends.frames import from_npy, to_npy
from qlower.backends.workers import WorkerDied, WorkerPool, close_at_exit, crashed_on
from qlower.errors import ExecutionError

MAX_ARENA = 1 << 30   # no model qlower writes needs more; a payload claiming more is refused
_POOL = close_at_exit(WorkerPool(Path(__file__).with_name("worker.py")))


def _call(request: list[bytes], what: str) -> list[bytes]:
    try:
        answer = _POOL.call(request)
    except WorkerDied as e:
        raise ExecutionError(crashed_on("TFLM's interpreter", what, e)) from None
    if answer[0] != b"ok":
        text = answer[1].decode(errors="replace").strip() if len(answer) > 1 else "no reason given"
        raise ExecutionError(f"TFLM refused {what}: {text}")
    return answer[1:]


def smallest_arena(model: bytes, what: str = "the model") -> int:
    """The smallest tensor arena (bytes; the buffer 16-byte aligned) in which TFLM's interpreter allocates and
    runs the model: one byte less fails."""
    return int(_call([b"arena", bytes(model), str(MAX_ARENA).encode()], what)[0])


def run(model: bytes, arena: int, inputs: Sequence[np.ndarray], what: str = "the model") -> list[np.ndarray]:
    """Run ``model`` with an arena of ``arena`` bytes on ``inputs`` (dtypes and order as the model's inputs)."""
    if not isinstance(arena, int) or not 0 < arena <= MAX_ARENA:
        raise ExecutionError(f"TFLM arena {str(arena)[:20]} is not a size in (0, {MAX_ARENA}]")
    request = [b"run", bytes(model), str(arena).encode(), *(to_npy(np.ascontiguousarray(x)) for x in inputs)]
    return [from_npy(part) for part in _call(request, what)]


def run_traced(model: bytes, arena: int, inputs: Sequence[np.ndarray], names: Sequence[str],
               what: str = "the model") -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """``run`` keeping every tensor (an arena of ``arena`` bytes, which must hold them all): the outputs
    and the tensors ``names`` by name."""
    if not isinstance(arena, int) or not 0 < arena <= MAX_ARENA:
        raise ExecutionError(f"TFLM arena {str(arena)[:20]} is not a size in (0, {MAX_ARENA}]")
    request = [b"trace", bytes(model), str(arena).encode(), "\n".join(names).encode(),
               *(to_npy(np.ascontiguousarray(x)) for x in inputs)]
    answer = _call(request, what)
    n = int(answer[0])
    arrays = [from_npy(part) for part in answer[1:]]
    return arrays[:n], dict(zip(names, arrays[n:]))
