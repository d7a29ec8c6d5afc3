"""One-domain ops on int8 codes: minimum / maximum, clamp by tensors, where, comparisons, logical ops,
casts to bool.

The quantizer puts the tensor operands and the result of minimum, maximum,
where and clamp (with tensor bounds) in one quantization domain, like concat.
Within one per-tensor domain dequantization is strictly increasing, so picking,
ordering and comparing codes is picking, ordering and comparing values: the
integer result is the fake-quant model's, exactly. An operand in another
domain (a pinned input, say) is first rescaled into the result's (one rounding,
at most one step); a float constant is quantized into it (exact for a pick: the
quantization of a minimum is the minimum of the quantizations).

A comparison with a scalar ``c`` is decided once per input code, by PyTorch on
the dequantized codes (as the fake-quant model computes it): the codes for which
it holds are an interval, so it becomes one integer comparison with a constant
code (``x >= k``, ``x <= k``, ``x == k`` or its negation). Results are bool.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.layout import Perm
from qlower.frontend.quantizer import packet
from qlower.frontend.rules import register
from qlower.frontend.rules.elementwise import _float_ref, _static_quantized
from qlower.frontend.rules.integer import is_plain
from qlower.ir import DType, QuantSpec, Value

aten = torch.ops.aten
QD = torch.ops.quantized_decomposed


def _in_domain(ctx: ImportContext, r: object, spec: QuantSpec) -> Ref:
    """An operand as codes of ``spec``: rescaled when quantized otherwise, quantized when a float constant."""
    if isinstance(r, (int, float)) and not isinstance(r, bool):
        r = Ref.constant(np.array(float(r), dtype=np.float32))
    if not isinstance(r, Ref):
        raise ctx.unsupported(f"operand {r!r} is not a tensor or a number")
    r = _float_ref(ctx, r)
    if r.is_float_const:
        return Ref.constant(ctx.quantize_value(r.data, spec), spec, r.origin)
    if not _static_quantized(r):
        raise ctx.unsupported("only integer on operands quantized per tensor (or float constants)")
    if r.spec == spec:
        return r
    return Ref.of(ctx.rescale(ctx.value_in(r), spec, r.perm), r.perm)


def _domain(ctx: ImportContext) -> QuantSpec:
    out = ctx.out_spec()
    if out is None or out.is_per_channel:
        raise ctx.unsupported("only integer when the result is quantized per tensor")
    return out


def _pick(ctx: ImportContext, kind: str, a: object, b: object, spec: QuantSpec) -> Ref:
    perm, (va, vb) = ctx.broadcast([_in_domain(ctx, a, spec), _in_domain(ctx, b, spec)])
    return Ref.of(ctx.emit(kind, va, vb, perm=perm), perm)


@register(aten.minimum.default, aten.maximum.default)
def min_max(ctx: ImportContext, node, input, other, **_):
    spec = _domain(ctx)
    return _pick(ctx, "minimum" if packet(node) is aten.minimum else "maximum", input, other, spec)


def clamp_tensor(ctx: ImportContext, input, lo, hi) -> Ref:
    """clamp with tensor bounds: ``minimum(maximum(x, lo), hi)`` (PyTorch's order when lo > hi)."""
    spec = _domain(ctx)
    x = _in_domain(ctx, input, spec)
    if lo is not None:
        x = _pick(ctx, "maximum", x, lo, spec)
    if hi is not None:
        x = _pick(ctx, "minimum", x, hi, spec)
    return x


# -- bool operands -------------------------------------------------------------------------------

def _is_bool(r: object) -> bool:
    if not isinstance(r, Ref):
        return False
    return r.data.dtype == np.bool_ if r.is_const else r.value.dtype is DType.BOOL


def _bool_in(ctx: ImportContext, r: Ref, perm: Perm) -> Value:
    """A bool Ref as a value of rank ``len(perm)`` in layout ``perm``."""
    k = len(perm) - r.rank
    if r.is_const:
        data = r.data.reshape((1,) * k + r.data.shape)
        return ctx.b.constant(layout.permute_array(data, perm), None, name="mask", origin=ctx.origin_of(ctx.node))
    if k:
        r = Ref.of(ctx.emit("reshape", r.value, perm=layout.prepend_dims(r.perm, k), shape=(1,) * k + r.value.shape),
                   layout.prepend_dims(r.perm, k))
    return ctx.value_in(r, perm)


def _rank_perm(ctx: ImportContext, refs: list[Ref]) -> Perm:
    """The layout a broadcasting op over ``refs`` works in (that of a full-rank runtime operand)."""
    rank = max(r.rank for r in refs)
    full = [r for r in refs if not r.is_const and r.rank == rank]
    preferred = [r for r in full if not layout.is_identity(r.perm)] or full
    return tuple(preferred[0].perm) if preferred else layout.identity(rank)


@register(aten.where.self)
def where(ctx: ImportContext, node, condition, input=None, other=None, **_):
    if input is None or not _is_bool(condition):
        raise ctx.unsupported("only integer as where(bool condition, a, b)")
    spec = _domain(ctx)
    a, b = _in_domain(ctx, input, spec), _in_domain(ctx, other, spec)
    perm = _rank_perm(ctx, [condition, a, b])
    # constant branches of lower rank broadcast like PyTorch's (leading 1s): where(mask, 1.0, 0.0)
    a, b = (Ref.constant(r.data.reshape((1,) * (len(perm) - r.rank) + r.data.shape), r.quant, r.origin)
            if r.is_const and r.rank < len(perm) else r for r in (a, b))
    if max(a.rank, b.rank) != len(perm):
        raise ctx.unsupported("where with values of lower rank than the condition")
    _, (va, vb) = ctx.broadcast([a, b], perm=perm)
    return Ref.of(ctx.emit("select", _bool_in(ctx, condition, perm), va, vb, perm=perm), perm)


def to_bool(ctx: ImportContext, x: Ref) -> Ref:
    """``x.to(torch.bool)``, i.e. ``x != 0``: a bool unchanged; plain integers (an int64 attention mask)
    compared with 0 by an IR ``equal`` on int32; quantized codes with the codes of 0 (one comparison)."""
    if _is_bool(x):
        return x
    if is_plain(x):
        zero = Ref.constant(np.array(0, np.int32), x.spec)
        perm, (vx, vz) = ctx.broadcast([x, zero])
        return Ref.of(ctx.emit("logical_not", ctx.emit("equal", vx, vz, perm=perm), perm=perm), perm)
    x = _float_ref(ctx, x)
    if _static_quantized(x):
        return _compare_scalar(ctx, aten.ne, x, 0.0)
    raise ctx.unsupported("a cast to bool of a float tensor (integers, bools and quantized tensors are integer)")


# -- comparisons ----------------------------------------------------------------------------------

_SWAP = {aten.lt: aten.gt, aten.le: aten.ge, aten.gt: aten.gt, aten.ge: aten.ge, aten.eq: aten.eq, aten.ne: aten.ne}
_TORCH = {aten.lt: torch.lt, aten.le: torch.le, aten.gt: torch.gt, aten.ge: torch.ge, aten.eq: torch.eq,
          aten.ne: torch.ne}


def _code_const(k: int, spec: QuantSpec) -> Ref:
    return Ref.constant(np.array(k, dtype=spec.dtype.numpy), spec)


def _compare_scalar(ctx: ImportContext, op, x: Ref, c: float) -> Ref:
    """``dq(x) op c`` decided per code by PyTorch, emitted as one comparison with a constant code."""
    spec = x.spec
    if spec.qmax - spec.qmin >= 2**16:  # plain int32 (token ids): no per-code table; PyTorch compares them
        raise ctx.unsupported("a comparison of 32-bit integers with a number")
    codes = torch.arange(spec.qmin, spec.qmax + 1, dtype=torch.int32)
    dq = QD.dequantize_per_tensor.default(codes, spec.scale[0], spec.zero_point[0], spec.qmin, spec.qmax,
                                          torch.int32)
    holds = _TORCH[op](dq, torch.tensor(c, dtype=torch.float32)).numpy()
    lo, hi = spec.dtype.min, spec.dtype.max  # codes outside the declared range compare like their neighbours
    true = np.flatnonzero(holds) + spec.qmin
    false = np.flatnonzero(~holds) + spec.qmin
    if not true.size:   # never: x > dtype max
        kind, a, b = "greater", x, _code_const(hi, spec)
    elif not false.size:  # always: x >= dtype min
        kind, a, b = "greater_equal", x, _code_const(lo, spec)
    elif true.min() > false.max():
        kind, a, b = "greater_equal", x, _code_const(int(true.min()), spec)
    elif true.max() < false.min():
        kind, a, b = "greater_equal", _code_const(int(true.max()), spec), x
    elif true.size == 1 or false.size == 1:
        k = int(true[0]) if true.size == 1 else int(false[0])
        perm, (va, vb) = ctx.broadcast([x, _code_const(k, spec)])
        eq = ctx.emit("equal", va, vb, perm=perm)
        return Ref.of(eq if true.size == 1 else ctx.emit("logical_not", eq, perm=perm), perm)
    else:
        raise ctx.unsupported("the codes where the comparison holds are not an interval")
    perm, (va, vb) = ctx.broadcast([a, b])
    return Ref.of(ctx.emit(kind, va, vb, perm=perm), perm)


@register(*(getattr(p, o) for p in _TORCH for o in ("Tensor", "Scalar")))
def compare(ctx: ImportContext, node, input, other, **_):
    op = packet(node)
    x = _float_ref(ctx, input) if isinstance(input, Ref) else input
    y = _float_ref(ctx, other) if isinstance(other, Ref) else other
    if isinstance(y, Ref) and y.is_float_const and y.data.size == 1:
        y = float(y.data.reshape(-1)[0])
    if isinstance(x, Ref) and _static_quantized(x) and isinstance(y, (int, float)) and not isinstance(y, bool):
        return _compare_scalar(ctx, op, x, float(y))
    if not (isinstance(x, Ref) and isinstance(y, Ref) and _static_quantized(x) and _static_quantized(y)):
        raise ctx.unsupported("only integer between two quantized tensors, or a quantized tensor and a number")
    if x.spec != y.spec:
        raise ctx.unsupported("only integer between tensors of one quantization domain")
    perm, (va, vb) = ctx.broadcast([x, y])
    if op in (aten.lt, aten.le):
        va, vb = vb, va
    kind = {aten.gt: "greater", aten.ge: "greater_equal", aten.eq: "equal", aten.ne: "equal"}[_SWAP[op]]
    out = ctx.emit(kind, va, vb, perm=perm)
    return Ref.of(ctx.emit("logical_not", out, perm=perm) if op is aten.ne else out, perm)


# -- logical ops on bools --------------------------------------------------------------------------

_LOGICAL = {aten.logical_and: "logical_and", aten.logical_or: "logical_or", aten.logical_xor: "logical_xor",
            aten.bitwise_and: "logical_and", aten.bitwise_or: "logical_or", aten.bitwise_xor: "logical_xor"}


@register(aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default, aten.bitwise_and.Tensor,
          aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor)
def logical(ctx: ImportContext, node, input, other, **_):
    if not (_is_bool(input) and _is_bool(other)):
        raise ctx.unsupported("only integer on bool tensors")
    perm = _rank_perm(ctx, [input, other])
    a, b = _bool_in(ctx, input, perm), _bool_in(ctx, other, perm)
    return Ref.of(ctx.emit(_LOGICAL[packet(node)], a, b, perm=perm), perm)


@register(aten.logical_not.default, aten.bitwise_not.default)
def logical_not(ctx: ImportContext, node, input, **_):
    if not _is_bool(input):
        raise ctx.unsupported("only integer on bool tensors")
    return Ref.of(ctx.emit("logical_not", _bool_in(ctx, input, input.perm), perm=input.perm), input.perm)


@register(aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.dims, aten.all.default)
def any_all(ctx: ImportContext, node, input, dim=None, keepdim=False, **_):
    """``any`` / ``all`` of a bool tensor along dims: the bools as 0/1 int8 codes, ``reduce_max`` (any) or
    ``reduce_min`` (all) per dim, compared with 0 (what ``scaled_dot_product_attention`` decomposes a
    bool mask's fully masked rows to)."""
    if not _is_bool(input) or input.is_const:
        raise ctx.unsupported("only integer on bool tensors")
    perm, shape = input.perm, input.torch_shape
    dims = range(len(shape)) if dim is None or dim == [] else [dim] if isinstance(dim, int) else list(dim)
    dims = sorted({layout.normalize_axis(d, len(shape)) for d in dims})
    bit = QuantSpec.per_tensor(1.0, 0, DType.INT8, 0, 1)

    def code(k: int) -> Value:
        return ctx.constant(np.full((1,) * len(perm), k, np.int8), bit)
    v = ctx.emit("select", ctx.value_in(input), code(1), code(0), perm=perm)
    kind = "reduce_max" if packet(node) is aten.any else "reduce_min"
    for d in dims:
        v = ctx.emit(kind, v, perm=perm, axis=layout.ir_axis(perm, d))
    out = Ref.of(ctx.emit("greater", v, code(0), perm=perm), perm)
    if keepdim:
        return out
    kept = tuple(s for d, s in enumerate(shape) if d not in dims)
    new_perm = layout.drop_dims(perm, dims)
    return Ref.of(ctx.emit("reshape", out.value, perm=new_perm, shape=layout.ir_shape(kept, new_perm)), new_perm)
