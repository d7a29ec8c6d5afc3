"""The kernel table of the reference interpreter: op kind -> function.

A kernel receives the op and its operand arrays (None for an absent optional
operand, a list for a variadic one) and returns the result array(s). Integer
kernels may return int64; the interpreter checks the range and casts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Kernel = Callable[..., np.ndarray | tuple[np.ndarray, ...]]
KERNELS: dict[str, Kernel] = {}


def kernel(kind: str):
    def wrap(fn: Kernel) -> Kernel:
        KERNELS[kind] = fn
        return fn
    return wrap
