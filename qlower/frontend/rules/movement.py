"""Ops that only move elements: reshapes, permutes, slices, padding (constant, reflect, replicate, circular),
concatenation, expand, identities.

Quantized operands keep their QuantSpec (the quantizer puts these ops in their
input's domain). ``permute`` / ``transpose`` move no data: they change the
value's layout, and a ``transpose`` is emitted only where a later op needs a
particular order. A reshape needs PyTorch's element order, so an NHWC value is
transposed first, unless its element order already agrees (e.g. ``[N, 1, 1, C]``).
On constants these ops run at import time with NumPy/PyTorch.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.rules import register
from qlower.frontend.rules.compare import to_bool
from qlower.frontend.rules.elementwise import _float_ref
from qlower.frontend.rules.quantization import quantize_to
from qlower.ir import DType

aten = torch.ops.aten


def _movable_const(r: Ref) -> bool:
    return r.is_const and (r.quant is None or not r.quant.is_per_channel)


def _fold(ctx: ImportContext, node, x: Ref) -> Ref:
    """Apply a pure data-movement op to constant data (codes keep their spec)."""
    result = ctx.fold(node, {node.args[0]: torch.from_numpy(np.array(x.data))})
    return Ref(data=result.contiguous().numpy().copy(), perm=layout.identity(result.dim()), quant=x.quant,
               origin=x.origin)


def reshape_to(ctx: ImportContext, x: Ref, shape: tuple[int, ...]) -> Ref:
    """``x`` reshaped in PyTorch's row-major order, in PyTorch layout."""
    x = _float_ref(ctx, x)
    if x.is_const:
        if not _movable_const(x):
            raise ctx.unsupported("reshape of a per-channel quantized constant")
        return Ref(data=x.data.reshape(shape), perm=layout.identity(len(shape)), quant=x.quant, origin=x.origin)
    if x.value.quant is not None and x.value.quant.is_per_channel:
        x = Ref.of(ctx.as_float(x), x.perm)
    in_order = layout.keeps_row_major_order(x.value.shape, x.perm)
    v = ctx.value_in(x) if in_order else ctx.value_in(x, layout.identity(x.rank))
    perm = layout.identity(len(shape))
    if tuple(v.shape) != tuple(shape):
        v = ctx.emit("reshape", v, perm=perm, shape=tuple(shape))
    return Ref.of(v, perm)


@register(aten.view, aten.reshape, aten._unsafe_view, aten.flatten, aten.unsqueeze, aten.squeeze)
def reshape(ctx: ImportContext, node, input: Ref, **_):
    return reshape_to(ctx, input, tuple(int(d) for d in node.meta["val"].shape))


@register(aten.clone, aten.contiguous, aten.alias, aten.detach, aten.lift_fresh_copy, aten.dropout)
def identity(ctx: ImportContext, node, input: Ref, train=False, **_):
    if train:
        raise ctx.unsupported("dropout in training mode; call model.eval() before exporting")
    return input


def permuted(ctx: ImportContext, node, x: Ref, dims) -> Ref:
    x = _float_ref(ctx, x)
    if x.is_const:
        data = np.transpose(x.data, dims)
        quant = x.quant.with_axis(list(dims).index(x.quant.axis)) if x.quant is not None and x.quant.is_per_channel \
            else x.quant
        return Ref(data=np.ascontiguousarray(data), perm=layout.identity(data.ndim), quant=quant, origin=x.origin)
    return Ref.of(x.value, layout.after_permute(x.perm, dims))


@register(aten.permute)
def permute(ctx: ImportContext, node, input: Ref, dims, **_):
    return permuted(ctx, node, input, dims)


@register(aten.transpose)
def transpose(ctx: ImportContext, node, input: Ref, dim0, dim1, **_):
    dims = list(range(input.rank))
    a, b = layout.normalize_axis(dim0, input.rank), layout.normalize_axis(dim1, input.rank)
    dims[a], dims[b] = dims[b], dims[a]
    return permuted(ctx, node, input, dims)


@register(aten.t)
def t(ctx: ImportContext, node, input: Ref, **_):
    return permuted(ctx, node, input, list(range(input.rank))[::-1])


def slice_along(ctx: ImportContext, x: Ref, dim: int, start: int, stop: int, step: int) -> Ref:
    x = _float_ref(ctx, x)
    d = layout.normalize_axis(dim, x.rank)
    if x.is_const:
        index = [slice(None)] * x.rank
        index[d] = slice(start, stop, step)
        return Ref(data=np.ascontiguousarray(x.data[tuple(index)]), perm=x.perm, quant=x.quant, origin=x.origin)
    v = ctx.value_in(x)
    axis = layout.ir_axis(x.perm, d)
    starts, stops, steps = [0] * x.rank, list(v.shape), [1] * x.rank
    starts[axis], stops[axis], steps[axis] = start, stop, step
    if (starts, stops, steps) == ([0] * x.rank, list(v.shape), [1] * x.rank):
        return x
    out = ctx.emit("slice", v, perm=x.perm, start=tuple(starts), stop=tuple(stops), step=tuple(steps))
    return Ref.of(out, x.perm)


@register(aten.slice)
def slice_(ctx: ImportContext, node, input: Ref, dim=0, start=None, end=None, step=1, **_):
    size = input.torch_shape[layout.normalize_axis(dim, input.rank)]
    s0, s1, st = slice(start, end, step).indices(size)
    if st < 1 or len(range(s0, s1, st)) == 0:
        raise ctx.unsupported(f"slice {start}:{end}:{step} of a dim of size {size} is empty or reversed")
    return slice_along(ctx, input, dim, s0, max(s1, s0), st)


@register(aten.select, aten.select_copy)  # select_copy: the same values, never a view
def select(ctx: ImportContext, node, input: Ref, dim, index, **_):
    d = layout.normalize_axis(dim, input.rank)
    i = index % input.torch_shape[d]
    x = slice_along(ctx, input, d, i, i + 1, 1)
    shape = tuple(int(s) for s in node.meta["val"].shape)
    if x.is_const:
        return Ref(data=x.data.reshape(shape), perm=layout.identity(len(shape)), quant=x.quant, origin=x.origin)
    perm = layout.drop_dims(x.perm, [d])
    ir = layout.ir_shape(shape, perm)
    return Ref.of(ctx.emit("reshape", x.value, perm=perm, shape=ir), perm)


def _edge_pad(ctx: ImportContext, x: Ref, pad, mode: str) -> Ref:
    """Reflect / replicate / circular padding as slices of ``x`` concatenated around it, one dim at a
    time (exact: every element is a copy of an input element)."""
    if len(pad) % 2 or len(pad) // 2 > x.rank:
        raise ctx.unsupported(f"pad list {list(pad)} for a rank-{x.rank} tensor")
    if x.spec is not None and x.spec.is_per_channel:
        raise ctx.unsupported("padding a per-channel quantized tensor")
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        before, after, n = int(pad[2 * i]), int(pad[2 * i + 1]), x.torch_shape[d]
        if before < 0 or after < 0:
            raise ctx.unsupported(f"negative {mode} padding {list(pad)}")
        if mode == "reflect":
            if max(before, after) >= n:
                raise ctx.unsupported(f"reflect padding {max(before, after)} of a dim of size {n}")
            rows = list(range(before, 0, -1)) + [None] + list(range(n - 2, n - 2 - after, -1))
        elif mode == "replicate":
            rows = [0] * before + [None] + [n - 1] * after
        else:  # circular
            if max(before, after) > n:
                raise ctx.unsupported(f"circular padding {max(before, after)} of a dim of size {n}")
            rows = list(range(n - before, n)) + [None] + list(range(after))
        if len(rows) > 1:
            x = concat_refs(ctx, [x if r is None else slice_along(ctx, x, d, r, r + 1, 1) for r in rows], d)
    return x


_PAD_MODES = {"reflection_pad1d": "reflect", "reflection_pad2d": "reflect", "reflection_pad3d": "reflect",
              "replication_pad1d": "replicate", "replication_pad2d": "replicate", "replication_pad3d": "replicate"}


@register(aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d, aten.replication_pad1d,
          aten.replication_pad2d, aten.replication_pad3d)
def edge_pad(ctx: ImportContext, node, input: Ref, padding, **_):
    return _edge_pad(ctx, _float_ref(ctx, input), padding, _PAD_MODES[node.target.overloadpacket.__name__])


@register(aten.pad, aten.constant_pad_nd)
def pad(ctx: ImportContext, node, input: Ref, pad, mode="constant", value=None, **_):
    if mode in ("reflect", "replicate", "circular"):
        return _edge_pad(ctx, _float_ref(ctx, input), pad, mode)
    if mode != "constant":
        raise ctx.unsupported(f"padding mode '{mode}'")
    x = _float_ref(ctx, input)
    if len(pad) % 2 or len(pad) // 2 > x.rank:
        raise ctx.unsupported(f"pad list {list(pad)} for a rank-{x.rank} tensor")
    before, after = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        before[d], after[d] = pad[2 * i], pad[2 * i + 1]
    for d in range(x.rank):  # negative padding crops
        if before[d] < 0 or after[d] < 0:
            size = x.torch_shape[d]
            x = slice_along(ctx, x, d, max(-before[d], 0), size - max(-after[d], 0), 1)
            before[d], after[d] = max(before[d], 0), max(after[d], 0)
    if not any(before) and not any(after):
        return x
    fill = 0.0 if value is None else float(value)
    v = ctx.value_in(x) if x.is_quantized else ctx.as_float(x)
    spec = v.quant
    if spec is not None:
        if spec.is_per_channel:
            raise ctx.unsupported("padding a per-channel quantized tensor")
        fill = int(ctx.quantize_value(np.array(fill, dtype=np.float32), spec))
    pads = []
    for p in x.perm:
        pads += [before[p], after[p]]
    return Ref.of(ctx.emit("pad", v, perm=x.perm, pads=tuple(pads), value=fill), x.perm)


def concat_refs(ctx: ImportContext, refs: list[Ref], dim: int) -> Ref:
    refs = [_float_ref(ctx, r) for r in refs]
    rank = refs[0].rank
    runtime = [r for r in refs if not r.is_const]
    perm = runtime[0].perm if runtime else layout.identity(rank)
    if any(r.is_quantized for r in refs):
        target = ctx.out_spec() or next(r.spec for r in refs if r.is_quantized)
        values = [ctx.value_in(quantize_to(ctx, r, target), perm) for r in refs]
    else:
        values = [ctx.as_float(r, perm) for r in refs]
    axis = layout.ir_axis(perm, dim)
    return Ref.of(ctx.emit("concat", tuple(values), perm=perm, axis=axis), perm)


@register(aten.cat, aten.concat)
def cat(ctx: ImportContext, node, tensors, dim=0, **_):
    refs = [r for r in tensors if not (r.is_const and r.data.size == 0)]
    return concat_refs(ctx, refs, layout.normalize_axis(dim, refs[0].rank))


@register(aten.stack)
def stack(ctx: ImportContext, node, tensors, dim=0, **_):
    rank = tensors[0].rank + 1
    d = layout.normalize_axis(dim, rank)
    refs = []
    for r in tensors:
        shape = list(r.torch_shape)
        shape.insert(d, 1)
        refs.append(reshape_to(ctx, r, tuple(shape)))
    return concat_refs(ctx, refs, d)


@register(aten.expand)
def expand(ctx: ImportContext, node, input: Ref, size, **_):
    shape = tuple(int(s) for s in node.meta["val"].shape)
    x = _float_ref(ctx, input)
    k = len(shape) - x.rank
    if x.is_const:
        data = np.broadcast_to(x.data.reshape((1,) * k + x.data.shape), shape)
        return Ref(data=np.ascontiguousarray(data), perm=layout.identity(len(shape)), quant=x.quant,
                   origin=x.origin)
    if k:
        x = reshape_to(ctx, x, (1,) * k + x.torch_shape)
    for d, n in enumerate(shape):
        if x.torch_shape[d] == 1 and n > 1:
            x = concat_refs(ctx, [x] * n, d)
    return x



@register(aten.unflatten)
def unflatten(ctx: ImportContext, node, input: Ref, **_):
    return reshape_to(ctx, input, tuple(int(d) for d in node.meta["val"].shape))


@register(aten.to, aten._to_copy, aten.type_as)
def to(ctx: ImportContext, node, input: Ref, dtype=None, **_):
    out = node.meta.get("val")
    if out is not None and out.dtype == torch.bool:
        return to_bool(ctx, input)
    if (out is not None and out.dtype != torch.float32) or dtype not in (None, torch.float32):
        raise ctx.unsupported("only float32 tensors are supported (a cast to another dtype was found)")
    plain = input.spec is not None and input.spec.is_plain_integer and input.scale is None
    if plain or (input.is_const and input.data.dtype.kind in "biu" and input.quant is None) \
            or (not input.is_const and input.value.dtype is DType.BOOL):
        raise ctx.unsupported("a cast of integers or bools to float")  # the float fallback converts them
    return input


@register(aten._assert_tensor_metadata, aten._assert_scalar)
def assertion(ctx: ImportContext, node, *args, **kwargs):
    """Export-time checks: nothing to compute."""
    return None
