"""TOSA flatbuffer -> VGF with the ML SDK model converter.

The converter (``model-converter``, PyPI ``ai-ml-sdk-model-converter``) reads a
TOSA 1.0 flatbuffer and writes a VGF file: the graph as a SPIR-V data-graph
module for the Vulkan ML extensions, its constants, and the model's input and
output tensors. It runs as a subprocess on temporary files; a failure is a
CompileError that carries the converter's own diagnostics.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from qlower.backends.derived import DerivedCache, digest
from qlower.backends.vgf.container import MAGIC
from qlower.errors import CompileError

INSTALL_HINT = "pip install ai-ml-sdk-model-converter==0.11.0 (scripts/setup_vulkan.sh installs it)"
TIMEOUT_SECONDS = 600
_MAX_DIAGNOSTIC_CHARS = 3000
# printed by the TOSA serialization library whenever it reads a TOSA 1.0.0 flatbuffer; not a diagnostic
_NOISE = ("WARNING: Different TOSA spec in flatbuffer", "VGF [debug]:", "Successfully saved vgf output")


def package_dirs(package: str) -> list[Path]:
    """Where an installed package's files are (without importing it); empty when it isn't installed."""
    spec = importlib.util.find_spec(package)
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []


def packaged_binary(package: str, relative: str, fallback: str) -> str | None:
    """The executable a wheel ships inside ``package`` (not its Python wrapper), else ``fallback`` on PATH."""
    for root in package_dirs(package):
        path = root / relative
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which(fallback)


def converter_path() -> str:
    path = packaged_binary("model_converter", "binaries/bin/model-converter", "model-converter")
    if path is None:
        raise CompileError(f"the ML SDK model converter (model-converter) is not installed: {INSTALL_HINT}")
    return path


def diagnostics(*streams: str) -> str:
    lines = [line for text in streams for line in text.splitlines()
             if line.strip() and not line.startswith(_NOISE)]
    text = "\n".join(lines)
    return text if len(text) <= _MAX_DIAGNOSTIC_CHARS else "...\n" + text[-_MAX_DIAGNOSTIC_CHARS:]


@dataclass(frozen=True)
class Converted:
    vgf: bytes
    seconds: float
    version: str


@functools.lru_cache(maxsize=1)
def converter_version() -> str:
    """The converter's version string (its --version JSON's "version"), or "unknown"."""
    try:
        out = subprocess.run([converter_path(), "--version"], capture_output=True, text=True, timeout=60)
        return str(json.loads(out.stdout).get("version", "unknown"))
    except (OSError, ValueError, subprocess.SubprocessError):
        return "unknown"


def tosa_to_vgf(tosa: bytes, what: str = "TOSA graph") -> Converted:
    """Convert a TOSA 1.0 flatbuffer to VGF bytes; CompileError with the converter's stderr on failure."""
    exe = converter_path()
    with tempfile.TemporaryDirectory(prefix="qlower-vgf-") as tmp:
        src, dst = Path(tmp) / "graph.tosa", Path(tmp) / "model.vgf"
        src.write_bytes(tosa)
        # not --require-static-shape: converter 0.11.0 then fails on every graph ("Can't identify input
        # tensors without entry functions"); read_vgf checks the IO shapes instead
        cmd = [exe, "--input", str(src), "--output", str(dst)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise CompileError(f"the ML SDK model converter did not finish converting {what} to VGF within "
                               f"{TIMEOUT_SECONDS} s") from None
        except OSError as e:
            raise CompileError(f"can't run the ML SDK model converter ({exe}): {e}. {INSTALL_HINT}") from None
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or not dst.is_file():
            raise CompileError(
                f"the ML SDK model converter could not convert {what} to VGF (exit code {proc.returncode}):\n"
                f"{diagnostics(proc.stderr, proc.stdout) or '(no diagnostics)'}")
        vgf = dst.read_bytes()
    if vgf[:4] != MAGIC:
        raise CompileError(f"the ML SDK model converter wrote a file that is not VGF (starts with {vgf[:8]!r})")
    return Converted(vgf, seconds, converter_version())


# conversions by the TOSA graph's digest and the converter that made them: a program loaded after
# compiling it (or loaded twice) is checked without converting again (backends/derived.py)
CONVERSIONS: DerivedCache[Converted] = DerivedCache(lambda c: len(c.vgf))


def tosa_to_vgf_cached(tosa: bytes, what: str = "TOSA graph") -> Converted:
    """``tosa_to_vgf``, remembered: the converter is deterministic (same TOSA, same VGF bytes)."""
    exe = converter_path()
    return CONVERSIONS.get((digest(tosa), exe, converter_version()), lambda: tosa_to_vgf(tosa, what))
