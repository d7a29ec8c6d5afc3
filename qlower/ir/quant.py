"""Quantization as part of a value's type (DESIGN.md rule 1).

A QuantSpec says how the integer codes of a tensor map to real numbers:
``real = (code - zero_point) * scale``, with codes kept in ``[qmin, qmax]``.
Scale and zero point are given once (per tensor) or once per channel along
``axis``. A dynamic spec (``dynamic`` set) has its activation scale computed at
run time; its ``scale`` is then the static factor that multiplies the run-time
scale (1 for an activation, the weight scales for an accumulator).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from qlower.ir.dtypes import DType

DynamicGranularity = Literal["per_tensor", "per_row"]


def _all_ints(values: object) -> bool:
    """A tuple of plain ints already (bools excluded): kept as it is."""
    return type(values) is tuple and set(map(type, values)) <= {int}


@dataclass(frozen=True)
class QuantSpec:
    dtype: DType
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    qmin: int
    qmax: int
    axis: int | None = None
    dynamic: DynamicGranularity | None = None

    def __post_init__(self) -> None:
        # Normalise to plain Python numbers so that equality and hashing are exact (through numpy:
        # per-channel specs of wide layers are made thousands of times in one compile).
        object.__setattr__(self, "scale", tuple(np.atleast_1d(np.asarray(self.scale, np.float64)).tolist()))
        object.__setattr__(self, "zero_point", tuple(int(z) for z in np.atleast_1d(self.zero_point))
                           if not _all_ints(self.zero_point) else tuple(self.zero_point))
        object.__setattr__(self, "qmin", int(self.qmin))
        object.__setattr__(self, "qmax", int(self.qmax))

    # -- constructors -------------------------------------------------------------
    @staticmethod
    def per_tensor(
        scale: float, zero_point: int = 0, dtype: DType = DType.INT8,
        qmin: int | None = None, qmax: int | None = None,
    ) -> QuantSpec:
        return QuantSpec(dtype, (scale,), (zero_point,),
                         dtype.min if qmin is None else qmin,
                         dtype.max if qmax is None else qmax)

    @staticmethod
    def per_channel(
        scales, zero_points=None, axis: int = 0, dtype: DType = DType.INT8,
        qmin: int | None = None, qmax: int | None = None,
    ) -> QuantSpec:
        scales = tuple(float(s) for s in np.asarray(scales).reshape(-1))
        zps = (0,) * len(scales) if zero_points is None else tuple(np.asarray(zero_points).reshape(-1))
        return QuantSpec(dtype, scales, zps,
                         dtype.min if qmin is None else qmin,
                         dtype.max if qmax is None else qmax, axis=axis)

    @staticmethod
    def plain_integer(dtype: DType = DType.INT32) -> QuantSpec:
        """Integers that stand for themselves (token ids, indices, counts): scale 1, zero point 0."""
        return QuantSpec(dtype, (1.0,), (0,), dtype.min, dtype.max)

    @property
    def is_plain_integer(self) -> bool:
        return (self.scale == (1.0,) and self.zero_point == (0,) and self.axis is None and not self.dynamic
                and (self.qmin, self.qmax) == (self.dtype.min, self.dtype.max))

    @staticmethod
    def accumulator(input_spec: QuantSpec, weight_spec: QuantSpec, axis: int | None) -> QuantSpec:
        """The int32 type of ``sum(input * weight)``: scale s_in * s_w[c], zero point 0."""
        scales = tuple((np.asarray(weight_spec.scale) * input_spec.scale[0]).tolist())  # float64, as Python's *
        per_channel = len(scales) > 1
        return QuantSpec(DType.INT32, scales, (0,) * len(scales), DType.INT32.min, DType.INT32.max,
                         axis=axis if per_channel else None, dynamic=input_spec.dynamic)

    # -- queries ------------------------------------------------------------------
    @property
    def is_per_channel(self) -> bool:
        return self.axis is not None

    def scale_array(self, rank: int) -> np.ndarray:
        """Scales as float64, shaped to broadcast against a tensor of ``rank``."""
        return self._broadcast(np.asarray(self.scale, dtype=np.float64), rank)

    def zero_point_array(self, rank: int) -> np.ndarray:
        return self._broadcast(np.asarray(self.zero_point, dtype=np.int64), rank)

    def _broadcast(self, values: np.ndarray, rank: int) -> np.ndarray:
        if self.axis is None:
            return values.reshape(()) if values.size == 1 else values
        shape = [1] * rank
        shape[self.axis] = values.size
        return values.reshape(shape)

    def with_axis(self, axis: int | None) -> QuantSpec:
        return replace(self, axis=axis)

    def __str__(self) -> str:
        def fmt(vals):
            if len(vals) == 1:
                return f"{vals[0]:.6g}"
            if len(vals) <= 4:
                return "[" + ",".join(f"{v:.6g}" for v in vals) + "]"
            return f"[{vals[0]:.6g},…×{len(vals)}]"
        parts = [f"s={fmt(self.scale)}", f"zp={fmt(self.zero_point)}"]
        if (self.qmin, self.qmax) != (self.dtype.min, self.dtype.max):
            parts.append(f"q=[{self.qmin},{self.qmax}]")
        if self.axis is not None:
            parts.append(f"axis={self.axis}")
        if self.dynamic:
            parts.append(f"dynamic={self.dynamic}")
        return "{" + " ".join(parts) + "}"
