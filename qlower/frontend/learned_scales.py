"""Learned quantization step sizes for QAT (LSQ, Esser et al. 2020, "Learned Step Size Quantization").

A min/max fake-quant's scale follows the tensor's largest value: one outlier weight sets the step of a
whole per-tensor weight, and at 4 bits most of the other weights round to zero. ``LearnedScaleFakeQuantize``
makes the scale a parameter trained by the task loss instead, so training can trade clipping the outlier
against resolving the rest:

- forward ``y = (clamp(round(x / s) + z, qmin, qmax) - z) * s``, the rounding a straight-through estimator;
  the gradient reaching ``s`` is LSQ's (``-x/s + round(x/s)`` inside the range, ``qmin - z`` / ``qmax - z``
  where clipped), multiplied by LSQ's ``1 / sqrt(n * qmax)`` (``n``: elements per scale);
- ``s = exp(log_scale)``: positive whatever the optimizer does, and an optimizer step moves it by a
  relative amount, so a per-channel scale of 1e-4 and a per-tensor one of 0.1 learn at one rate (give
  ``scale_parameters(model)`` their own learning rate: a log-scale step of 0.01 is a 1% change);
- the zero point stays the integer the observer chose at initialisation (0 for symmetric weights): only
  the step is learned;
- initialised from its observer (min/max) over ``prepare_qat``'s calibration batches, then never observes
  again; ``freeze_ranges`` stops the learning (``requires_grad`` off);
- whether it learns yet is the Python boolean ``learned`` (forward branches on it, so torch.export can
  capture the module: fake_quant.py), mirrored in the ``learning`` buffer so a state dict carries it.

``calculate_qparams`` returns ``exp(log_scale)`` as float32, which is what torchao's ``convert_pt2e`` writes
into the q/dq nodes ``qlower.compile`` imports: the program's scale is the learned one, bit for bit.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from qlower.frontend.fake_quant import ExportableFakeQuantize


class _RoundSte(torch.autograd.Function):
    """``torch.round`` (half to even, as ``quantize_per_tensor``) with the identity as its gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad


class LearnedScaleFakeQuantize(ExportableFakeQuantize):
    """A fake-quant whose scale is the parameter ``log_scale`` (see the module docstring). The ``scale``
    and ``zero_point`` buffers of ``FakeQuantize`` hold the current values after every forward."""

    def __init__(self, observer=None, quant_min: int | None = None, quant_max: int | None = None,
                 weight: bool = False, **observer_kwargs) -> None:
        super().__init__(observer=observer, quant_min=quant_min, quant_max=quant_max, **observer_kwargs)
        self.is_weight = weight  # LSQ's n: a weight's elements per scale, an activation's per sample
        self.log_scale = nn.Parameter(torch.zeros(1))
        self.register_buffer("learning", torch.tensor([0], dtype=torch.uint8))
        self.learned = False

    def start_learning(self) -> None:
        """The observed scale becomes the parameter's initial value; observation stops for good."""
        scale, zero_point = self.activation_post_process.calculate_qparams()
        scale = scale.detach().float().clamp_min(torch.finfo(torch.float32).tiny)
        self.log_scale = nn.Parameter(torch.log(scale).reshape(-1))
        self.scale.resize_(self.log_scale.shape).copy_(self.learned_scale())
        self.zero_point.resize_(zero_point.shape).copy_(zero_point)
        self.learning[0] = 1
        self.learned = True

    def sync_switches(self) -> None:
        super().sync_switches()
        if hasattr(self, "learning"):  # (the base constructor syncs before this buffer exists)
            self.learned = bool(self.learning[0])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # noqa: ANN001
        log_scale = state_dict.get(prefix + "log_scale")
        if isinstance(log_scale, torch.Tensor) and log_scale.shape != self.log_scale.shape:
            self.log_scale = nn.Parameter(torch.empty_like(log_scale))  # per-channel: one per channel
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def learned_scale(self) -> torch.Tensor:
        return torch.exp(self.log_scale.detach())

    @torch.jit.export
    def calculate_qparams(self):
        if not self.learned:
            return self.activation_post_process.calculate_qparams()
        return self.learned_scale(), self.zero_point.clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.learned:
            return super().forward(x)  # initialisation: observe and fake-quantize at the observed scale
        scale = torch.exp(self.log_scale)
        with torch.no_grad():
            self.scale.copy_(scale)
        if not self.fake_quantizing:
            return x
        qmin, qmax = self.activation_post_process.quant_min, self.activation_post_process.quant_max
        shape = [1] * x.dim()
        if self.is_per_channel:
            shape[self.ch_axis] = -1
            per_scale = x.numel() // max(scale.numel(), 1)
        else:
            per_scale = x.numel() if self.is_weight or x.dim() < 2 else x.numel() // x.shape[0]
        g = 1.0 / math.sqrt(max(per_scale, 1) * max(qmax, 1))
        scale = scale.detach() + (scale - scale.detach()) * g  # the value of s, the gradient times g
        scale, zero_point = scale.reshape(shape), self.zero_point.reshape(shape).to(x.dtype)
        inverse = 1.0 / scale  # as quantize_per_tensor / fake_quantize_per_tensor_affine: x * (1 / s)
        q = torch.clamp(_RoundSte.apply(x * inverse) + zero_point, qmin, qmax)
        return (q - zero_point) * scale

    def stop_learning(self) -> None:
        self.log_scale.requires_grad_(False)

    def extra_repr(self) -> str:
        return f"learned={self.learned}, " + super().extra_repr()


def learned_fake_quants(model: nn.Module) -> list[LearnedScaleFakeQuantize]:
    return [m for m in model.modules() if isinstance(m, LearnedScaleFakeQuantize)]


def scale_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The learned (log) scales of a ``prepare_qat(..., learn_scales=...)`` model, for an optimizer
    parameter group of their own (a log-scale learning rate is a relative change per step)."""
    return [m.log_scale for m in learned_fake_quants(model)]
