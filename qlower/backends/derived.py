"""Files a deterministic compiler derives from a validated graph, remembered by digest.

A program file's compiler outputs (a VGF from the model converter, a command stream from Vela)
are never trusted as read: loading derives them again from the TOSA graph that was just proven
to be qlower's own lowering, and refuses the file when a byte differs. Both compilers are
deterministic (same input and options, same bytes: tests/test_derived_payloads.py checks it),
so the derivation made at compile time serves a load in the same process, and loading one
program twice compiles once. The cache is bounded in entries and bytes, and thread-safe: two
threads asking for the same key wait for one derivation.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class DerivedCache(Generic[T]):
    """Least recently used results of ``make()`` by key, at most ``max_entries`` of them and
    ``max_bytes`` of their ``size``; a failed ``make`` is not remembered."""

    def __init__(self, size: Callable[[T], int], max_entries: int = 32, max_bytes: int = 512 << 20) -> None:
        self._size, self.max_entries, self.max_bytes = size, max_entries, max_bytes
        self._items: collections.OrderedDict[Hashable, tuple[T, int]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._making: dict[Hashable, threading.Lock] = {}
        self.made = 0   # how many times ``make`` ran (for tests and benchmarks)

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        while True:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
                    return self._items[key][0]
                pending = self._making.get(key)
                if pending is None:
                    pending = self._making[key] = threading.Lock()
                    pending.acquire()
                    break
            with pending:   # another thread derives it: wait, then look again
                pass
        try:
            value = make()
            size = self._size(value)
            with self._lock:
                self.made += 1
                if size <= self.max_bytes:
                    self._items[key] = (value, size)
                    self._bytes += size
                    while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                        _, (_, dropped) = self._items.popitem(last=False)
                        self._bytes -= dropped
            return value
        finally:
            with self._lock:
                del self._making[key]
            pending.release()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


def first_difference(a: bytes, b: bytes) -> str:
    """Where two byte strings first differ, in words (for refusal messages)."""
    if len(a) != len(b):
        return f"{len(a):,} bytes where {len(b):,} are derived"
    import numpy as np

    differ = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
    if differ.size == 0:
        return "no byte differs"
    at, count = int(differ[0]), int(differ.size)
    return f"{count:,} of {len(a):,} bytes differ, the first at offset {at:,}"
