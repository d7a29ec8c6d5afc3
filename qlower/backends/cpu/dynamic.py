"""Dynamic quantization fused kernels (DESIGN.md: S0, S2).

The IR spells dynamic quantization as

    codes, scale = dynamic_quantize(x)
    acc = conv2d | fully_connected(codes, w_int8_per_channel, None)
    y = dequantize(acc, scale)
    out = add(y, bias_f32_const)          (optional)

``DynamicGemm`` runs the chain in one kernel: the run-time scale and codes (float32
divide and round-half-even, as the reference), the exact int32 accumulator on the
integer GEMM engines, then ``acc * (scale * w_scale)`` and the bias add in float32 in
the reference's order. Every step is an exact or correctly rounded IEEE operation
done in the same order as the reference, so the result is bit-identical to running
the ops one by one (the contract only asks for 1e-5 relative). Without
``dynamic_quantize`` in the group (its codes feed several GEMMs) the kernel takes the
codes and scale as inputs.
"""

from __future__ import annotations

import torch

from qlower.backends.cpu.context import BuildContext, Kernel
from qlower.backends.cpu.conv import int_conv_kernel
from qlower.backends.cpu.quantization import Dequantizer, dynamic_codes, dynamic_scale
from qlower.backends.cpu.tensor_utils import torch_dtype
from qlower.ir import Op


class DynamicGemm:
    """``[dynamic_quantize] -> conv2d|fully_connected -> dequantize [-> add(bias const)]`` as one kernel.

    Called with ``(x, w, b[, bias])`` when ``dynamic_quantize`` is fused, else with
    ``(codes, scale, w, b[, bias])``.
    """

    def __init__(self, dq: Op | None, gemm_op: Op, deq: Op, add: Op | None, ctx: BuildContext) -> None:
        self.dq, self.gemm_op, self.deq, self.add = dq, gemm_op, deq, add
        self.gemm = int_conv_kernel(gemm_op, ctx)
        acc = gemm_op.result.type
        self.dequantize = Dequantizer(acc.quant, acc.rank, acc.dtype)
        if dq is not None:
            self.granularity, self.qmax = dq.attrs["granularity"], dq.attrs["qmax"]
            self.codes_dtype = torch_dtype(dq.attrs["dtype"])
        self.bias_first = add is not None and add.operands[0] is not deq.result

    def __call__(self, *args: torch.Tensor | None) -> torch.Tensor:
        if self.dq is not None:
            x, *rest = args
            scale = dynamic_scale(x, self.granularity, self.qmax)
            codes = dynamic_codes(x, scale, self.qmax, self.codes_dtype, self.dq)
        else:
            codes, scale, *rest = args
        w, b, *bias = rest
        acc = self.gemm(codes, w, b)
        y = self.dequantize(acc, scale)
        if self.add is None:
            return y
        return bias[0] + y if self.bias_first else y + bias[0]


def dynamic_kernel(dq: Op | None, gemm_op: Op, deq: Op, add: Op | None, ctx: BuildContext) -> Kernel:
    return DynamicGemm(dq, gemm_op, deq, add, ctx)
