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

It is also used only while ``K <= MAX_K`` (measured: past that oneDNN's blocked GEMM and the
separate requantization are faster); ``max_k`` (or ``MAX_K``) lifts that in tests of the exactness edge.

Then ``(acc * mult + round) >> shift``, the zero point and the two clamps are the same int64
operations as ``qlower.ir.requant.apply_scale_32`` and ``Requantizer``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from qlower.backends.cpu.gemm import PackedGemm
from qlower.backends.cpu.quantization import RescaleParams
from qlower.backends.cpu.tensor_utils import INT32_MAX
from qlower.ir import DType, requant

DOT_MAX = 255 * 128      # |(x + 128) * w| for int8 x and w
MIN_SHIFT = 32           # apply_scale_32's REQUIRE bound is 2**31 from here on
MAX_K = 256              # speed, not exactness: a K x 64 weight panel past L1 makes oneDNN's _int_mm faster


@dataclass(frozen=True)
class PackedQGemm:
    n: int
    weights: torch.Tensor    # int8 [NP/16, KP/4, 16, 4]
    chan: torch.Tensor       # int64 [5, NP]: offset - 128 * colsum, mult, shift, round_pos, round_neg
    scalars: torch.Tensor    # int64 [5]: out_zp, qmin, qmax, clamp lo, clamp hi


def pack(p: PackedGemm, params: RescaleParams, rank: int, clamp: tuple[int, int] | None,
         max_k: int | None = None) -> PackedQGemm | None:
    """The packed weights and parameters, or None when one of the module's conditions fails."""
    if p.engine != "int8" or p.w_zp is not None or p.offset_i32 is None or p.acc_bound > INT32_MAX:
        return None
    if p.k > (MAX_K if max_k is None else max_k) or p.k * DOT_MAX >= 2**31 or params.out_dtype is not DType.INT8 or np.any(params.in_zp):
        return None
    if int(params.shift.min()) < MIN_SHIFT or params.axis not in (None, rank - 1):
        return None
    k, n = p.k, p.n
    kp, np_ = -(-k // 4) * 4, -(-n // 16) * 16
    w = np.zeros((kp, np_), np.int8)
    w[:k, :n] = p.w.numpy()
    packed = np.ascontiguousarray(w.reshape(kp // 4, 4, np_ // 16, 16).transpose(2, 0, 3, 1))
    rp, rn = requant.rounding_terms(params.shift, params.double_round)
    chan = np.zeros((5, np_), np.int64)
    chan[2] = MIN_SHIFT   # padding channels: any valid shift, never stored
    chan[0, :n] = p.offset - 128 * p.w.numpy().astype(np.int64).sum(axis=0)
    for row, values in ((1, params.mult), (2, params.shift), (3, rp), (4, rn)):
        chan[row, :n] = np.broadcast_to(values, (n,))
    lo2, hi2 = clamp if clamp is not None else (params.qmin, params.qmax)
    scalars = torch.tensor([params.out_zp, params.qmin, params.qmax, lo2, hi2], dtype=torch.int64)
    return PackedQGemm(n, torch.from_numpy(packed), torch.from_numpy(chan), scalars)
