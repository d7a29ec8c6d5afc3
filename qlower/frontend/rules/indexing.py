"""Ops that pick, reorder or repeat elements: split, unbind, flip, roll, repeat, index_select, index
(constant indices), gather, embedding.

Every result keeps its input's QuantSpec (the quantizer puts these ops in their
input's domain, every output of split/unbind included), so they are exact on
codes. They become slices, concats and reshapes where that is cheap, else one
IR ``gather``:

- constant indices (flip, index_select, ``torch.gather``) are checked here and
  typed with their proven range ``[0, size - 1]``, which lets backends without a
  run-time index check (TOSA GATHER) take them;
- run-time indices (token ids into an embedding, an ``index_select`` by a graph
  input) are plain int32; the reference and cpu kernels reject an index outside
  the axis with an ExecutionError, TOSA leaves such a gather on the host.

A per-channel quantized constant never reaches these rules in a useful form
(only weights are per channel), so it is refused with ``ctx.unsupported``.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.rules import register
from qlower.frontend.rules.elementwise import _float_ref
from qlower.frontend.rules.movement import concat_refs, reshape_to, slice_along
from qlower.ir import DType, QuantSpec, Value

aten = torch.ops.aten


def _movable(ctx: ImportContext, x: Ref) -> Ref:
    """``x`` as floats, plain integers or per-tensor codes (elements keep their meaning wherever they go)."""
    x = _float_ref(ctx, x)
    if x.spec is not None and x.spec.is_per_channel:
        raise ctx.unsupported("moving elements of a per-channel quantized tensor")
    return x


def _drop_dim(ctx: ImportContext, x: Ref, d: int) -> Ref:
    """``x`` (size 1 along PyTorch dim ``d``) without that dim."""
    shape = tuple(s for i, s in enumerate(x.torch_shape) if i != d)
    if x.is_const:
        return Ref(data=x.data.reshape(shape), perm=layout.identity(len(shape)), quant=x.quant, origin=x.origin)
    perm = layout.drop_dims(x.perm, [d])
    return Ref.of(ctx.emit("reshape", x.value, perm=perm, shape=layout.ir_shape(shape, perm)), perm)


def bounded_indices(ctx: ImportContext, data: np.ndarray, size: int) -> tuple[np.ndarray, QuantSpec]:
    """Constant indices as int32 typed with their proven range (PyTorch rejects negative ones here too)."""
    data = np.asarray(data)
    if data.dtype.kind not in "iu":
        raise ctx.unsupported(f"indices of dtype {data.dtype} (integer indices expected)")
    if data.size and (data.min() < 0 or data.max() >= size):
        raise ctx.unsupported(f"a constant index outside 0..{size - 1}")
    return data.astype(np.int32), QuantSpec(DType.INT32, (1.0,), (0,), 0, max(size - 1, 0))


def gather_constant(ctx: ImportContext, x: Ref, d: int, index: np.ndarray) -> Ref:
    """``x`` indexed along PyTorch dim ``d`` by a 1-D constant ``index``; a run of consecutive
    indices is a slice, anything else one ``gather`` in the value's own layout."""
    size = x.torch_shape[d]
    index = np.asarray(index).reshape(-1)
    if index.size == 0:
        raise ctx.unsupported("an empty index")
    if np.array_equal(index, np.arange(index[0], index[0] + index.size)) and 0 <= index[0] and index[-1] < size:
        return slice_along(ctx, x, d, int(index[0]), int(index[-1]) + 1, 1)
    data, spec = bounded_indices(ctx, index, size)
    if x.is_const:
        return Ref(data=np.ascontiguousarray(np.take(x.data, data, axis=d)), perm=x.perm, quant=x.quant,
                   origin=x.origin)
    v = ctx.value_in(x)
    out = ctx.emit("gather", v, ctx.constant(data, spec), perm=x.perm, axis=layout.ir_axis(x.perm, d))
    return Ref.of(out, x.perm)


# -- several results ------------------------------------------------------------------------

@register(aten.split, aten.split_with_sizes, aten.split_copy, aten.split_with_sizes_copy)  # _copy: not views
def split(ctx: ImportContext, node, input: Ref, split_size=None, split_sizes=None, dim=0, **_):
    x = _movable(ctx, input)
    d = layout.normalize_axis(dim, x.rank)
    size = x.torch_shape[d]
    sizes = split_sizes if split_sizes is not None else split_size
    if isinstance(sizes, int):
        if sizes <= 0:
            raise ctx.unsupported(f"split size {sizes}")
        sizes = [min(sizes, size - s) for s in range(0, size, sizes)]
    sizes = [int(n) for n in sizes]
    if sum(sizes) != size or any(n <= 0 for n in sizes):
        raise ctx.unsupported(f"split sizes {sizes} of a dim of size {size} (empty pieces are not supported)")
    pieces, start = [], 0
    for n in sizes:
        pieces.append(slice_along(ctx, x, d, start, start + n, 1))
        start += n
    return tuple(pieces)


@register(aten.unbind)
def unbind(ctx: ImportContext, node, input: Ref, dim=0, **_):
    x = _movable(ctx, input)
    d = layout.normalize_axis(dim, x.rank)
    return tuple(_drop_dim(ctx, slice_along(ctx, x, d, i, i + 1, 1), d) for i in range(x.torch_shape[d]))


# -- reordering and repetition --------------------------------------------------------------

@register(aten.flip)
def flip(ctx: ImportContext, node, input: Ref, dims, **_):
    x = _movable(ctx, input)
    for d in sorted({layout.normalize_axis(d, x.rank) for d in dims}):
        n = x.torch_shape[d]
        if n > 1:
            x = gather_constant(ctx, x, d, np.arange(n - 1, -1, -1))
    return x


def _roll_dim(ctx: ImportContext, x: Ref, shift: int, d: int) -> Ref:
    n = x.torch_shape[d]
    s = shift % n if n else 0
    if s == 0:
        return x
    return concat_refs(ctx, [slice_along(ctx, x, d, n - s, n, 1), slice_along(ctx, x, d, 0, n - s, 1)], d)


@register(aten.roll)
def roll(ctx: ImportContext, node, input: Ref, shifts, dims=(), **_):
    x = _movable(ctx, input)
    shifts, dims = [int(s) for s in shifts], [int(d) for d in dims]
    if not dims:  # roll of the flattened tensor
        if len(shifts) != 1:
            raise ctx.unsupported(f"roll with shifts {shifts} and no dims")
        shape = x.torch_shape
        flat = _roll_dim(ctx, reshape_to(ctx, x, (int(np.prod(shape, dtype=np.int64)),)), shifts[0], 0)
        return reshape_to(ctx, flat, shape)
    if len(shifts) != len(dims):
        raise ctx.unsupported(f"roll with {len(shifts)} shifts for {len(dims)} dims")
    for s, d in zip(shifts, dims):
        x = _roll_dim(ctx, x, s, layout.normalize_axis(d, x.rank))
    return x


@register(aten.repeat)
def repeat(ctx: ImportContext, node, input: Ref, repeats, **_):
    x = _movable(ctx, input)
    repeats = [int(r) for r in repeats]
    k = len(repeats) - x.rank
    if k < 0 or any(r <= 0 for r in repeats):
        raise ctx.unsupported(f"repeat {repeats} of a rank-{x.rank} tensor")
    if x.is_const:
        data = np.tile(x.data, repeats)
        return Ref(data=data, perm=layout.identity(data.ndim), quant=x.quant, origin=x.origin)
    if k:
        x = reshape_to(ctx, x, (1,) * k + x.torch_shape)
    for d, r in enumerate(repeats):
        if r > 1:
            x = concat_refs(ctx, [x] * r, d)
    return x


# -- indexing -------------------------------------------------------------------------------

def _index_value(ctx: ImportContext, index: Ref) -> Value:
    """A run-time index tensor (plain int32) in its own layout."""
    spec = index.spec
    if index.is_const or spec is None or not spec.is_plain_integer or index.value.dtype is not DType.INT32:
        raise ctx.unsupported("a run-time index that is not an integer tensor")
    return ctx.value_in(index)


@register(aten.index_select)
def index_select(ctx: ImportContext, node, input: Ref, dim, index: Ref, **_):
    x = _movable(ctx, input)
    d = layout.normalize_axis(dim, x.rank)
    if index.is_const and index.quant is None:
        return gather_constant(ctx, x, d, index.data)
    if x.rank == 0:
        raise ctx.unsupported("index_select of a 0-d tensor")
    idx = _index_value(ctx, index)
    if idx.type.rank != 1:
        raise ctx.unsupported("index_select takes a 1-D index")
    return Ref.of(ctx.emit("gather", ctx.value_in(x), idx, perm=x.perm, axis=layout.ir_axis(x.perm, d)), x.perm)


@register(aten.index)
def index(ctx: ImportContext, node, input: Ref, indices, **_):
    """``x[:, [1, 0, 3]]``: one constant 1-D integer index (negative ones count from the end); several
    constant integer indices (broadcast together, NumPy's rules, which are PyTorch's): the positions
    they pick, a slice of the flattened tensor where they are a run (the attention-mask code of
    Hugging Face models, ``mask[zeros, arange]``), else one flat ``gather``."""
    x = _movable(ctx, input)
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if not given:
        raise ctx.unsupported("advanced indexing without an index tensor")
    if not all(isinstance(i, Ref) and i.is_const and i.quant is None for _, i in given):
        raise ctx.unsupported("advanced indexing with a run-time index (constant indices are supported)")
    if any(np.asarray(i.data).dtype.kind not in "iu" for _, i in given):
        raise ctx.unsupported("advanced indexing with a bool or float index (integer indices are supported)")
    if len(given) == 1 and np.asarray(given[0][1].data).ndim == 1:
        d, idx = given[0]
        data, size = np.asarray(idx.data), x.torch_shape[d]
        return gather_constant(ctx, x, d, np.where(data < 0, data + size, data))
    return _gather_positions(ctx, x, [None if i is None else np.asarray(i.data) for i in indices])


def _gather_positions(ctx: ImportContext, x: Ref, indices: list[np.ndarray | None]) -> Ref:
    """``x[indices]`` (PyTorch's advanced indexing by constant integer arrays), in PyTorch layout."""
    shape = x.torch_shape
    key = tuple(slice(None) if i is None else i for i in indices)
    try:
        positions = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)[key]
    except IndexError as e:
        raise ctx.unsupported(f"advanced indexing out of range: {e}") from None
    if positions.size == 0:
        raise ctx.unsupported("an empty index")
    flat = reshape_to(ctx, x, (int(np.prod(shape, dtype=np.int64)),))
    return reshape_to(ctx, gather_constant(ctx, flat, 0, positions.reshape(-1)), positions.shape)


@register(aten.gather)
def gather(ctx: ImportContext, node, input: Ref, dim, index: Ref, sparse_grad=False, **_):
    """``torch.gather`` with a constant index: one flat ``gather`` in the value's own layout
    (the positions are computed here, so no transpose is needed)."""
    x = _movable(ctx, input)
    if not (index.is_const and index.quant is None):
        raise ctx.unsupported("torch.gather with a run-time index (a constant index is supported)")
    d = layout.normalize_axis(dim, x.rank)
    idx = np.asarray(index.data)
    if idx.ndim != x.rank:
        raise ctx.unsupported(f"a rank-{idx.ndim} index for a rank-{x.rank} tensor")
    bounded_indices(ctx, idx, x.torch_shape[d])  # range check
    coords = np.indices(idx.shape)
    coords[d] = idx
    if x.is_const:
        return Ref(data=np.ascontiguousarray(x.data[tuple(coords)]), perm=layout.identity(x.rank), quant=x.quant,
                   origin=x.origin)
    v = ctx.value_in(x)
    positions = np.ravel_multi_index(tuple(coords[p] for p in x.perm), v.shape)  # PyTorch order of the result
    positions = np.transpose(positions, x.perm)  # laid out like the result, in x's layout
    data, spec = bounded_indices(ctx, positions, v.type.numel)
    flat = ctx.emit("reshape", v, perm=(0,), shape=(v.type.numel,))
    return Ref.of(ctx.emit("gather", flat, ctx.constant(data, spec), perm=x.perm, axis=0), x.perm)


@register(aten.embedding)
def embedding(ctx: ImportContext, node, weight: Ref, indices: Ref, **_):
    """Rows of a constant table (int8 codes when the quantizer quantized it) at token ids."""
    table = _float_ref(ctx, weight)
    if table.rank != 2:
        raise ctx.unsupported(f"an embedding table of rank {table.rank}")
    if table.is_const and table.quant is not None and table.quant.is_per_channel:
        raise ctx.unsupported("a per-channel quantized embedding table")
    if indices.is_const and indices.quant is None:
        data = np.asarray(indices.data)
        rows = gather_constant(ctx, table, 0, data.reshape(-1))
        return reshape_to(ctx, rows, data.shape + (table.torch_shape[1],))
    perm = indices.perm + (indices.rank,)  # the ids' layout, then the row
    out = ctx.emit("gather", ctx.value_in(table, layout.identity(2)), _index_value(ctx, indices), perm=perm, axis=0)
    return Ref.of(out, perm)
