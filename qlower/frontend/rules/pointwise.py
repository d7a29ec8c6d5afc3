"""Pointwise non-linearities (sigmoid, gelu, log, pow by a scalar, ...) as lookup tables.

On a per-tensor quantized input whose result PT2E quantizes, an op is a
``table`` of every input code's image, computed by PyTorch itself (dequantize
the code, apply the very node with its other arguments, quantize to the output
spec), so the table is bit-identical to the fake-quant model. A code whose image
is NaN (the log or square root of a negative number) reads the zero point: PyTorch
casts NaN to an undefined integer there, so no value is more right than 0.

Otherwise (a float import) the op is built from float IR ops where there is a
recipe, or left to the float fallback. Non-core ops without a float recipe are
registered ``STATIC_ONLY``: outside static quantization they are decomposed
into core ops before the import, like ops without a rule.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.quantizer import packet
from qlower.frontend.rules import STATIC_ONLY, register
from qlower.frontend.rules.elementwise import _float_ref, _static_quantized
from qlower.ir import QuantSpec, Value

aten = torch.ops.aten
QD = torch.ops.quantized_decomposed


def lookup_table(ctx: ImportContext, node, in_spec: QuantSpec, out_spec: QuantSpec) -> np.ndarray:
    """``out code = q_out(f(dq_in(code)))`` for every input code, computed by PyTorch like the fake-quant model."""
    codes = torch.arange(in_spec.qmin, in_spec.qmax + 1, dtype=torch.int32)
    dq = QD.dequantize_per_tensor.default(codes, in_spec.scale[0], in_spec.zero_point[0], in_spec.qmin,
                                          in_spec.qmax, torch.int32)
    y = ctx.fold(node, {node.args[0]: dq})
    y = torch.where(torch.isnan(y), torch.zeros_like(y), y)
    q = QD.quantize_per_tensor.default(y, out_spec.scale[0], out_spec.zero_point[0], out_spec.qmin,
                                       out_spec.qmax, torch.int32)
    return q.numpy().astype(out_spec.dtype.numpy)


def _scalar(ctx: ImportContext, v: float, rank: int) -> Value:
    return ctx.constant(np.full((1,) * rank, v, dtype=np.float32))


def _gelu(ctx, x, perm, approximate="none", **_):
    r = x.type.rank
    if approximate == "tanh":
        cube = ctx.emit("mul", ctx.emit("mul", x, x, perm=perm), x, perm=perm)
        inner = ctx.emit("add", x, ctx.emit("mul", cube, _scalar(ctx, 0.044715, r), perm=perm), perm=perm)
        t = ctx.emit("tanh", ctx.emit("mul", inner, _scalar(ctx, math.sqrt(2 / math.pi), r), perm=perm), perm=perm)
    else:
        t = ctx.emit("erf", ctx.emit("mul", x, _scalar(ctx, 1 / math.sqrt(2), r), perm=perm), perm=perm)
    half_x = ctx.emit("mul", x, _scalar(ctx, 0.5, r), perm=perm)
    return ctx.emit("mul", half_x, ctx.emit("add", t, _scalar(ctx, 1.0, r), perm=perm), perm=perm)


def _hardsigmoid(ctx, x, perm, **_):
    r = x.type.rank
    shifted = ctx.emit("add", x, _scalar(ctx, 3.0, r), perm=perm)
    return ctx.emit("mul", ctx.emit("clamp", shifted, perm=perm, min=0.0, max=6.0), _scalar(ctx, 1 / 6, r), perm=perm)


def _hardswish(ctx, x, perm, **_):
    return ctx.emit("mul", x, _hardsigmoid(ctx, x, perm), perm=perm)


def _silu(ctx, x, perm, **_):
    return ctx.emit("mul", x, ctx.emit("sigmoid", x, perm=perm), perm=perm)


FLOAT_POINTWISE = {
    aten.sigmoid: lambda ctx, x, perm, **_: ctx.emit("sigmoid", x, perm=perm),
    aten.tanh: lambda ctx, x, perm, **_: ctx.emit("tanh", x, perm=perm),
    aten.exp: lambda ctx, x, perm, **_: ctx.emit("exp", x, perm=perm),
    aten.gelu: _gelu,
    aten.hardsigmoid: _hardsigmoid,
    aten.hardswish: _hardswish,
    aten.hardswish_: _hardswish,
    aten.silu: _silu,
}

# Every op a table can stand for: f(x, constant arguments...), in place or not.
TABLE_OPS = (
    aten.abs, aten.abs_, aten.neg, aten.neg_, aten.sqrt, aten.sqrt_, aten.rsqrt, aten.rsqrt_, aten.log, aten.log_,
    aten.reciprocal, aten.reciprocal_, aten.exp, aten.exp_, aten.pow, aten.pow_, aten.leaky_relu,
    aten.leaky_relu_, aten.elu, aten.elu_, aten.gelu, aten.gelu_, aten.silu, aten.silu_, aten.mish, aten.mish_,
    aten.hardswish, aten.hardswish_, aten.hardsigmoid, aten.hardsigmoid_, aten.softplus, aten.celu, aten.celu_,
    aten.selu, aten.selu_, aten.sigmoid, aten.sigmoid_, aten.tanh, aten.tanh_, aten.log_sigmoid,
)
STATIC_ONLY.update(p for p in TABLE_OPS
                   if p not in FLOAT_POINTWISE and torch.Tag.core not in getattr(p, p.overloads()[0]).tags)


@register(*TABLE_OPS)
def pointwise(ctx: ImportContext, node, input: Ref, **kwargs):
    if not isinstance(input, Ref) or node.all_input_nodes[:1] != [node.args[0]] or len(node.all_input_nodes) > 1:
        raise ctx.unsupported("a lookup table needs the tensor as the only tensor operand (e.g. pow by a scalar)")
    x, out = _float_ref(ctx, input), ctx.out_spec()
    if _static_quantized(x) and out is not None:
        spec = x.spec
        if spec.qmax - spec.qmin >= 2**16:
            raise ctx.unsupported(f"a lookup table needs a per-tensor 8/16-bit input, got {spec}")
        table = lookup_table(ctx, node, spec, out)
        return Ref.of(ctx.emit("table", ctx.value_in(x), perm=x.perm, table=table, offset=-spec.qmin, out=out),
                      x.perm)
    fn = FLOAT_POINTWISE.get(packet(node))
    if fn is None:
        raise ctx.unsupported("only integer on tensors quantized per tensor on both sides (as a lookup table)")
    return Ref.of(fn(ctx, ctx.as_float(x), x.perm, **kwargs), x.perm)
