"""The frames that qlower's worker processes (``workers.py``) and their scripts exchange.

A frame is a u32 count of parts, then each part as a u64 length and its bytes (little-endian);
arrays cross as .npy without pickles. Standard library and NumPy only: the worker scripts import
this file by path (they run with ``-I`` and can't import qlower).
"""

from __future__ import annotations

import io
import os
import select
import struct
import sys
import tempfile
import time

_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")


def read_exactly(fd: int, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes from ``fd``; EOFError if the other side closed first, TimeoutError when
    ``deadline`` (a ``time.monotonic()`` time) passes before they came."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no answer within the time allowed ({got} of {n} bytes came)")
        k = os.readv(fd, [view[got:]])
        if k == 0:
            raise EOFError(f"the pipe closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def read_frame(fd: int, max_parts: int = 1 << 16, deadline: float | None = None) -> list[bytes]:
    (count,) = _COUNT.unpack(read_exactly(fd, _COUNT.size, deadline))
    if count > max_parts:
        raise ValueError(f"a frame of {count} parts")
    return [read_exactly(fd, _LENGTH.unpack(read_exactly(fd, _LENGTH.size, deadline))[0], deadline)
            for _ in range(count)]


def write_frame(fd: int, parts: list[bytes]) -> None:
    chunks = [_COUNT.pack(len(parts))]
    for p in parts:
        chunks += [_LENGTH.pack(len(p)), p]
    data = memoryview(b"".join(chunks))
    while data:
        data = data[os.write(fd, data):]


def to_npy(array) -> bytes:
    import numpy as np

    out = io.BytesIO()
    np.save(out, np.asarray(array), allow_pickle=False)   # (a 0-d array stays 0-d)
    return out.getvalue()


def from_npy(data: bytes):
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def serve(requests: int, answers: int, handle) -> None:
    """A worker's loop: each request frame from ``requests`` answered with ``handle(frame)`` on
    ``answers``, until the caller closes its end."""
    while True:
        try:
            frame = read_frame(requests)
        except EOFError:
            return  # the caller is gone or done
        write_frame(answers, handle(frame))


def private_pipes(silence: bool = True) -> tuple[int, int]:
    """The worker's request and answer descriptors, taken from its stdin and stdout, which then read
    nothing (and, with ``silence``, stdout and stderr print nowhere: a native library's chatter
    must never corrupt the frames)."""
    requests, answers = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2) if silence else (0,):
        os.dup2(devnull, fd)
    if silence:
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    return requests, answers


def load_native(answers: int, what: str, load):
    """A worker's native module, from ``load()``; when it can't be imported, the caller is told why
    (it raises that as its error) and None is returned."""
    try:
        return load()
    except Exception as e:  # noqa: BLE001 - reported to the caller, who raises it
        write_frame(answers, [b"error", f"can't import {what}: {e}".encode()])
        return None


def stderr_to_file():
    """fd 2 into a temporary file (returned, read back into error messages): what a native library
    prints is a diagnostic for the caller, never noise in the frames."""
    log = tempfile.TemporaryFile()
    os.dup2(log.fileno(), 2)
    return log
