"""Worker processes for native code that must not run in the caller's process.

The TOSA reference model and Vela are native libraries that crash on some inputs and write to
file descriptors 1 and 2 directly. Each runs in processes of its own (a script speaking the
frame protocol of ``frames.py``): a crash there is an error naming the signal, the caller's
descriptors are never touched, and threads run at once, each on a worker of its own. Workers
are reused and bounded; a thread waits when all are busy.

Workers run in a process group of their own, so a terminal's Ctrl-C interrupts the caller, never
an idle worker; an idle worker that died anyway (killed from outside) is replaced before it is
given work. A call waits at most ``QLOWER_WORKER_TIMEOUT`` seconds (default an hour) for its
answer; then the worker is killed and the call is a ``WorkerTimeout``. A worker killed by a
signal from outside while working (SIGKILL, SIGTERM, SIGINT, SIGHUP: the OOM killer, a user) is
a ``WorkerKilled``, not a crash blamed on its input; both are ExecutionErrors.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from qlower.backends.frames import read_frame, write_frame
from qlower.errors import ConfigError, ExecutionError

MAX_WORKERS_ENV = "QLOWER_TOSA_WORKERS"   # named when only the reference model had workers
_MAX_WORKERS_LIMIT = 64
TIMEOUT_ENV = "QLOWER_WORKER_TIMEOUT"
DEFAULT_TIMEOUT = 3600.0
# signals a process gets from others, not from its own faults (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL)
_FROM_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})


def worker_timeout() -> float:
    """Seconds a call waits for a worker's answer: ``QLOWER_WORKER_TIMEOUT``, default an hour."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return value


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


def crashed_on(tool: str, what: str, died: WorkerDied) -> str:
    """The message for native code that crashed on a payload: what is known (which payload, the
    signal or exit status), not a guess at its cause. A payload qlower lowered, or validated at
    load byte for byte, is one the tool should run: its crash is a bug to report."""
    return (f"{tool} crashed running {what}: its process {died}. A payload qlower lowered or validated at "
            f"load that crashes {tool} is a bug: please report it with the program file. "
            "The calling process is unaffected")


class WorkerKilled(ExecutionError):
    """A worker was killed by a signal from outside (not a crash on its input) while it worked."""


class WorkerTimeout(ExecutionError):
    """A worker did not answer within the time allowed; it was killed (the pool replaces it)."""


class Worker:
    """One worker process and the pipes to it."""

    def __init__(self, script: Path) -> None:
        env = dict(os.environ, TOSA_MODEL_NO_BACKTRACE="1")
        # -I: no user site or PYTHONPATH; a worker script imports only what it needs
        # a process group of its own: a terminal's Ctrl-C (sent to the foreground group) never reaches it
        self.proc = subprocess.Popen([sys.executable, "-I", str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, process_group=0)

    def call(self, parts: list[bytes], deadline: float | None = None) -> list[bytes]:
        write_frame(self.proc.stdin.fileno(), parts)
        return read_frame(self.proc.stdout.fileno(), deadline=deadline)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def killed_from_outside(self) -> str | None:
        """The signal's name when the process ended by a signal others send (see _FROM_OUTSIDE)."""
        rc = self.proc.poll()
        if rc is not None and rc < 0 and -rc in {int(s) for s in _FROM_OUTSIDE}:
            return signal.Signals(-rc).name
        return None

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

    def __init__(self, script: Path, limit: Callable[[], int] = max_workers,
                 timeout: Callable[[], float] = worker_timeout) -> None:
        self.script, self.limit, self.timeout = script, limit, timeout
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._alive = 0

    def acquire(self) -> Worker:
        with self._cond:
            limit = self.limit()
            while True:
                while self._idle and not self._idle[-1].alive():   # died while idle (killed from outside)
                    dead = self._idle.pop()
                    self._alive -= 1
                    dead.close()
                if self._idle or self._alive < limit:
                    break
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

    def call(self, parts: list[bytes], timeout: float | None = None) -> list[bytes]:
        """Send one request frame to an idle worker and return its answer within ``timeout`` seconds
        (default ``worker_timeout()``). WorkerDied when the worker crashes instead of answering,
        WorkerKilled when a signal from outside killed it, WorkerTimeout when it doesn't answer in
        time (it is replaced; the caller's process is unaffected)."""
        seconds = self.timeout() if timeout is None else timeout
        worker = self.acquire()
        try:
            answer = worker.call(parts, time.monotonic() + seconds)
        except TimeoutError:
            self.discard(worker)
            raise WorkerTimeout(f"the worker process ({self.script.stem}) did not answer within {seconds:g} s and was "
                                f"stopped; allow more with {TIMEOUT_ENV}=SECONDS") from None
        except (OSError, EOFError, ValueError):
            reason = worker.death()
            signal_name = worker.killed_from_outside()
            self.discard(worker)
            if signal_name is not None:
                raise WorkerKilled(f"the worker process ({self.script.stem}) was killed by {signal_name} from "
                                   "outside qlower while it worked (not a crash on its input); run again") from None
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
