"""Reference semantics of the index reductions: argmax, argmin (reduce_min and reduce_max, with
their float zero rules, are in pooling.py beside max pooling).

Both are exact on codes: an index is where
the first extreme code lies along the axis (ties go to the lowest index, as in
PyTorch's ``argmax`` / ``argmin`` / ``max(dim)`` and TOSA's ARGMAX). Because a
per-tensor dequantization is strictly increasing in the code, these agree with
the same reductions of the dequantized floats, ties included.
"""

from __future__ import annotations

import numpy as np

from qlower.ir import Op
from qlower.reference.registry import kernel


@kernel("argmax")
def _argmax(op: Op, x):
    return np.argmax(x, axis=op.attrs["axis"], keepdims=True).astype(np.int64)


@kernel("argmin")
def _argmin(op: Op, x):
    return np.argmin(x, axis=op.attrs["axis"], keepdims=True).astype(np.int64)
