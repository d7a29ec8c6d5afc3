"""Kernels that only move codes: constant, concat, reshape, transpose, pad, slice, gather.

Results may be views of their operand; that is safe because no kernel writes
into a tensor it received.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qlower.backends.cpu.context import BuildContext, Kernel, builder
from qlower.backends.cpu.tensor_utils import constant_tensor, execution_error
from qlower.ir import DType, Op


@builder("constant")
def _constant(op: Op, ctx: BuildContext) -> Kernel:
    data = constant_tensor(op.attrs["data"])
    return lambda: data


@builder("concat")
def _concat(op: Op, ctx: BuildContext) -> Kernel:
    axis = op.attrs["axis"]
    return lambda xs: torch.cat(xs, dim=axis)


@builder("reshape")
def _reshape(op: Op, ctx: BuildContext) -> Kernel:
    shape = tuple(op.attrs["shape"])
    return lambda x: x.reshape(shape)


@builder("transpose")
def _transpose(op: Op, ctx: BuildContext) -> Kernel:
    perm = tuple(op.attrs["perm"])
    native = ctx.native
    if native is not None and perm == (0, 2, 3, 1) and op.operands[0].dtype is DType.INT8:
        def to_nhwc(x: torch.Tensor) -> torch.Tensor:   # a model's NCHW input codes (native: one pass)
            out = torch.empty(op.result.shape, dtype=torch.int8)
            native.nchw_to_nhwc(x.contiguous(), out)
            return out
        return to_nhwc
    return lambda x: x.permute(perm).contiguous()


@builder("pad")
def _pad(op: Op, ctx: BuildContext) -> Kernel:
    pads, value = tuple(op.attrs["pads"]), op.attrs["value"]
    rank = len(pads) // 2
    torch_pads = [p for i in reversed(range(rank)) for p in (pads[2 * i], pads[2 * i + 1])]
    return lambda x: F.pad(x, torch_pads, value=value)


@builder("slice")
def _slice(op: Op, ctx: BuildContext) -> Kernel:
    a = op.attrs
    step = a["step"] or (1,) * len(a["start"])
    index = tuple(slice(s0, s1, st) for s0, s1, st in zip(a["start"], a["stop"], step))
    return lambda x: x[index].contiguous()


@builder("gather")
def _gather(op: Op, ctx: BuildContext) -> Kernel:
    axis = op.attrs["axis"]
    size = op.operands[0].shape[axis]
    shape = tuple(op.result.shape)

    def run(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        flat = indices.reshape(-1).long()
        if flat.numel():
            lo, hi = torch.aminmax(flat)
            if int(lo) < 0 or int(hi) >= size:
                bad = int(lo) if int(lo) < 0 else int(hi)
                raise execution_error(op, f"index {bad} is out of range for axis {axis} of size {size} "
                                          f"(valid indices: 0..{size - 1})")
        return torch.index_select(x, axis, flat).reshape(shape)
    return run
