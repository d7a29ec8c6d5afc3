"""QAT fake-quants whose on/off switches are Python booleans, so torch.export can capture a prepared model.

torchao's ``FakeQuantize`` keeps its switches ``observer_enabled`` and ``fake_quant_enabled`` as uint8
buffers and its forward branches on their values. That is a branch on tensor data: ``torch.export``
refuses it (``GuardOnDataDependentSymNode``), so a ``prepare_qat`` model could be trained and compiled
(compile converts it first) but not exported again, as the frontend's ``capture`` and
``qlower.sensitivity`` do. Here forward reads Python booleans instead; export captures the branch the
switches select when it runs (as it captures ``.train()`` / ``.eval()``).

The buffers stay: a state dict holds them as torchao's does, and loading one sets the booleans from them.
The switching methods (``enable_observer``, ``disable_fake_quant``, ...; torchao's module-level helpers of
the same names call them) set both. Writing a buffer directly leaves the boolean as it was: use the methods.
"""

from __future__ import annotations

import torch
from torchao.quantization.pt2e.fake_quantize import FakeQuantize, FixedQParamsFakeQuantize


class ExportableFakeQuantize(FakeQuantize):
    """torchao's ``FakeQuantize`` (same observers, same arithmetic, same state dict) with forward branching
    on ``observing`` / ``fake_quantizing``, Python mirrors of ``observer_enabled`` / ``fake_quant_enabled``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sync_switches()

    def sync_switches(self) -> None:
        """The Python switches set from the buffers (after construction and after loading a state dict)."""
        self.observing = bool(self.observer_enabled[0])
        self.fake_quantizing = bool(self.fake_quant_enabled[0])

    def enable_observer(self, enabled: bool = True) -> None:
        super().enable_observer(enabled)
        self.observing = bool(enabled)

    def enable_fake_quant(self, enabled: bool = True) -> None:
        super().enable_fake_quant(enabled)
        self.fake_quantizing = bool(enabled)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.sync_switches()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.observing:
            self.activation_post_process(x.detach())
            scale, zero_point = self.calculate_qparams()
            if self.scale.shape != scale.shape:
                self.scale.resize_(scale.shape)
                self.zero_point.resize_(zero_point.shape)
            self.scale.copy_(scale.to(self.scale.device))
            self.zero_point.copy_(zero_point.to(self.zero_point.device))
        if not self.fake_quantizing:
            return x
        qmin, qmax = self.activation_post_process.quant_min, self.activation_post_process.quant_max
        if self.is_per_channel:
            return torch.fake_quantize_per_channel_affine(x, self.scale, self.zero_point, self.ch_axis, qmin, qmax)
        return torch.fake_quantize_per_tensor_affine(x, self.scale, self.zero_point, qmin, qmax)


class ExportableFixedQParamsFakeQuantize(ExportableFakeQuantize, FixedQParamsFakeQuantize):
    """torchao's ``FixedQParamsFakeQuantize`` (a pinned scale and zero point) with the Python switches."""
