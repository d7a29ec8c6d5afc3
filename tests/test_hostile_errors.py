"""What qlower says when native code or memory fails (issue 30): a worker's crash names the
payload and the signal or exit status and asks for a report (nothing showed the payload corrupt);
out of memory is recognised by the error's type, the CPU allocator's words only as the last resort."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import torch

from qlower.backends.tflm import runner
from qlower.backends.tosa import executor
from qlower.backends.workers import WorkerDied
from qlower.cli import _out_of_memory
from qlower.errors import ExecutionError, InputError


@pytest.mark.parametrize("module, tool", [(executor, "the TOSA reference model"), (runner, "TFLM's interpreter")])
@pytest.mark.parametrize("how", ["was killed by SIGSEGV", "exited with status 3"])
def test_a_native_crash_says_what_is_known(monkeypatch, module, tool, how):
    def died(parts, timeout=None):
        raise WorkerDied(how)
    monkeypatch.setattr(module._POOL, "call", died)
    with pytest.raises(ExecutionError) as e:
        if module is executor:
            executor.run(b"graph", [np.zeros(1, np.int8)], "partition for ethos-u55-128")
        else:
            runner.run(b"model", 1024, [np.zeros(1, np.int8)], "the TFLM partition")
    text = str(e.value)
    assert f"{tool} crashed running" in text and how in text and "is a bug" in text, text
    assert ("partition for ethos-u55-128" if module is executor else "the TFLM partition") in text
    assert "corrupt" not in text and "hand-edited" not in text


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the error is the value under test
        return e
    raise AssertionError("no error")


def _wrapped(inner: BaseException) -> BaseException:
    def outer():
        try:
            raise inner
        except BaseException as e:
            raise InputError("the model could not be captured") from e
    return _raised(outer)


def test_out_of_memory_is_known_by_type():
    numpy_oom = _raised(lambda: np.zeros(1 << 46, np.int8))   # NumPy's _ArrayMemoryError (a MemoryError)
    assert isinstance(numpy_oom, MemoryError)
    cpu_oom = _raised(lambda: torch.zeros(1 << 46, dtype=torch.int8))   # a plain RuntimeError: the text
    for e in (MemoryError(), numpy_oom, torch.OutOfMemoryError("device"), OSError(errno.ENOMEM, "no memory"),
              cpu_oom, _wrapped(MemoryError()), _wrapped(cpu_oom)):
        assert _out_of_memory(e), repr(e)
    # words alone are not an allocation that failed: not on our own errors, nor on other RuntimeErrors
    for e in (ExecutionError("the worker ran out of memory"), RuntimeError("Cannot allocate memory"),
              OSError(errno.ENOENT, "missing"), ValueError("out of memory"), _wrapped(ValueError("x"))):
        assert not _out_of_memory(e), repr(e)
