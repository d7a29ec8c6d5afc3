"""Scalars read out of constants (``.item()``) are constants too (issue 25: YOLO11n was refused).

ultralytics' Detect head builds its anchor strides with ``torch.full(shape, stride.item())``, which
torch.export records as ``new_full`` of an activation (only its shape and dtype are read) filled with
``_local_scalar_dense`` of a constant buffer: the importer refused the scalar ("a constant expression
that doesn't produce a tensor"). Both are computed from constants: they are folded, and a scalar that a
run-time op reads is that op's literal operand.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import qlower
from qlower.frontend.capture import export_module

SEED = 0


class StrideAnchors(nn.Module):
    """Scales boxes by strides made as YOLO makes them: ``new_full`` of an activation's shape filled
    with a stride read out of a buffer; and scales once more by a buffer's ``.item()`` directly."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.register_buffer("stride", torch.tensor([8.0, 16.0]))
        self.register_buffer("gain", torch.tensor(0.75))

    def forward(self, x):
        y = self.conv(x).flatten(2).transpose(1, 2)  # (1, h*w, 4)
        strides = y.new_full((y.shape[1], 1), self.stride[1].item())
        return (y * strides) * self.gain.item()


def _batches(n: int = 3) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(SEED)
    return [(torch.randn(1, 3, 4, 5, generator=g),) for _ in range(n)]


def test_new_full_of_an_items_value_is_a_constant():
    torch.manual_seed(SEED)
    gm = export_module(StrideAnchors().eval(), _batches(1)[0], static=True)
    kinds = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("new_full" in k for k in kinds), kinds  # folded into a constant


def test_a_model_reading_item_of_constants_compiles_and_computes_it():
    torch.manual_seed(SEED)
    model = StrideAnchors().eval()
    batches = _batches()
    want = None
    for target in ("reference", "cpu", "tosa-1.0+int"):
        prog = qlower.compile(model, batches[0], target=target, calibration=batches, progress=False)
        got = prog.run(*batches[1])[0]
        want = got if want is None else want
        np.testing.assert_array_equal(got, want, err_msg=target)
    with torch.no_grad():
        eager = model(*batches[1]).numpy()
    # within two int8 steps of the output's range: the strides and the gain were applied
    assert np.abs(want - eager).max() <= 2 * (eager.max() - eager.min()) / 255
