"""Pooling and reductions: avg_pool2d, max_pool2d, reduce_sum, reduce_max (NHWC).

Integer average pooling is TOSA 1.0's: the exact sum of zero-point-centered
taps (padding not counted), scaled by ``reciprocal_scale(count)`` with
``apply_scale_32`` (the multipliers come from the reference's
``reciprocal_scale``, the rounding terms and bounds from requant). The sums are differences of
exact integer prefix sums of the zero-padded centered codes, along W then along H
(int32 when the whole map's sum of |code - zp| fits, else int64), so a window
costs the same whatever its size. Float average pooling adds the taps in float64
in the order the reference defines (along W, then the row sums along H), so it is
bit-identical; integer max pooling is a maximum over W then over H (int8: the native
kernel's maximum over the window's in-image taps, the same integers); float maxima (max pooling,
reduce_max) run the reference's kernels, whose TOSA rules for NaN and for the
sign of a zero depend on the taps' order; float reduce_sum uses NumPy's float64
sum like the reference.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from qlower.backends.cpu.context import BuildContext, Kernel, builder, by_reference
from qlower.backends.cpu.gemm import input_amax
from qlower.backends.cpu.quantization import ScaleConstants
from qlower.backends.cpu.tensor_utils import INT32_MAX, check_int32, execution_error, torch_dtype
from qlower.ir import Op, requant
from qlower.reference.pooling import geometry, pool_counts, reciprocal_scale


def _pad(x: torch.Tensor, op: Op, fill) -> torch.Tensor:
    """The input padded as the op says, cut to the rows and columns some window reads."""
    (n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) = geometry(op)
    if pt or pb or pl or pr:
        x = F.pad(x, (0, 0, pl, pr, pt, pb), value=fill)
    return x[:, :sh * (oh - 1) + kh, :sw * (ow - 1) + kw]


def _float_window_sums(x: torch.Tensor, op: Op) -> torch.Tensor:
    """float64 window sums, tap by tap in the reference's order (``float_window_sums``)."""
    (n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) = geometry(op)
    xp = _pad(x.to(torch.float64), op, 0.0)
    span_w, span_h = sw * (ow - 1) + 1, sh * (oh - 1) + 1
    rows = xp[:, :, 0:span_w:sw].clone()
    for kx in range(1, kw):
        rows += xp[:, :, kx:kx + span_w:sw]
    acc = rows[:, 0:span_h:sh].clone()
    for ky in range(1, kh):
        acc += rows[:, ky:ky + span_h:sh]
    return acc


def _separable_max(x: torch.Tensor, op: Op, fill) -> torch.Tensor:
    """Maximum of each window of ``x`` padded with ``fill``: over KW, then over KH."""
    (n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) = geometry(op)
    xp = _pad(x, op, fill)
    rows = xp.unfold(2, kw, sw).amax(dim=-1)
    return rows.unfold(1, kh, sh).amax(dim=-1)


@builder("avg_pool2d")
def _avg_pool2d(op: Op, ctx: BuildContext) -> Kernel:
    t = op.operands[0].type
    (n, h, w, c), (kh, kw), (sh, sw), (pt, pb, pl, pr), (oh, ow) = geometry(op)
    count = pool_counts(op)
    if t.quant is None:
        divisor = torch.from_numpy(count.astype(np.float64))[None, :, :, None]

        def run_float(x: torch.Tensor) -> torch.Tensor:
            return (_float_window_sums(x, op) / divisor).to(torch.float32)
        return run_float
    zp = t.quant.zero_point[0]
    m = reciprocal_scale(count)
    scale = ScaleConstants.of(m.multiplier, m.shift, shape=(1, *m.shift.shape, 1))
    bound = kh * kw * input_amax(t.dtype, zp)
    check = bound >= int(requant.require_bound(m.shift.min()))
    dmin, dmax = t.dtype.min, t.dtype.max
    global_pool = (kh, kw) == (h, w) and not (pt or pb or pl or pr)
    out_dtype = torch_dtype(t.dtype)
    # exact window sums from prefix sums of the zero-padded centered codes (padding adds 0), along W
    # then along H; every partial sum is bounded by the sum of all |code - zp|, hence the dtype
    prefix_dtype = torch.int32 if h * w * input_amax(t.dtype, zp) <= INT32_MAX else torch.int64

    def window_sums(v: torch.Tensor, dim: int, k: int, stride: int, out: int) -> torch.Tensor:
        cum = torch.cumsum(v, dim=dim, dtype=v.dtype)
        cum = F.pad(cum, (0, 0, 1, 0) if dim == 2 else (0, 0, 0, 0, 1, 0))   # a leading 0: sum of nothing
        span = stride * (out - 1) + 1
        return cum.narrow(dim, k, span)[(slice(None),) * dim + (slice(None, None, stride),)] - \
            cum.narrow(dim, 0, span)[(slice(None),) * dim + (slice(None, None, stride),)]

    def run_int(x: torch.Tensor) -> torch.Tensor:
        if global_pool:
            acc_dtype = torch.int32 if bound <= INT32_MAX else torch.int64
            acc = x.to(acc_dtype).sum(dim=(1, 2), keepdim=True, dtype=acc_dtype) - count[0, 0] * zp
        else:
            v = x.to(prefix_dtype) - zp
            if pt or pb or pl or pr:
                v = F.pad(v, (0, 0, pl, pr, pt, pb))
            acc = window_sums(window_sums(v, 2, kw, sw, ow), 1, kh, sh, oh)
        try:
            scaled = scale(acc, check=check)
        except requant.RequantRangeError as e:
            raise execution_error(op, str(e)) from None
        return (scaled + zp).clamp_(dmin, dmax).to(out_dtype)
    return run_int


@builder("max_pool2d")
def _max_pool2d(op: Op, ctx: BuildContext) -> Kernel:
    dtype = op.operands[0].type.dtype
    if dtype.is_float:   # which zero a zero maximum is depends on the taps' order: the reference's kernel
        return by_reference(op)
    out_dtype = torch_dtype(dtype)
    if ctx.native is not None and out_dtype == torch.int8:
        (n, h, w, c), (kh, kw), (sh, sw), (pt, _, pl, _), (oh, ow) = geometry(op)
        g = torch.tensor([n, h, w, c, kh, kw, sh, sw, pt, pl, oh, ow], dtype=torch.int64)
        native = ctx.native

        def run_native(x: torch.Tensor) -> torch.Tensor:
            out = torch.empty(op.result.shape, dtype=torch.int8)
            native.maxpool(x.contiguous(), g, out)
            return out
        return run_native
    return lambda x: _separable_max(x, op, dtype.min).to(out_dtype).contiguous()


@builder("reduce_sum")
def _reduce_sum(op: Op, ctx: BuildContext) -> Kernel:
    axis = op.attrs["axis"]
    t = op.operands[0].type
    if t.quant is None:
        return lambda x: torch.from_numpy(
            np.ascontiguousarray(x.numpy().astype(np.float64).sum(axis=axis, keepdims=True).astype(np.float32)))

    def run(x: torch.Tensor) -> torch.Tensor:
        s = x.to(torch.int64).sum(dim=axis, keepdim=True)
        check_int32(op, s)
        return s.to(torch.int32)
    return run


@builder("reduce_max")
def _reduce_max(op: Op, ctx: BuildContext) -> Kernel:
    axis = op.attrs["axis"]
    if op.operands[0].type.dtype.is_float:
        return by_reference(op)
    return lambda x: torch.amax(x, dim=axis, keepdim=True)
