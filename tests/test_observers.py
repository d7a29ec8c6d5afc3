"""The running histogram of the "histogram" / "percentile" / "mse" observers (qlower/frontend/histogram.py,
_histogram.c) and the ranges they choose from it.

The C kernels are checked against their torch / torchao twins; the histogram against a count of all the
data made here (so a merge that loses or misplaces a count fails); the ranges against torchao's
HistogramObserver and a brute-force search over the raw data; determinism across batch splits.
"""

import math

import numpy as np
import pytest
import torch
from torchao.quantization.pt2e import HistogramObserver

from qlower.frontend import histogram
from qlower.frontend.observers import (
    ACT_GRID,
    COARSE,
    SUBBINS,
    HistogramL2Observer,
    MSEObserver,
    PercentileObserver,
    _mse_search,
    _PointSums,
    _squared_errors,
)

INT8 = dict(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine)


def _streams(seed: int) -> dict[str, list[torch.Tensor]]:
    """Seeded calibration streams: outliers, ReLU-like (with and without a long tail), a range growing
    batch after batch, a positive shifted one, and non-finite values among finite ones."""
    g = torch.Generator().manual_seed(seed)
    outliers = torch.randn(3, 6000, generator=g)
    outliers[:, :4] = torch.tensor([40.0, -30.0, 25.0, 38.0])
    nonfinite = torch.randn(2, 3000, generator=g)
    nonfinite[0, :3] = torch.tensor([float("inf"), float("nan"), -float("inf")])
    return {"outliers": list(outliers), "relu": list(torch.randn(3, 6000, generator=g).relu()),
            "relu_tail": list((torch.randn(3, 6000, generator=g) ** 3).relu()),
            "growing": [torch.randn(4000, generator=g) * (1 + 3 * i) for i in range(4)],
            "shifted": [torch.rand(4000, generator=g) * (1 + i) + 1000 for i in range(3)],
            "nonfinite": list(nonfinite)}


def _state():
    return (torch.zeros(histogram.BINS, dtype=torch.float64), torch.tensor([histogram.EMPTY, 0]),
            torch.tensor([float("inf"), float("-inf")]))


def _observed(batches, observe=histogram.observe):
    state = _state()
    finite = sum(observe(b, *state) for b in batches)
    return state, finite


def test_native_library_builds():
    assert histogram.native() is not None  # calibration would fall back to the slow torch twins


@pytest.mark.parametrize("seed", [0, 1])
def test_c_histogram_equals_its_torch_twin(seed):
    for name, batches in _streams(seed).items():
        (c, g, e), n = _observed(batches)
        (tc, tg, te), tn = _observed(batches, histogram.observe_torch)
        assert n == tn and torch.equal(c, tc) and torch.equal(g, tg) and torch.equal(e, te), name


def _smallest_exponent(lo: float, hi: float, nbins: int) -> int:
    """The grid rule spelled out: the first exponent from far below that fits and is not below the floor."""
    top = max(abs(lo), abs(hi))
    floor_ = (math.frexp(top)[1] - 1 if top >= 2.0**-126 else -126) - 24
    return next(e for e in range(-200, 200)
                if e >= floor_ and math.floor(hi / 2.0**e) - math.floor(lo / 2.0**e) + 1 <= nbins)


def test_grid_exponent_is_the_smallest_that_fits():
    g = torch.Generator().manual_seed(3)
    pairs = [(0.0, 0.0), (1000.0, 1000.001), (-1e30, 1e-30), (0.0, 1e-40), (-5.0, -5.0), (-3.0, 5.0)]
    for _ in range(200):
        a, b = sorted((torch.randn(2, generator=g) * 10.0 ** torch.randint(-8, 9, (2,), generator=g)).tolist())
        pairs.append((float(np.float32(a)), float(np.float32(b))))
    for lo, hi in pairs:
        want = _smallest_exponent(lo, hi, histogram.BINS)
        assert histogram.exponent(lo, hi) == want == histogram.native().qh_exponent(lo, hi, histogram.BINS), (lo, hi)


@pytest.mark.parametrize("seed", [0, 1])
def test_histogram_is_every_value_counted_on_the_final_grid(seed):
    """Merging when the range widens loses no count and moves none to a wrong bin: the running histogram
    equals a count of all the values at once, whatever the split and order of the batches."""
    for name, batches in _streams(seed).items():
        (counts, grid, extremes), n = _observed(batches)
        data = torch.cat(batches).double().numpy()
        data = data[np.isfinite(data)]
        e, origin = int(grid[0]), int(grid[1])
        assert n == len(data) and float(counts.sum()) == len(data), name
        assert (e, origin) == (histogram.exponent(data.min(), data.max()), math.floor(data.min() / 2.0**e))
        want = np.bincount((np.floor(data / 2.0**e) - origin).astype(np.int64), minlength=histogram.BINS)
        assert np.array_equal(counts.numpy(), want), name
        resplit = list(torch.cat(batches[::-1]).split(1234))
        assert all(torch.equal(a, b) for a, b in zip(_observed(resplit)[0], (counts, grid, extremes), strict=True))


def _qparams(ctr, batches, **kwargs):
    obs = ctr(**INT8, **kwargs)
    for b in batches:
        obs(b)
    scale, zero = obs.calculate_qparams()
    return float(scale), int(zero)


@pytest.mark.parametrize("ctr", [HistogramL2Observer, PercentileObserver, MSEObserver])
def test_same_data_same_scale_whatever_the_batches(ctr):
    for name, batches in _streams(2).items():
        whole = torch.cat(batches)
        shuffled = whole[torch.randperm(len(whole), generator=torch.Generator().manual_seed(5))]
        want = _qparams(ctr, batches)
        assert _qparams(ctr, [whole]) == want == _qparams(ctr, list(shuffled.split(777))), name


def test_histogram_ranges_match_torchao_within_a_bin():
    """torchao's HistogramObserver given the same data (all at once: its histogram is then exact) and ours
    choose the same range within one bin on nearly every stream. Where they don't, the two histograms differ
    only by how each fine bin's count is spread (histogram.rebinned), and torchao's greedy search, which stops
    at the first step where its error rises, is that sensitive (relu seed 7: 39 bins apart, with the C and
    torchao searches agreeing on each histogram): the range found then quantizes the data as well, within 1%."""
    within, total = 0, 0
    for seed in range(6):
        for name, batches in _streams(seed).items():
            if name == "nonfinite":  # torchao's histc refuses NaN
                continue
            ours, theirs = HistogramL2Observer(**INT8), HistogramObserver(**INT8)
            for b in batches:
                ours(b)
            theirs(torch.cat(batches))
            lo, hi = ours._clip()
            t_lo, t_hi = (float(v) for v in theirs._non_linear_param_search())
            # one of torchao's bins, plus the float32 rounding of its ends (it computes them in float32)
            width = float(theirs.max_val - theirs.min_val) / 2048 + 4 * 2.0**-23 * max(abs(t_lo), abs(t_hi))
            total += 1
            if abs(lo - t_lo) <= width and abs(hi - t_hi) <= width:
                within += 1
                continue
            x = torch.cat(batches).double().numpy()
            assert _raw_error(x, lo, hi) <= 1.01 * _raw_error(x, t_lo, t_hi), (seed, name, lo, t_lo, hi, t_hi, width)
    assert within >= 0.9 * total, (within, total)


def test_c_range_search_equals_torchaos_code_on_the_same_histogram():
    """Bin for bin, up to float32 rounding in torchao's norms (which may flip its stop by one step)."""
    g = torch.Generator().manual_seed(4)
    for hist in [torch.randn(2048, generator=g).abs() ** 4 * 100, torch.randint(0, 50, (2048,), generator=g) ** 2,
                 torch.exp(-torch.linspace(0, 12, 2048)) * 1e5, torch.ones(2048)]:
        hist = hist.double().round()
        for dst in (256, 16):
            (start, end), (t_start, t_end) = histogram.l2_search(hist, 0.01, dst), histogram.l2_search_torchao(hist, 0.01, dst)
            assert abs(start - t_start) <= 1 and abs(end - t_end) <= 1, (start, end, t_start, t_end)


def test_c_squared_errors_equal_the_torch_sums():
    g = torch.Generator().manual_seed(6)
    points = torch.linspace(-3.0, 40.0, 8192, dtype=torch.float64)
    weights = (torch.randn(8192, generator=g).abs() ** 3).double() * (torch.rand(8192, generator=g) < 0.3)
    a, b = -3.0 * torch.rand(300, generator=g).double(), 40.0 * torch.rand(300, generator=g).double() + 0.1
    scale = (b - a) / 255
    zero = torch.clamp(-128 - torch.round(a / scale), -128, 127)
    native = _PointSums(points, weights).errors(scale, zero, -128, 127)
    torch.testing.assert_close(native, _squared_errors(points, weights, scale, zero, -128, 127), rtol=1e-10, atol=0)


def _sequential_errors(prefix, first: float, step: float, scale: np.ndarray, zero: np.ndarray, qmin: int, qmax: int):
    """The prefix-sum errors (``_squared_errors``' rule) in numpy, code after code in order: what the C sums, to
    the last bit (numpy rounds each operation once, as C does without fused multiply-adds)."""
    p0, p1, p2 = (p.numpy() for p in prefix)
    npoints, err, prev = len(p0) - 1, np.zeros(len(scale)), np.zeros(len(scale), dtype=np.int64)
    for q in range(qmin, qmax + 1):
        k = np.ceil(((((q + 1.0) - zero) - 0.5) * scale - first) / step)
        nxt = np.clip(k, 0, npoints).astype(np.int64) if q < qmax else np.full(len(scale), npoints)
        r = (q - zero) * scale
        err += (p2[nxt] - p2[prev]) - 2 * r * (p1[nxt] - p1[prev]) + r * r * (p0[nxt] - p0[prev])
        prev = nxt
    return err


@pytest.mark.parametrize("step", [2.0**-7, 0.1])
def test_c_squared_errors_are_the_sums_in_order_bit_for_bit(step):
    """The C kernel sums candidates side by side, and multiplies by 1 / step where step is a power of two: each
    candidate's error is still every code's term added in order, exactly. Scales that are multiples of a
    quarter step put code boundaries on points, where dividing by 0.1 and multiplying by 1 / 0.1 disagree."""
    g = torch.Generator().manual_seed(8)
    points = -2.0 + step * torch.arange(3001, dtype=torch.float64)
    weights = torch.randint(0, 1000, (3001,), generator=g).double() * (torch.rand(3001, generator=g) < 0.4)
    prefix = _PointSums(points, weights).prefix
    top = float(points[-1])
    for qmin, qmax in ((-128, 127), (0, 255), (-8, 7)):
        a = torch.tensor([-2.0, -1.0, 0.0, -0.5, -2.0, -1e-3, -2.0, -1.7, -0.25, 0.0, -2.0, -1.1, -0.9]).double()
        b = top * torch.tensor([1.0, 0.5, 0.25, 0.05, 1e-9, 0.9, 0.7, 0.33, 0.61, 1.0, 0.2, 0.8, 0.45]).double()
        scale = (b - a) / (qmax - qmin)
        zero = torch.clamp(qmin - torch.round(a / scale), qmin, qmax)
        aligned = step / 4 * torch.arange(1, 60, dtype=torch.float64)  # 72 candidates: a partial block of 8
        scale = torch.cat([scale, aligned])
        zero = torch.cat([zero, torch.randint(qmin, qmax + 1, (len(aligned),), generator=g).double()])
        got = histogram.squared_errors_native(prefix, float(points[0]), step, scale, zero, qmin, qmax)
        want = _sequential_errors(prefix, float(points[0]), step, scale.numpy(), zero.numpy(), qmin, qmax)
        assert np.array_equal(got.numpy(), want), (qmin, qmax, got.numpy() - want)


def test_points_summed_directly_in_place_are_the_expression_bit_for_bit():
    """Where the codes outnumber the points (int16), each candidate's error is the sum over the points, computed
    in place: exactly what the expression computes."""
    g = torch.Generator().manual_seed(9)
    points = torch.linspace(-3.0, 40.0, 2001, dtype=torch.float64)
    weights = torch.randint(0, 50, (2001,), generator=g).double() * (torch.rand(2001, generator=g) < 0.5)
    scale = torch.cat([43.0 / 65535 * ACT_GRID.double(), 40.0 / 32767.5 * ACT_GRID.double()])
    zero = torch.cat([torch.full((39,), -32768 + 2860.0), torch.zeros(39)])
    s, z = scale[:, None], zero[:, None]
    want = (((torch.clamp(torch.round(points / s) + z, -32768, 32767) - z) * s - points) ** 2 * weights).sum(1)
    assert torch.equal(_squared_errors(points, weights, scale, zero, -32768, 32767), want)


def _adversarial_states(seed: int):
    """Seeded histogram states (counts on the grid ``(e, origin)`` and the extremes): random counts, a few spikes
    among empty bins, everything in one bin, one bin holding all but a few values, two equal bins at the ends,
    no count at all (every clip ties), over ranges that are negative, positive (after a ReLU), both, or far from
    0 (points with 28 significant bits, whose squares round: the largest origin a float32 range gets)."""
    g = torch.Generator().manual_seed(seed)
    for kind in ("random", "spikes", "one_bin", "almost_one_bin", "two_ends", "empty"):
        for origin_of in (lambda n: -n // 3, lambda n: 0, lambda n: -n + 1, lambda n: 23_000_002 - n % 2):
            e = int(torch.randint(-20, 6, (1,), generator=g))
            n = int(torch.randint(300, histogram.BINS + 1, (1,), generator=g))
            counts = torch.zeros(n, dtype=torch.float64)
            spot = int(torch.randint(0, n, (1,), generator=g))
            if kind == "random":
                counts = torch.randint(0, 1000, (n,), generator=g).double() ** 2
            elif kind == "spikes":
                where = torch.randint(0, n, (7,), generator=g)
                counts[where] = torch.randint(1, 10**6, (7,), generator=g).double()
            elif kind == "one_bin":
                counts[spot] = 4096.0
            elif kind == "almost_one_bin":
                counts[spot] = 1e9
                counts[torch.randint(0, n, (3,), generator=g)] += 1.0
            elif kind == "two_ends":
                counts[0] = counts[-1] = 5.0
            origin, width = origin_of(n), 2.0**e
            lo, hi = origin * width, (origin + n - 1) * width  # the first and the last bin's left edges
            assert np.float32(lo) == lo and np.float32(hi) == hi  # the extremes are float32
            yield f"{kind} {origin}/{n}", counts, (e, origin), (lo, hi)


def _observer_in(state, **kwargs) -> MSEObserver:
    counts, grid, extremes = state
    obs = MSEObserver(**kwargs)
    obs.histogram[:len(counts)] = counts
    obs.grid[:] = torch.tensor(grid)
    obs.extremes[:] = torch.tensor(extremes)
    return obs


def test_c_mse_search_equals_the_python_search_bit_for_bit():
    """One C call (histogram.mse_search: the points, their prefix sums, every candidate, the coarse and the fine
    rounds, the first of equal errors) chooses the clip of the Python search it replaced (observers._mse_search
    over _centres), with the same error to the last bit, on adversarial histograms, affine and symmetric, for
    8 and 4 bits; and the observer's clip is that one."""
    for seed in (0, 1):
        for name, *state in _adversarial_states(seed):
            for qscheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                for qmin, qmax in ((-128, 127), (0, 255), (-8, 7)):
                    obs = _observer_in(state, dtype=torch.int8 if qmin < 0 else torch.uint8, quant_min=qmin,
                                       quant_max=qmax, qscheme=qscheme)
                    lows, highs, *_ = args = obs._candidates()
                    counts, left, width = histogram.occupied(obs.histogram, obs.grid, obs.extremes)
                    r, c, error = histogram.mse_search(counts, left, width, SUBBINS, *args, COARSE)
                    assert (r, c, error) == _mse_search(*obs._centres(), *args), (name, qscheme, qmin)
                    assert obs._clip() == ((-highs[c], highs[c]) if lows is None else (lows[r], highs[c]))


def _raw_error(x: np.ndarray, lo: float, hi: float, qmin: int = -128, qmax: int = 127) -> float:
    scale = (hi - lo) / (qmax - qmin)
    zero = np.clip(qmin - np.round(lo / scale), qmin, qmax)
    return float((((np.clip(np.round(x / scale) + zero, qmin, qmax) - zero) * scale - x) ** 2).mean())


@pytest.mark.parametrize("name", ["outliers", "relu_tail", "growing"])
def test_mse_clip_is_the_brute_force_best_on_the_raw_data(name):
    """Every clip of the grid tried on every value (numpy, no histogram): the observer's is within 1% of the best."""
    batches = _streams(0)[name]
    obs = MSEObserver(**INT8)
    for b in batches:
        obs(b)
    lo, hi = obs._clip()
    x = torch.cat(batches).double().numpy()
    grid = ACT_GRID.double().numpy()
    lows = min(x.min(), 0.0) * (grid if x.min() < 0 else grid[:1])
    errors = [_raw_error(x, a, b) for a in lows for b in max(x.max(), 0.0) * grid]
    assert _raw_error(x, lo, hi) <= min(errors) * 1.01, (lo, hi, _raw_error(x, lo, hi), min(errors))
    assert _raw_error(x, lo, hi) <= _raw_error(x, x.min(), x.max())


@pytest.mark.parametrize("ctr", [HistogramL2Observer, PercentileObserver, MSEObserver])
def test_torch_twins_give_the_same_qparams(ctr, monkeypatch):
    """Without the C library (no compiler, or QLOWER_OBSERVER_NATIVE=0) calibration gives the same scales."""
    streams = _streams(1)
    native = {name: _qparams(ctr, batches) for name, batches in streams.items()}
    monkeypatch.setattr(histogram, "native", lambda: None)
    assert {name: _qparams(ctr, batches) for name, batches in streams.items()} == native


def test_a_loaded_state_gives_its_own_qparams():
    streams = _streams(0)
    source, target = MSEObserver(**INT8), MSEObserver(**INT8)
    for b in streams["outliers"]:
        source(b)
    for b in streams["relu"]:
        target(b)
    target.calculate_qparams()  # cached for the ReLU data
    target.load_state_dict(source.state_dict())
    assert [float(t) for t in target.calculate_qparams()] == [float(t) for t in source.calculate_qparams()]
