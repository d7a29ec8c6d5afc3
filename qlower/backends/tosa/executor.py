"""Running a TOSA flatbuffer on the official TOSA reference model.

The serialization library prints "WARNING: Different TOSA spec in flatbuffer"
to file descriptor 1 every time it reads a 1.0.0 flatbuffer (unconditionally,
whatever the verbosity), and the reference model reports failed ERROR_IF /
REQUIRE checks on file descriptor 2. Both descriptors are redirected around the
call: the warning is dropped, the diagnostics are kept for the error message.
Anything but TOSA_VALID is an ExecutionError: TOSA_ERROR (an ERROR_IF failed)
and TOSA_UNPREDICTABLE (a REQUIRE failed, e.g. a RESCALE input out of range for
its shift) mean the outputs are not defined.

Only graphs validated by tosa-opt should be run: the reference model aborts
the process on some invalid graphs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np

os.environ["TOSA_MODEL_NO_BACKTRACE"] = "1"

import tosa_reference_model as trm  # noqa: E402

from qlower.errors import ExecutionError  # noqa: E402

_MAX_DIAGNOSTIC_CHARS = 1500


@contextlib.contextmanager
def _redirected_fds() -> Iterator[list[str]]:
    """fd 1 -> /dev/null, fd 2 -> a temporary file whose text is appended to the yielded list."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    captured: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as err_file:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            os.dup2(err_file.fileno(), 2)
            yield captured
        finally:
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(devnull)
            os.close(saved_out)
            os.close(saved_err)
            err_file.seek(0)
            captured.append(err_file.read().decode(errors="replace"))


def _summary(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    keep = [line for line in lines if "fails AT" in line or line.startswith("Op") or "ERROR" in line]
    text = "\n".join(keep or lines)
    return text[-_MAX_DIAGNOSTIC_CHARS:]


def run(flatbuffer: bytes, inputs: Sequence[np.ndarray], what: str = "TOSA graph") -> list[np.ndarray]:
    """Run ``flatbuffer`` on ``inputs`` (dtypes and order exactly as the graph's inputs)."""
    arrays = [np.ascontiguousarray(x) for x in inputs]
    try:
        with _redirected_fds() as captured:
            outputs, status = trm.run(flatbuffer, arrays)
    except ValueError as e:
        raise ExecutionError(f"the TOSA reference model rejected {what}: {e}. {_summary(captured[0])}") from e
    if status != trm.GraphStatus.TOSA_VALID:
        raise ExecutionError(
            f"the TOSA reference model ran {what} with status {status.name}: the outputs are undefined "
            f"(an ERROR_IF or REQUIRE check failed, e.g. an integer overflow or a value out of a "
            f"RESCALE's range). Reference model says:\n{_summary(captured[0])}")
    return list(outputs)
