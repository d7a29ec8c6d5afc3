"""conv1d / conv2d / linear / addmm / matmul (mm, bmm, 1-D operands, broadcast batch dims):
multiply-accumulate into an int32 accumulator, then ``rescale``.

Static: int8 input × int8 weight (OHWI for convs, permuted with NumPy) + int32
bias ``round_half_even(b / (s_in * s_w[c]))`` → accumulator with scale
``s_in * s_w[c]`` → ``rescale`` to the output's QuantSpec (or to that of a fused
activation). A conv without bias gets ``None``, never a zero bias.
Dynamic: codes with a run-time scale → accumulator → ``dequantize`` by the
run-time scale → ``add`` of the float bias. Float: the same ops on float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.rules import register
from qlower.frontend.rules.movement import reshape_to
from qlower.ir import DType, QuantSpec, Value

aten = torch.ops.aten


def _spatial(values: int | Sequence[int], n: int) -> tuple[int, ...]:
    values = [values] if isinstance(values, int) else list(values)
    return tuple(values * n) if len(values) == 1 else tuple(values)


def conv_padding(padding, kernel: Sequence[int], dilation: Sequence[int]) -> list[tuple[int, int]]:
    """(before, after) per spatial dim; 'same' puts the odd extra element after, as PyTorch does."""
    if padding == "valid":
        return [(0, 0)] * len(kernel)
    if padding == "same":
        out = []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            out.append((total // 2, total - total // 2))
        return out
    return [(p, p) for p in _spatial(padding, len(kernel))]


def quantized_bias(ctx: ImportContext, bias: Ref | None, acc_spec: QuantSpec) -> Value | None:
    """The float bias as int32 codes at the accumulator's scale (round half to even)."""
    if bias is None:
        return None
    if not bias.is_float_const:
        raise ctx.unsupported("the bias must be a float constant")
    spec = acc_spec.with_axis(0 if acc_spec.is_per_channel else None)
    codes = np.rint(bias.data.astype(np.float64) / np.asarray(spec.scale, dtype=np.float64))
    if np.abs(codes).max(initial=0) > DType.INT32.max:
        raise ctx.unsupported("the bias doesn't fit int32 at scale s_in * s_w; the input or weight scale is tiny")
    return ctx.constant(codes.astype(np.int32), spec, origin=bias.origin, name=f"{ctx.node.name}_bias")


def _accumulate(ctx: ImportContext, kind: str, x: Value, w: Ref, w_perm, bias: Ref | None, perm, **attrs) -> Value:
    """Static quantized gemm: returns the int32 accumulator (bias included)."""
    if w.quant is None:
        raise ctx.unsupported("a quantized input needs a quantized weight")
    wv = _weight(ctx, w, w_perm)
    acc_spec = QuantSpec.accumulator(x.quant, wv.quant, axis=0)
    bias_value = quantized_bias(ctx, bias, acc_spec)
    if x.type.dtype is DType.INT16:
        _check_int16_sums(ctx, x.type.quant, w, bias, acc_spec)
    return ctx.emit(kind, x, wv, bias_value, perm=perm, **attrs)


def _span(q: QuantSpec) -> int:
    """The largest ``|code - zero point|`` a quantized tensor of spec ``q`` holds."""
    return max(abs(q.qmin - q.zero_point[0]), abs(q.qmax - q.zero_point[0]))


def _check_int16_sums(ctx: ImportContext, xq: QuantSpec, w: Ref, bias: Ref | None, acc_spec: QuantSpec) -> None:
    """int16 x int8 (A16W8) accumulates in int48 on TOSA targets, in int32 in the IR: the weights prove, per
    output channel, that no input can take a sum (bias included) beyond int32, or the op runs in float."""
    codes = np.abs(w.data.astype(np.int64) - np.asarray(w.quant.zero_point, np.int64).reshape(
        (-1,) + (1,) * (w.data.ndim - 1)))
    worst = codes.reshape(codes.shape[0], -1).sum(axis=1) * _span(xq)
    if bias is not None:
        worst = worst + np.abs(np.rint(bias.data.astype(np.float64) / np.asarray(acc_spec.scale, np.float64)))
    if worst.max(initial=0) > DType.INT32.max:
        raise ctx.unsupported(f"int16 input: weights this large ({int(worst.max()):,} at worst) can take the sum of "
                              "products beyond the int32 accumulator")


def _weight(ctx: ImportContext, w: Ref, perm, floats: bool = False) -> Value:
    value = ctx.place_constant(w, tuple(perm), name=f"{ctx.node.name}_weight")
    return ctx.as_float(Ref.of(value, tuple(perm))) if floats else value


def _dynamic_finish(ctx: ImportContext, acc: Value, scale: Value, bias: Ref | None, perm) -> Value:
    out = ctx.emit("dequantize", acc, scale, perm=perm)
    if bias is None:
        return out
    data = bias.data.astype(np.float32).reshape((1,) * (acc.type.rank - 1) + (-1,))
    return ctx.emit("add", out, ctx.constant(data, origin=bias.origin, name=f"{ctx.node.name}_bias"), perm=perm)


def _float_bias(ctx: ImportContext, bias: Ref | None) -> Value | None:
    if bias is None:
        return None
    return ctx.as_float(Ref.of(ctx.place_constant(bias, (0,), name=f"{ctx.node.name}_bias"), (0,)))


@register(aten.conv2d, aten.conv1d)
def conv(ctx: ImportContext, node, input: Ref, weight: Ref, bias: Ref | None = None, stride=1, padding=0,
         dilation=1, groups=1, **_):
    if not weight.is_const:
        raise ctx.unsupported("the conv weight must be a constant (a parameter or buffer)")
    n_spatial = weight.data.ndim - 2
    if n_spatial not in (1, 2) or input.rank != n_spatial + 2:
        raise ctx.unsupported(f"conv with a {input.rank}-D input and a {weight.data.ndim}-D weight")
    kernel = weight.data.shape[2:]
    stride, dilation = _spatial(stride, n_spatial), _spatial(dilation, n_spatial)
    pads = conv_padding(padding, kernel, dilation)
    if n_spatial == 1:  # conv1d as a conv2d over [N, 1, L, C]
        stride, dilation, pads = (1,) + stride, (1,) + dilation, [(0, 0)] + pads
        weight = Ref(data=weight.data[:, :, None, :], perm=(0, 1, 2, 3), quant=weight.quant, origin=weight.origin)
    attrs = dict(stride=stride, dilation=dilation, pad=tuple(p for pair in pads for p in pair), groups=groups)
    if input.is_quantized and weight.quant is None:  # a conv the quantizer left alone: float
        input = Ref.of(ctx.as_float(input), input.perm)

    x, scale = _conv_input(ctx, input, n_spatial)
    if scale is not None:  # dynamic
        acc = ctx.emit("conv2d", x, _weight(ctx, weight, layout.NHWC), None, perm=layout.NHWC, **attrs)
        out = _dynamic_finish(ctx, acc, scale, bias, layout.NHWC)
        result = Ref.of(out, layout.NHWC)
    elif x.quant is not None:
        acc = _accumulate(ctx, "conv2d", x, weight, layout.NHWC, bias, layout.NHWC, **attrs)
        result = ctx.requant(acc, layout.NHWC) if n_spatial == 2 else _requant_or_float(ctx, acc)
    else:
        out = ctx.emit("conv2d", x, _weight(ctx, weight, layout.NHWC, floats=True), _float_bias(ctx, bias),
                       perm=layout.NHWC, **attrs)
        result = Ref.of(out, layout.NHWC)
    if n_spatial == 2:
        return result
    # [N, 1, L, O] → [N, L, O], i.e. PyTorch's [N, O, L] in layout (0, 2, 1)
    v = result.value
    return Ref.of(ctx.emit("reshape", v, perm=(0, 2, 1), shape=(v.shape[0], v.shape[2], v.shape[3])), (0, 2, 1))


def _requant_or_float(ctx: ImportContext, acc: Value) -> Ref:
    """A per-channel accumulator can't be reshaped: requantize it, or go to float."""
    ref = ctx.requant(acc, layout.NHWC)
    if ref.value.quant.is_per_channel:
        return Ref.of(ctx.as_float(ref), layout.NHWC)
    return ref


def _conv_input(ctx: ImportContext, x: Ref, n_spatial: int) -> tuple[Value, Value | None]:
    """The conv input as NHWC (conv1d: [N, 1, L, C]) codes or floats, with its run-time scale if dynamic."""
    if n_spatial == 2:
        return ctx.value_in(x, layout.NHWC), _scale_in(ctx, x, layout.NHWC)
    v = ctx.value_in(x, (0, 2, 1))
    n, length, c = v.shape
    v4 = ctx.emit("reshape", v, perm=(), shape=(n, 1, length, c))
    scale = _scale_in(ctx, x, (0, 2, 1))
    if scale is not None:
        scale = ctx.emit("reshape", scale, perm=(), shape=(scale.shape[0], 1) + scale.shape[1:])
    return v4, scale


def _scale_in(ctx: ImportContext, x: Ref, perm) -> Value | None:
    if x.scale is None:
        return None
    if x.value.quant.dynamic == "per_row" and tuple(x.perm) != tuple(perm):
        raise ctx.unsupported("per-row dynamic codes in the wrong layout for this conv")
    return x.scale


@register(aten.linear)
def linear(ctx: ImportContext, node, input: Ref, weight: Ref, bias: Ref | None = None, **_):
    if not weight.is_const or weight.data.ndim != 2:
        raise ctx.unsupported("the linear weight must be a 2-D constant (a parameter or buffer)")
    rank = input.rank
    if input.is_quantized and weight.quant is None:  # a linear the quantizer left alone: float
        input = Ref.of(ctx.as_float(input), input.perm)
    perm = input.perm if input.perm and input.perm[-1] == rank - 1 else layout.identity(rank)
    x = ctx.value_in(input, perm)
    if input.scale is not None:
        acc = ctx.emit("fully_connected", x, _weight(ctx, weight, (0, 1)), None, perm=perm)
        return Ref.of(_dynamic_finish(ctx, acc, input.scale, bias, perm), perm)
    if x.quant is not None:
        return ctx.requant(_accumulate(ctx, "fully_connected", x, weight, (0, 1), bias, perm), perm)
    out = ctx.emit("fully_connected", x, _weight(ctx, weight, (0, 1), floats=True), _float_bias(ctx, bias), perm=perm)
    return Ref.of(out, perm)


@register(aten.matmul, aten.bmm, aten.mm)
def matmul(ctx: ImportContext, node, input: Ref, other: Ref | None = None, mat2: Ref | None = None, **_):
    """PyTorch matmul semantics: a 1-D left operand is a row ``[1, K]``, a 1-D right operand a column
    ``[K, 1]`` (the dim is removed from the result); batch dims broadcast. A rank-2 right operand
    under a batched left one flattens the batch into rows; other broadcast batch dims are
    replicated (``concat``), so the IR matmul always sees equal batch dims."""
    a, b = input, other if other is not None else mat2
    out_shape = tuple(int(d) for d in node.meta["val"].shape)
    if a.scale is not None or b.scale is not None:
        if _dynamic_pair(a, b) and not _sums_overflow(a, b, a.torch_shape[-1]):
            return _dynamic_matmul(ctx, a, b)
        # dynamic codes of other shapes: the dequantized operands in a float matmul (fake-quant's meaning)
        a = Ref.of(ctx.as_float(a), a.perm) if a.scale is not None else a
        b = Ref.of(ctx.as_float(b), b.perm) if b.scale is not None else b
    if a.rank == 1:
        a = reshape_to(ctx, a, (1,) + a.torch_shape)
    if b.rank == 1:
        b = reshape_to(ctx, b, b.torch_shape + (1,))
    sa, sb = a.torch_shape, b.torch_shape
    quantized = a.is_quantized and b.is_quantized
    if quantized and (a.spec.is_per_channel or b.spec.is_per_channel):
        quantized = False
    place = ctx.value_in if quantized else ctx.as_float
    if b.rank == 2 and a.rank > 2:  # [..., M, K] @ [K, N]: rows of one 2-D matmul
        va = reshape_to(ctx, a, (int(np.prod(sa[:-1])), sa[-1]))
        va, vb = place(va, (0, 1)), place(b, (0, 1))
    else:
        batch = tuple(torch.broadcast_shapes(sa[:-2], sb[:-2]))
        va = place(_broadcast_batch(ctx, a, batch), layout.identity(len(batch) + 2))
        vb = place(_broadcast_batch(ctx, b, batch), layout.identity(len(batch) + 2))
    if quantized and _sums_overflow(a, b, sa[-1]):
        raise ctx.unsupported(f"{a.spec.dtype.value} x {b.spec.dtype.value} operands: {sa[-1]} products of codes "
                              f"up to {_span(a.spec)} x {_span(b.spec)} can exceed the int32 accumulator")
    acc = ctx.emit("matmul", va, vb, perm=layout.identity(va.type.rank))
    result = ctx.requant(acc, layout.identity(acc.type.rank)) if quantized else Ref.of(acc, layout.identity(acc.type.rank))
    if result.torch_shape != out_shape:
        result = reshape_to(ctx, result, out_shape)
    return result


def _sums_overflow(a: Ref, b: Ref, k: int) -> bool:
    """Whether k products of the operands' codes can sum beyond int32 (the IR verifier's bound for a
    matmul: no constant operand bounds it, so the codes' ranges do)."""
    return k * _span(a.spec) * _span(b.spec) > DType.INT32.max


def _broadcast_batch(ctx: ImportContext, x: Ref, batch: tuple[int, ...]) -> Ref:
    """``x[..., M, K]`` with its batch dims broadcast to ``batch`` (leading 1s, then copies)."""
    shape = x.torch_shape
    k = len(batch) - (len(shape) - 2)
    if k:
        x = reshape_to(ctx, x, (1,) * k + shape)
    for d, n in enumerate(batch):
        if x.torch_shape[d] != n:
            x = repeat(ctx, x, d, n)
    return x


def repeat(ctx: ImportContext, x: Ref, dim: int, n: int) -> Ref:
    """``n`` copies of ``x`` along PyTorch ``dim`` (a ``concat`` of one value: its domain is kept)."""
    if x.is_const:
        return Ref(data=np.concatenate([x.data] * n, axis=dim), perm=x.perm, quant=x.quant, origin=x.origin)
    v = ctx.value_in(x) if x.is_quantized else ctx.as_float(x)
    return Ref.of(ctx.emit("concat", (v,) * n, perm=x.perm, axis=layout.ir_axis(x.perm, dim)), x.perm)


def _dynamic_pair(a: Ref, b: Ref) -> bool:
    """Both operands quantized at run time, with equal ranks and batch dims (an integer dynamic matmul)."""
    sa, sb = a.torch_shape, b.torch_shape
    return a.scale is not None and b.scale is not None and a.rank >= 2 and a.rank == b.rank and sa[:-2] == sb[:-2]


def _dynamic_matmul(ctx: ImportContext, a: Ref, b: Ref) -> Ref:
    va, vb = ctx.value_in(a, layout.identity(a.rank)), ctx.value_in(b, layout.identity(b.rank))
    perm = layout.identity(a.rank)
    acc = ctx.emit("matmul", va, vb, perm=perm)
    scale = ctx.emit("mul", a.scale, b.scale, perm=())
    return Ref.of(ctx.emit("dequantize", acc, scale, perm=perm), perm)


@register(aten.addmm)
def addmm(ctx: ImportContext, node, input: Ref, mat1: Ref, mat2: Ref, beta=1, alpha=1, **_):
    """``beta * bias + mat1 @ mat2`` with a constant ``mat2 [K, N]`` (a decomposed linear): a
    fully connected layer with weight ``mat2.T`` (per-channel scales on mat2's axis 1)."""
    if not mat2.is_const or mat2.data.ndim != 2 or mat1.rank != 2:
        raise ctx.unsupported("addmm with a run-time mat2 runs as a float matmul")
    if alpha != 1:
        raise ctx.unsupported(f"addmm with alpha={alpha}")
    n = mat2.data.shape[1]
    bias = None
    if input is not None and beta != 0:
        if not input.is_float_const or input.data.size != n or input.data.shape[-1:] != (n,):
            raise ctx.unsupported("addmm's added term must be a float constant of one value per output column")
        bias = Ref.constant((input.data.reshape(n) * beta).astype(np.float32), origin=input.origin)
    quant = mat2.quant
    if quant is not None and quant.is_per_channel:
        if quant.axis != 1:
            raise ctx.unsupported("addmm's mat2 must be quantized per output column (axis 1)")
        quant = quant.with_axis(0)
    weight = Ref(data=np.ascontiguousarray(mat2.data.T), perm=(0, 1), quant=quant, origin=mat2.origin)
    return linear(ctx, node, mat1, weight, bias)
