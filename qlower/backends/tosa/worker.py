"""The TOSA reference model's own process (started by ``executor``; not imported by qlower).

The reference model is native code that aborts or crashes on some graphs, and
the serialization library writes to file descriptors 1 and 2 directly. Run in
the caller's process, the first takes the caller down and the second needs a
process-wide swap of fd 1 and 2, which no other thread can share. Here both
stay in this process: fd 1 goes to /dev/null, fd 2 to a scratch file whose text
becomes the run's diagnostics, and requests arrive on a private copy of the
original stdin, answers leave on a private copy of the original stdout.

Wire format (both directions): a frame is a u32 count of parts, then each part
as a u64 length and its bytes (little-endian). A request is
``[b"run", flatbuffer, input .npy ...]``; an answer is
``[b"ok", status name, diagnostics, output .npy ...]`` or ``[b"error", message]``.
Arrays cross as .npy without pickles (``frames.py``). This file imports only the standard
library, NumPy and the reference model, so it starts fast and runs as a script.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# the frame protocol, shared with Vela's worker (this process can't import qlower: it runs with -I)
sys.path.append(str(Path(__file__).resolve().parent.parent))
from frames import from_npy, load_native, private_pipes, serve, stderr_to_file, to_npy  # noqa: E402


def _reference_model():
    import numpy  # noqa: F401
    import tosa_reference_model

    return tosa_reference_model


def _serve(requests: int, answers: int) -> None:
    trm = load_native(answers, "the TOSA reference model", _reference_model)
    if trm is None:
        return
    diagnostics = stderr_to_file()

    def handle(frame: list[bytes]) -> list[bytes]:
        try:
            if len(frame) < 2 or frame[0] != b"run":
                raise ValueError("a request must be [b'run', flatbuffer, inputs...]")
            inputs = [from_npy(part) for part in frame[2:]]
            diagnostics.seek(0)
            diagnostics.truncate()
            outputs, status = trm.run(frame[1], inputs)
            diagnostics.seek(0)
            text = diagnostics.read()
            return [b"ok", status.name.encode(), text, *(to_npy(y) for y in outputs)]
        except Exception as e:  # noqa: BLE001 - a rejected graph or input is the caller's error to raise
            diagnostics.seek(0)
            return [b"error", f"{type(e).__name__}: {e}".encode() + b"\n" + diagnostics.read()]

    serve(requests, answers, handle)


def main() -> None:
    os.environ["TOSA_MODEL_NO_BACKTRACE"] = "1"   # no gdb backtrace on a failure
    _serve(*private_pipes())


if __name__ == "__main__":
    main()
