"""The float fallback op on the CPU: the reference's own call of the ATen op (bit-exact by construction)."""

from __future__ import annotations

import torch

from qlower.backends.cpu.context import BuildContext, Kernel, builder
from qlower.backends.cpu.tensor_utils import execution_error
from qlower.ir import Op
from qlower.reference.aten_fallback import call, resolve


@builder("aten")
def _aten(op: Op, ctx: BuildContext) -> Kernel:
    resolve(op.attrs["target"])  # a bad target fails at prepare time, not at the first run

    def run(xs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        try:
            return call(op, xs)
        except (ArithmeticError, ValueError, RuntimeError) as e:
            raise execution_error(op, str(e)) from e
    return run
