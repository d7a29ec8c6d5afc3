"""Checking a TOSA flatbuffer with ``tosa-opt --tosa-validate`` against a profile.

``--tosa-attach-target`` is what makes tosa-opt check profiles and extensions
(without it an fp32 graph passes as +INT), and ``strict-op-spec-alignment``
makes it check every operator's dtypes against the specification. The
reference model is only ever given graphs that passed this check: on some
invalid graphs it crashes the process instead of reporting an error.

A failure is reported with the position of the failing operator among the
graph's non-constant operators, which the caller maps back to the IR op it was
emitted for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qlower.errors import CompileError

_TIMEOUT_S = 600
_SPEC_WARNING = "WARNING: Different TOSA spec"
_CONST_OPS = ('"tosa.const"', '"tosa.const_shape"')
_NOTE = re.compile(r"note: see current operation: (.*)$")
_ERROR = re.compile(r"error: (.*)$")


@dataclass(frozen=True)
class Diagnostic:
    """One tosa-opt error: its message, the TOSA op name and the operator's position
    among the non-constant operators (None when it can't be located)."""

    message: str
    tosa_op: str | None
    position: int | None


def tosa_opt_path() -> str:
    """tosa-opt from the running environment (tosa-tools installs it next to python)."""
    local = Path(sys.executable).parent / "tosa-opt"
    if local.exists():
        return str(local)
    found = shutil.which("tosa-opt")
    if found is None:
        raise CompileError("tosa-opt not found: install the tosa-tools package into this environment")
    return found


def _run(args: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([tosa_opt_path(), *args, "-"], input="module {}", capture_output=True,
                              text=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CompileError(f"tosa-opt did not finish within {_TIMEOUT_S} s") from None


def validate(flatbuffer: bytes, profiles: str, extensions: Sequence[str] = ()) -> list[Diagnostic]:
    """Validate; returns [] when the graph is valid, else one Diagnostic per error."""
    target = f"profiles={profiles}" + (f" extensions={','.join(sorted(extensions))}" if extensions else "")
    with tempfile.TemporaryDirectory(prefix="qlower-tosa-") as tmp:
        path = os.path.join(tmp, "graph.tosa")
        with open(path, "wb") as f:
            f.write(flatbuffer)
        proc = _run(["--tosa-deserialize", f"--tosa-deserialize-filename={path}",
                     f"--tosa-attach-target={target}", "--tosa-validate=strict-op-spec-alignment",
                     "-o", os.devnull])
        if proc.returncode == 0:
            return []
        lines = proc.stderr.splitlines()
        if not any(_ERROR.search(line) for line in lines):
            raise CompileError(f"tosa-opt failed (exit code {proc.returncode}): {proc.stderr.strip()[:2000]}")
        generic = _run(["--tosa-deserialize", f"--tosa-deserialize-filename={path}", "--mlir-print-op-generic"])
    return _diagnostics(lines, _operator_lines(generic.stdout))


def _operator_lines(mlir: str) -> list[str]:
    """The non-constant operator lines of the deserialized graph, in order."""
    ops = []
    for line in mlir.splitlines():
        line = line.strip()
        if line.startswith("%") and '"tosa.' in line and not any(c in line for c in _CONST_OPS):
            ops.append(line)
    return ops


def _diagnostics(stderr_lines: list[str], operators: list[str]) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    message = None
    for line in stderr_lines:
        if _SPEC_WARNING in line:
            continue
        err, note = _ERROR.search(line), _NOTE.search(line)
        if err:
            if message is not None:
                out.append(Diagnostic(message, _op_name(message), None))
            message = err.group(1)
        elif note and message is not None:
            text = note.group(1).strip()
            position = operators.index(text) if text in operators else None
            out.append(Diagnostic(message, _op_name(message) or _op_name(text), position))
            message = None
    if message is not None:
        out.append(Diagnostic(message, _op_name(message), None))
    return out


def _op_name(text: str) -> str | None:
    m = re.search(r"'?\"?tosa\.([a-z0-9_]+)", text)
    return m.group(1).upper() if m else None
