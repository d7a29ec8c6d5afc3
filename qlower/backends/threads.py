"""Thread counts: which ones a user may ask for, and running with torch's process-wide count.

A count is a positive integer up to ``max_threads()`` (env ``QLOWER_MAX_THREADS``, default
256): far more threads than cores only slows a run down, and OpenMP aborts the whole process
when it can't create them (``threads=4096``), so the limit is checked where the count is given.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from qlower.errors import ConfigError

MAX_THREADS_ENV = "QLOWER_MAX_THREADS"
DEFAULT_MAX_THREADS = 256


def max_threads() -> int:
    raw = os.environ.get(MAX_THREADS_ENV)
    if raw is None:
        return DEFAULT_MAX_THREADS
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{MAX_THREADS_ENV}={raw!r}: expected a positive integer")
    return int(raw)


def available_cores() -> int:
    """The cores this process may run on: what a run with no thread count given uses (torch's own
    default for the cpu backend; LiteRT's would be one thread)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_threads(threads: object, what: str = "threads") -> int | None:
    """``threads`` when it is None or an integer in [1, max_threads()]; ConfigError otherwise."""
    if threads is None:
        return None
    if not isinstance(threads, int) or isinstance(threads, bool):
        raise ConfigError(f"{what} must be None or a positive integer, got {type(threads).__name__} {threads!r}")
    limit = max_threads()
    if not 1 <= threads <= limit:
        raise ConfigError(f"{what}={threads}: expected None or an integer in [1, {limit}] (this machine has "
                          f"{os.cpu_count()} cores; set {MAX_THREADS_ENV} to allow more)")
    return threads


class _TorchThreads:
    """torch's intra-op thread count is one setting for the whole process. Runs that want the
    same count share it; a run that wants another waits until they are done, and the count the
    process had is put back when the last run ends (never left at whichever run ended last)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._wanted: int | None = None
        self._restore = 0

    @contextlib.contextmanager
    def use(self, threads: int | None) -> Iterator[None]:
        if threads is None:
            yield
            return
        import torch

        with self._cond:
            while self._active and self._wanted != threads:
                self._cond.wait()
            if not self._active:
                self._restore = torch.get_num_threads()
                if threads != self._restore:
                    torch.set_num_threads(threads)
                self._wanted = threads
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if not self._active:
                    if torch.get_num_threads() != self._restore:
                        torch.set_num_threads(self._restore)
                    self._wanted = None
                    self._cond.notify_all()


torch_threads = _TorchThreads().use
