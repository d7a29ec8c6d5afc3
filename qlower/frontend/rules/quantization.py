"""Quantize / dequantize nodes of a converted PT2E graph, folded into the types of IR values.

Static: ``q(s, zp) → dq(s, zp)`` around a tensor turns it into integer codes
with that QuantSpec. A ``quantize`` of a float value becomes an IR ``quantize``
(graph inputs, float islands); a ``quantize`` of codes already in that spec is
nothing; a ``dequantize`` is nothing (consumers that need floats ask for an
explicit IR ``dequantize``). Quantized constants (``fold_quantize`` turned them
into int8 attributes) keep their codes and get the spec from their dequantize.

Dynamic: ``choose_qparams → quantize(x, s, zp) → dequantize`` becomes one IR
``dynamic_quantize`` of ``x``, per tensor or per row (the block size decides).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch
from torch.fx import Node

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref, ir_dtype, spec_from_qparams
from qlower.frontend.rules import register
from qlower.ir import QuantSpec

QD = torch.ops.quantized_decomposed
TORCHAO = torch.ops.torchao


@dataclass(frozen=True)
class DynamicQParams:
    """The run-time (scale, zero point) of ``source``; nothing is emitted for it."""

    source: Ref
    symmetric: bool


@dataclass(frozen=True)
class DynamicCodes:
    """``source`` quantized at run time; becomes IR when its dequantize is reached."""

    source: Ref
    block_size: tuple[int, ...] | None
    qmin: int
    qmax: int
    symmetric: bool


def quantize_to(ctx: ImportContext, x: Ref, spec: QuantSpec) -> Ref:
    """``x`` as codes in ``spec``: quantize floats, rescale codes of another domain, keep equal ones."""
    producer = ctx.node.args[0] if ctx.node is not None and ctx.node.args else None
    origin = ctx.origin_of(producer if isinstance(producer, Node) else ctx.node, x.perm)
    if x.is_const and x.quant is None:
        return Ref.constant(ctx.quantize_value(x.data, spec), spec, x.origin)
    if x.is_quantized and x.scale is None and x.spec == spec:
        return x
    if not x.is_quantized or x.scale is not None:
        value = ctx.emit("quantize", ctx.as_float(x), perm=x.perm, origin=origin, out=spec)
        return Ref.of(value, x.perm)
    return Ref.of(ctx.emit("rescale", ctx.value_in(x), perm=x.perm, origin=origin, out=spec), x.perm)


@register(QD.quantize_per_tensor)
def quantize_per_tensor(ctx: ImportContext, node, input, scale, zero_point, quant_min, quant_max, dtype, **_):
    if isinstance(scale, DynamicQParams):
        return DynamicCodes(input, None, quant_min, quant_max, scale.symmetric)
    return quantize_to(ctx, input, spec_from_qparams(scale, zero_point, quant_min, quant_max, dtype))


@register(QD.dequantize_per_tensor)
def dequantize_per_tensor(ctx: ImportContext, node, input, scale, zero_point, quant_min, quant_max, dtype, **_):
    if isinstance(input, DynamicCodes):
        return dynamic_quantize(ctx, input)
    spec = spec_from_qparams(scale, zero_point, quant_min, quant_max, dtype)
    if input.is_const and input.quant is None and input.data.dtype.kind in "iu":
        return Ref.constant(input.data, spec, input.origin)
    if not input.is_quantized:
        raise ctx.unsupported("dequantize of a tensor that was never quantized")
    return quantize_to(ctx, input, spec)


@register(QD.dequantize_per_channel)
def dequantize_per_channel(ctx: ImportContext, node, input, scales, zero_points, axis, quant_min, quant_max,
                           dtype, **_):
    if not (input.is_const and input.quant is None):
        raise ctx.unsupported("per-channel quantization is supported for constants (weights) only")
    zps = zero_points.data if isinstance(zero_points, Ref) else None
    spec = QuantSpec.per_channel(np.asarray(scales.data, dtype=np.float64), zps,
                                 axis=layout.normalize_axis(axis, input.data.ndim),
                                 dtype=ir_dtype(dtype), qmin=quant_min, qmax=quant_max)
    return Ref.constant(input.data, spec, input.origin)


@register(QD.quantize_per_channel)
def quantize_per_channel(ctx: ImportContext, node, input, scales, zero_points, axis, quant_min, quant_max,
                         dtype, **_):
    if not input.is_float_const:
        raise ctx.unsupported("per-channel quantization is supported for constants (weights) only")
    t = torch.from_numpy(input.data)
    s, z = torch.from_numpy(scales.data), torch.from_numpy(zero_points.data)
    codes = QD.quantize_per_channel.default(t, s, z, axis, quant_min, quant_max, dtype).numpy()
    return Ref.constant(codes, origin=input.origin)


# -- dynamic quantization -------------------------------------------------------------------

@register(QD.choose_qparams_symmetric)
def choose_qparams_symmetric(ctx: ImportContext, node, input, *args, **_):
    return DynamicQParams(input, symmetric=True)


@register(QD.choose_qparams)
def choose_qparams(ctx: ImportContext, node, input, *args, **_):
    return DynamicQParams(input, symmetric=False)


@register(TORCHAO.choose_qparams_affine)
def choose_qparams_affine(ctx: ImportContext, node, input, mapping_type, *args, **_):
    return DynamicQParams(input, symmetric=str(mapping_type) == "SYMMETRIC")


@register(operator.getitem)
def getitem(ctx: ImportContext, node, obj, index):
    if isinstance(obj, DynamicQParams):
        return obj
    if isinstance(obj, (tuple, list)):  # the results of a multi-output op (split, unbind, a fallback ...)
        return obj[index]
    raise ctx.unsupported("indexing the result of a multi-output op is not supported")


@register(TORCHAO.quantize_affine)
def quantize_affine(ctx: ImportContext, node, input, block_size, scale, zero_point, output_dtype,
                    quant_min=None, quant_max=None, **_):
    if not isinstance(scale, DynamicQParams):
        raise ctx.unsupported("static affine quantization of activations is not supported (use the qlower quantizer)")
    return DynamicCodes(input, tuple(block_size), int(quant_min), int(quant_max), scale.symmetric)


@register(TORCHAO.dequantize_affine)
def dequantize_affine(ctx: ImportContext, node, input, *args, **_):
    if not isinstance(input, DynamicCodes):
        raise ctx.unsupported("dequantize_affine is supported after a dynamic quantize_affine only")
    return dynamic_quantize(ctx, input)


def dynamic_quantize(ctx: ImportContext, codes: DynamicCodes) -> Ref:
    """IR ``dynamic_quantize`` of the source: per tensor, or per row along the one blocked dim.

    A per-row scale covers the IR value's last dim, so the value is laid out with
    the blocked PyTorch dim last (NHWC for a conv's channels: one scale per pixel).
    """
    if not codes.symmetric or codes.qmin != -codes.qmax:
        raise ctx.unsupported(f"dynamic quantization must be symmetric in [-qmax, qmax], got "
                              f"[{codes.qmin}, {codes.qmax}] {'symmetric' if codes.symmetric else 'asymmetric'}")
    x = codes.source
    shape = x.torch_shape
    if codes.block_size is None or tuple(codes.block_size) == tuple(shape):
        granularity, perm = "per_tensor", x.perm
    else:
        blocked = [d for d, b in enumerate(codes.block_size) if b != 1]
        if len(blocked) != 1 or codes.block_size[blocked[0]] != shape[blocked[0]]:
            raise ctx.unsupported(f"dynamic block size {list(codes.block_size)} for shape {list(shape)} is neither "
                                  f"per tensor nor per row")
        d = blocked[0]
        granularity = "per_row"
        if x.perm and x.perm[-1] == d:
            perm = x.perm
        elif len(shape) == 4 and d == 1:
            perm = layout.NHWC
        else:
            perm = tuple(p for p in x.perm if p != d) + (d,)
    source = ctx.as_float(x, perm)
    key = ("dynamic_quantize", source, granularity, codes.qmax)
    if key not in ctx.memo:  # several consumers of one tensor quantize it once
        ctx.memo[key] = ctx.emit_multi("dynamic_quantize", source, perm=perm, granularity=granularity,
                                       dtype=ir_dtype(torch.int8), qmax=codes.qmax)
    value, scale = ctx.memo[key]
    return Ref.of(value, perm, scale=scale)
