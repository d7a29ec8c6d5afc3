"""How a model is quantized: the user-facing QuantConfig."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from qlower.errors import ConfigError

FixedQParams = tuple[float, int, int, int]  # scale, zero_point, qmin, qmax


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_fixed(key: object, params: object) -> None:
    where = f"QuantConfig.fixed[{key!r}]"
    if not isinstance(key, str) or not key:
        raise ConfigError(f"QuantConfig.fixed keys are 'output', 'input', 'input:N' or a module's name, got {key!r}")
    if not isinstance(params, (tuple, list)) or len(params) != 4:
        raise ConfigError(f"{where} must be (scale, zero_point, qmin, qmax), got {params!r}")
    scale, zp, qmin, qmax = params
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)) \
            or not math.isfinite(scale) or scale <= 0:
        raise ConfigError(f"{where}: the scale must be a finite number > 0, got {scale!r}")
    if not all(_is_int(x) for x in (zp, qmin, qmax)):
        raise ConfigError(f"{where}: zero_point, qmin and qmax must be integers, got {(zp, qmin, qmax)!r}")
    if not -(1 << 31) <= qmin < qmax < (1 << 31) or not qmin <= zp <= qmax:
        raise ConfigError(f"{where}: need qmin < qmax within int32 and qmin <= zero_point <= qmax, got "
                          f"qmin={qmin}, qmax={qmax}, zero_point={zp}")


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
        choices = {"mode": ("static", "dynamic"), "fallback": ("float", "error"),
                   "granularity": ("per_tensor", "per_row")}
        for name, accepted in choices.items():
            if getattr(self, name) not in accepted:
                raise ConfigError(f"QuantConfig.{name} must be one of {', '.join(map(repr, accepted))}, "
                                  f"got {getattr(self, name)!r}")
        for name in ("per_channel", "symmetric_acts"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"QuantConfig.{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("act_qmin", "act_qmax", "weight_qmin", "weight_qmax"):
            if not _is_int(getattr(self, name)):
                raise ConfigError(f"QuantConfig.{name} must be an integer, got {getattr(self, name)!r}")
        # zero must have a code: activations' zero point lies in the range, weights are symmetric (zp 0)
        if not -128 <= self.act_qmin <= 0 <= self.act_qmax <= 127 or self.act_qmin == self.act_qmax:
            raise ConfigError(f"QuantConfig activation range [act_qmin, act_qmax] = [{self.act_qmin}, "
                              f"{self.act_qmax}] must lie within int8 [-128, 127], contain 0 and hold two codes")
        if not -128 <= self.weight_qmin < 0 < self.weight_qmax <= 127:
            raise ConfigError(f"QuantConfig weight range [weight_qmin, weight_qmax] = [{self.weight_qmin}, "
                              f"{self.weight_qmax}] must lie within int8 [-128, 127] with weight_qmin < 0 < "
                              "weight_qmax (weights are symmetric: zero point 0)")
        if not isinstance(self.fixed, dict):
            raise ConfigError(f"QuantConfig.fixed must be a dict of name -> (scale, zero_point, qmin, qmax), "
                              f"got {type(self.fixed).__name__}")
        for key, params in self.fixed.items():
            _check_fixed(key, params)

    def __hash__(self) -> int:
        return hash((self.mode, self.per_channel, self.act_qmin, self.act_qmax, self.symmetric_acts,
                     self.weight_qmin, self.weight_qmax, self.granularity, tuple(sorted(self.fixed.items())), self.fallback))
