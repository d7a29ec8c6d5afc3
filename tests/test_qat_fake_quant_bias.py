"""The fake-quant model adds a conv's bias as deployment does, int32 codes at s_in * s_w (bias_rounding.py):
where the output's scale is much finer than the accumulator's, the float bias alone put the reference
many steps from the fake-quant model, and verify's one-step bound failed."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from torch import nn

import qlower
from qlower.frontend import pt2e_input
from qlower.verification import verify_program

capture = importlib.import_module("qlower.frontend.capture")  # (qlower.frontend.capture is also a function)
W4 = qlower.QuantConfig(per_channel=False, weight_qmin=-7, weight_qmax=7)


class CoarseAccumulator(nn.Module):
    """A 1x1 conv whose 4-bit per-tensor weight scale is set by one large weight on an input channel that
    stays near 0, so the output (mostly the small bias) has a scale ~30x finer than s_in * s_w."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.conv = nn.Conv2d(2, 6, 1)
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.weight[0, 0, 0, 0] = 10.0
            self.conv.weight[:, 1, 0, 0] = 0.02 * torch.randn(6, generator=g)
            self.conv.bias.copy_(0.05 * (torch.rand(6, generator=g) * 2 - 1))

    def forward(self, x):
        return self.conv(x)


def _inputs(n: int, seed: int) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.rand(1, 2, 4, 4, generator=g) * 2 - 1
        x[:, 0] *= 1e-3
        out.append((x,))
    return out


def _verified(prog) -> tuple[float, bool]:
    """verify's largest step between a layer of the reference and of fake-quant on the same inputs (its
    one-step bound), and whether verify found no problem."""
    report = verify_program(prog, _inputs(2, 1))
    steps = [r.isolated_vs_fake_quant.max_steps for r in report.layers if r.isolated_vs_fake_quant is not None]
    assert steps, report.table()
    return max(steps), report.ok


def _qat_model(model: nn.Module):
    qat = qlower.prepare_qat(model, _inputs(1, 0)[0], W4, calibration=_inputs(4, 0))
    return qat.eval()


@pytest.mark.parametrize("path", ["calibrated", "qat"])
def test_fake_quant_rounds_the_bias_as_deployment_so_verify_holds_one_step(path, monkeypatch):
    model = CoarseAccumulator().eval()
    example = _inputs(1, 0)[0]

    def compile_():
        if path == "qat":
            return qlower.compile(_qat_model(model), example, "reference", progress=False, trace=True)
        return qlower.compile(model, example, "reference", W4, _inputs(4, 0), progress=False, trace=True)

    prog = compile_()
    (acc,) = [op for op in prog.source.ops if op.kind == "conv2d"]
    (out,) = [op.results[0] for op in prog.source.ops if op.kind == "rescale" and op.operands[0] is acc.results[0]]
    assert acc.results[0].quant.scale[0] > 10 * out.quant.scale[0]  # the coarse accumulator this test is about
    rounded = _verified(prog)

    with monkeypatch.context() as m:  # the float bias convert_pt2e leaves, as before bias_rounding.py
        m.setattr(capture, "round_biases", lambda gm: 0)
        m.setattr(pt2e_input, "round_biases", lambda gm: 0)
        float_bias = compile_()
    assert _verified(float_bias)[0] > 1  # the float bias: many steps off, verify reports it
    assert rounded[0] <= 1 and rounded[1]
    # the program deployed is the same either way: only the fake-quant model changed
    for (x,) in _inputs(3, 2):
        np.testing.assert_array_equal(prog.run(x)[0], float_bias.run(x)[0])
