"""Plain integer tensors (PyTorch int32/int64 data: ids, counts, integer arithmetic): PyTorch's integer
semantics exactly, never quantized, never saturated.

- ``+ - *`` of int32 tensors (and Python ints) give int32 in PyTorch and wrap around on overflow: they
  are IR ``add`` / ``sub`` / ``mul`` on plain int32 values, which wrap the same way (ops_arith.py).
- a clamp with integer bounds gives the input's integer dtype: an IR ``clamp`` whose bounds are the
  results at the int32 extremes (the clamp is monotone), so bounds beyond int32 and ``min > max``
  (PyTorch: ``min(max(x, lo), hi)``) mean what they mean in PyTorch.
- a float result (``x * 0.5``, a float clamp bound, an int tensor plus a float tensor) converts the
  integer operands to float32 first, as PyTorch's type promotion does.
- anything else on integers (int64 or narrower arithmetic, which the IR holds as int32 and so could not
  wrap where PyTorch does; division) is refused here, so the importer runs the aten op itself on the
  host: exact by definition.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import Node

from qlower.frontend.context import ImportContext, Ref
from qlower.ir import DType, QuantSpec

PLAIN = QuantSpec.plain_integer(DType.INT32)
I32 = DType.INT32


def is_plain(r: object) -> bool:
    return isinstance(r, Ref) and r.spec is not None and r.spec.is_plain_integer and r.scale is None


def _int_const(r: object) -> bool:
    return isinstance(r, Ref) and r.is_const and r.quant is None and r.data.dtype.kind in "iub"


def involved(*operands: object) -> bool:
    """Whether an op reads an integer tensor (a run-time plain integer or an integer constant)."""
    return any(is_plain(r) or _int_const(r) for r in operands)


def _dtype(x: object) -> torch.dtype | None:
    val = x.meta.get("val") if isinstance(x, Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def as_floats(ctx: ImportContext, *operands: object) -> list[object]:
    """Integer operands as float32 (PyTorch promotes them so when the result is float)."""
    out = []
    for r in operands:
        if is_plain(r):
            r = Ref.constant(r.data.astype(np.float32), origin=r.origin) if r.is_const \
                else Ref.of(ctx.as_float(r), r.perm)
        elif _int_const(r):
            r = Ref.constant(r.data.astype(np.float32), origin=r.origin)
        out.append(r)
    return out


def float_result(node: Node) -> bool:
    dtype = _dtype(node)
    return dtype is not None and dtype.is_floating_point


def _wrap32(v: int) -> int:
    return ((int(v) + 2**31) & (2**32 - 1)) - 2**31


def _plain_ref(ctx: ImportContext, r: object) -> Ref:
    if isinstance(r, (bool, int)):
        return Ref.constant(np.array(_wrap32(r), dtype=np.int32), PLAIN)
    if _int_const(r):
        return Ref.constant(r.data.astype(np.int32), PLAIN, r.origin)
    return r


def arithmetic(ctx: ImportContext, node: Node, kind: str, input: object, other: object, alpha: object = 1) -> Ref:
    """``input (+|-|*) alpha * other`` with an integer result, as PyTorch computes it."""
    tensors = [a for a in node.args[:2] if isinstance(a, Node)]
    scalars = [a for a in node.args[:2] if not isinstance(a, Node)] + [alpha]
    if _dtype(node) != torch.int32 or any(_dtype(a) != torch.int32 for a in tensors) \
            or not all(isinstance(s, (bool, int)) for s in scalars) \
            or not all(is_plain(r) or _int_const(r) or isinstance(r, (bool, int)) for r in (input, other)):
        dtypes = ", ".join(str(_dtype(a) or type(a).__name__) for a in (node, *node.args[:2]))
        raise ctx.unsupported(f"integer arithmetic on {dtypes} (the IR wraps int32 only): it runs as "
                              "the PyTorch op itself on the host")
    a, b = _plain_ref(ctx, input), _plain_ref(ctx, other)
    if alpha != 1:
        perm, (vb, va) = ctx.broadcast([b, _plain_ref(ctx, alpha)])
        b = Ref.of(ctx.emit("mul", vb, va, perm=perm, wrap=True), perm)
    perm, (va, vb) = ctx.broadcast([a, b])
    return Ref.of(ctx.emit(kind, va, vb, perm=perm, wrap=True), perm)


def clamp(ctx: ImportContext, node: Node, x: Ref, lo: object, hi: object) -> Ref:
    """A clamp of a plain integer tensor to Python number bounds."""
    if float_result(node):
        (x,) = as_floats(ctx, x)
        with np.errstate(over="ignore"):  # PyTorch rounds a bound to float32 too; inf is refused below
            f_lo, f_hi = (np.float32(-np.inf if v is None else v) for v in (lo, hi))
        if not (np.isfinite(f_lo) or lo is None) or not (np.isfinite(f_hi) or hi is None):
            raise ctx.unsupported("a clamp bound beyond float32")
        f_lo = -np.finfo(np.float32).max if lo is None else f_lo
        f_hi = np.finfo(np.float32).max if hi is None else f_hi
        f_lo = min(f_lo, f_hi)  # min > max: PyTorch's min(max(x, lo), hi) is hi everywhere
        return Ref.of(ctx.emit("clamp", ctx.value_in(x), perm=x.perm, min=float(f_lo), max=float(f_hi)), x.perm)
    if any(v is not None and not float(v).is_integer() for v in (lo, hi)):
        raise ctx.unsupported(f"an integer clamp to non-integer bounds ({lo}, {hi})")

    def f(v: int) -> int:  # PyTorch's clamp of one integer
        v = v if lo is None else max(v, int(lo))
        return v if hi is None else min(v, int(hi))
    # monotone, so on int32 values it is the clamp between its results at the extremes
    c_lo, c_hi = f(I32.min), f(I32.max)
    if c_lo < I32.min or c_hi > I32.max:
        raise ctx.unsupported(f"clamp bounds ({lo}, {hi}) move int32 values outside int32")
    x = _plain_ref(ctx, x)
    return Ref.of(ctx.emit("clamp", ctx.value_in(x), perm=x.perm, min=c_lo, max=c_hi), x.perm)
