"""The fused int8 GEMM + requantization of ``_native.c`` (``qlw_qgemm_i8``, AVX-512 VNNI): when it applies.

It computes ``clamp(rescale(x @ w + offset))`` for int8 codes in one pass, the
accumulator never written out. It is used only where every step is provably the
reference's arithmetic (the conditions of ``pack``):

* int8 ``x`` and int8 weights with zero weight zero points (the int8 GEMM engine's offset form);
* ``K * 255 * 128 < 2**31``: the kernel sums ``(x + 128) * w`` (vpdpbusd takes unsigned bytes), each
  such dot product is at most ``K * 255 * 128`` in magnitude, so the int32 lanes hold it exactly, and
  the ``-128 * colsum(w)`` that undoes the shift is folded into the offset;
* the true accumulator ``|acc| <= acc_bound <= 2**31 - 1`` (bias and zero-point terms included), so the
  rescale input is an int32 and the product ``acc * mult`` (``mult < 2**31``) an exact int64;
* every shift >= 32 and a zero input zero point: apply_scale_32's REQUIRE (``|v| < min(2**(s-1), 2**31)``)
  then holds for every int32, so no check is skipped that could fail;
* int8 output, channels along the last axis (or one scale).

It is also used only while ``K <= MAX_K`` or the GEMM has at most ``SMALL_M`` rows (measured on MobileNetV2:
past K = 384 oneDNN's blocked GEMM and the separate requantization are faster, except for its classifier's
single row, 0.05 against 0.13 ms); ``max_k`` (or ``MAX_K``) lifts that in tests of the exactness edge.

With AMX (``NativeKernels.has_amx``), K % 4 == 0 and at least ``AMX_MIN_M`` rows, the same product runs on
AMX tiles (``qlw_qgemm_amx_i8``: int8 x int8 tile dot products, exact in int32 for the same K bound, with
fastrq's requantization of the raw sums; the weight packing is already the tiles' layout).

A SINGLE_ROUND rescale whose shifts are in [32, 54] takes fastrq's requantization (offset, rounding term and
zero point folded into one int64 addend per channel, one clamp; fastrq.py says why it is the same integers);
other ones the kernel's general requantization below.

Then ``(acc * mult + round) >> shift``, the zero point and the two clamps are the same integers as
``qlower.ir.requant.apply_scale_32`` and ``Requantizer`` compute in int64: the kernel adds the offset in
wrapping int32 (the true accumulator fits int32), multiplies in 64 bits (``0 <= mult < 2**31``, checked),
and after the shift (>= 32) every value is below 2**30 in magnitude, so the rest is exact in int32 lanes.

Without AMX, K > MAX_K (ResNet-18's 3x3 convolutions, K = 576..4608) stays with oneDNN's ``_int_mm`` and the
separate requantization: measured on ResNet-18 at 224, forcing the VNNI kernel there made those layers 1.2x
slower in all (9.3 -> 11.3 ms at 1 thread; it streams each 4-row x 64-column tile's whole K with no cache
blocking). The AMX kernel beats oneDNN at every K measured (ResNet-18's convolutions 18.7 -> 11.4 ms, under load).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from qlower.backends.cpu import fastrq
from qlower.backends.cpu.gemm import PackedGemm
from qlower.backends.cpu.quantization import RescaleParams
from qlower.backends.cpu.tensor_utils import INT32_MAX
from qlower.ir import DType, requant

DOT_MAX = 255 * 128      # |(x + 128) * w| for int8 x and w
MIN_SHIFT = 32           # apply_scale_32's REQUIRE bound is 2**31 from here on
MAX_K = 384              # speed, not exactness: past it oneDNN's _int_mm is faster, except for a few rows:
SMALL_M = 4              # one tile of rows (a fully connected layer's batch) takes this kernel at any K
AMX_MIN_M = 16           # one AMX tile of rows


@dataclass(frozen=True)
class PackedQGemm:
    n: int
    weights: torch.Tensor    # int8 [NP/16, KP/4, 16, 4]
    chan: torch.Tensor       # int64 [NP/16, 6, 8]: fastrq's parameters, when it applies; else [NP/16, 9, 8]:
    #                          offset - 128 * colsum (as int32), then mult, shift, round_pos, round_neg of the even
    #                          and the odd channels of each 16
    scalars: torch.Tensor    # int64 [6]: out_zp, qmin, qmax, clamp lo, clamp hi (fastrq: a, b), fastrq or not
    chan_amx: torch.Tensor | None = None   # fastrq's parameters for the AMX kernel's raw sums (no +128 shift),
    #                                        when fastrq applies (its K step is 4: conv.py pads im2col's columns)


def pack(p: PackedGemm, params: RescaleParams, rank: int, clamp: tuple[int, int] | None,
         max_k: int | None = None, rows: int | None = None, amx: bool = False) -> PackedQGemm | None:
    """The packed weights and parameters, or None when one of the module's conditions fails
    (``rows``: the GEMM's row count, when known before it runs; ``amx``: the AMX kernel can run here)."""
    if p.engine != "int8" or p.w_zp is not None or p.offset_i32 is None or p.acc_bound > INT32_MAX:
        return None
    on_amx = (amx and rows is not None and rows >= AMX_MIN_M
              and fastrq.applies(params, rank, p.acc_bound))
    fast_enough = p.k <= (MAX_K if max_k is None else max_k) or (rows is not None and rows <= SMALL_M) or on_amx
    if not fast_enough or p.k * DOT_MAX >= 2**31 or params.out_dtype is not DType.INT8 or np.any(params.in_zp):
        return None
    if int(params.shift.min()) < MIN_SHIFT or params.axis not in (None, rank - 1):
        return None
    if np.any(params.mult < 0) or np.any(params.mult >= 2**31):   # vpmuldq takes int32 multipliers
        return None
    k, n = p.k, p.n
    kp, np_ = -(-k // 4) * 4, -(-n // 16) * 16
    w = np.zeros((kp, np_), np.int8)
    w[:k, :n] = p.w.numpy()
    packed = np.ascontiguousarray(w.reshape(kp // 4, 4, np_ // 16, 16).transpose(2, 0, 3, 1))
    lo2, hi2 = clamp if clamp is not None else (params.qmin, params.qmax)
    offset = p.offset - 128 * p.w.numpy().astype(np.int64).sum(axis=0)
    if fastrq.applies(params, rank, p.acc_bound):
        lanes = np.where(np.arange(np_) < n, np.arange(np_), -1)
        a, b = fastrq.clamp_bounds(params, clamp)
        scalars = torch.tensor([params.out_zp, params.qmin, params.qmax, a, b, 1], dtype=torch.int64)
        amx = torch.from_numpy(fastrq.parameters(p.offset, params, lanes))
        return PackedQGemm(n, torch.from_numpy(packed), torch.from_numpy(fastrq.parameters(offset, params, lanes)),
                           scalars, amx)
    rp, rn = requant.rounding_terms(params.shift, params.double_round)
    rows = np.zeros((5, np_), np.int64)
    rows[2] = MIN_SHIFT   # padding channels: any valid shift, never stored
    rows[0, :n] = offset
    for row, values in ((1, params.mult), (2, params.shift), (3, rp), (4, rn)):
        rows[row, :n] = np.broadcast_to(values, (n,))
    # per 16 channels (_native.c, rq16): the offsets wrapped to int32 (the true accumulator fits int32, so
    # wrapping int32 adds give it exactly), then mult, shift, rnd_pos, rnd_neg of the even and the odd channels
    groups = rows.reshape(5, np_ // 16, 8, 2)                       # [param, group, lane, even/odd]
    chan = np.zeros((np_ // 16, 9, 8), np.int64)
    chan[:, 0] = ((groups[0] + 2**31) % 2**32 - 2**31).astype(np.int32).reshape(np_ // 16, 16).view(np.int64)
    chan[:, 1:] = groups[1:].transpose(1, 0, 3, 2).reshape(np_ // 16, 8, 8)
    scalars = torch.tensor([params.out_zp, params.qmin, params.qmax, lo2, hi2, 0], dtype=torch.int64)
    return PackedQGemm(n, torch.from_numpy(packed), torch.from_numpy(chan), scalars)
