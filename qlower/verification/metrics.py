"""Numeric comparisons between stages: quantization steps, exact share, SQNR."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qlower.ir import QuantSpec
from qlower.reference.quantization import quantize_array


@dataclass(frozen=True)
class Comparison:
    """How one stage's tensor compares with another's."""

    max_steps: float        # max |codes difference| (quantized values) or max |difference| / scale
    exact_share: float      # share of elements with identical codes
    max_abs: float          # max |real difference|
    sqnr_db: float | None   # SQNR of this stage against fp32, when fp32 is known

    @staticmethod
    def worst(comparisons: list[Comparison | None]) -> Comparison | None:
        """Each metric at its worst over ``comparisons`` (None when none was made): most steps,
        least exact share, largest difference, lowest SQNR. NaN steps (no step size) stay NaN."""
        made = [c for c in comparisons if c is not None]
        if not made:
            return None
        sqnrs = [c.sqnr_db for c in made if c.sqnr_db is not None]
        steps = [c.max_steps for c in made]
        return Comparison(float("nan") if any(math.isnan(x) for x in steps) else max(steps),
                          min(c.exact_share for c in made),
                          max(c.max_abs for c in made), min(sqnrs) if sqnrs else None)

    @staticmethod
    def mismatched_shape() -> Comparison:
        """A stage that produced a tensor of another shape: nothing of it agrees (never a skipped check)."""
        return Comparison(float("inf"), 0.0, float("inf"), None)

    def as_dict(self) -> dict:
        return {"max_steps": self.max_steps, "exact_share": self.exact_share,
                "max_abs": self.max_abs, "sqnr_db": self.sqnr_db}


def sqnr_db(signal: np.ndarray, approx: np.ndarray) -> float:
    """10·log10(‖signal‖² / ‖signal − approx‖²); inf when identical."""
    s = np.asarray(signal, dtype=np.float64)
    noise = s - np.asarray(approx, dtype=np.float64)
    pn = float(np.sum(noise * noise))
    ps = float(np.sum(s * s))
    if pn == 0.0:
        return float("inf")
    if ps == 0.0:
        return float("-inf")
    return 10.0 * np.log10(ps / pn)


def dequantize(codes: np.ndarray, q: QuantSpec) -> np.ndarray:
    rank = codes.ndim
    return (codes.astype(np.int64) - q.zero_point_array(rank)) * q.scale_array(rank)


def to_codes(values: np.ndarray, q: QuantSpec) -> np.ndarray:
    """Quantize real values with ``q`` exactly as the program's ``quantize`` op does."""
    rank = values.ndim
    return quantize_array(values, q.scale_array(rank), q.zero_point_array(rank), q.qmin, q.qmax)


def compare_codes(codes: np.ndarray, other_codes: np.ndarray, q: QuantSpec,
                  fp32: np.ndarray | None = None) -> Comparison:
    a, b = codes.astype(np.int64), other_codes.astype(np.int64)
    diff = np.abs(a - b)
    real = dequantize(a, q)
    return Comparison(float(diff.max(initial=0)), float(np.mean(diff == 0)) if diff.size else 1.0,
                      float(np.abs(real - dequantize(b, q)).max(initial=0.0)),
                      None if fp32 is None else sqnr_db(fp32, real))


def compare_floats(values: np.ndarray, other: np.ndarray, fp32: np.ndarray | None = None,
                   scale: float | None = None) -> Comparison:
    a, b = np.asarray(values, np.float64), np.asarray(other, np.float64)
    diff = np.abs(a - b)
    # dequantized float32 values carry a rounding error of up to |code - zp| * 2**-24 steps (4e-3 for
    # int16 codes): two decimals keep 1 step from reading 1.000002 and lose nothing real
    steps = round(float(diff.max(initial=0.0) / scale), 2) if scale else float("nan")
    return Comparison(steps, float(np.mean(diff == 0)) if diff.size else 1.0, float(diff.max(initial=0.0)),
                      None if fp32 is None else sqnr_db(fp32, a))
