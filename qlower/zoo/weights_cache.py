"""Trained zoo weights on disk: safetensors (no pickle) in ``$QLOWER_CACHE_DIR`` or ``~/.cache/qlower``.

A file name carries its model's recipe version, so a change of architecture or
recipe never loads stale weights. A file that can't be read, or doesn't fit the
architecture, counts as absent (the caller retrains and overwrites it). Writes are
atomic, so concurrent test workers and users never see half a file, and a model
is trained by one process at a time.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn

M = TypeVar("M", bound=nn.Module)


def cache_dir() -> Path:
    """``$QLOWER_CACHE_DIR`` if set, else ``~/.cache/qlower`` (the cache of the native kernels too)."""
    env = os.environ.get("QLOWER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "qlower"


def save_atomic(state: dict[str, torch.Tensor], path: Path) -> None:
    """Write ``state`` to ``path`` through a temporary file in the same directory and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in state.items()}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_cached(make: Callable[[], M], path: Path) -> M | None:
    """A fresh ``make()`` holding the weights of ``path`` (eval mode), or None if there is no usable file."""
    if not path.is_file():
        return None
    with torch.random.fork_rng(devices=[]):   # the initial weights are overwritten: draw them off the caller's RNG
        model = make()
    try:
        model.load_state_dict(load_file(path), strict=True)
    except Exception:  # noqa: BLE001  (a corrupt or mismatched file: retrain instead of failing)
        return None
    return model.eval()


def cached_or_trained(make: Callable[[], M], path: Path, train: Callable[[], M]) -> M:
    """The model cached at ``path``, else ``train()``'s result, cached there for next time.

    Training holds an exclusive lock on ``<path>.lock``: processes that want the same
    model at once (test workers, parallel jobs) train it once, the others wait and load it.
    """
    model = load_cached(make, path)
    if model is not None:
        return model
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes
        model = load_cached(make, path)    # trained by whoever held the lock before us
        if model is None:
            model = train().eval()
            save_atomic(model.state_dict(), path)
    return model
