"""The files qlower writes and reads by path: only regular files (or, to write, new paths).

Saving renames a finished temporary file over the destination, which would replace whatever
is there: a device node, a FIFO, a symbolic link (as root, ``--output /dev/null`` would replace
/dev/null). So a destination that exists must be a regular file, not a link to one. Reading
a FIFO or a device blocks or never ends (``--input`` a FIFO waits for a writer forever), so an
input is opened without blocking and read only when it is a regular file.
"""

from __future__ import annotations

__all__ = ["check_destination", "kind_of", "open_regular"]

import os
import stat
from typing import BinaryIO

from qlower.errors import InputError, SaveError

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def check_destination(path: str | os.PathLike) -> None:
    """SaveError unless ``path`` is new or a regular file (a symbolic link is refused, not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise SaveError(f"can't write {os.fspath(path)}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise SaveError(f"can't write {os.fspath(path)}: it is {kind_of(mode)}; qlower writes only to regular "
                        "files or new paths, never replacing anything else (give a file's own path)")


def open_regular(path: str | os.PathLike, what: str = "input") -> BinaryIO:
    """``path`` opened for reading; InputError when it is not a regular file (a FIFO, a device, a
    folder: it would block or never end) or can't be opened. Opened without blocking, then checked,
    so that a FIFO with no writer is refused at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise InputError(f"{what} {os.fspath(path)}: can't open it ({e.strerror or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"{what} {os.fspath(path)}: it is {kind_of(mode)}, not a regular file; qlower reads "
                             "inputs from regular files only")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
