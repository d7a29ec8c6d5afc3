"""conv_transpose1d / conv_transpose2d as an exact rewrite into ops the backends already have.

A transposed convolution with stride ``s``, padding ``p``, output padding ``op``,
dilation ``d`` and kernel ``k`` equals, per spatial dim, an ordinary stride-1
convolution (dilation ``d``) of the input with ``s - 1`` zeros inserted between
neighbours, padded by ``d·(k-1) - p`` before and ``d·(k-1) - p + op`` after (a
negative amount crops), with the weight's in/out channels swapped per group and
its taps flipped. Zeros are inserted with reshape → ``pad`` → reshape and hold the
zero point's code, so every product they enter is exactly 0: the integer result
is the conv2d rule's (same accumulator, bias and single ``rescale``).

Quantization: PyTorch's weight is ``[in, out/groups, k...]``, quantized per output
channel on axis 1 (the quantizer's ``weight_axis1``); the rewritten OIHW weight
repeats those ``out/groups`` scales once per group.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.rules import register
from qlower.frontend.rules.gemm import _conv_input, _spatial, conv
from qlower.frontend.rules.host import node_arg, on_host
from qlower.ir import QuantSpec, Value

aten = torch.ops.aten


@register(aten.conv_transpose1d, aten.conv_transpose2d)
def conv_transpose(ctx: ImportContext, node, input: Ref, weight: Ref, bias: Ref | None = None, stride=1,
                   padding=0, output_padding=0, groups=1, dilation=1, **_):
    n_sp = input.rank - 2
    s, p, op, d = (_spatial(v, n_sp) for v in (stride, padding, output_padding, dilation))
    reason = None
    if not weight.is_const or weight.data.ndim != n_sp + 2 or n_sp not in (1, 2):
        reason = "a transposed conv's weight must be a constant of the input's rank"
    elif input.scale is not None:
        reason = "a transposed conv of dynamically quantized codes"
    elif input.is_quantized and (input.spec.is_per_channel or weight.quant is None):
        reason = "a transposed conv of a per-channel quantized input or with a float weight"
    elif weight.quant is not None and weight.quant.is_per_channel and weight.quant.axis != 1:
        reason = "a transposed conv's weight must be quantized per output channel (axis 1)"
    if reason is not None:
        args = (node.args[0], node.args[1], node_arg(node, 2, "bias"), list(s), list(p), list(d), True, list(op),
                groups)
        return on_host(ctx, node, aten.convolution.default, args, reason)

    k = weight.data.shape[2:]
    if n_sp == 1:
        s, p, op, d, k = (1,) + s, (0,) + p, (0,) + op, (1,) + d, (1,) + k
    x, _ = _conv_input(ctx, input, n_sp) if input.is_quantized else (_float_input(ctx, input, n_sp), None)
    fill = x.quant.zero_point[0] if x.quant is not None else 0.0
    x = _insert_zeros(ctx, x, s, fill)
    before = [di * (ki - 1) - pi for di, ki, pi in zip(d, k, p)]
    after = [di * (ki - 1) - pi + opi - (si - 1) for di, ki, pi, opi, si in zip(d, k, p, op, s)]
    x = _pad_or_crop(ctx, x, before, after, fill)
    w = _conv_weight(weight, groups, n_sp)
    out = conv(ctx, node, Ref.of(x, layout.NHWC), w, bias, stride=1, padding=0, dilation=d, groups=groups)
    if n_sp == 2:
        return out
    v = out.value
    if v.quant is not None and v.quant.is_per_channel:  # an accumulator can't be reshaped per channel
        v = ctx.as_float(out)
    return Ref.of(ctx.emit("reshape", v, perm=(0, 2, 1), shape=(v.shape[0], v.shape[2], v.shape[3])), (0, 2, 1))


def _float_input(ctx: ImportContext, x: Ref, n_sp: int) -> Value:
    if n_sp == 2:
        return ctx.as_float(x, layout.NHWC)
    v = ctx.as_float(x, (0, 2, 1))
    return ctx.emit("reshape", v, perm=(), shape=(v.shape[0], 1) + v.shape[1:])


def _insert_zeros(ctx: ImportContext, x: Value, stride, fill) -> Value:
    """``s - 1`` copies of ``fill`` after every row (H) and column (W) of NHWC ``x``."""
    sh, sw = stride
    n, h, w, c = x.shape
    if sh > 1:
        x = ctx.emit("reshape", x, perm=(), shape=(n, h, 1, w * c))
        x = ctx.emit("pad", x, perm=(), pads=(0, 0, 0, 0, 0, sh - 1, 0, 0), value=fill)
        h *= sh
        x = ctx.emit("reshape", x, perm=layout.NHWC, shape=(n, h, w, c))
    if sw > 1:
        x = ctx.emit("reshape", x, perm=(), shape=(n * h, w, 1, c))
        x = ctx.emit("pad", x, perm=(), pads=(0, 0, 0, 0, 0, sw - 1, 0, 0), value=fill)
        w *= sw
        x = ctx.emit("reshape", x, perm=layout.NHWC, shape=(n, h, w, c))
    return x


def _pad_or_crop(ctx: ImportContext, x: Value, before, after, fill) -> Value:
    """Pad H and W of NHWC ``x`` by (before, after); a negative amount removes rows/columns."""
    n, h, w, c = x.shape
    if any(b < 0 for b in before) or any(a < 0 for a in after):
        start = (0, max(-before[0], 0), max(-before[1], 0), 0)
        stop = (n, h - max(-after[0], 0), w - max(-after[1], 0), c)
        x = ctx.emit("slice", x, perm=layout.NHWC, start=start, stop=stop, step=(1, 1, 1, 1))
    pads = (0, 0, max(before[0], 0), max(after[0], 0), max(before[1], 0), max(after[1], 0), 0, 0)
    if any(pads):
        x = ctx.emit("pad", x, perm=layout.NHWC, pads=pads, value=fill)
    return x


def _conv_weight(weight: Ref, groups: int, n_sp: int) -> Ref:
    """``[in, out/g, k...]`` → the equivalent conv's ``[out, in/g, kh, kw]``: channels swapped per
    group, taps flipped; per-channel scales (axis 1) repeated once per group on axis 0."""
    data = weight.data
    cin, cout_g = data.shape[:2]
    k = data.shape[2:]
    w = data.reshape((groups, cin // groups, cout_g) + k).swapaxes(1, 2).reshape((groups * cout_g, cin // groups) + k)
    w = np.flip(w, axis=tuple(range(2, 2 + n_sp)))
    if n_sp == 1:
        w = w[:, :, None, :]
    quant = weight.quant
    if quant is not None and quant.is_per_channel:
        quant = QuantSpec(quant.dtype, tuple(np.tile(quant.scale, groups)), tuple(np.tile(quant.zero_point, groups)),
                          quant.qmin, quant.qmax, axis=0)
    return Ref(data=np.ascontiguousarray(w), perm=(0, 1, 2, 3), quant=quant, origin=weight.origin)
