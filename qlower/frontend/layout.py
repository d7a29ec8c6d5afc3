"""NCHW → NHWC: how an IR value's dimension order relates to the PyTorch tensor it stands for.

Every imported value carries a *layout* ``P``: the IR value equals
``torch_tensor.permute(P)`` (IR dim ``i`` is PyTorch dim ``P[i]``). Ops whose
meaning doesn't depend on dimension order (elementwise, quantization, concat
and reductions along a translated axis) keep their input's layout; ops that
need a particular order (conv and pooling: NHWC; reshape, matmul, linear and
the graph boundary: PyTorch order) ask for it, and only then is a ``transpose``
emitted. A ``permute`` in the model changes the layout without moving data.
Constants are permuted with NumPy at import time, never by an op.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

Perm = tuple[int, ...]
NHWC: Perm = (0, 2, 3, 1)


def identity(rank: int) -> Perm:
    return tuple(range(rank))


def is_identity(perm: Perm) -> bool:
    return all(i == p for i, p in enumerate(perm))


def origin_layout(perm: Perm) -> Perm | None:
    """What ``Origin.layout`` records: the permutation, or None when IR and PyTorch agree."""
    return None if is_identity(perm) else tuple(perm)


def normalize_axis(axis: int, rank: int) -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


def ir_axis(perm: Perm, torch_axis: int) -> int:
    """Where PyTorch dim ``torch_axis`` sits in the IR value."""
    return perm.index(normalize_axis(torch_axis, len(perm)))


def ir_shape(torch_shape: Sequence[int], perm: Perm) -> tuple[int, ...]:
    return tuple(int(torch_shape[p]) for p in perm)


def torch_shape(shape: Sequence[int], perm: Perm) -> tuple[int, ...]:
    """PyTorch shape of an IR value of ``shape`` in layout ``perm``."""
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = int(shape[i])
    return tuple(out)


def transpose_between(src: Perm, dst: Perm) -> Perm:
    """The IR ``transpose`` perm that takes a value in layout ``src`` to layout ``dst``."""
    return tuple(src.index(d) for d in dst)


def after_permute(perm: Perm, dims: Sequence[int]) -> Perm:
    """Layout of ``x.permute(dims)`` when ``x`` has layout ``perm``, with no data moved."""
    dims = [normalize_axis(d, len(perm)) for d in dims]
    return tuple(dims.index(p) for p in perm)


def drop_dims(perm: Perm, torch_dims: Iterable[int]) -> Perm:
    """Layout after PyTorch dims ``torch_dims`` are removed (reduction without keepdim, select)."""
    dropped = {normalize_axis(d, len(perm)) for d in torch_dims}
    return tuple(p - sum(d < p for d in dropped) for p in perm if p not in dropped)


def prepend_dims(perm: Perm, count: int) -> Perm:
    """Layout after ``count`` leading size-1 dims are added (rank matching for broadcasting)."""
    return identity(count) + tuple(p + count for p in perm)


def keeps_row_major_order(shape: Sequence[int], perm: Perm) -> bool:
    """True when the IR value lists its elements in PyTorch's row-major order.

    Size-1 dims don't affect element order, so e.g. NHWC ``[N, 1, 1, C]`` can be
    reshaped to ``[N, C]`` without a transpose.
    """
    order = [p for i, p in enumerate(perm) if shape[i] != 1]
    return order == sorted(order)


def permute_array(data: np.ndarray, perm: Perm) -> np.ndarray:
    """A constant in PyTorch order, laid out as ``perm`` (done at import time with NumPy)."""
    return np.ascontiguousarray(np.transpose(data, perm)) if not is_identity(perm) else data
