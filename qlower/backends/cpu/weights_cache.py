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
concurrent prepares pack each distinct key exactly once. It is bounded: at most
``QLOWER_WEIGHTS_CACHE_ENTRIES`` entries (default 512) and
``QLOWER_WEIGHTS_CACHE_BYTES`` bytes of packed tensors (default 1 GiB); the least
recently used entries go first. A plan keeps the entries it was prepared with, so an
eviction only means the next prepare of those weights packs them again.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np
import torch

from qlower.ir import QuantSpec

T = TypeVar("T")

DEFAULT_MAX_ENTRIES = 512
DEFAULT_MAX_BYTES = 1 << 30
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


def _env_limit(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else default


def packed_bytes(packed: Any, depth: int = 0) -> int:
    """Bytes of the tensors and arrays an entry holds (in its fields, containers of them, and
    their fields, two levels down: a packed entry is a small record of tensors)."""
    if isinstance(packed, torch.Tensor):
        return packed.numel() * packed.element_size()
    if isinstance(packed, np.ndarray):
        return packed.nbytes
    if depth >= 3:
        return 0
    if isinstance(packed, (tuple, list)):
        return sum(packed_bytes(x, depth + 1) for x in packed)
    if isinstance(packed, dict):
        return sum(packed_bytes(x, depth + 1) for x in packed.values())
    fields = getattr(packed, "__dict__", None)
    if fields is None and hasattr(packed, "__slots__"):
        fields = {k: getattr(packed, k, None) for k in packed.__slots__}
    return sum(packed_bytes(x, depth + 1) for x in (fields or {}).values())


class _WeightsCache:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._entries: OrderedDict[tuple[Hashable, ...], tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    def get_or_pack(self, key: tuple[Hashable, ...], pack: Callable[[], T]) -> T:
        with self._lock:
            if key in self._entries:
                self._hits += 1
                self._entries.move_to_end(key)
                return self._entries[key][0]
            packed = pack()
            size = packed_bytes(packed)
            self._entries[key] = (packed, size)
            self._bytes += size
            self._misses += 1
            self._evict()
            return packed

    def _evict(self) -> None:
        max_entries = _env_limit("QLOWER_WEIGHTS_CACHE_ENTRIES", DEFAULT_MAX_ENTRIES)
        max_bytes = _env_limit("QLOWER_WEIGHTS_CACHE_BYTES", DEFAULT_MAX_BYTES)
        while len(self._entries) > 1 and (len(self._entries) > max_entries or self._bytes > max_bytes):
            _, (_, size) = self._entries.popitem(last=False)
            self._bytes -= size
            self._evictions += 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self._hits, "misses": self._misses, "entries": len(self._entries),
                    "bytes": self._bytes, "evictions": self._evictions}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._hits = 0
            self._misses = 0
            self._evictions = 0


_CACHE = _WeightsCache()


def get_or_pack(key: tuple[Hashable, ...], pack: Callable[[], T]) -> T:
    """The cached entry for ``key``, packing it with ``pack()`` on first use."""
    return _CACHE.get_or_pack(key, pack)


def stats() -> dict[str, int]:
    """``{"hits", "misses", "entries", "bytes", "evictions"}`` since the last ``clear()``."""
    return _CACHE.stats()


def clear() -> None:
    """Drop every packed entry and reset the counters (plans keep the entries they hold)."""
    _CACHE.clear()
