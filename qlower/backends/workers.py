"""Worker processes for native code that must not run in the caller's process.

The TOSA reference model and Vela are native libraries that crash on some inputs and write to
file descriptors 1 and 2 directly. Each runs in processes of its own (a script speaking the
frame protocol of ``frames.py``): a crash there is an error naming the signal, the caller's
descriptors are never touched, and threads run at once, each on a worker of its own. Workers
are reused and bounded; a thread waits when all are busy.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from qlower.backends.frames import read_frame, write_frame
from qlower.errors import ConfigError

MAX_WORKERS_ENV = "QLOWER_TOSA_WORKERS"   # named when only the reference model had workers
_MAX_WORKERS_LIMIT = 64


def max_workers() -> int:
    """How many workers each pool may keep alive: ``QLOWER_TOSA_WORKERS``, default the number of
    cores (at least 2)."""
    raw = os.environ.get(MAX_WORKERS_ENV)
    if raw is None:
        return max(2, os.cpu_count() or 1)
    if not raw.isdigit() or not 1 <= int(raw) <= _MAX_WORKERS_LIMIT:
        raise ConfigError(f"{MAX_WORKERS_ENV}={raw!r}: expected an integer in [1, {_MAX_WORKERS_LIMIT}]")
    return int(raw)


class WorkerDied(Exception):
    """A worker process ended instead of answering; the message says how (e.g. "was killed by SIGSEGV")."""


class Worker:
    """One worker process and the pipes to it."""

    def __init__(self, script: Path) -> None:
        env = dict(os.environ, TOSA_MODEL_NO_BACKTRACE="1")
        # -I: no user site or PYTHONPATH; a worker script imports only what it needs
        self.proc = subprocess.Popen([sys.executable, "-I", str(script)], stdin=subprocess.PIPE,
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


class WorkerPool:
    """Idle workers running ``script``, at most ``limit()`` alive (read at each acquire); thread-safe."""

    def __init__(self, script: Path, limit: Callable[[], int] = max_workers) -> None:
        self.script, self.limit = script, limit
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._alive = 0

    def acquire(self) -> Worker:
        with self._cond:
            limit = self.limit()
            while not self._idle and self._alive >= limit:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._alive += 1
        try:
            return Worker(self.script)
        except BaseException:
            self.discard(None)
            raise

    def release(self, worker: Worker) -> None:
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()

    def discard(self, worker: Worker | None) -> None:
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

    def call(self, parts: list[bytes]) -> list[bytes]:
        """Send one request frame to an idle worker and return its answer; WorkerDied when the
        worker ends instead of answering (it is replaced; the caller's process is unaffected)."""
        worker = self.acquire()
        try:
            answer = worker.call(parts)
        except (OSError, EOFError, ValueError):
            reason = worker.death()
            self.discard(worker)
            raise WorkerDied(reason) from None
        except BaseException:   # e.g. KeyboardInterrupt mid-frame: the pipe state is unknown
            self.discard(worker)
            raise
        self.release(worker)
        return answer

    def pids(self) -> list[int]:
        """The idle workers' process ids (for tests)."""
        with self._cond:
            return [w.proc.pid for w in self._idle]


def close_at_exit(pool: WorkerPool) -> WorkerPool:
    atexit.register(pool.close)
    return pool
