"""The kernel table of the reference interpreter: op kind -> function.

A kernel receives the op and its operand arrays (None for an absent optional
operand, a list for a variadic one) and returns the result array(s). Integer
kernels may return int64; the interpreter checks the range and casts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qlower.registry import Registry

Kernel = Callable[..., np.ndarray | tuple[np.ndarray, ...]]
KERNELS: Registry[str, Kernel] = Registry("reference kernels")


def kernel(kind: str):
    return KERNELS.register(kind)
