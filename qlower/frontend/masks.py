"""Attention masks in an fx graph: which values are masks, never quantities.

A fill at or below ``MASK_FILL`` (``-inf``, Hugging Face's ``torch.finfo(dtype).min``) is a mask: added
to finite scores it makes their exponential 0 in float32, whatever the score. No int8 code holds it
(an observer that sees it picks a scale near 1e36 and every score becomes code 0), so the quantizer
leaves every value made of such fills float, quantizes the scores they mask, and the importer's
softmax reads the scores' codes and a bool "kept" condition instead (rules/softmax.py).

Recognised, structurally (per op, any model):
- a mask term, 0 where kept and at most ``MASK_FILL`` elsewhere: ``where(c, 0, fill)``,
  ``where(c, fill, 0)``, ``zeros.masked_fill(c, fill)``, ``t * fill`` with ``t = a·float(m) + b`` an
  affine function of an integer or bool tensor ``m`` (``(1 - mask) * finfo.min``: kept where
  ``a·m + b <= 0``), a mask term times or divided by a positive number, the sum of two mask terms;
- a shape op (slice, view, expand, unsqueeze, ...) on a mask term, once finite_fills has moved it onto
  the term's bool (``where(op(c), 0, MASK_FILL)``), and ``scaled_dot_product_attention``'s guard of a
  float mask, ``where(any(mask != -inf), mask, 0)``, which finite fills make the mask itself;
- masked scores, ``x`` where kept and at most ``MASK_FILL`` elsewhere: ``where(c, x, fill)``,
  ``where(c, fill, x)``, ``x.masked_fill(c, fill)``, ``x + mask term``, and masked scores times or
  divided by a positive number (``masked_fill(..., -inf) / sqrt(d)``: the scores' scale times the factor;
  the mask stays a mask).

``a·m + b < 0`` (a mask value above 1 in ``(1 - mask) * fill``) would add a huge *positive* number in
PyTorch: no attention mask means that, and it is read as kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.fx import Node

from qlower.frontend.constants import attribute_tensor

aten = torch.ops.aten
MASK_FILL = -1e30   # a fill at or below this is a mask: exp(fill - max) is 0 in float32
_SCALAR_SOURCES = {aten.scalar_tensor, aten.full, aten.full_like, aten.zeros, aten.zeros_like, aten.lift_fresh_copy,
                   aten.clone, aten.detach, aten.alias}
_CASTS = {aten._to_copy, aten.to, aten.type_as}


@dataclass(frozen=True)
class Keep:
    """Where ``node`` (a bool or integer tensor) marks an entry kept: for a bool, ``node`` (``not node``
    when ``negate``); for an integer, ``a·node + b <= 0``."""
    node: Node
    negate: bool = False
    a: float | None = None
    b: float = 0.0


@dataclass(frozen=True)
class Masked:
    """Masked scores: ``scores · factor`` where every keep holds, at most MASK_FILL elsewhere (a mask term
    alone has ``scores`` None: 0 where kept)."""
    scores: Node | None
    keeps: tuple[Keep, ...]
    factor: float = 1.0
    chain: tuple[Node, ...] = ()   # the nodes computing it (left float), the last one the result


def _packet(n: object):
    return getattr(n.target, "overloadpacket", None) if isinstance(n, Node) and n.op == "call_function" else None


def _dtype(n: object) -> torch.dtype | None:
    val = n.meta.get("val") if isinstance(n, Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def scalar(x: object) -> float | None:
    """The one number a literal or a constant node holds everywhere (a scalar_tensor, full, zeros, a 0-d
    or uniform float attribute), else None."""
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if not isinstance(x, Node):
        return None
    if x.op == "get_attr":
        try:
            t = attribute_tensor(x.graph.owning_module, x)
        except (LookupError, AttributeError):
            return None
        if t is None or not t.is_floating_point() or t.numel() == 0 or t.numel() > 4096:
            return None
        first = t.reshape(-1)[0]
        return float(first) if bool((t == first).all()) else None
    p = _packet(x)
    if p in (aten.zeros, aten.zeros_like):
        return 0.0
    if p is aten.scalar_tensor or p in (aten.lift_fresh_copy, aten.clone, aten.detach, aten.alias):
        return scalar(x.args[0]) if x.args else None
    if p in (aten.full, aten.full_like) and len(x.args) > 1:
        return scalar(x.args[1])
    return None


def is_fill(x: object) -> bool:
    v = scalar(x)
    return v is not None and v <= MASK_FILL


def _positive(x: object) -> float | None:
    v = scalar(x) if not isinstance(x, Node) or _dtype(x) in (None, torch.float32) else None
    return v if v is not None and 0 < v < math.inf else None


def _affine(n: object) -> tuple[Node, float, float, tuple[Node, ...]] | None:
    """``n`` as ``a·float(m) + b`` of an integer or bool tensor ``m``: (m, a, b, the nodes computing it)."""
    p = _packet(n)
    if p in _CASTS and isinstance(n.args[0], Node):
        src, out = _dtype(n.args[0]), _dtype(n)
        if src is not None and not src.is_floating_point and out is not None and out.is_floating_point:
            return n.args[0], 1.0, 0.0, (n,)
        return None
    if p in (aten.add, aten.sub, aten.rsub, aten.mul) and len(n.args) >= 2 and n.kwargs.get("alpha", 1) == 1:
        x, y = n.args[:2]
        for t, k, first in ((x, y, True), (y, x, False)):
            inner, c = _affine(t) if isinstance(t, Node) else None, scalar(k)
            if inner is None or c is None or not math.isfinite(c):
                continue
            m, a, b, nodes = inner
            nodes += (n,)
            if p is aten.add:
                return m, a, b + c, nodes
            if p is aten.mul:
                return m, a * c, b * c, nodes
            if (p is aten.sub) != first:   # c - t: sub(c, t) or rsub(t, c)
                return m, -a, c - b, nodes
            return m, a, b - c, nodes
    if p is aten.neg:
        inner = _affine(n.args[0])
        return None if inner is None else (inner[0], -inner[1], -inner[2], inner[3] + (n,))
    return None


def _bool_keep(c: object, negate: bool) -> Keep | None:
    return Keep(c, negate) if isinstance(c, Node) and _dtype(c) == torch.bool else None


def _filled(n: Node) -> tuple[object, Keep] | None:
    """``where(c, x, fill)``, ``where(c, fill, x)``, ``x.masked_fill(c, fill)``: (x, where x is kept)."""
    args = n.args
    if n.target == aten.where.self and len(args) == 3:
        c, a, b = args
        found = (a, _bool_keep(c, False)) if is_fill(b) else (b, _bool_keep(c, True)) if is_fill(a) else None
    elif _packet(n) is aten.masked_fill and len(args) == 3 and is_fill(args[2]):
        found = (args[0], _bool_keep(args[1], True))
    else:
        return None
    return found if found is not None and found[1] is not None else None


def mask_term(n: object) -> Masked | None:
    """``n`` as a mask term (module doc), or None."""
    p = _packet(n)
    if p is None:
        return None
    args, filled = n.args, _filled(n)
    if filled is not None:
        return Masked(None, (filled[1],), chain=(n,)) if scalar(filled[0]) == 0 else None
    if p in (aten.mul, aten.div) and len(args) == 2:
        for t, k in ((args[0], args[1]), (args[1], args[0]) if p is aten.mul else (None, None)):
            if not isinstance(t, Node):
                continue
            if p is aten.mul and is_fill(k):
                found = _affine(t)
                if found is not None:
                    m, a, b, nodes = found
                    return Masked(None, (_int_keep(m, a, b),), chain=nodes + (n,))
            inner = mask_term(t)
            if inner is not None and _positive(k) is not None:
                return Masked(None, inner.keeps, chain=inner.chain + (n,))
        return None
    if p is aten.add and len(args) == 2 and n.kwargs.get("alpha", 1) == 1:
        left, right = mask_term(args[0]), mask_term(args[1])
        if left is not None and right is not None:
            return Masked(None, left.keeps + right.keeps, chain=left.chain + right.chain + (n,))
    return None


def _int_keep(m: Node, a: float, b: float) -> Keep:
    if _dtype(m) == torch.bool:  # values 0 and 1: kept where a·m + b <= 0
        kept0, kept1 = b <= 0, a + b <= 0
        if kept0 != kept1:
            return Keep(m, negate=kept0)
    return Keep(m, a=a, b=b)


def masked_scores(n: object) -> Masked | None:
    """``n`` as masked scores (module doc), or None."""
    p = _packet(n)
    if p is None:
        return None
    args, filled = n.args, _filled(n)
    if filled is not None:
        x, keep = filled
        return Masked(x, (keep,), chain=(n,)) if isinstance(x, Node) and scalar(x) is None else None
    if p is aten.add and len(args) == 2 and n.kwargs.get("alpha", 1) == 1:
        for x, m in ((args[0], args[1]), (args[1], args[0])):
            term = mask_term(m)
            if term is None or not isinstance(x, Node):
                continue
            inner = masked_scores(x)
            if inner is not None:
                return Masked(inner.scores, inner.keeps + term.keeps, inner.factor,
                              inner.chain + term.chain + (n,))
            return Masked(x, term.keeps, chain=term.chain + (n,))
        return None
    if p in (aten.mul, aten.div) and len(args) == 2:
        for x, k in ((args[0], args[1]), (args[1], args[0]) if p is aten.mul else (None, None)):
            inner = masked_scores(x) if isinstance(x, Node) else None
            factor = _positive(k)
            if inner is not None and factor is not None:
                factor = factor if p is aten.mul else 1.0 / factor
                return Masked(inner.scores, inner.keeps, inner.factor * factor, inner.chain + (n,))
    return None


def masked(n: object) -> Masked | None:
    """``n`` as masked scores or a mask term."""
    return mask_term(n) or masked_scores(n)


_SHAPE_OPS = {aten.slice, aten.select, aten.view, aten.reshape, aten._unsafe_view, aten.expand, aten.unsqueeze,
              aten.squeeze, aten.permute, aten.transpose, aten.t, aten.flatten, aten.unflatten, aten.clone,
              aten.contiguous, aten.alias}
_ANY = {aten.any, aten.all}


class _NoValue(Exception):
    """A node without the fake value export records: its mask is left as it is."""


def _val(x: object) -> object:
    if not isinstance(x, Node):
        return x
    if "val" not in x.meta:
        raise _NoValue(x)
    return x.meta["val"]


def _call(gm: torch.fx.GraphModule, target, args: tuple, kwargs: dict, at: Node) -> Node:
    """A new node ``target(*args, **kwargs)`` before ``at``, with its value's metadata (computed on the
    operands' fake values) and ``at``'s source location."""
    with gm.graph.inserting_before(at):
        n = gm.graph.call_function(target, args, kwargs)
    n.meta["val"] = target(*torch.fx.node.map_aggregate(args, _val), **torch.fx.node.map_aggregate(kwargs, _val))
    n.meta.update({k: v for k, v in at.meta.items() if k in ("stack_trace", "nn_module_stack")})
    return n


def _kept_bool(gm: torch.fx.GraphModule, term: Masked, at: Node) -> Node | None:
    """A bool node true where the mask term ``term`` keeps, of the term's own shape (None when a keep
    is an integer comparison: those stay where they are)."""
    kept = None
    for k in term.keeps:
        if k.a is not None:
            return None
        b = _call(gm, aten.logical_not.default, (k.node,), {}, at) if k.negate else k.node
        kept = b if kept is None else _call(gm, aten.logical_and.default, (kept, b), {}, at)
    shape = list(_val(term.chain[-1]).shape)
    if kept is not None and list(_val(kept).shape) != shape:
        kept = _call(gm, aten.expand.default, (kept, shape), {}, at)
    return kept


def _through_shape_ops(gm: torch.fx.GraphModule) -> int:
    """A shape op on a mask term (a slice, view, expand, unsqueeze, ... of ``where(c, 0, fill)``) becomes
    the mask term of the same shape op on its bool: ``where(op(c), 0, MASK_FILL)``, which masks.py
    recognises where it meets the scores. Exact: the shape op moves values, and moves the bools with them."""
    rewritten = 0
    for n in list(gm.graph.nodes):
        if _packet(n) not in _SHAPE_OPS or not n.args or not _dtype(n) or not _dtype(n).is_floating_point:
            continue
        term = mask_term(n.args[0])
        try:
            kept = _kept_bool(gm, term, n) if term is not None else None
            if kept is None:
                continue
            moved = _call(gm, n.target, (kept, *n.args[1:]), n.kwargs, n)
            zero, fill = (_call(gm, aten.scalar_tensor.default, (v,), {"dtype": _dtype(n)}, n) for v in (0.0, MASK_FILL))
            mask = _call(gm, aten.where.self, (moved, zero, fill), {}, n)
        except _NoValue:
            continue   # what was added is dead code, removed below
        n.replace_all_uses_with(mask)
        rewritten += 1
    return rewritten


def _never_neg_inf(n: object) -> bool:
    """``n`` is ``any`` / ``all`` of ``t != -inf`` with ``t`` a mask term: true everywhere, as its fills are
    finite (finite_fills)."""
    if _packet(n) not in _ANY or not isinstance(n.args[0], Node):
        return False
    ne = n.args[0]
    return (_packet(ne) is aten.ne and len(ne.args) == 2 and scalar(ne.args[1]) == -math.inf
            and mask_term(ne.args[0]) is not None)


def _sdpa_guards(gm: torch.fx.GraphModule) -> int:
    """``scaled_dot_product_attention`` with a float mask decomposes to ``where(any(mask != -inf), mask, 0)``
    added to the scores (and its result multiplied by ``where(any(...), 1, 0)``): with finite fills the
    guard holds everywhere, so the first is the mask term itself, and the second's condition all true."""
    rewritten = 0
    for n in list(gm.graph.nodes):
        if n.target != aten.where.self or len(n.args) != 3 or not _never_neg_inf(n.args[0]):
            continue
        guard, a, b = n.args
        try:
            if isinstance(a, Node) and mask_term(a) is not None and scalar(b) == 0 and \
                    list(_val(a).shape) == list(_val(n).shape):
                n.replace_all_uses_with(a)
            else:
                true = _call(gm, aten.full.default, (list(_val(guard).shape), True), {"dtype": torch.bool}, n)
                n.replace_input_with(guard, true)
        except _NoValue:
            continue
        rewritten += 1
    return rewritten


def finite_fills(gm: torch.fx.GraphModule) -> int:
    """Attention masks in the forms masks.py recognises, in place (a shape op on a mask term moved onto
    its bool, ``scaled_dot_product_attention``'s guard of a float mask dropped), then every mask fill
    below MASK_FILL (``-inf``, ``finfo.min``) made MASK_FILL; the number of rewrites. Nothing else
    changes: exp(MASK_FILL + score - max) is 0 in float32 as exp(-inf) is, and MASK_FILL times a positive factor below 1e8 stays finite. What it defines is a row masked
    everywhere: PyTorch's softmax of all -inf is NaN, which no observer can measure and no code holds;
    with a finite fill every entry of the row is equal, so the softmax is uniform, as Hugging Face's
    ``finfo.min`` masks make it, and as the integer softmax computes (rules/softmax.py)."""
    nodes = len(gm.graph.nodes)
    rewritten = _through_shape_ops(gm) + _sdpa_guards(gm)
    changed = (rewritten or len(gm.graph.nodes) != nodes) and gm.graph.eliminate_dead_code()
    for n in list(gm.graph.nodes):
        found = masked(n) if n.op == "call_function" else None
        for c in found.chain if found is not None else ():
            args = list(c.args)
            for i, a in enumerate(args):
                v = scalar(a)
                if v is None or v >= MASK_FILL:
                    continue
                if isinstance(a, Node):
                    with gm.graph.inserting_before(c):
                        a = gm.graph.call_function(aten.full_like.default, (a, MASK_FILL))
                    a.meta.update({k: v for k, v in args[i].meta.items() if k in ("val", "stack_trace", "nn_module_stack")})
                    args[i] = a
                else:
                    args[i] = MASK_FILL
                rewritten += 1
            c.args = tuple(args)
    if rewritten or changed:
        gm.recompile()
    return rewritten
