"""CPU kernels of the order reductions: reduce_min, argmax, argmin (any axis, dim kept).

Bit-exact with the reference: an integer minimum is one of the inputs (float minima run the
reference's kernel),
and torch's ``argmax`` / ``argmin`` on CPU return the first extreme index along
the axis, as the reference (NumPy) does.
"""

from __future__ import annotations

import torch

from qlower.backends.cpu.context import BuildContext, Kernel, builder, by_reference
from qlower.ir import Op


@builder("reduce_min")
def _reduce_min(op: Op, ctx: BuildContext) -> Kernel:
    axis = op.attrs["axis"]
    if op.operands[0].type.dtype.is_float:   # the sign of a zero minimum: the reference's kernel
        return by_reference(op)
    return lambda x: torch.amin(x, dim=axis, keepdim=True)


@builder("argmax", "argmin")
def _arg_reduce(op: Op, ctx: BuildContext) -> Kernel:
    axis = op.attrs["axis"]
    fn = torch.argmax if op.kind == "argmax" else torch.argmin

    def run(x: torch.Tensor) -> torch.Tensor:
        # int8 codes are widened first: torch's integer argmax/argmin is defined for every dtype, but the
        # widening keeps one code path for int8/int16/int32 inputs
        return fn(x.to(torch.int32), dim=axis, keepdim=True).to(torch.int32)
    return run
