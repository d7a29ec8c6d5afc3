"""The native kernels' fast requantization (``_native.c``, ``fast_requant16``): when it is exact, and its parameters.

For a conv's exact raw int32 sum ``acc`` and its int64 per-channel offset ``off`` (the true accumulator is
``v = acc + off``), the reference computes, for a SINGLE_ROUND rescale with input zero point 0 and a clamp::

    y = clamp(clamp(((v * m + 2**(s-1)) >> s) + zp, qmin, qmax), lo, hi)

The kernel computes ``V = acc * m + R`` in wrapping int64 lanes, ``R = off * m + 2**(s-1) + zp * 2**s`` (folded
here, once), then ``V >> s`` and one clamp to ``[a, b]``. That is the same integer when (``applies``):

* ``|v| <= 2**31 - 1`` for every input (the caller's bound ``acc_bound``): then ``|v * m| < 2**62``, and with
  ``s <= MAX_SHIFT`` also ``|V| < 2**62 + 2**53 + 128 * 2**54 < 2**63``, so the wrapped sum is ``V`` itself,
  and adding ``zp * 2**s`` before the floor shift is adding ``zp`` after it;
* ``s >= 32``: apply_scale_32's REQUIRE (``|v| < min(2**(s-1), 2**31)``) holds for every int32, so no check
  is skipped that could fail, and ``|V >> s| < 2**30`` fits an int32 lane;
* ``0 <= m < 2**31`` (vpmuldq multiplies signed int32s), input zero point 0, SINGLE_ROUND (no sign-dependent
  rounding term), int8 output with channels on the last axis (or one scale);
* the clamp pair is monotone, so ``clamp(clamp(y, qmin, qmax), lo, hi) == clamp(y, a, b)`` with ``a``, ``b``
  its values at -inf and +inf (``a == b`` when the ranges are disjoint).
"""

from __future__ import annotations

import numpy as np

from qlower.backends.cpu.quantization import RescaleParams
from qlower.ir import DType

MIN_SHIFT, MAX_SHIFT = 32, 54
INT32_MAX = 2**31 - 1
LANES = 16


def applies(params: RescaleParams, rank: int, acc_bound: int) -> bool:
    """Whether ``fast_requant16`` computes this rescale exactly for every accumulator within ``acc_bound``."""
    return (not params.double_round and params.out_dtype is DType.INT8 and acc_bound <= INT32_MAX
            and params.axis in (None, rank - 1) and not np.any(params.in_zp)
            and int(params.shift.min()) >= MIN_SHIFT and int(params.shift.max()) <= MAX_SHIFT
            and int(params.mult.min()) >= 0 and int(params.mult.max()) < 2**31)


def clamp_bounds(params: RescaleParams, clamp: tuple[int, int] | None) -> tuple[int, int]:
    """``(a, b)`` with ``clamp(clamp(y, qmin, qmax), lo, hi) == min(max(y, a), b)`` for every ``y``."""
    lo, hi = clamp if clamp is not None else (params.qmin, params.qmax)

    def both(y: int) -> int:
        return min(max(min(max(y, params.qmin), params.qmax), lo), hi)
    return both(-(2**40)), both(2**40)


def parameters(offset: np.ndarray, params: RescaleParams, lanes: np.ndarray) -> np.ndarray:
    """The kernel's parameter rows, int64 ``[len(lanes) // 16, 6, 8]``: for each 16 lanes, the multipliers of
    the even lanes and of the odd lanes, then R, then the shifts (``s`` even, ``s - 32`` odd).

    ``offset``: int64 per channel (n of them); ``lanes[i]``: the channel in lane ``i`` (the kernel's order),
    or -1 for a lane no output is taken from (m = 0, R = 0, s = 32)."""
    n = offset.size
    mult = np.broadcast_to(params.mult, (n,)).astype(object)
    shift = np.broadcast_to(params.shift, (n,)).astype(object)
    r = [int(o) * int(m) + (1 << (int(s) - 1)) + params.out_zp * (1 << int(s))
         for o, m, s in zip(offset.tolist(), mult, shift)]
    r = np.array([(v + 2**63) % 2**64 - 2**63 for v in r], dtype=np.int64)   # wrapping int64, as the lanes add
    used = lanes >= 0
    take = np.where(used, lanes, 0)
    m_l = np.where(used, np.asarray(mult, dtype=np.int64)[take], 0)
    r_l = np.where(used, r[take], 0)
    s_l = np.where(used, np.asarray(shift, dtype=np.int64)[take], MIN_SHIFT)
    groups = lanes.size // LANES
    out = np.empty((groups, 6, 8), np.int64)
    for row, (values, minus) in enumerate(((m_l, 0), (r_l, 0), (s_l, 32))):
        v = values.reshape(groups, 8, 2)
        out[:, 2 * row] = v[:, :, 0]
        out[:, 2 * row + 1] = v[:, :, 1] - minus
    return out
