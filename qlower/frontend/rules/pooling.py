"""Pooling and reductions: max_pool2d, avg_pool2d, adaptive_avg_pool2d, mean, sum.

Max pooling stays in its input's domain. Average pooling owns its output
domain. A global average (the window is the whole plane) is a mean, below.
Otherwise int8 codes are first rescaled (exactly, ×128) to int16 with the zero
point removed and averaged there, then rescaled to the output: the IR's
TOSA-style integer average rounds at 1/256 of an input step, so the result is
within that of a single rounding.
``count_include_pad`` padding becomes an explicit ``pad`` with the code of 0.0
followed by an unpadded pool. ``mean`` / ``sum`` over any dims: rescale to int32
(zero point removed), ``reduce_sum`` per dim, multiply by an int32 constant
holding ``1/count`` exactly (code 1, scale ``1/count``), rescale to the output.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.quantizer import packet
from qlower.frontend.rules import register
from qlower.frontend.rules.elementwise import _float_ref
from qlower.ir import DType, QuantSpec

aten = torch.ops.aten
WIDEN = 128  # int8 codes minus zero point times 128 stay within int16


def _pair(v) -> tuple[int, int]:
    v = [v] if isinstance(v, int) else list(v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _nhwc(ctx: ImportContext, x: Ref):
    x = _float_ref(ctx, x)
    if x.rank != 4:
        raise ctx.unsupported(f"2-D pooling needs a 4-D [N, C, H, W] input, got rank {x.rank}")
    if x.is_quantized and x.spec.is_per_channel:
        return ctx.as_float(x, layout.NHWC)
    return ctx.value_in(x, layout.NHWC) if x.is_quantized else ctx.as_float(x, layout.NHWC)


def _bottom_right_pad(size: int, out: int, k: int, s: int, p: int) -> int:
    """Padding after, so that the IR's floor-mode size equals PyTorch's (ceil_mode adds windows)."""
    return max(p, (out - 1) * s + k - size - p)


@register(aten.max_pool2d)
def max_pool2d(ctx: ImportContext, node, input: Ref, kernel_size, stride=(), padding=0, dilation=1,
               ceil_mode=False, **_):
    if _pair(dilation) != (1, 1):
        raise ctx.unsupported("max_pool2d with dilation")
    k, p = _pair(kernel_size), _pair(padding)
    s = _pair(stride) if stride else k
    v = _nhwc(ctx, input)
    _, h, w, _ = v.shape
    oh, ow = (int(d) for d in node.meta["val"].shape[-2:])
    pad = (p[0], _bottom_right_pad(h, oh, k[0], s[0], p[0]), p[1], _bottom_right_pad(w, ow, k[1], s[1], p[1]))
    return Ref.of(ctx.emit("max_pool2d", v, perm=layout.NHWC, kernel=k, stride=s, pad=pad), layout.NHWC)


def average(ctx: ImportContext, input: Ref, kernel, stride, pad, count_include_pad: bool) -> Ref:
    if tuple(kernel) == tuple(input.torch_shape[-2:]) and not any(pad):  # global: sum, then one rounding
        return reduce_dims(ctx, input, [2, 3], mean=True, keepdim=True)
    v = _nhwc(ctx, input)
    fill = 0.0
    if v.quant is not None:
        target = ctx.requant_target()
        if target is not None and target != v.quant:
            wide = QuantSpec.per_tensor(v.quant.scale[0] / WIDEN, 0, DType.INT16)
            v = ctx.rescale(v, wide, layout.NHWC)
        fill = v.quant.zero_point[0]
    if count_include_pad and any(pad):
        v = ctx.emit("pad", v, perm=layout.NHWC, pads=(0, 0, pad[0], pad[1], pad[2], pad[3], 0, 0), value=fill)
        pad = (0, 0, 0, 0)
    out = ctx.emit("avg_pool2d", v, perm=layout.NHWC, kernel=tuple(kernel), stride=tuple(stride), pad=tuple(pad))
    return ctx.requant(out, layout.NHWC)


@register(aten.avg_pool2d)
def avg_pool2d(ctx: ImportContext, node, input: Ref, kernel_size, stride=(), padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None, **_):
    if divisor_override:
        raise ctx.unsupported("avg_pool2d with divisor_override")
    k, p = _pair(kernel_size), _pair(padding)
    s = _pair(stride) if stride else k
    h, w = input.torch_shape[-2:]
    oh, ow = (int(d) for d in node.meta["val"].shape[-2:])
    if ceil_mode and ((h + 2 * p[0] - k[0]) // s[0] + 1, (w + 2 * p[1] - k[1]) // s[1] + 1) != (oh, ow):
        raise ctx.unsupported("avg_pool2d with ceil_mode adding partial windows")
    return average(ctx, input, k, s, (p[0], p[0], p[1], p[1]), count_include_pad)


@register(aten.adaptive_avg_pool2d)
def adaptive_avg_pool2d(ctx: ImportContext, node, input: Ref, output_size, **_):
    h, w = input.torch_shape[-2:]
    oh, ow = (int(d) for d in node.meta["val"].shape[-2:])
    if h % oh or w % ow:
        raise ctx.unsupported(f"adaptive_avg_pool2d from {h}x{w} to {oh}x{ow}: sizes must divide evenly")
    k = (h // oh, w // ow)
    return average(ctx, input, k, k, (0, 0, 0, 0), False)


@register(aten.mean, aten.sum)
def reduce(ctx: ImportContext, node, input: Ref, dim=None, keepdim=False, dtype=None, **_):
    if dtype is not None and dtype != torch.float32:
        raise ctx.unsupported(f"reduction to dtype {dtype}")
    return reduce_dims(ctx, input, dim or range(input.rank), packet(node) is aten.mean, keepdim)


def reduce_dims(ctx: ImportContext, input: Ref, dims, mean: bool, keepdim: bool) -> Ref:
    """Sum (or mean) over PyTorch ``dims`` in the input's own layout; quantized: exact int32 sum,
    times ``1/count`` held exactly as an int32 constant's scale, one rounding in the final rescale."""
    x = _float_ref(ctx, input)
    dims = sorted({layout.normalize_axis(d, x.rank) for d in dims})
    count = int(np.prod([x.torch_shape[d] for d in dims]))
    quantized = x.is_quantized and not x.spec.is_per_channel
    if quantized:
        v = ctx.rescale(ctx.value_in(x), QuantSpec.per_tensor(x.spec.scale[0], 0, DType.INT32), x.perm)
    else:
        v = ctx.as_float(x)
    for d in dims:
        v = ctx.emit("reduce_sum", v, perm=x.perm, axis=layout.ir_axis(x.perm, d))
    if mean and count > 1:
        ones = (1,) * x.rank
        if quantized:
            c = ctx.constant(np.ones(ones, np.int32), QuantSpec.per_tensor(1.0 / count, 0, DType.INT32))
        else:
            c = ctx.constant(np.full(ones, 1.0 / count, np.float32))
        v = ctx.emit("mul", v, c, perm=x.perm)
    result = ctx.requant(v, x.perm) if quantized else Ref.of(v, x.perm)
    if keepdim:
        return result
    shape = tuple(s for d, s in enumerate(x.torch_shape) if d not in dims)
    perm = layout.drop_dims(x.perm, dims)
    return Ref.of(ctx.emit("reshape", result.value, perm=perm, shape=layout.ir_shape(shape, perm)), perm)
