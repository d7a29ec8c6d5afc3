"""log_softmax on int8 codes, built from integer IR ops (the exponentials as softmax.py computes them).

Recipe (input codes ``x`` with scale ``s`` along ``axis`` of length ``N``; ``D = qmax - qmin``)::

    d   = x - max(x)                      # int32 at scale s, in [-D, 0], exact
    e   = table(d)                        # round(exp(d·s) · 2**15), int32 (softmax.py's exp_table)
    S   = reduce_sum(e)                   # int32 at scale 2**-15, value in [1, N]
    S16 = rescale(S → int16 [0, 32767] at scale N / 32767)
    L   = table(S16)                      # round(log(S16 · N/32767) · 2**LOG_BITS), int32
    out = rescale(d·s - L·2**-LOG_BITS → output spec)   # both at one int32 scale, as add/sub

log_softmax(x) = (x - max) · s - log(sum(exp((x - max) · s))), and ``d`` is exact,
so the only errors are in ``log S``: the exponentials' rounding (at most
``N / 2**16`` relative to ``S >= 1``), the int16 rescale of S (at most
``N / 65534`` relative, since ``S16 >= 32767 / N``) and L's own rounding
(``2**-(LOG_BITS+1)``). Their sum, an absolute error in the output's units, is
checked at import to be below a quarter of an output step, so the result differs
from the fake-quant model only where the exact value lies that close to a rounding
boundary, and then by one step. Longer rows (or finer outputs) stay in float.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.rules import STATIC_ONLY, register
from qlower.frontend.rules.elementwise import _float_ref, _static_quantized
from qlower.frontend.rules.softmax import EXP_BITS, exponentials
from qlower.ir import DType, QuantSpec
from qlower.ir.add_domain import add_domain_scale

aten = torch.ops.aten
LOG_BITS = 16
S16_MAX = 2**15 - 1


def log_table(n: int) -> np.ndarray:
    """``round(log(c · n / 32767) · 2**LOG_BITS)`` for codes ``c = 0 .. 32767`` (code 0 reads code 1's entry)."""
    c = np.maximum(np.arange(S16_MAX + 1, dtype=np.float64), 1.0)
    return np.rint(np.log(c * n / S16_MAX) * 2.0**LOG_BITS).astype(np.int32)


@register(aten.log_softmax, aten._log_softmax)
def log_softmax(ctx: ImportContext, node, input: Ref, dim, dtype=None, half_to_float=False, **_):
    x, out = _float_ref(ctx, input), ctx.out_spec()
    if not _static_quantized(x) or out is None or x.spec.dtype not in (DType.INT8, DType.INT16):
        raise ctx.unsupported("only integer on int8/int16 tensors quantized per tensor on both sides")
    axis = layout.ir_axis(x.perm, dim)
    perm, s = x.perm, x.spec.scale[0]
    n = ctx.value_in(x).shape[axis]
    error = n / 2**16 + n / (2 * S16_MAX) + 2.0 ** -(LOG_BITS + 1)
    if n * 2**EXP_BITS >= 2**31 or error > out.scale[0] / 4:
        raise ctx.unsupported(f"a row of {n} is too long for an integer log_softmax within a quarter of an "
                              f"output step ({out.scale[0]:.3g})")
    d, _, total = exponentials(ctx, x, axis)
    s16 = ctx.rescale(total, QuantSpec.per_tensor(n / S16_MAX, 0, DType.INT16, 0, S16_MAX), perm)
    log_s = ctx.emit("table", s16, perm=perm, table=log_table(n), offset=0,
                     out=QuantSpec.per_tensor(2.0**-LOG_BITS, 0, DType.INT32))
    common = QuantSpec.per_tensor(add_domain_scale((s, 2.0**-LOG_BITS)), 0, DType.INT32)
    diff = ctx.emit("sub", ctx.rescale(d, common, perm), ctx.rescale(log_s, common, perm), perm=perm)
    return Ref.of(ctx.rescale(diff, out, perm), perm)


STATIC_ONLY.add(aten.log_softmax)
