"""A C source built into a shared library once per machine and cached (for ctypes).

The library lands in ``$QLOWER_CACHE_DIR`` (else ``$XDG_CACHE_HOME/qlower`` or ``~/.cache/qlower``)
under a name keyed by the source text, the compiler and its version, the flags and the CPU's
feature flags, so a binary built with ``-march=native`` is never loaded on a CPU it wasn't built
for. It is written to a temporary file and renamed into place: concurrent builders never see a
partial library.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["build_library", "compiler", "cpu_flags"]


def compiler() -> str | None:
    """``$CC``, else ``cc`` or ``gcc`` on the PATH; None when there is none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.cache
def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (/proc/cpuinfo; empty where it can't be read)."""
    line = _cpu_flags()
    return frozenset(line.split(":", 1)[1].split()) if ":" in line else frozenset()


def build_library(source: Path, flags: tuple[str, ...], folder: str, cc: str) -> Path:
    """``source`` compiled by ``cc`` with ``flags`` (plus ``-shared -fPIC``) into the cache's ``folder``.

    Raises RuntimeError with the compiler's messages when the build fails (OSError or
    subprocess.SubprocessError when the compiler can't be run)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([source.read_text(), cc, version, *flags, _cpu_flags()]).encode()).hexdigest()
    base = os.environ.get("QLOWER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "qlower")
    target = Path(base) / folder / f"lib{source.stem.lstrip('_')}_{key[:24]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        run = subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", partial, str(source)], capture_output=True,
                             text=True, timeout=300)
        if run.returncode != 0:
            raise RuntimeError(run.stderr.strip()[-2000:])
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
