"""Range setting: which clip of the calibration data (activations) or of a weight each quantization keeps.

Activations (``QuantConfig.observer``), all per tensor:
- ``"minmax"``: torchao's MinMaxObserver, the extremes seen;
- ``"histogram"``: torchao's HistogramObserver's range search (its greedy L2-norm search inwards from
  both tails, ``histogram.l2_search``) on the same 2048-bin histogram of [min, max] that observer keeps;
- ``"percentile"``: clipped at the ``percentile``-th percentile of each tail (the lower tail only where
  the data is negative);
- ``"mse"``: the clip ``[a * min, b * max]`` (symmetric: ``c * max|x|``) of least expected squared
  quantization error over a grid of ``a, b``. Each bin's values are spread over its width: a clip inside
  a bin is charged the rounding error of the values beside it. Each clip's error is summed per code from
  prefix sums (``_squared_errors``); an end at 0 (after a ReLU) is one clip, not a grid of equal ones; of
  the ``a, b`` grid, every third value of each end is tried, then every value within two steps of the best
  of those (the whole grid's best wherever the error has a single valley there, about an eighth of the clips).

The last three read one running histogram (histogram.py): per batch, the extremes and one count per value
on a power-of-two grid that widens by merging whole bins, in C; the searches run once, at
``calculate_qparams``, also in C (the mse search whole, in one call: about 0.15 ms an observer at int8).
Calibrating MobileNetV2 at 224 with any of them costs 1.2-1.5x min/max's CPU time
(benchmarks/calibration_speed.py, at load 8); what they add is mostly the counting pass, a third to a half
of the float forward's time. What differs from torchao's HistogramObserver, which re-bins its 2048
bins over the new [min, max] whenever a batch widens it (spreading each old bin's count over the new
bins, an approximation that accumulates batch after batch): here no count is ever spread until the search,
which re-bins the exact histogram once onto torchao's grid (``histogram.rebinned``). The two histograms
differ only by how counts are spread within a fine bin; the ranges agree within one bin on 56 of 60 seeded
streams, and where they don't, torchao's greedy stop (the first step where its error rises) has flipped on
those few counts and the range quantizes the data as well, within 1% (tests/test_observers.py). This one is
the same whatever the batch split; torchao's depends on it.

Weights (``QuantConfig.weight_observer``), symmetric per channel or per tensor:
``"minmax"`` keeps max|w|; ``"mse"`` picks, per channel, the clip ``c * max|w|`` (``c`` on a grid in
[0.5, 1]) whose quantization of the weight itself has the least squared error.

Every search is a fixed grid over fixed data: the same calibration gives the same scales.
"""

from __future__ import annotations

import warnings

import torch
from torchao.quantization.pt2e import MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.observer import UniformQuantizationObserverBase

from qlower.frontend import histogram
from qlower.frontend.histogram import BINS, EMPTY

ACT_GRID = torch.linspace(0.05, 1.0, 39)  # clip fractions of each extreme tried by "mse" (1.0: min/max)
WEIGHT_GRID = torch.linspace(0.5, 1.0, 51)
SUBBINS = 4  # each histogram bin's values spread over this many points when charging errors
COARSE = 3  # "mse" tries every COARSE-th clip of each end, then every clip around the best of those
FLOAT32_EPS = torch.finfo(torch.float32).eps
TORCHAO_BINS = 2048  # HistogramObserver's default bins: the grid "histogram" searches on


class _HistogramRange(UniformQuantizationObserverBase):
    """A per-tensor activation observer over histogram.py's running histogram; subclasses choose the
    range from it (``_clip``). The qparams are computed once per state (bias fitting asks twice)."""

    def __init__(self, dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False, quant_min=None,
                 quant_max=None, factory_kwargs=None, eps=FLOAT32_EPS, is_dynamic=False,
                 **kwargs) -> None:
        if qscheme not in (torch.per_tensor_affine, torch.per_tensor_symmetric) or is_dynamic:
            raise NotImplementedError(f"{type(self).__name__} is a static per-tensor observer")
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range, quant_min=quant_min,
                         quant_max=quant_max, factory_kwargs=factory_kwargs, eps=eps, is_dynamic=is_dynamic, **kwargs)
        self.register_buffer("histogram", torch.zeros(BINS, dtype=torch.float64))
        self.register_buffer("grid", torch.tensor([EMPTY, 0], dtype=torch.int64))  # exponent, origin
        self.register_buffer("extremes", torch.tensor([float("inf"), float("-inf")]))
        self._qparams: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def min_val(self) -> torch.Tensor:
        return self.extremes[0]

    @property
    def max_val(self) -> torch.Tensor:
        return self.extremes[1]

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel():
            histogram.observe(x_orig, self.histogram, self.grid, self.extremes)
            self._qparams = None
        return x_orig

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._qparams = None  # another histogram: computed again

    def calculate_qparams(self):
        if int(self.grid[0]) == EMPTY:  # never observed (or nothing finite): torchao's default and warning
            warnings.warn("must run observer before calling calculate_qparams. Returning default scale and zero point",
                          stacklevel=2)
            return torch.tensor([1.0]), torch.tensor([0])
        if self._qparams is None:
            lo, hi = float(self.min_val), float(self.max_val)
            if hi > lo:
                lo, hi = self._clip()
            self._qparams = self._calculate_qparams(torch.tensor(lo, dtype=torch.float32),
                                                    torch.tensor(hi, dtype=torch.float32))
        return self._qparams

    def _centres(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Points standing for the histogram's values (``SUBBINS`` per bin, evenly spaced) and their weights."""
        counts, left, width = histogram.occupied(self.histogram, self.grid, self.extremes)
        offsets = (torch.arange(SUBBINS, dtype=torch.float64) + 0.5) / SUBBINS
        points = left + (torch.arange(len(counts), dtype=torch.float64)[:, None] + offsets) * width
        weights = counts[:, None].expand(-1, SUBBINS) / SUBBINS
        return points.reshape(-1), weights.reshape(-1)

    def _clip(self) -> tuple[float, float]:
        raise NotImplementedError


class HistogramL2Observer(_HistogramRange):
    """torchao HistogramObserver's range: its L2 search over 2048 bins of [min, max] (module docstring)."""

    def _clip(self) -> tuple[float, float]:
        lo, hi = float(self.min_val), float(self.max_val)
        width = (hi - lo) / TORCHAO_BINS
        hist = histogram.rebinned(self.histogram, self.grid, self.extremes, TORCHAO_BINS)
        start, end = histogram.l2_search(hist, width, 2 ** torch.iinfo(self.dtype).bits)
        return lo + width * start, min(lo + width * (end + 1), hi)


class PercentileObserver(_HistogramRange):
    """Clips each tail at ``percentile`` (e.g. 99.99: the extreme 0.01% of values saturate)."""

    def __init__(self, percentile: float = 99.99, **kwargs) -> None:
        super().__init__(**kwargs)
        self.percentile = float(percentile)

    def _clip(self) -> tuple[float, float]:
        lo, hi = float(self.min_val), float(self.max_val)
        counts, left, width = histogram.occupied(self.histogram, self.grid, self.extremes)
        cdf = torch.cumsum(counts, 0)
        total = float(cdf[-1])
        tail = total * (100.0 - self.percentile) / 100.0
        # the upper clip: the right edge of the first bin whose cumulative count leaves at most `tail` above
        upper = int(torch.searchsorted(cdf, torch.tensor(total - tail, dtype=torch.float64)))
        lower = int(torch.searchsorted(cdf, torch.tensor(tail, dtype=torch.float64), right=True))
        clip_hi = max(min(left + width * (upper + 1), hi), 0.0)
        clip_lo = min(max(left + width * lower, lo), 0.0) if lo < 0 else lo
        return clip_lo, clip_hi


class MSEObserver(_HistogramRange):
    """The clip of least expected squared quantization error over the histogram's values."""

    def _clip(self) -> tuple[float, float]:
        lows, highs, *_ = args = self._candidates()
        counts, left, width = histogram.occupied(self.histogram, self.grid, self.extremes)
        found = histogram.mse_search(counts, left, width, SUBBINS, *args, COARSE)
        r, c, _ = found if found is not None else _mse_search(*self._centres(), *args)
        return (-float(highs[c]), float(highs[c])) if lows is None else (float(lows[r]), float(highs[c]))

    def _candidates(self) -> tuple[torch.Tensor | None, torch.Tensor, int, int, float]:
        """The search's arguments: the clips' low ends (None: symmetric) and high ends, qmin, qmax, eps."""
        lo, hi = min(float(self.min_val), 0.0), max(float(self.max_val), 0.0)
        grid = ACT_GRID.to(torch.float64)
        if self.qscheme == torch.per_tensor_symmetric:
            lows, highs = None, max(-lo, hi) * grid
        else:  # an end at 0 (after a ReLU) has one clip, not a grid of equal ones
            lows, highs = lo * (grid if lo < 0 else grid[:1]), hi * (grid if hi > 0 else grid[:1])
        return lows, highs, self.quant_min, self.quant_max, float(self.eps)


def _mse_search(points: torch.Tensor, weights: torch.Tensor, lows: torch.Tensor | None, highs: torch.Tensor,
                qmin: int, qmax: int, eps: float) -> tuple[int, int, float]:
    """MSEObserver's search over weighted points (histogram.mse_search is its C twin, bit for bit): the indices
    ``(r, c)`` of the clip ``(lows[r], highs[c])`` of least error, the first of equal errors (the widest on the
    grid's order; ``lows`` None: the symmetric clip ``±highs[c]``, r = 0), and that error."""
    sums = _PointSums(points, weights)
    if lows is None:
        err = sums.errors((highs / ((qmax - qmin) / 2)).clamp_min(eps), torch.zeros_like(highs), qmin, qmax)
        c = int(torch.argmin(err))
        return 0, c, float(err[c])
    tried: dict[tuple[int, int], float] = {}

    def search(rows: list[int], cols: list[int]) -> None:
        ij = [(r, c) for r in rows for c in cols if (r, c) not in tried]
        if not ij:
            return
        r, c = (torch.tensor(v) for v in zip(*ij, strict=True))
        a, b = lows[r], highs[c]
        scale = (b - a) / (qmax - qmin)
        zero = torch.clamp(qmin - torch.round(a / scale.clamp_min(1e-30)), qmin, qmax)
        tried.update(zip(ij, sums.errors(scale.clamp_min(eps), zero, qmin, qmax).tolist(), strict=True))

    def around(n: int, centre: int | None) -> list[int]:
        if centre is None:  # every COARSE-th value, and the last (min/max)
            return sorted({*range(0, n, COARSE), n - 1})
        return list(range(max(0, centre - COARSE + 1), min(n, centre + COARSE)))

    search(around(len(lows), None), around(len(highs), None))
    r0, c0 = min(tried, key=lambda k: (tried[k], k))
    search(around(len(lows), r0), around(len(highs), c0))
    r, c = min(tried, key=lambda k: (tried[k], k))
    return r, c, tried[r, c]


class _PointSums:
    """Evenly spaced weighted points and their prefix sums, for ``errors`` over many candidates: the C
    search (histogram.squared_errors_native) where it is built and applies, else ``_squared_errors``."""

    def __init__(self, points: torch.Tensor, weights: torch.Tensor) -> None:
        self.points, self.weights = points, weights
        zero = torch.zeros(1, dtype=torch.float64)
        self.prefix = [torch.cat([zero, torch.cumsum(weights * points ** k, 0)]) for k in range(3)]

    def errors(self, scale: torch.Tensor, zero: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
        p = self.points
        if qmax - qmin + 1 < len(p) and len(p) >= 2:
            native = histogram.squared_errors_native(self.prefix, float(p[0]), float(p[1] - p[0]), scale, zero,
                                                     qmin, qmax)
            if native is not None:
                return native
        return _squared_errors(p, self.weights, scale, zero, qmin, qmax)


def _squared_errors(points: torch.Tensor, weights: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                    qmin: int, qmax: int) -> torch.Tensor:
    """Per candidate ``(scale, zero)``: the weighted squared error of quantizing the evenly spaced ``points``,
    ``sum w (clamp(round(p / s) + z, qmin, qmax) - z) * s - p) ** 2``.

    Every code ``q`` takes the points between its rounding boundaries ``(q - z - 0.5) s`` and ``(q - z + 0.5) s`` (the end
    codes everything beyond), so with prefix sums of ``w``, ``w p`` and ``w p**2`` one code's error is
    ``S2 - 2 r S1 + r**2 S0`` (``r = (q - z) s``): O(codes) per candidate instead of O(points), the
    same sums up to float64 rounding (a point on a boundary, a tie, counts in the upper code here and
    in the even one in ``round``). Where the codes outnumber the points (int16), the points directly.
    """
    codes = qmax - qmin + 1
    errors = torch.empty(len(scale), dtype=torch.float64)
    if codes >= len(points) or len(points) < 2:
        for start in range(0, len(scale), 64):  # [64, points] at a time: bounded memory
            s, z = scale[start:start + 64, None], zero[start:start + 64, None]
            # ((clamp(round(p / s) + z) - z) * s - p) ** 2 * w in place: one buffer, not eight (each one a fresh
            # mapping of megabytes, whose page faults cost more than the arithmetic), the same operations
            e = torch.div(points, s).round_().add_(z).clamp_(qmin, qmax)
            errors[start:start + 64] = e.sub_(z).mul_(s).sub_(points).pow_(2).mul_(weights).sum(1)
        return errors
    first, step = float(points[0]), float(points[1] - points[0])
    zero_ = torch.zeros(1, dtype=torch.float64)
    prefix = [torch.cat([zero_, torch.cumsum(weights * points ** k, 0)]) for k in range(3)]
    steps = torch.arange(qmin, qmax + 1, dtype=torch.float64)
    chunk = max(1, (1 << 21) // codes)
    for start in range(0, len(scale), chunk):
        s, z = scale[start:start + chunk, None], zero[start:start + chunk, None]
        bounds = (steps[1:] - z - 0.5) * s  # [C, codes - 1]: the lower edge of each code but the first
        # the points are evenly spaced: the first at or above a bound is found by arithmetic, not a search
        idx = torch.ceil((bounds - first) / step).clamp(0, len(points)).long()
        edges = torch.cat([torch.zeros_like(idx[:, :1]), idx, torch.full_like(idx[:, :1], len(points))], 1)
        s0, s1, s2 = (p[edges[:, 1:]] - p[edges[:, :-1]] for p in prefix)
        r = (steps - z) * s
        errors[start:start + chunk] = (s2 - 2 * r * s1 + r * r * s0).sum(1)
    return errors


def _weight_mse_clip(w: torch.Tensor, axis: int | None, qmin: int, qmax: int) -> torch.Tensor:
    """Per channel of ``axis`` (or per tensor when None): the clip ``c * max|w|`` of least squared error."""
    rows = w.detach().to(torch.float64)
    rows = rows.reshape(1, -1) if axis is None else rows.movedim(axis, 0).reshape(rows.shape[axis], -1)
    top = rows.abs().amax(1)
    best_err = torch.full_like(top, float("inf"))
    best = top.clone()
    half = (qmax - qmin) / 2
    for c in WEIGHT_GRID.to(torch.float64).flip(0).tolist():  # from 1.0 down: ties keep the wider clip
        clip = top * c
        s = (clip / half).clamp_min(1e-30)[:, None]
        err = ((torch.clamp(torch.round(rows / s), qmin, qmax) * s - rows) ** 2).sum(1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, clip, best)
    return best.to(torch.float32)


class _LastWeightMSE:
    """Mixin for torchao's min/max weight observers: remembers the last tensor observed and clips it
    where the squared quantization error is least (per channel of ``_mse_axis()``, or per tensor)."""

    def forward(self, x):
        self._last = x.detach()
        return super().forward(x)

    def calculate_qparams(self):
        if getattr(self, "_last", None) is None:
            return super().calculate_qparams()
        axis = self._mse_axis()
        clip = _weight_mse_clip(self._last, axis, self.quant_min, self.quant_max)
        if axis is None:
            clip = clip[0]
        return self._calculate_qparams(-clip, clip)


class WeightMSEObserver(_LastWeightMSE, MinMaxObserver):
    """Symmetric per-tensor weight clip of least squared error (over the last tensor observed)."""

    def _mse_axis(self) -> int | None:
        return None


class PerChannelWeightMSEObserver(_LastWeightMSE, PerChannelMinMaxObserver):
    """Symmetric per-channel weight clips of least squared error (over the last tensor observed)."""

    def _mse_axis(self) -> int | None:
        return self.ch_axis


def activation_observer(observer: str, percentile: float = 99.99):
    """The observer constructor (with its arguments) for ``QuantConfig.observer``."""
    if observer == "minmax":
        return MinMaxObserver
    if observer == "histogram":
        return HistogramL2Observer
    if observer == "percentile":
        return PercentileObserver.with_args(percentile=percentile)
    if observer == "mse":
        return MSEObserver
    raise ValueError(f"unknown activation observer {observer!r}")


def weight_observer(observer: str, per_channel: bool):
    """The weight observer class for ``QuantConfig.weight_observer``."""
    if observer == "mse":
        return PerChannelWeightMSEObserver if per_channel else WeightMSEObserver
    return PerChannelMinMaxObserver if per_channel else MinMaxObserver


def fake_quantize_weight(w: torch.Tensor, observer_ctr, axis: int | None, qmin: int, qmax: int) -> torch.Tensor:
    """``w`` quantized and dequantized as the observer ``observer_ctr`` (per channel of ``axis``, or
    per tensor) quantizes it: what bias correction compares the float weight with."""
    kwargs = dict(dtype=torch.int8, quant_min=qmin, quant_max=qmax)
    if axis is None:
        obs = observer_ctr(qscheme=torch.per_tensor_symmetric, **kwargs)
    else:
        obs = observer_ctr(qscheme=torch.per_channel_symmetric, ch_axis=axis, **kwargs)
    obs(w)
    scale, zero = obs.calculate_qparams()
    if axis is None:
        return torch.fake_quantize_per_tensor_affine(w, float(scale), int(zero), qmin, qmax)
    return torch.fake_quantize_per_channel_affine(w, scale.float(), zero.int(), axis, qmin, qmax)
