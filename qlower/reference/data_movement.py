"""Reference semantics of ops that only move codes: concat, reshape, transpose, pad, slice, gather."""

from __future__ import annotations

import numpy as np

from qlower.ir import Op
from qlower.reference.registry import kernel


@kernel("constant")
def _constant(op: Op):
    return op.attrs["data"]


@kernel("concat")
def _concat(op: Op, xs):
    return np.concatenate(xs, axis=op.attrs["axis"])


@kernel("reshape")
def _reshape(op: Op, x):
    return x.reshape(op.attrs["shape"])


@kernel("transpose")
def _transpose(op: Op, x):
    return np.ascontiguousarray(np.transpose(x, op.attrs["perm"]))


@kernel("pad")
def _pad(op: Op, x):
    p = op.attrs["pads"]
    widths = [(p[2 * i], p[2 * i + 1]) for i in range(x.ndim)]
    return np.pad(x, widths, constant_values=op.attrs["value"])


@kernel("slice")
def _slice(op: Op, x):
    a = op.attrs
    step = a["step"] or (1,) * x.ndim
    return np.ascontiguousarray(x[tuple(slice(s0, s1, st) for s0, s1, st in zip(a["start"], a["stop"], step))])


@kernel("gather")
def _gather(op: Op, x, indices):
    axis = op.attrs["axis"]
    size = x.shape[axis]
    idx = np.asarray(indices, dtype=np.int64)
    bad = idx[(idx < 0) | (idx >= size)]
    if bad.size:
        raise ValueError(f"index {int(bad.flat[0])} is out of range for axis {axis} of size {size} "
                         f"(valid indices: 0..{size - 1})")
    return np.ascontiguousarray(np.take(x, idx, axis=axis))
