"""The running histogram behind the "histogram", "percentile" and "mse" observers (observers.py).

State: an exponent ``e``, an origin ``o`` and ``BINS`` counts; ``counts[j]`` is how many values ``v``
had ``floor(v / 2**e) == o + j``, so the bins are a power-of-two grid anchored at 0. ``e`` is the
smallest exponent at which the extremes seen fit in ``BINS`` bins (``exponent``), so the data span at
least ``BINS / 2 - 1`` of them; ``o`` is the bin of the minimum. When a batch widens the range, old
bins merge whole (``2**k`` into one) and nothing is ever split or spread: the histogram after any
sequence of batches is exactly the histogram of all their values on the final grid, which depends
on the final extremes only. The same data therefore give the same histogram whatever the batch
split or order, and no count is lost. Non-finite values are skipped (torchao's observers skip
infinities too).

Cost: one pass for the extremes and one to count, in C (``_histogram.c``, built on first use into
qlower's cache; ``QLOWER_OBSERVER_NATIVE=0`` or no C compiler: the torch twins below, which compute
the same counts and are what the tests compare the C with). The range searches over the histogram
(``l2_search``, and ``mse_search``: the whole of MSEObserver's clip search in one call) are in C too,
with Python / torchao twins.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import subprocess
import warnings
from pathlib import Path

import numpy as np
import torch

from qlower.native_build import build_library, compiler

BINS = 4096
EMPTY = -(2**63)  # the exponent before any finite value
SOURCE = Path(__file__).with_name("_histogram.c")
# -ffp-contract=off: no fused multiply-adds, so the searches round as their torch twins do
FLAGS = ("-O3", "-march=native", "-std=c99", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off")
_FLT_MIN = 2.0**-126


def exponent(lo: float, hi: float, nbins: int = BINS) -> int:
    """The grid's exponent for extremes ``lo <= hi``: the smallest ``e`` with
    ``floor(hi / 2**e) - floor(lo / 2**e) + 1 <= nbins``, and no finer than half a float32 step of
    ``max(|lo|, |hi|)`` (finer bins would stay empty). Non-decreasing as ``[lo, hi]`` widens."""
    top = max(abs(lo), abs(hi))
    e = (math.frexp(top)[1] - 1 if top >= _FLT_MIN else -126) - 24
    if hi > lo:
        e = max(e, math.frexp((hi - lo) / nbins)[1] - 2)  # certainly too fine: 2 * nbins - 1 bins or more
    while math.floor(math.ldexp(hi, -e)) - math.floor(math.ldexp(lo, -e)) + 1 > nbins:
        e += 1
    return e


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("QLOWER_OBSERVER_NATIVE", "1") == "0":
        return None
    cc = compiler()
    try:
        if cc is None:
            raise RuntimeError("no C compiler found ($CC, cc or gcc)")
        lib = ctypes.CDLL(str(build_library(SOURCE, FLAGS, "observer-native", cc)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        warnings.warn(f"qlower observers: building {SOURCE.name} failed ({e}); calibrating with the (slower) torch "
                      "histograms", stacklevel=3)
        return None
    p, i64, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
    lib.qh_observe.argtypes, lib.qh_observe.restype = [p, i64, p, i64, p, p], i64
    lib.qh_l2_search.argtypes, lib.qh_l2_search.restype = [p, i64, f64, i64, p], None
    lib.qh_squared_errors.argtypes = [p, p, p, i64, f64, f64, p, p, i64, i64, i64, p]
    lib.qh_squared_errors.restype = i64
    lib.qh_mse_search.argtypes = [p, i64, f64, f64, i64, p, i64, p, i64, i64, i64, f64, i64, p, p]
    lib.qh_mse_search.restype = i64
    lib.qh_exponent.argtypes, lib.qh_exponent.restype = [f64, f64, i64], i64
    return lib


def native() -> ctypes.CDLL | None:
    """The C library, or None (disabled, or no compiler: the torch twins are used)."""
    return _library()


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def observe(x: torch.Tensor, counts: torch.Tensor, grid: torch.Tensor, extremes: torch.Tensor) -> int:
    """Adds the finite values of ``x`` to the histogram (``counts``: float64 [BINS]; ``grid``: int64
    [exponent, origin]; ``extremes``: float32 [min, max] seen), in place. Returns how many were finite."""
    lib = native()
    if lib is None:
        return observe_torch(x, counts, grid, extremes)
    x = x.detach().to(torch.float32).contiguous()
    finite = int(lib.qh_observe(_ptr(x), x.numel(), _ptr(counts), counts.numel(), _ptr(grid), _ptr(extremes)))
    if finite < 0:
        raise MemoryError("qlower observers: no memory for a histogram update")
    return finite


def observe_torch(x: torch.Tensor, counts: torch.Tensor, grid: torch.Tensor, extremes: torch.Tensor) -> int:
    """``observe`` in torch (the C kernel's twin: the same counts, exponent and origin)."""
    v = x.detach().to(torch.float32).reshape(-1)
    finite = torch.isfinite(v)
    if not bool(finite.all()):
        v = v[finite]
    if v.numel() == 0:
        return 0
    lo, hi = (float(t) for t in torch.aminmax(v))
    empty = int(grid[0]) == EMPTY
    if not empty:
        lo, hi = min(lo, float(extremes[0])), max(hi, float(extremes[1]))
    e = exponent(lo, hi, counts.numel())
    origin = math.floor(math.ldexp(lo, -e))
    if empty:
        counts.zero_()
    elif (e, origin) != (int(grid[0]), int(grid[1])):
        held = torch.nonzero(counts).reshape(-1)  # empty bins past the maximum may fall outside the new grid
        old, shift = int(grid[1]) + held, e - int(grid[0])
        merged = -(old < 0).long() if shift >= 62 else torch.div(old, 2**shift, rounding_mode="floor")
        counts.copy_(torch.zeros_like(counts).index_add_(0, merged - origin, counts[held]))
    index = torch.floor(v.double() * 2.0**-e).long() - origin
    counts += torch.bincount(index, minlength=counts.numel()).double()
    grid[0], grid[1] = e, origin
    extremes[0], extremes[1] = lo, hi
    return int(v.numel())


def l2_search(hist: torch.Tensor, width: float, dst_nbins: int) -> tuple[int, int]:
    """torchao's HistogramObserver range search (``_non_linear_param_search``: from both tails inwards
    in steps of 1e-5 of the mass, while the L2 error of quantizing the histogram to ``dst_nbins``
    levels keeps falling) on ``hist`` (float64, bins of ``width``): the first and last bin kept."""
    lib = native()
    if lib is None:
        return l2_search_torchao(hist, width, dst_nbins)
    hist = hist.to(torch.float64).contiguous()
    out = torch.zeros(2, dtype=torch.int64)
    lib.qh_l2_search(_ptr(hist), hist.numel(), width, dst_nbins, _ptr(out))
    if int(out[0]) < 0:
        raise MemoryError("qlower observers: no memory for the range search")
    return int(out[0]), int(out[1])


def l2_search_torchao(hist: torch.Tensor, width: float, dst_nbins: int) -> tuple[int, int]:
    """``l2_search`` by torchao's own code (the C search's twin), on a HistogramObserver given ``hist``."""
    from torchao.quantization.pt2e import HistogramObserver

    obs = HistogramObserver(bins=hist.numel())
    obs.histogram = hist.to(torch.float32)
    obs.min_val, obs.max_val = torch.tensor(0.0), torch.tensor(width * hist.numel())
    obs.dst_nbins = dst_nbins
    lo, hi = obs._non_linear_param_search()
    return round(float(lo) / width), round(float(hi) / width) - 1


def squared_errors_native(prefix: list[torch.Tensor], first: float, step: float, scale: torch.Tensor,
                          zero: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor | None:
    """observers._squared_errors' prefix-sum path in C (``prefix``: the three float64 prefix sums over
    the points), or None without the library."""
    lib = native()
    if lib is None:
        return None
    p0, p1, p2 = (p.contiguous() for p in prefix)
    s, z = scale.to(torch.float64).contiguous(), zero.to(torch.float64).contiguous()
    out = torch.empty(len(s), dtype=torch.float64)
    if lib.qh_squared_errors(_ptr(p0), _ptr(p1), _ptr(p2), len(p0) - 1, first, step, _ptr(s), _ptr(z), len(s),
                             qmin, qmax, _ptr(out)):
        raise MemoryError("qlower observers: no memory for the clip search")
    return out


def mse_search(counts: torch.Tensor, left: float, width: float, subbins: int, lows: torch.Tensor | None,
               highs: torch.Tensor, qmin: int, qmax: int, eps: float, coarse: int) -> tuple[int, int, float] | None:
    """observers.MSEObserver's whole clip search in one C call (its twin: ``observers._mse_search`` over
    ``_centres`` with ``squared_errors_native``, the same result bit for bit): the indices ``(r, c)`` of the
    clip ``(lows[r], highs[c])`` (``lows`` None: the symmetric clip ``±highs[c]``, r = 0) and its error. None
    without the library, or where the codes outnumber the points (int16: the points are summed directly, in
    torch)."""
    lib = native()
    npoints = len(counts) * subbins
    if lib is None or not qmax - qmin + 1 < npoints:
        return None
    counts, highs = counts.to(torch.float64).contiguous(), highs.to(torch.float64).contiguous()
    lows_ = highs[:0] if lows is None else lows.to(torch.float64).contiguous()
    out, least = torch.zeros(2, dtype=torch.int64), torch.zeros(1, dtype=torch.float64)
    if lib.qh_mse_search(_ptr(counts), len(counts), left, width, subbins, _ptr(lows_), len(lows_), _ptr(highs),
                         len(highs), qmin, qmax, eps, coarse, _ptr(out), _ptr(least)):
        raise MemoryError("qlower observers: no memory for the clip search")
    return int(out[0]), int(out[1]), float(least)


def occupied(counts: torch.Tensor, grid: torch.Tensor, extremes: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """(the counts of the bins from the minimum's to the maximum's, the first one's left edge, bin width)."""
    e, origin = int(grid[0]), int(grid[1])
    width = math.ldexp(1.0, e)
    last = math.floor(math.ldexp(float(extremes[1]), -e)) - origin
    return counts[:last + 1], origin * width, width


def rebinned(counts: torch.Tensor, grid: torch.Tensor, extremes: torch.Tensor, bins: int) -> torch.Tensor:
    """The histogram on ``bins`` equal bins spanning exactly [min, max] (torchao's HistogramObserver's
    grid), each fine bin's count spread evenly over its part of [min, max]. Float64, the same total."""
    hist, left, width = occupied(counts, grid, extremes)
    lo, hi = float(extremes[0]), float(extremes[1])
    fine = hist.numpy()
    edges = np.clip(left + width * np.arange(len(fine) + 1), lo, hi)
    below = np.concatenate([[0.0], np.cumsum(fine)])
    at = np.interp(np.linspace(lo, hi, bins + 1)[1:-1], edges, below)
    return torch.from_numpy(np.diff(np.concatenate([[0.0], at, [below[-1]]])))
