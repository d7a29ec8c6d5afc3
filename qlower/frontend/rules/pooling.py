"""Pooling and reductions: max_pool2d, avg_pool2d, adaptive_avg_pool1d/2d, mean, sum.

Max pooling stays in its input's domain. Average pooling owns its output
domain. A global average (the window is the whole plane) is a mean, below.
Otherwise int8 codes are first rescaled (exactly, ×128) to int16 with the zero
point removed and averaged there, then rescaled to the output: the IR's
TOSA-style integer average rounds at 1/256 of an input step, so the result is
within that of a single rounding. int16 codes (A16W8) have no room to widen:
their averages are exact sums (a depthwise conv of ones, global ones too)
rescaled once.
``count_include_pad`` padding becomes an explicit ``pad`` with the code of 0.0
followed by an unpadded pool; ``ceil_mode``'s partial windows are extra
bottom/right padding, which the IR's average never counts (as PyTorch).
``divisor_override``: the window sum as a depthwise conv of ones at scale
``1/divisor`` (exact accumulator, one rounding). adaptive_avg_pool2d: runs of
equal, equally spaced windows, one pool each, repeated where an output larger than its input
takes a window more than once, concatenated. Dilated max pooling:
each tap a strided slice, taps side by side, one max pool over them. ``mean`` / ``sum`` over any dims: rescale to int32
(zero point removed), ``reduce_sum`` per dim, multiply by an int32 constant
holding ``1/count`` exactly (code 1, scale ``1/count``), rescale to the output; a
mean over H and W (global average) is an average pool over the whole plane instead,
as NPUs run it fastest.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.frontend import layout
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.quantizer import packet
from qlower.frontend.rules import register
from qlower.frontend.rules.elementwise import _float_ref
from qlower.frontend.rules.host import on_host
from qlower.ir import DType, QuantSpec

aten = torch.ops.aten
WIDEN = 128  # int8 codes minus zero point times 128 stay within int16


def _int16(x: Ref) -> bool:
    """Quantized to int16 codes (A16W8): averaged by exact sums, never widened like int8."""
    return isinstance(x, Ref) and x.is_quantized and x.spec.dtype is DType.INT16


def _pair(v) -> tuple[int, int]:
    v = [v] if isinstance(v, int) else list(v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _nhwc(ctx: ImportContext, x: Ref):
    x = _float_ref(ctx, x)
    if x.rank != 4:
        raise ctx.unsupported(f"2-D pooling needs a 4-D [N, C, H, W] input, got rank {x.rank}")
    if x.is_quantized and x.spec.is_per_channel:
        return ctx.as_float(x, layout.NHWC)
    return ctx.value_in(x, layout.NHWC) if x.is_quantized else ctx.as_float(x, layout.NHWC)


def _bottom_right_pad(size: int, out: int, k: int, s: int, p: int) -> int:
    """Padding after, so that the IR's floor-mode size equals PyTorch's (ceil_mode adds windows)."""
    return max(p, (out - 1) * s + k - size - p)


@register(aten.max_pool2d)
def max_pool2d(ctx: ImportContext, node, input: Ref, kernel_size, stride=(), padding=0, dilation=1,
               ceil_mode=False, **_):
    k, p, d = _pair(kernel_size), _pair(padding), _pair(dilation)
    s = _pair(stride) if stride else k
    v = _nhwc(ctx, input)
    _, h, w, _ = v.shape
    oh, ow = (int(n) for n in node.meta["val"].shape[-2:])
    if d != (1, 1):
        return Ref.of(_dilated_max(ctx, v, k, s, p, d, (oh, ow)), layout.NHWC)
    pad = (p[0], _bottom_right_pad(h, oh, k[0], s[0], p[0]), p[1], _bottom_right_pad(w, ow, k[1], s[1], p[1]))
    return Ref.of(ctx.emit("max_pool2d", v, perm=layout.NHWC, kernel=k, stride=s, pad=pad), layout.NHWC)


def _dilated_max(ctx: ImportContext, v, k, s, p, d, out) -> object:
    """Dilated max pooling without a dilated pool: pad with the lowest code (it never wins: every
    PyTorch window holds an input element), take each of the ``kh·kw`` taps as a strided slice,
    lay the taps side by side along W of a ``[N·OH·OW, 1, taps, C]`` tensor and max-pool them."""
    n, h, w, c = v.shape
    (oh, ow), taps = out, k[0] * k[1]
    lowest = v.quant.qmin if v.quant is not None else float(np.finfo(np.float32).min)
    after = [max(0, (o - 1) * st + (kk - 1) * dd + 1 - size - pp)
             for o, st, kk, dd, size, pp in zip(out, s, k, d, (h, w), p)]
    if any(p) or any(after):
        v = ctx.emit("pad", v, perm=layout.NHWC, pads=(0, 0, p[0], after[0], p[1], after[1], 0, 0), value=lowest)
    pieces = []
    for i in range(k[0]):
        for j in range(k[1]):
            start = (0, i * d[0], j * d[1], 0)
            stop = (n, i * d[0] + (oh - 1) * s[0] + 1, j * d[1] + (ow - 1) * s[1] + 1, c)
            tap = ctx.emit("slice", v, perm=layout.NHWC, start=start, stop=stop, step=(1, s[0], s[1], 1))
            pieces.append(ctx.emit("reshape", tap, perm=layout.NHWC, shape=(n * oh * ow, 1, 1, c)))
    side = ctx.emit("concat", tuple(pieces), perm=layout.NHWC, axis=2)
    m = ctx.emit("max_pool2d", side, perm=layout.NHWC, kernel=(1, taps), stride=(1, taps))
    return ctx.emit("reshape", m, perm=layout.NHWC, shape=(n, oh, ow, c))


def _widened(ctx: ImportContext, input: Ref):
    """The NHWC input, and for codes that the result requantizes, widened exactly to int16 (×128,
    zero point 0) so that the average's own rounding is 1/256 of an input step."""
    v = _nhwc(ctx, input)
    if v.quant is not None and v.dtype.itemsize == 1:
        target = ctx.requant_target()
        if target is not None and target != v.quant:
            wide = QuantSpec.per_tensor(v.quant.scale[0] / WIDEN, 0, DType.INT16)
            v = ctx.rescale(v, wide, layout.NHWC)
    return v


def average(ctx: ImportContext, input: Ref, kernel, stride, pad, count_include_pad: bool,
            extra: tuple[int, int] = (0, 0)) -> Ref:
    """Average pool; ``pad`` (top, bottom, left, right) is counted when ``count_include_pad``,
    ``extra`` bottom/right padding (ceil_mode's partial windows) never is."""
    if tuple(kernel) == tuple(input.torch_shape[-2:]) and not any(pad) and not any(extra):
        return reduce_dims(ctx, input, [2, 3], mean=True, keepdim=True)  # global: a mean over H and W
    if _int16(input):
        # int16 codes can't be widened: TOSA's average would round at a whole input step. Windows of
        # one size (no uncounted padding) sum exactly instead; others run in float.
        if any(extra) or (any(pad) and not count_include_pad):
            raise ctx.unsupported("an int16 average pool whose windows count different numbers of taps")
        return _window_sum(ctx, input, kernel, stride, pad, int(kernel[0] * kernel[1]))
    v = _widened(ctx, input)
    fill = v.quant.zero_point[0] if v.quant is not None else 0.0
    if count_include_pad and any(pad):
        v = ctx.emit("pad", v, perm=layout.NHWC, pads=(0, 0, pad[0], pad[1], pad[2], pad[3], 0, 0), value=fill)
        pad = (0, 0, 0, 0)
    pad = (pad[0], pad[1] + extra[0], pad[2], pad[3] + extra[1])
    out = ctx.emit("avg_pool2d", v, perm=layout.NHWC, kernel=tuple(kernel), stride=tuple(stride), pad=tuple(pad))
    return ctx.requant(out, layout.NHWC)


@register(aten.avg_pool2d)
def avg_pool2d(ctx: ImportContext, node, input: Ref, kernel_size, stride=(), padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None, **_):
    k, p = _pair(kernel_size), _pair(padding)
    s = _pair(stride) if stride else k
    h, w = input.torch_shape[-2:]
    oh, ow = (int(d) for d in node.meta["val"].shape[-2:])
    extra = (_bottom_right_pad(h, oh, k[0], s[0], p[0]) - p[0], _bottom_right_pad(w, ow, k[1], s[1], p[1]) - p[1])
    if divisor_override:
        return _window_sum(ctx, input, k, s, (p[0], p[0] + extra[0], p[1], p[1] + extra[1]), int(divisor_override))
    return average(ctx, input, k, s, (p[0], p[0], p[1], p[1]), count_include_pad, extra)


def _window_sum(ctx: ImportContext, input: Ref, k, s, pad, divisor: int) -> Ref:
    """``sum(window) / divisor`` (padding adds 0): a depthwise conv whose weights are all code 1 at
    scale ``1/divisor``, so the accumulator is exactly the sum at scale ``s_in / divisor``."""
    x = _float_ref(ctx, input)
    if not x.is_quantized or x.spec.is_per_channel or x.spec.dtype not in (DType.INT8, DType.INT16):
        raise ctx.unsupported("avg_pool2d with divisor_override of a tensor that isn't int8/int16 per tensor")
    v = ctx.value_in(x, layout.NHWC)
    c = v.shape[3]
    w = ctx.constant(np.ones((c, 1, k[0], k[1]), np.int8), QuantSpec.per_tensor(1.0 / divisor, 0, DType.INT8),
                     perm=layout.NHWC, name=f"{ctx.node.name}_ones")
    acc = ctx.emit("conv2d", v, w, None, perm=layout.NHWC, stride=tuple(s), dilation=(1, 1), pad=tuple(pad),
                   groups=c)
    return ctx.requant(acc, layout.NHWC)


def _adaptive_segments(size: int, out: int) -> list[tuple[int, int, int, int, int]]:
    """PyTorch's adaptive windows ``[floor(i·size/out), ceil((i+1)·size/out))`` grouped into runs:
    (first start, length, spacing, count, repeat) per run, ``count`` distinct windows of one length
    and spacing, each taken ``repeat`` times in a row. An output larger than its input takes the
    same window several times, and a pool's stride can't be 0: pool it once, then repeat it."""
    distinct: list[list[int]] = []  # [start, end, times]; windows are monotonic, so repeats are adjacent
    for i in range(out):
        window = [(i * size) // out, -((-(i + 1) * size) // out)]
        if distinct and distinct[-1][:2] == window:
            distinct[-1][2] += 1
        else:
            distinct.append([*window, 1])
    runs: list[list[int]] = []
    for start, end, times in distinct:
        if runs:
            first, length, step, count, repeat = runs[-1]
            spacing = start - first - (count - 1) * step
            if end - start == length and times == repeat and (count == 1 or spacing == step):
                runs[-1] = [first, length, spacing if count == 1 else step, count + 1, repeat]
                continue
        runs.append([start, end - start, 0, 1, times])
    return [(first, length, step or length, count, repeat) for first, length, step, count, repeat in runs]


def _repeat_each(ctx: ImportContext, v, axis: int, times: int):
    """Each element of the NHWC ``v`` along ``axis`` taken ``times`` times in a row (as
    ``torch.repeat_interleave``): concatenated copies, through ``[outer, size, 1, inner]`` when
    the axis holds more than one element."""
    if times == 1:
        return v
    shape = v.shape
    if shape[axis] == 1:
        return ctx.emit("concat", (v,) * times, perm=layout.NHWC, axis=axis)
    outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    v = ctx.emit("reshape", v, perm=layout.NHWC, shape=(outer, shape[axis], 1, inner))
    v = ctx.emit("concat", (v,) * times, perm=layout.NHWC, axis=2)
    return ctx.emit("reshape", v, perm=layout.NHWC,
                    shape=tuple(n * times if d == axis else n for d, n in enumerate(shape)))


MAX_ADAPTIVE_PIECES = 64


@register(aten.adaptive_avg_pool2d)
def adaptive_avg_pool2d(ctx: ImportContext, node, input: Ref, output_size, **_):
    h, w = input.torch_shape[-2:]
    oh, ow = (int(d) for d in node.meta["val"].shape[-2:])
    if input.rank != 4 or len(_adaptive_segments(h, oh)) * len(_adaptive_segments(w, ow)) > MAX_ADAPTIVE_PIECES:
        return on_host(ctx, node, aten._adaptive_avg_pool2d.default, (node.args[0], [oh, ow]),
                       f"adaptive_avg_pool2d from {h}x{w} to {oh}x{ow} needs over {MAX_ADAPTIVE_PIECES} pools")
    return _adaptive_average(ctx, input, oh, ow)


@register(aten.adaptive_avg_pool1d)
def adaptive_avg_pool1d(ctx: ImportContext, node, input: Ref, output_size, **_):
    """The 2-D pool over ``[N, 1, L, C]`` (as conv1d), back to ``[N, L, C]``."""
    length, out = input.torch_shape[-1], int(node.meta["val"].shape[-1])
    if input.rank != 3 or len(_adaptive_segments(length, out)) > MAX_ADAPTIVE_PIECES:
        return on_host(ctx, node, aten.adaptive_avg_pool1d.default, (node.args[0], [out]),
                       f"adaptive_avg_pool1d from {length} to {out} needs over {MAX_ADAPTIVE_PIECES} pools")
    x = _float_ref(ctx, input)
    if x.is_quantized and x.spec.is_per_channel:
        x = Ref.of(ctx.as_float(x), x.perm)
    v = ctx.value_in(x, (0, 2, 1)) if x.is_quantized else ctx.as_float(x, (0, 2, 1))
    n, _, c = v.shape
    v4 = ctx.emit("reshape", v, perm=layout.NHWC, shape=(n, 1, length, c))
    result = _adaptive_average(ctx, Ref.of(v4, layout.NHWC), 1, out)
    return Ref.of(ctx.emit("reshape", result.value, perm=(0, 2, 1), shape=(n, out, c)), (0, 2, 1))


def _adaptive_average(ctx: ImportContext, input: Ref, oh: int, ow: int) -> Ref:
    """Runs of equal, equally spaced windows are one avg pool each (uniform sizes: a single pool);
    pieces are averaged in the widened domain, repeated where windows repeat, concatenated, and
    rescaled once."""
    h, w = input.torch_shape[-2:]
    if h % oh == 0 and w % ow == 0:
        k = (h // oh, w // ow)
        return average(ctx, input, k, k, (0, 0, 0, 0), False)
    rows, cols = _adaptive_segments(h, oh), _adaptive_segments(w, ow)
    v = _widened(ctx, input)
    n, _, _, c = v.shape
    bands = []
    for r0, rk, rs, rn, rr in rows:
        pieces = []
        for c0, ck, cs, cn, cr in cols:
            stop = (n, r0 + (rn - 1) * rs + rk, c0 + (cn - 1) * cs + ck, c)
            piece = v
            if (r0, c0) != (0, 0) or stop != v.shape:
                piece = ctx.emit("slice", v, perm=layout.NHWC, start=(0, r0, c0, 0), stop=stop, step=(1, 1, 1, 1))
            piece = ctx.emit("avg_pool2d", piece, perm=layout.NHWC, kernel=(rk, ck), stride=(rs, cs))
            pieces.append(_repeat_each(ctx, piece, 2, cr))
        band = pieces[0] if len(pieces) == 1 else ctx.emit("concat", tuple(pieces), perm=layout.NHWC, axis=2)
        bands.append(_repeat_each(ctx, band, 1, rr))
    out = bands[0] if len(bands) == 1 else ctx.emit("concat", tuple(bands), perm=layout.NHWC, axis=1)
    return ctx.requant(out, layout.NHWC)


@register(aten.mean, aten.sum)
def reduce(ctx: ImportContext, node, input: Ref, dim=None, keepdim=False, dtype=None, **_):
    if dtype is not None and dtype != torch.float32:
        raise ctx.unsupported(f"reduction to dtype {dtype}")
    return reduce_dims(ctx, input, dim or range(input.rank), packet(node) is aten.mean, keepdim)


def _pool_fits(x: Ref) -> bool:
    """Whether the IR's average pool holds a mean over the whole plane: its window sum of widened
    int8 codes (at most 255 * WIDEN each) is an int32, as TOSA's average accumulates; int16 codes
    are summed exactly by a convolution of any size. A backend whose pool takes less splits it
    in its own rewrite (Ethos-U: ``ethosu.pool_limit``)."""
    h, w = (int(n) for n in x.torch_shape[2:])
    return h >= 1 and w >= 1 and (_int16(x) or h * w * 255 * WIDEN <= 2**31 - 1)


def _global_average(ctx: ImportContext, x: Ref, keepdim: bool) -> Ref:
    """A mean over H and W as one average pool over the whole plane: the int16-widened codes
    averaged with TOSA's rounding at 1/256 of an input step, then one requantization (within a
    step of fake-quant, like every average pool here). NPUs run it as one AVG_POOL2D, where a
    sum over H and W costs a transpose and a reduction (issue 16: 2.0 M cycles on MobileNetV2)."""
    h, w = (int(n) for n in x.torch_shape[2:])
    if _int16(x) and h * w == 1:  # the mean of one pixel is the pixel
        out = ctx.requant(ctx.value_in(x, layout.NHWC), layout.NHWC)
    elif _int16(x):  # int16 codes can't be widened: the exact sum of the plane, a depthwise conv of ones
        out = _window_sum(ctx, x, (h, w), (h, w), (0, 0, 0, 0), h * w)
    else:
        v = _widened(ctx, x)
        out = ctx.requant(ctx.emit("avg_pool2d", v, perm=layout.NHWC, kernel=(h, w), stride=(h, w)), layout.NHWC)
    if keepdim:
        return out
    perm = layout.drop_dims(layout.NHWC, (2, 3))
    shape = layout.ir_shape(x.torch_shape[:2], perm)
    return Ref.of(ctx.emit("reshape", out.value, perm=perm, shape=shape), perm)


def reduce_dims(ctx: ImportContext, input: Ref, dims, mean: bool, keepdim: bool) -> Ref:
    """Sum (or mean) over PyTorch ``dims`` in the input's own layout; quantized: exact int32 sum,
    times ``1/count`` held exactly as an int32 constant's scale, one rounding in the final rescale."""
    x = _float_ref(ctx, input)
    dims = sorted({layout.normalize_axis(d, x.rank) for d in dims})
    count = int(np.prod([x.torch_shape[d] for d in dims]))
    quantized = x.is_quantized and not x.spec.is_per_channel
    if mean and quantized and x.rank == 4 and dims == [2, 3] and _pool_fits(x):
        return _global_average(ctx, x, keepdim)
    if quantized:
        v = ctx.rescale(ctx.value_in(x), QuantSpec.per_tensor(x.spec.scale[0], 0, DType.INT32), x.perm)
    else:
        v = ctx.as_float(x)
    for d in dims:
        v = ctx.emit("reduce_sum", v, perm=x.perm, axis=layout.ir_axis(x.perm, d))
    if mean and count > 1:
        ones = (1,) * x.rank
        if quantized:
            c = ctx.constant(np.ones(ones, np.int32), QuantSpec.per_tensor(1.0 / count, 0, DType.INT32))
        else:
            c = ctx.constant(np.full(ones, 1.0 / count, np.float32))
        v = ctx.emit("mul", v, c, perm=x.perm)
    result = ctx.requant(v, x.perm) if quantized else Ref.of(v, x.perm)
    if keepdim:
        return result
    shape = tuple(s for d, s in enumerate(x.torch_shape) if d not in dims)
    perm = layout.drop_dims(x.perm, dims)
    return Ref.of(ctx.emit("reshape", result.value, perm=perm, shape=layout.ir_shape(shape, perm)), perm)
