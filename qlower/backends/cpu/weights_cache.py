"""Process-wide cache of packed weights (DESIGN.md rule 7: absent is not null).

Packing (transposing to the GEMM layout, centering, folding zero points and
the bias into per-channel offsets) happens once per distinct constant per
process, shared by every op, plan and program that uses it. The key is a content
hash: BLAKE2b of the weight bytes, dtype, shape and QuantSpec, the same for
the bias, *or* the ``NO_BIAS`` token when the op has no bias, plus the packing
kind and its parameters (e.g. the input zero point folded into the offsets).
``NO_BIAS`` is not a digest, so an op without bias can never share an entry with
an op whose bias is zero, nor with another op's bias.

The cache is thread-safe: a lock is held while a missing entry is packed, so
concurrent prepares pack each distinct key exactly once.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np

from qlower.ir import QuantSpec

T = TypeVar("T")

NO_BIAS = "<no bias>"  # never a hex digest, so it can't collide with any bias


def array_digest(array: np.ndarray, quant: QuantSpec | None = None) -> str:
    """Content hash of an array: its bytes, dtype, shape and quantization."""
    array = np.ascontiguousarray(array)
    h = hashlib.blake2b(digest_size=20)
    h.update(repr((array.dtype.str, array.shape, quant)).encode())
    h.update(memoryview(array).cast("B"))
    return h.hexdigest()


def make_key(kind: str, weights: np.ndarray, weight_quant: QuantSpec | None,
             bias: np.ndarray | None, bias_quant: QuantSpec | None, **params: Any) -> tuple[Hashable, ...]:
    """Key of one packed entry; ``bias=None`` means "no bias" and is keyed by ``NO_BIAS``."""
    bias_key = NO_BIAS if bias is None else "bias:" + array_digest(bias, bias_quant)
    return (kind, "weights:" + array_digest(weights, weight_quant), bias_key, repr(sorted(params.items())))


class _WeightsCache:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._entries: dict[tuple[Hashable, ...], Any] = {}
        self._hits = 0
        self._misses = 0

    def get_or_pack(self, key: tuple[Hashable, ...], pack: Callable[[], T]) -> T:
        with self._lock:
            if key in self._entries:
                self._hits += 1
                return self._entries[key]
            packed = pack()
            self._entries[key] = packed
            self._misses += 1
            return packed

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self._hits, "misses": self._misses, "entries": len(self._entries)}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._hits = 0
            self._misses = 0


_CACHE = _WeightsCache()


def get_or_pack(key: tuple[Hashable, ...], pack: Callable[[], T]) -> T:
    """The cached entry for ``key``, packing it with ``pack()`` on first use."""
    return _CACHE.get_or_pack(key, pack)


def stats() -> dict[str, int]:
    """``{"hits", "misses", "entries"}`` since the last ``clear()``."""
    return _CACHE.stats()


def clear() -> None:
    """Drop every packed entry and reset the counters (plans keep the entries they hold)."""
    _CACHE.clear()
