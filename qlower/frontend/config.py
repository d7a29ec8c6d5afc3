"""How a model is quantized: the user-facing QuantConfig."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FixedQParams = tuple[float, int, int, int]  # scale, zero_point, qmin, qmax


@dataclass(frozen=True)
class QuantConfig:
    """Quantization scheme for ``qlower.compile`` / ``qlower.verify``.

    ``mode="static"``: int8 activations with scales observed on calibration data,
    int8 weights (per output channel when ``per_channel``), int32 bias.
    ``mode="dynamic"``: activations quantized at run time (``granularity`` per
    tensor or per row, symmetric), int8 per-channel weights, float outputs.
    ``fixed`` pins a value's quantization: key ``"output"`` (the model output),
    ``"input"`` / ``"input:N"``, or a module's qualified name (its output).
    ``fallback="float"`` runs an op without an integer rule in float on the host
    (dequantize, the ATen op, quantize again); ``"error"`` refuses it instead, for
    users who want a fully integer program.
    """

    mode: Literal["static", "dynamic"] = "static"
    per_channel: bool = True
    act_qmin: int = -128
    act_qmax: int = 127
    symmetric_acts: bool = False
    weight_qmin: int = -127
    weight_qmax: int = 127
    granularity: Literal["per_tensor", "per_row"] = "per_tensor"
    fixed: dict[str, FixedQParams] = field(default_factory=dict)
    fallback: Literal["float", "error"] = "float"

    def __post_init__(self) -> None:
        if self.mode not in ("static", "dynamic"):
            raise ValueError(f"QuantConfig.mode must be 'static' or 'dynamic', got {self.mode!r}")
        if self.fallback not in ("float", "error"):
            raise ValueError(f"QuantConfig.fallback must be 'float' or 'error', got {self.fallback!r}")
        if self.granularity not in ("per_tensor", "per_row"):
            raise ValueError(f"QuantConfig.granularity must be 'per_tensor' or 'per_row', got {self.granularity!r}")
        if not -128 <= self.act_qmin < self.act_qmax <= 127:
            raise ValueError(f"activation range [{self.act_qmin}, {self.act_qmax}] must lie within int8")
        if not -128 <= self.weight_qmin < self.weight_qmax <= 127:
            raise ValueError(f"weight range [{self.weight_qmin}, {self.weight_qmax}] must lie within int8")

    def __hash__(self) -> int:
        return hash((self.mode, self.per_channel, self.act_qmin, self.act_qmax, self.symmetric_acts,
                     self.weight_qmin, self.weight_qmax, self.granularity, tuple(sorted(self.fixed.items())), self.fallback))
