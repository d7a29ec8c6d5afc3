"""Pooling and reductions: avg_pool2d, max_pool2d, reduce_sum, reduce_max (NHWC).

Integer average pooling is TOSA 1.0's: the exact int32 sum of zero-point-centered
taps (padding not counted), scaled by ``reciprocal_scale(count)`` with
``apply_scale_32`` (the multipliers come from the reference's
``reciprocal_scale``, the arithmetic is requant's). Float average pooling adds
the taps in float64 in the reference's order, so it is bit-identical too; float
reduce_sum uses NumPy's float64 sum like the reference.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from qlower import requant
from qlower.backends.cpu.context import BuildContext, Kernel, builder
from qlower.backends.cpu.gemm import input_amax
from qlower.backends.cpu.quantization import apply_scale_32
from qlower.backends.cpu.tensor_utils import INT32_MAX, check_int32, execution_error, torch_dtype
from qlower.ir import Op
from qlower.reference.pooling import reciprocal_scale


def _geometry(op: Op):
    n, h, w, c = op.operands[0].shape
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = op.attrs["kernel"], op.attrs["stride"], op.attrs["pad"]
    _, oh, ow, _ = op.result.shape
    return n, h, w, c, kh, kw, sh, sw, pt, pb, pl, pr, oh, ow


def _windows(x: torch.Tensor, op: Op, fill) -> torch.Tensor:
    """[N, OH, OW, C, KH, KW] view of the padded input's windows (taps in reading order ky, kx)."""
    n, h, w, c, kh, kw, sh, sw, pt, pb, pl, pr, oh, ow = _geometry(op)
    if pt or pb or pl or pr:
        x = F.pad(x, (0, 0, pl, pr, pt, pb), value=fill)
    x = x.contiguous()
    s_n, s_h, s_w, s_c = x.stride()
    return x.as_strided((n, oh, ow, c, kh, kw), (s_n, s_h * sh, s_w * sw, s_c, s_h, s_w))


def _counts(op: Op) -> np.ndarray:
    """Number of real (non-padding) taps of each output position, [OH, OW]."""
    n, h, w, c, kh, kw, sh, sw, pt, pb, pl, pr, oh, ow = _geometry(op)
    rows = np.array([len(set(range(y * sh - pt, y * sh - pt + kh)) & set(range(h))) for y in range(oh)])
    cols = np.array([len(set(range(x * sw - pl, x * sw - pl + kw)) & set(range(w))) for x in range(ow)])
    return (rows[:, None] * cols[None, :]).astype(np.int64)


@builder("avg_pool2d")
def _avg_pool2d(op: Op, ctx: BuildContext) -> Kernel:
    t = op.operands[0].type
    n, h, w, c, kh, kw, sh, sw, pt, pb, pl, pr, oh, ow = _geometry(op)
    count = _counts(op)
    if t.quant is None:
        taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]

        def run_float(x: torch.Tensor) -> torch.Tensor:
            win = _windows(x.to(torch.float64), op, 0.0)
            acc = win[..., 0, 0].clone()
            for ky, kx in taps[1:]:  # the reference's order: float64 additions tap by tap
                acc += win[..., ky, kx]
            return (acc / torch.from_numpy(count.astype(np.float64))[None, :, :, None]).to(torch.float32)
        return run_float
    zp = t.quant.zero_point[0]
    m = reciprocal_scale(count)
    mult = torch.from_numpy(m.multiplier.astype(np.int64))[None, :, :, None]
    shift = torch.from_numpy(m.shift.astype(np.int64))[None, :, :, None]
    bound = kh * kw * input_amax(t.dtype, zp)
    check = bound >= min(1 << (int(m.shift.min()) - 1), 2**31)
    dmin, dmax = t.dtype.min, t.dtype.max
    global_pool = (kh, kw) == (h, w) and not (pt or pb or pl or pr)
    out_dtype = torch_dtype(t.dtype)

    def run_int(x: torch.Tensor) -> torch.Tensor:
        acc_dtype = torch.int32 if bound <= INT32_MAX else torch.int64
        if global_pool:
            acc = x.to(acc_dtype).sum(dim=(1, 2), keepdim=True, dtype=acc_dtype) - count[0, 0] * zp
        else:
            acc = (_windows(x, op, zp).to(acc_dtype) - zp).sum(dim=(4, 5), dtype=acc_dtype)
        try:
            scaled = apply_scale_32(acc.to(torch.int64), mult, shift, check=check)
        except requant.RequantRangeError as e:
            raise execution_error(op, str(e)) from None
        return (scaled + zp).clamp_(dmin, dmax).to(out_dtype)
    return run_int


@builder("max_pool2d")
def _max_pool2d(op: Op, ctx: BuildContext) -> Kernel:
    n, h, w, c, kh, kw, sh, sw, pt, pb, pl, pr, oh, ow = _geometry(op)
    dtype = op.operands[0].type.dtype
    lowest = float(np.finfo(np.float32).min) if dtype.is_float else dtype.min
    # torch's NHWC max pooling mishandles int8; integer codes are pooled as floats that hold them
    # exactly (float32 below 2**24, float64 for int32), which leaves every maximum unchanged.
    work = None if dtype.is_float else (torch.float64 if dtype.max > 2**24 else torch.float32)
    out_dtype = torch_dtype(dtype)

    def run(x: torch.Tensor) -> torch.Tensor:
        if work is not None:
            x = x.to(work)
        if pt or pb or pl or pr:  # padding never wins: it holds the lowest value, as in the reference
            x = F.pad(x, (0, 0, pl, pr, pt, pb), value=lowest)
        y = F.max_pool2d(x.permute(0, 3, 1, 2), (kh, kw), (sh, sw))
        return y.permute(0, 2, 3, 1).to(out_dtype).contiguous()
    return run


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
    return lambda x: torch.amax(x, dim=axis, keepdim=True)
