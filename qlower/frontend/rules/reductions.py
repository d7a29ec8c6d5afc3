"""Order reductions and the variance: amax / amin, max / min (whole tensor or along a dim, with indices),
argmax / argmin, var. (sum and mean are in pooling.py.)

Integer recipes, all exact on per-tensor codes:
- amax / amin / max / min values: ``reduce_max`` / ``reduce_min`` per dim on the codes; the result
  stays in the input's domain (the quantizer shares it), so it is exactly fake-quant's.
- indices (argmax / argmin, the second result of max.dim / min.dim): ``argmax`` / ``argmin`` on the
  codes, plain int32. Dequantization is strictly increasing in the code, so the first extreme code
  is where PyTorch finds the first extreme float: bit-exact with fake-quant, ties included.
- var: with ``d = code - zp`` (int32) over the ``N`` reduced elements, ``S1 = Σd``, ``S2 = Σd²``,
  ``var = s² (N·S2 - S1²) / (N (N - correction))``. The numerator is computed exactly in int32 (the
  rule checks statically that ``N²·max|d|²`` fits), ``1 / (N (N - correction))`` is held exactly as
  the scale of an int32 constant 1, and the only rounding is the final ``rescale`` to the output.

Float or per-channel inputs (and a var whose sums could overflow int32) raise ``ctx.unsupported``:
the op then runs in float on the host. Rules are registered per overload, only for core ATen ones
(which have that fallback) and ``max`` / ``min`` of a whole tensor (reduced in float IR ops here);
other overloads (``max.other``, ``var.default``, ...) are decomposed before quantization as before.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.quantizer import packet
from qlower.frontend.rules import register
from qlower.frontend.rules.elementwise import _float_ref, _static_quantized
from qlower.ir import DType, QuantSpec, Value

aten = torch.ops.aten


def _codes(ctx: ImportContext, x: Ref, what: str) -> Ref:
    x = _float_ref(ctx, x)
    if not _static_quantized(x):
        raise ctx.unsupported(f"{what} is integer on per-tensor quantized codes only; this input is "
                              f"{'per-channel quantized' if x.is_quantized else 'float'}")
    return x


def _dims(x: Ref, dim) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return list(range(x.rank))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({layout.normalize_axis(d, x.rank) for d in dims})


def _squeeze(ctx: ImportContext, value: Value, perm: layout.Perm, torch_shape, dims: list[int]) -> Ref:
    """``value`` (reduced dims kept, layout ``perm``) without the reduced dims."""
    shape = tuple(s for d, s in enumerate(torch_shape) if d not in dims)
    new_perm = layout.drop_dims(perm, dims)
    return Ref.of(ctx.emit("reshape", value, perm=new_perm, shape=layout.ir_shape(shape, new_perm)), new_perm)


def extreme(ctx: ImportContext, x: Ref, dims: list[int], kind: str, keepdim: bool) -> Ref:
    """``reduce_max`` / ``reduce_min`` of codes over PyTorch ``dims``; requantized only if a consumer
    asks for another domain than the input's."""
    v = ctx.value_in(x)
    for d in dims:
        v = ctx.emit(kind, v, perm=x.perm, axis=layout.ir_axis(x.perm, d))
    result = ctx.requant(v, x.perm)
    return result if keepdim else _squeeze(ctx, result.value, x.perm, x.torch_shape, dims)


def index_of(ctx: ImportContext, x: Ref, dim: int | None, kind: str, keepdim: bool) -> Ref:
    """``argmax`` / ``argmin`` of codes along PyTorch ``dim`` (None: of the flattened tensor)."""
    if dim is None:
        flat = ctx.emit("reshape", ctx.value_in(x, layout.identity(x.rank)), perm=(0,),
                        shape=(int(np.prod(x.torch_shape)),))
        index = ctx.emit(kind, flat, perm=(0,), axis=0)
        shape = (1,) * x.rank if keepdim else ()
        return Ref.of(ctx.emit("reshape", index, perm=layout.identity(len(shape)), shape=shape),
                      layout.identity(len(shape)))
    d = layout.normalize_axis(dim, x.rank)
    index = ctx.emit(kind, ctx.value_in(x), perm=x.perm, axis=layout.ir_axis(x.perm, d))
    return Ref.of(index, x.perm) if keepdim else _squeeze(ctx, index, x.perm, x.torch_shape, [d])


@register(aten.amax.default, aten.amin.default)
def amax_amin(ctx: ImportContext, node, input: Ref, dim=(), keepdim=False, **_):
    kind = "reduce_max" if packet(node) is aten.amax else "reduce_min"
    x = _codes(ctx, input, str(packet(node)))
    return extreme(ctx, x, _dims(x, dim), kind, keepdim)


@register(aten.max.default, aten.max.dim, aten.min.default, aten.min.dim)
def max_min(ctx: ImportContext, node, input: Ref, dim=None, keepdim=False, **_):
    is_max = packet(node) is aten.max
    kind = "reduce_max" if is_max else "reduce_min"
    if node.target._overloadname == "default":  # not core ATen (no float fallback): floats reduced here
        x = _float_ref(ctx, input)
        if not _static_quantized(x):
            x = Ref.of(ctx.as_float(x), x.perm)
        return extreme(ctx, x, _dims(x, None), kind, False)
    x = _codes(ctx, input, str(node.target))
    values = extreme(ctx, x, _dims(x, dim), kind, keepdim)
    indices = index_of(ctx, x, dim, "argmax" if is_max else "argmin", keepdim)
    return values, indices


@register(aten.argmax.default, aten.argmin.default)
def argmax_argmin(ctx: ImportContext, node, input: Ref, dim=None, keepdim=False, **_):
    x = _codes(ctx, input, str(packet(node)))
    return index_of(ctx, x, dim, "argmax" if packet(node) is aten.argmax else "argmin", keepdim)


@register(aten.var.dim, aten.var.correction)
def var(ctx: ImportContext, node, input: Ref, dim=None, unbiased=None, correction=None, keepdim=False, **_):
    x = _codes(ctx, input, "var")
    dims = _dims(x, dim)
    if correction is None:
        correction = 0 if unbiased is False else 1
    if isinstance(correction, Ref) or float(correction) != int(correction):
        raise ctx.unsupported(f"var with correction {correction!r}: an integer correction is needed")
    n = int(np.prod([x.torch_shape[d] for d in dims]))
    denominator = n * (n - int(correction))
    if denominator <= 0:
        raise ctx.unsupported(f"var of {n} element(s) with correction {correction} divides by zero")
    q = x.spec
    widest = max(q.qmax - q.zero_point[0], q.zero_point[0] - q.qmin)
    if n * n * widest * widest > DType.INT32.max:
        raise ctx.unsupported(f"var over {n} elements: N·Σd² could reach {n * n * widest * widest}, beyond int32")
    s, perm, ones = q.scale[0], x.perm, (1,) * x.rank
    d = ctx.rescale(ctx.value_in(x), QuantSpec.per_tensor(s, 0, DType.INT32), perm)
    s1, s2 = d, ctx.emit("mul", d, d, perm=perm)
    for axis in dims:
        s1 = ctx.emit("reduce_sum", s1, perm=perm, axis=layout.ir_axis(perm, axis))
        s2 = ctx.emit("reduce_sum", s2, perm=perm, axis=layout.ir_axis(perm, axis))
    count = ctx.constant(np.full(ones, n, np.int32), QuantSpec.per_tensor(1.0, 0, DType.INT32))
    numerator = ctx.emit("sub", ctx.emit("mul", s2, count, perm=perm), ctx.emit("mul", s1, s1, perm=perm),
                         perm=perm)
    inverse = ctx.constant(np.ones(ones, np.int32), QuantSpec.per_tensor(1.0 / denominator, 0, DType.INT32))
    result = ctx.requant(ctx.emit("mul", numerator, inverse, perm=perm), perm)
    return result if keepdim else _squeeze(ctx, result.value, perm, x.torch_shape, dims)
