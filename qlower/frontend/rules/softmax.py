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

Masked attention (every form qlower/frontend/masks.py recognises: ``masked_fill(~mask, -inf)``,
``where(mask, x, -inf)``, ``x + where(mask, 0, finfo.min)``, ``x + (1 - mask) * finfo.min``, masks and
masked scores scaled by positive numbers, what ``scaled_dot_product_attention`` decomposes to) is integer
too: softmax reads the codes of ``x`` and a bool "kept" condition, not the fill no code can hold (the
quantizer never observes it). A positive factor applied after the mask scales the exponentials' table
(``exp(d·s·factor)``): the codes are the same, the scores are ``s·factor`` apart. Masked entries take
the lowest code (so they never win the maximum) and their exponentials are zeroed before the sum, both
by a ``minimum`` with a cap computed from the mask (``_mask_caps``: no bool op on the scores' path);
exp(x - 1e30 - max) is 0 in float32, so the result is the same softmax over the kept entries with the
same bound. A row with every entry masked is uniform: PyTorch gives NaN for -inf fills and uniform for
finite ones (``finfo.min``); qlower rewrites fills below -1e30 to -1e30 before calibration
(masks.finite_fills), so the float model, its fake-quant form and the integer softmax all agree.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.masks import Keep, masked_scores
from qlower.frontend.rules import register
from qlower.frontend.rules.compare import _bool_in, _is_bool
from qlower.frontend.rules.elementwise import _float_ref, _static_quantized
from qlower.frontend.rules.integer import is_plain
from qlower.ir import DType, QuantSpec, Value

aten = torch.ops.aten
EXP_BITS = 15
PROB_BITS = 15


def exp_table(scale: float, span: int) -> np.ndarray:
    """``round(exp(d · scale) · 2**EXP_BITS)`` for code differences ``d = -span .. 0`` (index ``d + span``)."""
    d = np.arange(-span, 1, dtype=np.float64)
    return np.rint(np.exp(d * scale) * 2.0**EXP_BITS).astype(np.int32)


def exponentials(ctx: ImportContext, x: Ref, axis: int, keep: Value | None = None, factor: float = 1.0
                 ) -> tuple[Value, Value, Value]:
    """The first lines of the recipe, shared with log_softmax: ``d = x - max`` (int32 at the input's
    scale, exact), ``e = round(exp(d·s·factor) · 2**EXP_BITS)`` and its sum ``S`` along ``axis``. With a
    bool ``keep`` (in ``x``'s layout, broadcasting to it) only the kept entries count (module doc);
    ``factor`` > 0 scales the scores (masked scores divided by sqrt(d) after the fill)."""
    perm, spec = x.perm, x.spec
    s, span = spec.scale[0], spec.qmax - spec.qmin
    if span > -DType.INT16.min:
        # int16 codes (A16W8): differences reach 2**16, beyond an int16 table index, and 2**-15
        # probabilities are whole int16 output steps; it runs in float until a wider recipe lands
        raise ctx.unsupported("softmax of int16 codes: the integer recipe is built for int8 ranges")
    v = ctx.value_in(x)
    e_spec = QuantSpec.per_tensor(2.0**-EXP_BITS, 0, DType.INT32)
    if keep is not None:
        score_cap, exp_cap = _mask_caps(ctx, keep, spec, e_spec, perm)
        v = ctx.emit("minimum", v, score_cap, perm=perm)
    centered = QuantSpec.per_tensor(s, 0, DType.INT32)
    m = ctx.emit("reduce_max", v, perm=perm, axis=axis)
    d = ctx.emit("sub", ctx.rescale(v, centered, perm), ctx.rescale(m, centered, perm), perm=perm)
    d16 = ctx.rescale(d, QuantSpec.per_tensor(s, 0, DType.INT16, -span, 0), perm)
    e = ctx.emit("table", d16, perm=perm, table=exp_table(s * factor, span), offset=span, out=e_spec)
    if keep is not None:  # zero the masked exponentials; a row with nothing kept keeps them all (uniform)
        kept = ctx.emit("minimum", e, exp_cap, perm=perm)
        # a row with an entry kept sums to 2**EXP_BITS at least (its largest kept code is the row's maximum,
        # or every code is the lowest): ``any`` is 2**EXP_BITS there, 0 in a row with nothing kept, and
        # ``e - any`` <= 0 <= kept there, so the maximum is ``kept`` where anything is kept and ``e`` elsewhere
        total = ctx.emit("reduce_sum", kept, perm=perm, axis=axis)
        any_kept = ctx.emit("clamp", total, perm=perm, min=0, max=2**EXP_BITS)
        e = ctx.emit("maximum", kept, ctx.emit("sub", e, any_kept, perm=perm), perm=perm)
    return d, e, ctx.emit("reduce_sum", e, perm=perm, axis=axis)


def _mask_caps(ctx: ImportContext, keep: Value, spec: QuantSpec, e_spec: QuantSpec, perm
               ) -> tuple[Value, Value]:
    """The bool ``keep`` as two integer caps, so the scores' path holds no bool op (Ethos-U55 and VGF run
    none): the scores' codes capped at ``qmax`` where kept and ``qmin`` elsewhere (masked entries take the
    lowest code, so they never win the maximum), the exponentials at ``2**EXP_BITS`` (exp(0), the table's
    largest value) where kept and 0 elsewhere. A minimum with a cap is the select it replaces, exactly.
    Both depend on the mask alone, so where a target takes no bool they run on the host before any
    partition (the mask comes from the model's inputs), instead of splitting the attention."""
    rank = len(perm)

    def full(value: int, q: QuantSpec) -> Value:
        return ctx.constant(np.full((1,) * rank, value, q.dtype.numpy), q)
    return (ctx.emit("select", keep, full(spec.qmax, spec), full(spec.qmin, spec), perm=perm),
            ctx.emit("select", keep, full(2**EXP_BITS, e_spec), full(0, e_spec), perm=perm))


def _kept(ctx: ImportContext, keep: Keep, perm) -> Value | None:
    """The bool ``keep`` (masks.py) as a value in layout ``perm`` (None: every entry kept)."""
    r = ctx.env.get(keep.node)
    if keep.a is None:
        if not _is_bool(r):
            raise ctx.unsupported("a mask whose condition is not a bool tensor")
        if r.is_const:
            r = Ref.constant(r.data != keep.negate, origin=r.origin)
        elif keep.negate:
            r = Ref.of(ctx.emit("logical_not", r.value, perm=r.perm), r.perm)
        return _bool_in(ctx, r, perm)
    a, b = keep.a, keep.b  # kept where a·m + b <= 0 (m integer)
    if _is_bool(r):  # masks.py reduced the other bool cases to a bool keep: the same for 0 and 1
        a = 0.0
    if a == 0:
        if b <= 0:
            return None
        raise ctx.unsupported("a mask that masks every entry")
    k = math.floor(-b / a) if a > 0 else math.ceil(-b / a)
    if isinstance(r, Ref) and r.is_const and r.quant is None and r.data.dtype.kind in "iub":
        m = r.data.astype(np.int64)
        return _bool_in(ctx, Ref.constant(m <= k if a > 0 else m >= k, origin=r.origin), perm)
    if not is_plain(r):
        raise ctx.unsupported("a mask computed from a tensor that is neither bool nor integer")
    lo, hi = DType.INT32.min, DType.INT32.max
    if (a > 0 and k >= hi) or (a < 0 and k <= lo):
        return None
    if (a > 0 and k < lo) or (a < 0 and k > hi):
        raise ctx.unsupported("a mask that masks every entry")
    bound = Ref.constant(np.array(k, np.int32), r.spec)
    perm_r, (vm, vk) = ctx.broadcast([r, bound])
    cmp = ctx.emit("greater_equal", *((vk, vm) if a > 0 else (vm, vk)), perm=perm_r)
    return _bool_in(ctx, Ref.of(cmp, perm_r), perm)


def masked_input(ctx: ImportContext, node) -> tuple[Ref, Value | None, float] | None:
    """A softmax's input as masked scores (masks.py): (the scores' codes, where they are kept as a bool
    value in their layout or None for everywhere, the positive factor scaling them), or None."""
    found = masked_scores(node.args[0]) if node.args else None
    if found is None or not isinstance(found.scores, torch.fx.Node):
        return None
    x = ctx.env.get(found.scores)
    if not isinstance(x, Ref) or not _static_quantized(x) or x.spec.dtype is not DType.INT8:
        return None
    if len(node.args[0].meta["val"].shape) != x.rank:
        return None
    keep = None
    for k in found.keeps:
        v = _kept(ctx, k, x.perm)
        keep = v if keep is None or v is None else ctx.emit("logical_and", keep, v, perm=x.perm)
    return x, keep, found.factor


@register(aten.softmax, aten._softmax)
def softmax(ctx: ImportContext, node, input: Ref, dim, dtype=None, half_to_float=False, **_):
    masked = masked_input(ctx, node) if ctx.out_spec() is not None else None
    keep, factor = None, 1.0
    if masked is not None:
        x, keep, factor = masked
    else:
        x = _float_ref(ctx, input)
    axis = layout.ir_axis(x.perm, dim)
    spec = x.spec
    if not x.is_quantized or spec.is_per_channel or spec.dtype not in (DType.INT8, DType.INT16):
        return Ref.of(ctx.emit("softmax", ctx.as_float(x), perm=x.perm, axis=axis), x.perm)

    perm = x.perm
    _, e, total = exponentials(ctx, x, axis, keep, factor)
    one = ctx.constant(np.full((1,) * x.rank, 2**PROB_BITS, np.int32),
                       QuantSpec.per_tensor(2.0**-PROB_BITS, 0, DType.INT32))
    p = ctx.emit("intdiv", ctx.emit("mul", e, one, perm=perm), total, perm=perm)
    return ctx.requant(p, perm)
