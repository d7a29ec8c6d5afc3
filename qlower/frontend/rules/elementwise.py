"""Elementwise ops: add / sub / mul / div, clamps (relu family), batch norm.

Integer recipes (all scale changes are IR ``rescale`` ops):
- add / sub: both operands rescaled to int32 at a common scale
  ``2 * max(s_a, s_b) / 2**20`` (TFLite's left shift: 20 bits of headroom keep the
  sum exact to ~1e-6 of an input step; 15 bits with int16 operands), added, rescaled to the output.
  A float constant operand becomes int32 codes at that scale.
- mul: both operands rescaled to int32 with the zero point removed (same scale),
  multiplied (scale ``s_a * s_b``), rescaled. A float constant that varies along
  at most one axis (a per-channel ``[1, C, 1, 1]`` buffer, a scalar) is held
  *exactly* as int32 codes ±1 with scale ``|c|`` per channel; other float
  constants as int32 codes at scale ``max|c| / 2**20``.
- relu / relu6 / hardtanh / clamp: ``rescale`` to the output spec, then an explicit
  ``clamp`` to the codes of the bounds (the code of 0.0 is the zero point).
- pointwise non-linearities (sigmoid, gelu, ...): lookup tables, see pointwise.py.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.quantizer import packet
from qlower.frontend.rules import integer, register
from qlower.ir import DType, QuantSpec
from qlower.ir.add_domain import ADD_SHIFT, add_domain_scale

aten = torch.ops.aten
CONSTANT_BITS = 20  # a float constant of many magnitudes as int32 codes: max|c| is 2**20 codes
INT16_COMMON_SHIFT = 15  # add / sub with an int16 operand: 2**15 * 2**14 per operand, the sum below 2**31
FLOAT_MAX = float(np.finfo(np.float32).max)


def operand(x: object) -> Ref:
    """A rule argument as a Ref (Python numbers become float constants)."""
    if isinstance(x, Ref):
        return x
    if isinstance(x, (int, float, bool)):
        return Ref.constant(np.array(float(x), dtype=np.float32))
    raise TypeError(f"unsupported operand {x!r}")


def _static_quantized(r: Ref) -> bool:
    """Codes with a static per-tensor spec (an accumulator with per-channel scales counts as float)."""
    return r.is_quantized and r.scale is None and not r.spec.is_per_channel


def _float_ref(ctx: ImportContext, r: Ref) -> Ref:
    """Dynamic codes are only meaningful to a gemm: elsewhere they are floats."""
    return Ref.of(ctx.as_float(r), r.perm) if r.scale is not None else r


def _int32_codes(ctx: ImportContext, data: np.ndarray, scale: float) -> np.ndarray:
    codes = np.rint(data.astype(np.float64) / scale)
    if np.abs(codes).max(initial=0) > DType.INT32.max:
        raise ctx.unsupported("a constant operand is too large for int32 at the operation's scale")
    return codes.astype(np.int32)


def _per_tensor_scale(ctx: ImportContext, r: Ref) -> float:
    q = r.spec
    if q.is_per_channel:
        raise ctx.unsupported("a per-channel quantized operand in an elementwise op")
    return q.scale[0]


@register(aten.add, aten.add_, aten.sub, aten.sub_)
def add_sub(ctx: ImportContext, node, input, other, alpha=1, **_):
    kind = "sub" if packet(node) in (aten.sub, aten.sub_) else "add"
    if integer.involved(input, other):
        if not integer.float_result(node):
            return integer.arithmetic(ctx, node, kind, input, other, alpha)
        input, other = integer.as_floats(ctx, input, other)
    refs = [_float_ref(ctx, operand(input)), _float_ref(ctx, operand(other))]
    if alpha != 1:
        refs[1] = _times_alpha(ctx, refs[1], alpha)
    quantized = [_static_quantized(r) for r in refs]
    if not any(quantized) or not all(q or r.is_float_const for q, r in zip(quantized, refs)):
        perm, (a, b) = ctx.broadcast(refs, floats=True)
        return Ref.of(ctx.emit(kind, a, b, perm=perm), perm)
    scales = [_per_tensor_scale(ctx, r) if q else float(np.abs(r.data).max(initial=0.0)) / 127
              for q, r in zip(quantized, refs)]
    # int16 codes (|code| < 2**15) keep 15 bits of headroom instead of 20, so the sum stays within int32
    shift = ADD_SHIFT if all(not q or r.spec.dtype.itemsize == 1 for q, r in zip(quantized, refs)) \
        else INT16_COMMON_SHIFT
    common = QuantSpec.per_tensor(add_domain_scale(scales, shift), 0, DType.INT32)
    refs = [r if q else Ref.constant(_int32_codes(ctx, r.data, common.scale[0]), common, r.origin)
            for q, r in zip(quantized, refs)]
    perm, (a, b) = ctx.broadcast(refs)
    out = ctx.emit(kind, ctx.rescale(a, common, perm), ctx.rescale(b, common, perm), perm=perm)
    return ctx.requant(out, perm)


def _times_alpha(ctx: ImportContext, r: Ref, alpha: float) -> Ref:
    """``alpha * r`` for add/sub: a float constant scaled; int8 codes as int32 times ``alpha`` held exactly
    (a ±1 code at scale ``|alpha|``), so only the usual common-scale rescale rounds."""
    if r.is_float_const:
        return Ref.constant((r.data.astype(np.float64) * alpha).astype(np.float32), origin=r.origin)
    if not _static_quantized(r):
        raise ctx.unsupported(f"alpha={alpha} on a float operand")
    perm, (v, c) = ctx.broadcast([r, exact_multiplier(ctx, np.array(float(alpha)), r.rank)])
    codes = ctx.rescale(v, QuantSpec.per_tensor(_per_tensor_scale(ctx, r), 0, DType.INT32), perm)
    return Ref.of(ctx.emit("mul", codes, c, perm=perm), perm)


def exact_multiplier(ctx: ImportContext, c: np.ndarray, rank: int) -> Ref:
    """A float constant as int32 codes for ``mul``: exact (±1 × |c| per channel) when it varies
    along at most one axis, else codes at scale ``max|c| / 2**20``."""
    c = c.astype(np.float64).reshape((1,) * (rank - c.ndim) + c.shape)
    axes = [d for d in range(c.ndim) if c.shape[d] > 1]
    magnitudes = np.unique(np.abs(c[c != 0]))
    if len(magnitudes) <= 1:  # one magnitude (a scalar, a 0/1 or ±1 mask): per tensor, the signs as codes
        v = float(magnitudes.max(initial=0.0))
        spec = QuantSpec.per_tensor(abs(v) or 1.0, 0, DType.INT32)
        return Ref.constant(np.sign(c).astype(np.int32), spec)
    if len(axes) == 1:
        flat = c.reshape(-1)
        scales = np.where(flat == 0, 1.0, np.abs(flat))
        spec = QuantSpec.per_channel(scales, axis=axes[0], dtype=DType.INT32)
        return Ref.constant(np.sign(c).astype(np.int32), spec)
    amax = float(np.abs(c).max())
    spec = QuantSpec.per_tensor((amax or 1.0) / 2**CONSTANT_BITS, 0, DType.INT32)
    return Ref.constant(_int32_codes(ctx, c, spec.scale[0]), spec)


@register(aten.mul, aten.mul_, aten.div, aten.div_)
def mul_div(ctx: ImportContext, node, input, other, rounding_mode=None, **_):
    divide = packet(node) in (aten.div, aten.div_)
    if integer.involved(input, other):
        if divide:  # a multiply by the reciprocal isn't PyTorch's correctly rounded quotient
            raise ctx.unsupported("division of integer tensors runs as the PyTorch op itself on the host")
        if not integer.float_result(node):
            return integer.arithmetic(ctx, node, "mul", input, other)
        input, other = integer.as_floats(ctx, input, other)
    a, b = _float_ref(ctx, operand(input)), _float_ref(ctx, operand(other))
    if divide:
        if rounding_mode is None and _static_quantized(b) and (_static_quantized(a) or a.is_float_const):
            return _divide_by_codes(ctx, a, b)
        if rounding_mode is not None or not b.is_float_const:
            if _static_quantized(a) or _static_quantized(b) or rounding_mode is not None:
                raise ctx.unsupported("division is supported by a float constant only (no rounding mode)")
            perm, (va, vb) = ctx.broadcast([a, b], floats=True)
            return Ref.of(ctx.emit("mul", va, ctx.emit("reciprocal", vb, perm=perm), perm=perm), perm)
        b = Ref.constant((1.0 / b.data.astype(np.float64)).astype(np.float32), origin=b.origin)
    return _multiply(ctx, a, b)


def _multiply(ctx: ImportContext, a: Ref, b: Ref) -> Ref:
    qa, qb = _static_quantized(a), _static_quantized(b)
    if qa and qb:
        perm, (va, vb) = ctx.broadcast([a, b])
        ia = ctx.rescale(va, QuantSpec.per_tensor(_per_tensor_scale(ctx, a), 0, DType.INT32), perm)
        ib = ctx.rescale(vb, QuantSpec.per_tensor(_per_tensor_scale(ctx, b), 0, DType.INT32), perm)
        return ctx.requant(ctx.emit("mul", ia, ib, perm=perm), perm)
    if (qa and b.is_float_const) or (qb and a.is_float_const):
        x, c = (a, b) if qa else (b, a)
        cref = exact_multiplier(ctx, c.data, x.rank)
        perm, (vx, vc) = ctx.broadcast([x, cref])
        ix = ctx.rescale(vx, QuantSpec.per_tensor(_per_tensor_scale(ctx, x), 0, DType.INT32), perm)
        return ctx.requant(ctx.emit("mul", ix, vc, perm=perm), perm)
    perm, (va, vb) = ctx.broadcast([a, b], floats=True)
    return Ref.of(ctx.emit("mul", va, vb, perm=perm), perm)


RECIPROCAL_BITS = 22


def _const_codes(data: object, spec: QuantSpec) -> Ref:
    return Ref.constant(np.asarray(data).astype(spec.dtype.numpy), spec)


def _divide_by_codes(ctx: ImportContext, a: Ref, b: Ref) -> Ref:
    """``a / b`` with ``b`` int8/int16 codes: ``a * r``, ``r = round(2**22 / (b - zp_b))`` read from a table
    (int32 at scale ``1 / (2**22 s_b)``), then the product requantized like ``mul``.

    ``r`` is within ``|b - zp_b| / 2**23 <= 255 / 2**23`` of ``1 / (b - zp_b)`` relatively, so a result of
    at most 256 output steps is within 0.008 of a step before its final rounding: it differs from the
    fake-quant model only next to a rounding boundary, by one step. ``|a - zp_a| * |r| < 2**30``: no
    overflow. A zero divisor saturates like PyTorch's quantized ±inf (qmax, qmin), and ``0 / 0`` (NaN,
    an undefined code in PyTorch) gives the zero point.
    """
    out, spec = ctx.requant_target(), b.spec
    if out is None or out.is_per_channel or spec.qmax - spec.qmin >= 2**16:
        raise ctx.unsupported("division by a tensor is integer only with per-tensor 8/16-bit codes on both sides")
    zp = spec.zero_point[0]
    d = np.arange(spec.qmin, spec.qmax + 1, dtype=np.int64) - zp
    table = np.where(d == 0, 0, np.rint(2.0**RECIPROCAL_BITS / np.where(d == 0, 1, d))).astype(np.int32)
    recip = QuantSpec.per_tensor(1.0 / (2.0**RECIPROCAL_BITS * spec.scale[0]), 0, DType.INT32)
    r = ctx.emit("table", ctx.value_in(b), perm=b.perm, table=table, offset=-spec.qmin, out=recip)
    y = _multiply(ctx, a, Ref.of(r, b.perm))
    if y.value.quant != out:
        raise ctx.unsupported("division by a tensor whose result isn't requantized")
    qmax, qmin, zero = _const_codes(out.qmax, out), _const_codes(out.qmin, out), _const_codes(out.zero_point[0], out)
    if a.is_float_const:
        c = a.data.astype(np.float64)
        saturated = _const_codes(np.where(c > 0, out.qmax, np.where(c < 0, out.qmin, out.zero_point[0])), out)
    else:
        za = _const_codes(a.spec.zero_point[0], a.spec)
        perm, (va, vz) = ctx.broadcast([a, za])
        pos = Ref.of(ctx.emit("greater", va, vz, perm=perm), perm)
        neg = Ref.of(ctx.emit("greater", vz, va, perm=perm), perm)
        perm, (c, lo, mid) = ctx.broadcast([neg, qmin, zero])
        below = Ref.of(ctx.emit("select", c, lo, mid, perm=perm), perm)
        perm, (c, hi, rest) = ctx.broadcast([pos, qmax, below])
        saturated = Ref.of(ctx.emit("select", c, hi, rest, perm=perm), perm)
    perm, (vb, vzb) = ctx.broadcast([b, _const_codes(zp, spec)])
    by_zero = Ref.of(ctx.emit("equal", vb, vzb, perm=perm), perm)
    perm, (c, s, v) = ctx.broadcast([by_zero, saturated, y])
    return Ref.of(ctx.emit("select", c, s, v, perm=perm), perm)


# -- clamps ----------------------------------------------------------------------------------

def _code(ctx: ImportContext, v: float | None, spec: QuantSpec, default: int) -> int:
    if v is None:
        return default
    return int(ctx.quantize_value(np.array(v, dtype=np.float32), spec))


def clamp_to(ctx: ImportContext, x: Ref, lo: float | None, hi: float | None) -> Ref:
    if integer.is_plain(x):
        return integer.clamp(ctx, ctx.node, x, lo, hi)
    x = _float_ref(ctx, x)
    if _static_quantized(x):
        value, out = ctx.value_in(x), ctx.out_spec()
        if out is not None:
            value = ctx.rescale(value, out, x.perm)
        spec = value.quant
        if not spec.is_per_channel:
            c_lo, c_hi = _code(ctx, lo, spec, spec.qmin), _code(ctx, hi, spec, spec.qmax)
            return Ref.of(ctx.emit("clamp", value, perm=x.perm, min=c_lo, max=c_hi), x.perm)
        if lo == 0 and hi is None and not any(spec.zero_point):  # relu on an accumulator
            return Ref.of(ctx.emit("clamp", value, perm=x.perm, min=0, max=spec.qmax), x.perm)
    v = ctx.as_float(x)
    f_lo = -FLOAT_MAX if lo is None else float(lo)
    f_hi = FLOAT_MAX if hi is None else float(hi)
    return Ref.of(ctx.emit("clamp", v, perm=x.perm, min=f_lo, max=f_hi), x.perm)


@register(aten.relu, aten.relu_)
def relu(ctx: ImportContext, node, input, **_):
    return clamp_to(ctx, input, 0.0, None)


@register(aten.relu6)
def relu6(ctx: ImportContext, node, input, **_):
    return clamp_to(ctx, input, 0.0, 6.0)


@register(aten.hardtanh, aten.hardtanh_)
def hardtanh(ctx: ImportContext, node, input, min_val=-1.0, max_val=1.0, **_):
    return clamp_to(ctx, input, min_val, max_val)


@register(aten.clamp, aten.clamp_)
def clamp(ctx: ImportContext, node, input, min=None, max=None, **_):  # noqa: A002  (schema names)
    if isinstance(min, Ref) or isinstance(max, Ref):
        from qlower.frontend.rules.compare import clamp_tensor  # compare builds on this module
        return clamp_tensor(ctx, input, min, max)
    return clamp_to(ctx, input, min, max)


@register(aten.batch_norm)
def batch_norm(ctx: ImportContext, node, input: Ref, weight, bias, running_mean, running_var, training, momentum,
               eps, **_):
    if training:
        raise ctx.unsupported("batch norm in training mode; call model.eval() before exporting")
    c = input.torch_shape[1]
    mean, var = running_mean.data.astype(np.float64), running_var.data.astype(np.float64)
    w = weight.data.astype(np.float64) if weight is not None else np.ones(c)
    b = bias.data.astype(np.float64) if bias is not None else np.zeros(c)
    scale = w / np.sqrt(var + eps)
    if _static_quantized(_float_ref(ctx, input)):  # not folded into a conv: an integer per-channel affine map
        from qlower.frontend.rules.normalization import channel_affine
        return channel_affine(ctx, input, scale, b - mean * scale)
    shape = (1, c) + (1,) * (input.rank - 2)
    mul = Ref.constant(scale.reshape(shape).astype(np.float32))
    add = Ref.constant((b - mean * scale).reshape(shape).astype(np.float32))
    perm, (x, m) = ctx.broadcast([input, mul], floats=True)
    scaled = ctx.emit("mul", x, m, perm=perm)
    _, (a,) = ctx.broadcast([add], perm=perm, floats=True)
    return Ref.of(ctx.emit("add", scaled, a, perm=perm), perm)
