"""Small helpers shared by the CPU kernels: dtype mapping, channel-shaped parameters, errors.

Kernels exchange torch tensors (zero-copy views of the caller's NumPy arrays at
the boundary). A kernel never writes into a tensor it received: values are
immutable SSA values, and a view of a constant or of a caller's input may be
shared by several consumers.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.errors import ExecutionError
from qlower.ir import DType, Op

TORCH_DTYPES: dict[DType, torch.dtype] = {
    DType.BOOL: torch.bool,
    DType.INT8: torch.int8,
    DType.UINT8: torch.uint8,
    DType.INT16: torch.int16,
    DType.INT32: torch.int32,
    DType.FLOAT32: torch.float32,
}

INT32_MIN, INT32_MAX = DType.INT32.min, DType.INT32.max   # (the IR's bounds, by name for the kernels)


def torch_dtype(dtype: DType) -> torch.dtype:
    return TORCH_DTYPES[dtype]


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """A torch view of ``array`` (a private copy when NumPy can't share it read-write)."""
    array = np.asarray(array)
    if not array.flags.c_contiguous or not array.flags.writeable:
        array = np.array(array, copy=True, order="C")
    return torch.from_numpy(array)


def constant_tensor(array: np.ndarray) -> torch.Tensor:
    """A private contiguous copy of a constant: nothing the caller does later can change it."""
    return torch.from_numpy(np.array(array, copy=True, order="C"))


def param_tensor(values, shape: tuple[int, ...], dtype: np.dtype | type) -> torch.Tensor:
    """A private tensor of ``values`` converted to ``dtype`` and reshaped (0-d when ``shape`` is ())."""
    return torch.from_numpy(np.array(values, dtype=dtype).reshape(shape))


def channel_shape(rank: int, axis: int | None, size: int) -> tuple[int, ...]:
    """Shape that broadcasts ``size`` per-channel parameters along ``axis`` of a rank-``rank`` tensor."""
    if axis is None or size == 1:
        return ()
    shape = [1] * rank
    shape[axis] = size
    return tuple(shape)


def where(op: Op) -> str:
    """``%name`` of the op's first result plus its model location, for error messages."""
    name = f"%{op.results[0].name}" if op.results else op.kind
    origin = op.origin
    return f"{name} at {origin.describe()}" if origin is not None else name


def execution_error(op: Op, message: str) -> ExecutionError:
    return ExecutionError(f"{op.kind} producing {where(op)}: {message}")


def check_int32(op: Op, values: torch.Tensor) -> None:
    """Raise like the reference interpreter when an int32 result would overflow."""
    if values.numel():
        lo, hi = torch.aminmax(values)
        lo, hi = int(lo), int(hi)
        if lo < INT32_MIN or hi > INT32_MAX:
            raise execution_error(op, f"overflows int32 (range {lo}..{hi})")
