"""Softmax on int8 codes, built from integer IR ops.

Recipe (input codes ``x`` with scale ``s``, along ``axis``; ``D = qmax - qmin``)::

    m   = reduce_max(x)                                   # int8, same spec
    d   = sub(rescale(x → int32, zp 0), rescale(m → int32, zp 0))
                                                          # x - max in [-D, 0], exact
    d16 = rescale(d → int16 in [-D, 0])                   # ratio 1: exact, narrow range for the table
    e   = table(d16, offset D)                            # e = round(exp(d·s) · 2**E), int32, scale 2**-E
    S   = reduce_sum(e)                                   # int32, scale 2**-E
    p   = intdiv(mul(e, 2**F at scale 2**-F), S)          # floor(e · 2**F / S), scale 2**-F
    out = rescale(p → output spec)

with E = F = 15 (``e · 2**F < 2**31``; ``S`` fits int32 for rows up to 2**16 long).
Softmax is shift-invariant, so subtracting the row maximum changes nothing,
and exp(0) = 1 is exactly ``2**E``, so ``S >= 2**E``.

Error bound against float softmax of the dequantized input, per element, before
the final rescale: with table rounding errors ``|ε_j| <= 1/2`` and ``N`` the row
length, ``|p_int - p| <= (1/2 + N·p/2) / (2**E - N/2) + 2**-F``. For a 16-long
row that is below 3e-4, i.e. 0.08 of an int8 output step of 1/255: the result
differs from the fake-quant model only where the exact value lies within that
distance of a rounding boundary, and then by one step.

Masked attention (``masked_fill(~mask, -inf)``, ``where(mask, x, -inf)``, ``x + where(mask, 0, -big)``
with ``big >= 1e30``, what ``scaled_dot_product_attention`` decomposes to) is integer too: softmax
reads the codes of ``x`` and the bool mask, not the float fill no code can hold. Masked entries take
the lowest code (so they never win the maximum) and their exponentials are zeroed before the sum;
exp(x - big - max) is below 2**-100 in float32, so the result is the same softmax over the kept
entries with the same bound. A row with every entry masked is uniform (PyTorch: uniform for a finite
fill, NaN for -inf, which no code can hold).
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.quantizer import packet
from qlower.frontend.rules import register
from qlower.frontend.rules.compare import _bool_in, _is_bool
from qlower.frontend.rules.elementwise import _float_ref, _static_quantized
from qlower.ir import DType, QuantSpec, Value

aten = torch.ops.aten
EXP_BITS = 15
PROB_BITS = 15
MASK_FILL = -1e30   # a fill at or below this is a mask: exp(fill - max) is 0 in float32


def exp_table(scale: float, span: int) -> np.ndarray:
    """``round(exp(d · scale) · 2**EXP_BITS)`` for code differences ``d = -span .. 0`` (index ``d + span``)."""
    d = np.arange(-span, 1, dtype=np.float64)
    return np.rint(np.exp(d * scale) * 2.0**EXP_BITS).astype(np.int32)


def exponentials(ctx: ImportContext, x: Ref, axis: int, keep: Value | None = None) -> tuple[Value, Value, Value]:
    """The first lines of the recipe, shared with log_softmax: ``d = x - max`` (int32 at the input's
    scale, exact), ``e = round(exp(d·s) · 2**EXP_BITS)`` and its sum ``S`` along ``axis``. With a bool
    ``keep`` (in ``x``'s layout, broadcasting to it) only the kept entries count (module doc)."""
    perm, spec = x.perm, x.spec
    s, span = spec.scale[0], spec.qmax - spec.qmin
    if span > -DType.INT16.min:
        # int16 codes (A16W8): differences reach 2**16, beyond an int16 table index, and 2**-15
        # probabilities are whole int16 output steps; it runs in float until a wider recipe lands
        raise ctx.unsupported("softmax of int16 codes: the integer recipe is built for int8 ranges")
    v = ctx.value_in(x)
    if keep is not None:
        lowest = ctx.constant(np.full((1,) * x.rank, spec.qmin, spec.dtype.numpy), spec)
        v = ctx.emit("select", keep, v, lowest, perm=perm)
    centered = QuantSpec.per_tensor(s, 0, DType.INT32)
    m = ctx.emit("reduce_max", v, perm=perm, axis=axis)
    d = ctx.emit("sub", ctx.rescale(v, centered, perm), ctx.rescale(m, centered, perm), perm=perm)
    d16 = ctx.rescale(d, QuantSpec.per_tensor(s, 0, DType.INT16, -span, 0), perm)
    e = ctx.emit("table", d16, perm=perm, table=exp_table(s, span), offset=span,
                 out=QuantSpec.per_tensor(2.0**-EXP_BITS, 0, DType.INT32))
    if keep is not None:  # zero the masked exponentials; a row with nothing kept keeps them all (uniform)
        zero = ctx.constant(np.zeros((1,) * x.rank, np.int32), e.quant)
        kept = ctx.emit("select", keep, e, zero, perm=perm)
        none = ctx.emit("equal", ctx.emit("reduce_sum", kept, perm=perm, axis=axis), zero, perm=perm)
        e = ctx.emit("select", ctx.emit("logical_or", keep, none, perm=perm), e, zero, perm=perm)
    return d, e, ctx.emit("reduce_sum", e, perm=perm, axis=axis)


def _fill(r: object) -> bool:
    """A float constant number at or below MASK_FILL (-inf, torch.finfo(float32).min)."""
    if isinstance(r, (int, float)) and not isinstance(r, bool):
        return r <= MASK_FILL
    return isinstance(r, Ref) and r.is_float_const and r.data.size == 1 and float(r.data.reshape(-1)[0]) <= MASK_FILL


def _zero(r: object) -> bool:
    if isinstance(r, (int, float)) and not isinstance(r, bool):
        return r == 0
    return isinstance(r, Ref) and r.is_float_const and r.data.size == 1 and float(r.data.reshape(-1)[0]) == 0


def _where_mask(ctx: ImportContext, n: object, fill_value: bool) -> tuple[object, Ref | None, bool] | None:
    """``where(c, a, b)`` fx node ``n`` with one branch a mask fill: (the other branch, c, whether c
    marks the kept entries). ``fill_value``: the other branch must be the constant 0 (an additive mask)."""
    if not isinstance(n, torch.fx.Node) or n.target is not aten.where.self or len(n.args) != 3:
        return None
    c, a, b = (ctx.env.get(x) if isinstance(x, torch.fx.Node) else x for x in n.args)
    if not _is_bool(c):
        return None
    for other, fill, kept in ((a, b, True), (b, a, False)):
        if _fill(fill) and (not fill_value or _zero(other)):
            return other, c, kept
    return None


def masked_input(ctx: ImportContext, node) -> tuple[Ref, Ref, bool] | None:
    """The integer codes and the mask a softmax's input is made of (module doc), or None: (codes, bool
    mask, whether the mask marks the kept entries)."""
    src = node.args[0] if node.args else None
    found = _where_mask(ctx, src, False)
    if found is None and isinstance(src, torch.fx.Node) and packet(src) is aten.add and len(src.args) == 2 \
            and src.kwargs.get("alpha", 1) == 1:
        for scores, mask in (src.args, src.args[::-1]):
            hit = _where_mask(ctx, mask, True)
            if hit is not None and isinstance(scores, torch.fx.Node):
                found = (ctx.env.get(scores), hit[1], hit[2])
                break
    if found is None:
        return None
    x, cond, kept = found
    if not isinstance(x, Ref) or not _static_quantized(x) or x.spec.dtype is not DType.INT8:
        return None
    if x.rank < cond.rank or len(node.args[0].meta["val"].shape) != x.rank:
        return None
    return x, cond, kept


@register(aten.softmax, aten._softmax)
def softmax(ctx: ImportContext, node, input: Ref, dim, dtype=None, half_to_float=False, **_):
    masked = masked_input(ctx, node) if ctx.out_spec() is not None else None
    keep = None
    if masked is not None:
        x, cond, kept = masked
        keep = _bool_in(ctx, cond, x.perm)
        if not kept:
            keep = ctx.emit("logical_not", keep, perm=x.perm)
    else:
        x = _float_ref(ctx, input)
    axis = layout.ir_axis(x.perm, dim)
    spec = x.spec
    if not x.is_quantized or spec.is_per_channel or spec.dtype not in (DType.INT8, DType.INT16):
        return Ref.of(ctx.emit("softmax", ctx.as_float(x), perm=x.perm, axis=axis), x.perm)

    perm = x.perm
    _, e, total = exponentials(ctx, x, axis, keep)
    one = ctx.constant(np.full((1,) * x.rank, 2**PROB_BITS, np.int32),
                       QuantSpec.per_tensor(2.0**-PROB_BITS, 0, DType.INT32))
    p = ctx.emit("intdiv", ctx.emit("mul", e, one, perm=perm), total, perm=perm)
    return ctx.requant(p, perm)
