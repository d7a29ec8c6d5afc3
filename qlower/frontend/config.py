"""How a model is quantized: the user-facing QuantConfig."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from qlower.errors import ConfigError

FixedQParams = tuple[float, int, int, int]  # scale, zero_point, qmin, qmax
ACT_DTYPES = ("int8", "int16")
OBSERVERS = ("minmax", "histogram", "percentile", "mse")  # activation range setting (frontend/observers.py)
WEIGHT_OBSERVERS = ("minmax", "mse")
INT16_ACT_RANGE = (-32768, 32767)  # symmetric (zero point 0) over the whole dtype: no saturation clamps


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
    ``act_dtype="int16"`` (A16W8): static activations in int16, symmetric in
    ``[-32768, 32767]`` (zero point 0, as TOSA's int16 x int8 convolutions take
    them); weights stay int8. ``layer_dtypes={"features.3": "int16"}`` sets the
    activation dtype of the ops inside a module (by qualified name; the innermost
    named module wins) over ``act_dtype``. ``auto_int16=K``: ``compile`` first
    measures each layer's int8 sensitivity on the calibration data
    (``qlower.sensitivity``) and adds the K most sensitive to ``layer_dtypes`` as int16.

    Range setting (static activations; frontend/observers.py): ``observer="minmax"`` (the
    calibration data's extremes), ``"histogram"`` (torchao's HistogramObserver's L2 range search, the
    peers' default, run on qlower's exact running histogram), ``"percentile"`` (clip at the ``percentile``-th percentile of each tail) or
    ``"mse"`` (the clip that minimises the quantization error of the calibration data).
    ``weight_observer="mse"`` clips weights (per channel or per tensor) where their own
    quantization error is least; ``"minmax"`` keeps their extremes.
    ``equalize=True`` rescales consecutive conv / linear channels (through ReLU / ReLU6 and
    folded BatchNorms) so their weight ranges match, the float function unchanged
    (frontend/equalization.py); ``absorb_bias=True`` (with ``equalize``) moves the part of a
    bias before a ReLU / ReLU6 that stays positive on the calibration data into the next layer's
    bias (exact where the activation never clips it); ``bias_correction=True`` removes from each conv / linear bias
    the mean output shift its weight quantization causes on the calibration data
    (frontend/bias_correction.py); ``smooth=alpha`` (SmoothQuant, in [0, 1]) moves activation
    outliers of a LayerNorm's output into the linear layers reading it (frontend/smoothquant.py).
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
    act_dtype: Literal["int8", "int16"] = "int8"
    layer_dtypes: dict[str, Literal["int8", "int16"]] = field(default_factory=dict)
    auto_int16: int = 0
    observer: Literal["minmax", "histogram", "percentile", "mse"] = "minmax"
    percentile: float = 99.99
    weight_observer: Literal["minmax", "mse"] = "minmax"
    equalize: bool = False
    absorb_bias: bool = False
    bias_correction: bool = False
    smooth: float | None = None

    def __post_init__(self) -> None:
        choices = {"mode": ("static", "dynamic"), "fallback": ("float", "error"),
                   "granularity": ("per_tensor", "per_row"), "act_dtype": ACT_DTYPES, "observer": OBSERVERS,
                   "weight_observer": WEIGHT_OBSERVERS}
        for name, accepted in choices.items():
            if getattr(self, name) not in accepted:
                raise ConfigError(f"QuantConfig.{name} must be one of {', '.join(map(repr, accepted))}, "
                                  f"got {getattr(self, name)!r}")
        for name in ("per_channel", "symmetric_acts", "equalize", "absorb_bias", "bias_correction"):
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
        if not isinstance(self.layer_dtypes, dict):
            raise ConfigError(f"QuantConfig.layer_dtypes must be a dict of module name -> 'int8' or 'int16', "
                              f"got {type(self.layer_dtypes).__name__}")
        for key, dtype in self.layer_dtypes.items():
            if not isinstance(key, str) or not key or dtype not in ACT_DTYPES:
                raise ConfigError(f"QuantConfig.layer_dtypes maps a module's qualified name to 'int8' or 'int16', "
                                  f"got {key!r}: {dtype!r}")
        if not _is_int(self.auto_int16) or self.auto_int16 < 0:
            raise ConfigError(f"QuantConfig.auto_int16 is how many layers to promote to int16, an integer >= 0; "
                              f"got {self.auto_int16!r}")
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float, np.integer, np.floating)) \
                or not 50 < self.percentile <= 100:
            raise ConfigError(f"QuantConfig.percentile is the percentile of each tail to clip at, a number in "
                              f"(50, 100]; got {self.percentile!r}")
        if self.smooth is not None and (isinstance(self.smooth, bool) or not isinstance(
                self.smooth, (int, float, np.integer, np.floating)) or not 0 <= self.smooth <= 1):
            raise ConfigError(f"QuantConfig.smooth is SmoothQuant's migration strength alpha, a number in [0, 1] "
                              f"(or None: off); got {self.smooth!r}")
        if self.absorb_bias and not self.equalize:
            raise ConfigError("QuantConfig.absorb_bias moves biases between the layer pairs that equalization "
                              "finds: it needs equalize=True")
        if self.mode == "dynamic" and self.observer != "minmax":
            raise ConfigError(f"QuantConfig.observer={self.observer!r} sets ranges from calibration data: it needs "
                              "mode='static' (dynamic mode takes each activation's range at run time)")
        if self.mode == "dynamic" and (self.act_dtype != "int8" or self.layer_dtypes or self.auto_int16):
            raise ConfigError("int16 activations are static: act_dtype, layer_dtypes and auto_int16 need mode='static'")

    def act_dtype_of(self, module_paths: list[str]) -> str:
        """The activation dtype of an op inside the modules ``module_paths`` (outermost first)."""
        for path in reversed(module_paths):
            if path in self.layer_dtypes:
                return self.layer_dtypes[path]
        return self.act_dtype

    def __hash__(self) -> int:
        return hash((self.mode, self.per_channel, self.act_qmin, self.act_qmax, self.symmetric_acts,
                     self.weight_qmin, self.weight_qmax, self.granularity, tuple(sorted(self.fixed.items())), self.fallback,
                     self.act_dtype, tuple(sorted(self.layer_dtypes.items())), self.auto_int16, self.observer,
                     self.percentile, self.weight_observer, self.equalize, self.absorb_bias, self.bias_correction,
                     self.smooth))

    @property
    def rewrites_weights(self) -> bool:
        """Whether the float graph's weights are rewritten before quantization (equalize, smooth,
        bias_correction): these need the BatchNorms folded first."""
        return self.equalize or self.bias_correction or self.smooth is not None
