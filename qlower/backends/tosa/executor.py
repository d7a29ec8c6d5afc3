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

import atexit
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from qlower.backends.tosa.worker import from_npy, read_frame, to_npy, write_frame
from qlower.errors import ExecutionError

_MAX_DIAGNOSTIC_CHARS = 1500
_WORKER_SCRIPT = Path(__file__).with_name("worker.py")
_MAX_WORKERS_LIMIT = 64


def _max_workers() -> int:
    raw = os.environ.get("QLOWER_TOSA_WORKERS")
    if raw is None:
        return max(2, os.cpu_count() or 1)
    if not raw.isdigit() or not 1 <= int(raw) <= _MAX_WORKERS_LIMIT:
        from qlower.errors import ConfigError

        raise ConfigError(f"QLOWER_TOSA_WORKERS={raw!r}: expected an integer in [1, {_MAX_WORKERS_LIMIT}]")
    return int(raw)


class _Worker:
    """One reference-model process and the pipes to it."""

    def __init__(self) -> None:
        env = dict(os.environ, TOSA_MODEL_NO_BACKTRACE="1")
        # -I: no user site or PYTHONPATH; the script imports only NumPy and the reference model
        self.proc = subprocess.Popen([sys.executable, "-I", str(_WORKER_SCRIPT)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

    def call(self, parts: list[bytes]) -> list[bytes]:
        write_frame(self.proc.stdin.fileno(), parts)
        return read_frame(self.proc.stdout.fileno())

    def death(self) -> str:
        """Why the process ended (it has, or is about to, after a broken pipe)."""
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.close()
            return "stopped answering"
        if rc < 0:
            try:
                return f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"was killed by signal {-rc}"
        return f"exited with status {rc}"

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class _Pool:
    """Idle workers, at most ``_max_workers()`` alive; thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._alive = 0

    def acquire(self) -> _Worker:
        with self._cond:
            limit = _max_workers()
            while not self._idle and self._alive >= limit:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._alive += 1
        try:
            return _Worker()
        except BaseException:
            self.discard(None)
            raise

    def release(self, worker: _Worker) -> None:
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()

    def discard(self, worker: _Worker | None) -> None:
        if worker is not None:
            worker.close()
        with self._cond:
            self._alive -= 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            self._alive -= len(idle)
        for w in idle:
            w.close()

    def pids(self) -> list[int]:
        """The idle workers' process ids (for tests)."""
        with self._cond:
            return [w.proc.pid for w in self._idle]


_POOL = _Pool()
atexit.register(_POOL.close)


def _summary(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    keep = [line for line in lines if "fails AT" in line or line.startswith("Op") or "ERROR" in line]
    text = "\n".join(keep or lines)
    return text[-_MAX_DIAGNOSTIC_CHARS:]


def run(flatbuffer: bytes, inputs: Sequence[np.ndarray], what: str = "TOSA graph") -> list[np.ndarray]:
    """Run ``flatbuffer`` on ``inputs`` (dtypes and order exactly as the graph's inputs)."""
    request = [b"run", bytes(flatbuffer), *(to_npy(np.ascontiguousarray(x)) for x in inputs)]
    worker = _POOL.acquire()
    try:
        answer = worker.call(request)
    except (OSError, EOFError, ValueError):
        reason = worker.death()
        _POOL.discard(worker)
        raise ExecutionError(f"the TOSA reference model crashed running {what}: its process {reason}. "
                             "The graph is invalid for the reference model (a corrupt or hand-edited "
                             "payload?); the calling process is unaffected.") from None
    except BaseException:   # e.g. KeyboardInterrupt mid-frame: the pipe state is unknown
        _POOL.discard(worker)
        raise
    _POOL.release(worker)
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
