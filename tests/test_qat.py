"""qlower.prepare_qat: train with fake-quants, compile with the learned scales (issue 28 §4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlower
from qlower.errors import ConfigError
from qlower.frontend.qat import freeze_batch_norms, freeze_ranges, fuse_conv_bn
from qlower.reference import run_graph


class ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = F.relu6(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.fc(y.mean((2, 3)))


def _model() -> ConvBn:
    torch.manual_seed(0)
    m = ConvBn()
    with torch.no_grad():
        for bn in (m.bn1, m.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    return m.eval()


def test_conv_bn_fuse_keeps_the_float_function():
    """The training rewrite conv(x, w*s)/s [+b] -> bn computes what conv -> bn computes."""
    m, x = _model(), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    gm = torch.export.export(m, (x,)).module()
    assert len(fuse_conv_bn(gm)) == 2
    torch.testing.assert_close(gm(x), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quant", [qlower.QuantConfig(per_channel=False),
                                   qlower.QuantConfig(act_qmin=-100, act_qmax=100)])
def test_trained_qat_model_compiles_bit_exact_with_its_learned_scales(quant):
    g = torch.Generator().manual_seed(2)
    x_train = torch.randn(32, 3, 8, 8, generator=g)
    y_train = torch.randint(0, 4, (32,), generator=g)
    example = (x_train[:1],)
    qat = qlower.prepare_qat(_model(), example, quant, calibration=[(x_train[:16],)])
    opt = torch.optim.SGD(qat.parameters(), lr=0.05)
    before = [p.detach().clone() for p in qat.parameters()]
    qat.train()
    for step in range(4):  # batches of 8: another batch size than the example's
        opt.zero_grad()
        F.cross_entropy(qat(x_train[step * 8:(step + 1) * 8]), y_train[step * 8:(step + 1) * 8]).backward()
        opt.step()
    qat.eval()
    assert not all(torch.equal(a, b) for a, b in zip(before, qat.parameters()))  # it trained
    tests = [torch.randn(1, 3, 8, 8, generator=g) for _ in range(3)]
    with torch.no_grad():
        qat_out = [qat(t).numpy() for t in tests]
    for target in ("reference", "tosa-1.0+int", "tflm"):
        prog = qlower.compile(qat, example, target=target, progress=False)
        specs = [v.quant for op in prog.canonical.ops for v in op.results if v.quant is not None]
        if not quant.per_channel:
            assert all(len(q.scale) == 1 for q in specs if q.dtype.name == "INT8")
        assert any(q.qmin == quant.act_qmin and q.qmax == quant.act_qmax for q in specs)
        for t, expected in zip(tests, qat_out):
            out = prog.run(t)[0]
            np.testing.assert_array_equal(out, run_graph(prog.source, [t.numpy()])[0])
            # the program computes what the trained QAT model computes, up to a few output steps
            assert np.abs(out - expected).max() < 0.05 * np.abs(expected).max() + 1e-3


def test_prepare_qat_refuses_dynamic_quantization():
    with pytest.raises(ConfigError, match="static"):
        qlower.prepare_qat(_model(), (torch.randn(1, 3, 8, 8),), qlower.QuantConfig(mode="dynamic"))


@pytest.mark.parametrize("quant", [qlower.QuantConfig(observer="histogram"), qlower.QuantConfig(equalize=True),
                                   qlower.QuantConfig(bias_correction=True), qlower.QuantConfig(smooth=0.5)])
def test_prepare_qat_refuses_what_only_post_training_quantization_does(quant):
    """Calibration observers and weight rewrites are PTQ's: QAT would ignore them, so it names them."""
    with pytest.raises(ConfigError, match="silently ignore"):
        qlower.prepare_qat(_model(), (torch.randn(1, 3, 8, 8),), quant)


def test_frozen_batch_norms_train_on_running_statistics_as_deployment_folds():
    x = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(3))

    def prepared():
        qat = freeze_ranges(qlower.prepare_qat(_model(), (x[:1],), qlower.QuantConfig(), calibration=[(x,)]))
        qat.eval()
        with torch.no_grad():
            return qat, qat(x)

    qat, expected = prepared()
    qat.train()
    with torch.no_grad():
        assert not torch.allclose(qat(x), expected, atol=1e-4)  # batch statistics: another function
    qat, expected = prepared()
    stats = {k: b.clone() for k, b in qat.named_buffers() if "running" in k}
    assert len(stats) == 4
    freeze_batch_norms(qat)
    qat.train()  # stays frozen through train()
    out = qat(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()  # a training step's forward leaves the running statistics alone
    assert all(torch.equal(b, dict(qat.named_buffers())[k]) for k, b in stats.items())
