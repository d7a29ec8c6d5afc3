"""A prepare_qat model exports with torch.export (its fake-quants branch on Python switches, not on buffers:
frontend/fake_quant.py), in learning and frozen states, computing exactly what the eager model computes;
a state dict restores the switches; a QAT model is never quantized a second time (issue 28's follow-ups)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchao.quantization.pt2e import MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver
from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase

import qlower
from qlower import zoo
from qlower.errors import ConfigError
from qlower.frontend.fake_quant import ExportableFakeQuantize, ExportableFixedQParamsFakeQuantize
from qlower.frontend.learned_scales import LearnedScaleFakeQuantize, learned_fake_quants
from qlower.frontend.qat import freeze_ranges
from qlower.reference import run_graph

W4 = qlower.QuantConfig(per_channel=False, weight_qmin=-7, weight_qmax=7)


def _exported(model, inputs: tuple) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(model, inputs, strict=False).module()


@pytest.mark.slow
def test_trained_qat_digits_cnn_exports_exactly_learning_and_frozen_and_compiles_bit_exact():
    """(The frontend's ``capture(qat, example, None, None)`` exports it as well, equal to eager, but takes
    20-40 s decomposing the fake-quant ops: not run here; ``compile`` converts a QAT model instead.)"""
    model, example, _, calibration = zoo.get("digits_cnn", trained=True)
    x_train, y_train, _, _ = zoo.digits.dataset()
    qat = qlower.prepare_qat(model, example, W4, calibration[:4])  # learned weight scales (LSQ)
    fqs = [m for m in qat.modules() if isinstance(m, FakeQuantizeBase)]
    assert fqs and all(isinstance(m, ExportableFakeQuantize) for m in fqs)
    assert len(learned_fake_quants(qat)) == 4 < len(fqs)  # the 4 weights learn; activations follow min/max
    opt = torch.optim.Adam(qat.parameters(), lr=1e-3)
    qat.train()
    for step in range(3):
        opt.zero_grad()
        F.cross_entropy(qat(x_train[step * 32:(step + 1) * 32]), y_train[step * 32:(step + 1) * 32]).backward()
        opt.step()
    qat.eval()
    (held_out,), _ = zoo.held_out("digits_cnn", "digits-hard")
    x, other = held_out[:8], held_out[8:16]
    with torch.no_grad():
        eager = qat(x)
    for state in ("learning", "frozen"):
        if state == "frozen":
            freeze_ranges(qat)
        assert all(fq.learned and fq.log_scale.requires_grad == (state == "learning") for fq in learned_fake_quants(qat))
        exported = _exported(qat, (x,))
        with torch.no_grad():  # the same numbers, bit for bit, on the export's inputs and on others
            assert torch.equal(exported(x), eager) and torch.equal(exported(other), qat(other))
            assert torch.equal(qat(x), eager)  # exporting left the model's state alone
    # the frontend's capture refuses to quantize it again (sensitivity would): its fake-quants are not float layers
    with pytest.raises(ConfigError, match="quantized already"):
        qlower.sensitivity(qat, example, calibration=calibration[:2], progress=False)
    prog = qlower.compile(qat, example, target="cpu", progress=False)
    step = next(op.operands[0].quant.scale[0] for op in reversed(prog.canonical.ops) if op.kind == "dequantize")
    for i in range(3):
        t = held_out[i:i + 1]
        out = prog.run(t)[0]
        np.testing.assert_array_equal(out, run_graph(prog.source, [t.numpy()])[0])
        assert np.abs(out - eager[i].numpy()).max() <= 2 * step + 1e-6  # the QAT model's logits, to two output steps


def _observed(per_channel: bool) -> LearnedScaleFakeQuantize:
    observer = MovingAveragePerChannelMinMaxObserver if per_channel else MovingAverageMinMaxObserver
    qscheme = torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric
    return LearnedScaleFakeQuantize(observer=observer, quant_min=-7, quant_max=7, dtype=torch.int8,
                                    qscheme=qscheme, weight=True, averaging_constant=1.0)


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_state_dict_restores_the_learned_and_enabled_switches(per_channel):
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
    trained = _observed(per_channel)
    trained(x)
    trained.start_learning()
    with torch.no_grad():
        trained.log_scale -= 0.4  # a learned scale, away from the observed min/max one
    learned = trained(x)
    fresh = _observed(per_channel)  # still observing: min/max of what it sees
    assert not fresh.learned and not torch.equal(fresh(x), learned)
    fresh = _observed(per_channel)
    fresh.load_state_dict(trained.state_dict())
    assert fresh.learned and torch.equal(fresh(x), learned)
    assert torch.equal(fresh.calculate_qparams()[0], trained.learned_scale())
    trained.disable_fake_quant()
    off = _observed(per_channel)
    off.load_state_dict(trained.state_dict())
    assert not off.fake_quantizing and torch.equal(off(x), x)
    back = _observed(per_channel)  # a state saved before learning puts a learning module back to observing
    back(x)
    before = {k: v.clone() for k, v in back.state_dict().items()}  # (a state dict shares the buffers)
    back.start_learning()
    back.load_state_dict(before)
    assert not back.learned and torch.equal(back(x), _observed(per_channel)(x))


def test_a_pinned_value_keeps_its_scale_through_export_and_compile():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh()).eval()
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    pinned = qlower.QuantConfig(fixed={"output": (1 / 128, 0, -128, 127)})
    qat = qlower.prepare_qat(model, (x[:1],), pinned, [(x,)], learn_scales="all").eval()
    fixed = [m for m in qat.modules() if isinstance(m, ExportableFixedQParamsFakeQuantize)]
    assert len(fixed) == 1 and float(fixed[0].scale) == 1 / 128
    with torch.no_grad():
        assert torch.equal(_exported(qat, (x,))(x), qat(x))
    prog = qlower.compile(qat, (x[:1],), progress=False)
    assert [op.operands[0].quant.scale for op in prog.canonical.ops if op.kind == "dequantize"] == [(1 / 128,)]
