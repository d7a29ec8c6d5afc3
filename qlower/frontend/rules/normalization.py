"""Normalisation: the integer per-channel affine map of a BatchNorm that was not folded into a conv.

In eval mode a BatchNorm is ``y = a[c] * x + b[c]`` with ``a = w / sqrt(var + eps)`` and
``b = bias - mean * a`` (float64 at import). On per-tensor codes ``x = s (q - zp)``:

1. ``d = q - zp`` as int32 (exact ``rescale``);
2. ``mul`` by int32 codes ``A[c] = round(a[c] s / t)`` held at scale ``t / s``, with
   ``t = (max|d|·s·max|a| + max|b|) / 2**29``: the product has one per-tensor scale ``t``;
3. ``add`` ``b`` as int32 codes at ``t``; the sum stays below ``2**30``;
4. ``rescale`` to the output domain (the only rounding at the output's step).

Steps 2 and 3 round by at most ``(max|d| + 1) t / 2``, about ``2**-22`` of the value range, far
below an output step: the result is within 1 step of fake-quant. Every scale is per tensor, so the
ops run in whatever layout the input has (no per-channel RESCALE, which TOSA only has along the
last axis).

LayerNorm, GroupNorm and InstanceNorm stay float on the host (their decompositions end in
``native_layer_norm`` / ``native_group_norm`` / ``_native_batch_norm_legit``, core ATen fallbacks):
an integer version needs an integer reciprocal square root that is bit-exact between the
reference, the cpu kernels and TOSA 1.0 INT, which has none. The tensors around them stay
integer: their inputs and outputs are quantized where the model's other ops quantize them.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.errors import UnsupportedOpError
from qlower.frontend import channel_affine as _op  # noqa: F401  (defines torch.ops.qlower.channel_affine)
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.rules import register
from qlower.frontend.rules.elementwise import _float_ref, _int32_codes, _static_quantized
from qlower.ir import DType, QuantSpec

HEADROOM_BITS = 29


def channel_affine(ctx: ImportContext, input: Ref, scale: np.ndarray, shift: np.ndarray) -> Ref:
    """``scale[c] * x + shift[c]`` along PyTorch dim 1 of per-tensor codes ``input``, in integers."""
    x = _float_ref(ctx, input)
    q = x.spec
    c = x.torch_shape[1]
    shape = (1, c) + (1,) * (x.rank - 2)
    scale, shift = np.asarray(scale, np.float64).reshape(shape), np.asarray(shift, np.float64).reshape(shape)
    if not (np.isfinite(scale).all() and np.isfinite(shift).all()):
        raise ctx.unsupported("a BatchNorm with non-finite scale or shift (zero variance and eps?)")
    s = q.scale[0]
    widest = max(q.qmax - q.zero_point[0], q.zero_point[0] - q.qmin)
    span = widest * s * float(np.abs(scale).max()) + float(np.abs(shift).max())
    t = (span or 1.0) / 2**HEADROOM_BITS
    multiplier = Ref.constant(_int32_codes(ctx, scale * s / t, 1.0), QuantSpec.per_tensor(t / s, 0, DType.INT32))
    perm, (vx, vm) = ctx.broadcast([x, multiplier])
    product = ctx.emit("mul", ctx.rescale(vx, QuantSpec.per_tensor(s, 0, DType.INT32), perm), vm, perm=perm)
    p = product.quant.scale[0]
    offset = Ref.constant(_int32_codes(ctx, shift, p), QuantSpec.per_tensor(p, 0, DType.INT32))
    _, (vb,) = ctx.broadcast([offset], perm=perm)
    return ctx.requant(ctx.emit("add", product, vb, perm=perm), perm)


@register(torch.ops.qlower.channel_affine)
def unfolded_batch_norm(ctx: ImportContext, node, input: Ref, scale: Ref, shift: Ref, **_):
    if _static_quantized(_float_ref(ctx, input)):
        try:
            return channel_affine(ctx, input, scale.data, shift.data)
        except UnsupportedOpError:
            pass  # this op has no core-ATen float fallback: float IR ops below
    shape = (1, -1) + (1,) * (input.rank - 2)
    mul = Ref.constant(scale.data.reshape(shape).astype(np.float32))
    add = Ref.constant(shift.data.reshape(shape).astype(np.float32))
    perm, (x, m) = ctx.broadcast([input, mul], floats=True)
    _, (a,) = ctx.broadcast([add], perm=perm, floats=True)
    return Ref.of(ctx.emit("add", ctx.emit("mul", x, m, perm=perm), a, perm=perm), perm)
