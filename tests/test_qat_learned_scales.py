"""QAT with learned scales (LSQ, qlower.frontend.learned_scales): the scales train, compile writes exactly
the learned ones, and on a toy task they clip an outlier weight that min/max QAT can't (issue 28 §4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlower
from qlower.errors import ConfigError
from qlower.frontend.learned_scales import LearnedScaleFakeQuantize, learned_fake_quants, scale_parameters
from qlower.frontend.qat import freeze_ranges
from qlower.reference import run_graph

W4 = qlower.QuantConfig(per_channel=False, weight_qmin=-7, weight_qmax=7)
GEMMS = ("conv2d", "fully_connected")  # the IR ops whose operand 1 is a quantized weight


class ConvBnNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = F.relu6(self.bn(self.conv(x)))
        return self.fc(F.relu(self.dw(y)).mean((2, 3)))


def _trained(quant: qlower.QuantConfig, learn_scales: str):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 4, (32,), generator=g)
    qat = qlower.prepare_qat(ConvBnNet().eval(), (x[:1],), quant, [(x[:16],)], learn_scales=learn_scales)
    start = {id(fq): fq.learned_scale().clone() for fq in learned_fake_quants(qat)}
    opt = torch.optim.Adam([{"params": [p for p in qat.parameters() if all(p is not s for s in scale_parameters(qat))]},
                            {"params": scale_parameters(qat), "lr": 0.05}], lr=1e-3)
    qat.train()
    for step in range(4):
        opt.zero_grad()
        F.cross_entropy(qat(x[step * 8:(step + 1) * 8]), y[step * 8:(step + 1) * 8]).backward()
        opt.step()
    return qat.eval(), start, (x[:1],)


def test_learned_scales_move_and_compile_writes_them_bit_exactly_on_every_target_family():
    qat, start, example = _trained(W4, "all")
    fqs = learned_fake_quants(qat)
    weights = [fq for fq in fqs if fq.is_weight]
    assert len(weights) == 3 and len(fqs) > len(weights)  # activations learn too with "all"
    for fq in fqs:  # every scale trained away from its min/max initialisation; zero points stay integers
        assert not torch.equal(fq.learned_scale(), start[id(fq)])
        assert not fq.zero_point.dtype.is_floating_point and (not fq.is_weight or not fq.zero_point.any())
    learned = sorted(float(fq.learned_scale()) for fq in weights)
    activations = {float(fq.learned_scale()) for fq in fqs if not fq.is_weight}
    t = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = qat(t).numpy()
    for target in ("cpu", "tosa-1.0+int", "litert"):
        prog = qlower.compile(qat, example, target=target, progress=False)
        graph = prog.canonical
        compiled = sorted(op.operands[1].quant.scale[0] for op in graph.ops if op.kind in GEMMS)
        assert compiled == learned  # the program's weight scales are the learned parameters, bit for bit
        values = {q.scale[0] for op in graph.ops for v in op.results if (q := v.quant) is not None and q.axis is None}
        assert activations <= values
        out = prog.run(t)[0]
        np.testing.assert_array_equal(out, run_graph(prog.source, [t.numpy()])[0])
        assert np.abs(out - expected).max() <= 0.05 * np.abs(expected).max() + 1e-3


def test_per_channel_learned_weight_scales_are_the_compiled_ones():
    qat, start, example = _trained(qlower.QuantConfig(), "weights")
    weights = learned_fake_quants(qat)
    assert all(fq.is_weight for fq in weights) and sorted(fq.learned_scale().numel() for fq in weights) == [4, 8, 8]
    prog = qlower.compile(qat, example, target="reference", progress=False)
    graph = prog.canonical
    compiled = [np.array(op.operands[1].quant.scale) for op in graph.ops if op.kind in GEMMS]
    assert len(compiled) == 3
    for fq in weights:
        learned = fq.learned_scale().double().numpy()
        assert not np.array_equal(learned, start[id(fq)].double().numpy())
        assert any(c.shape == learned.shape and np.array_equal(c, learned) for c in compiled)


def _toy_error(learn_scales: str) -> tuple[float, float, float]:
    """A linear layer with 4-bit per-tensor weights that should compute a teacher's outputs: one teacher
    weight is an outlier (3.0, reading a feature 20x smaller than the others), the rest ~0.1. QAT from
    the teacher's weights, 150 Adam steps; returns (held-out mean squared error, final weight scale,
    initial weight scale)."""
    g = torch.Generator().manual_seed(28)
    teacher = 0.1 * torch.randn(4, 16, generator=g)
    teacher[0, 0] = 3.0
    feature_scale = torch.ones(16)
    feature_scale[0] = 0.05
    x_train, x_test = (torch.randn(n, 16, generator=g) * feature_scale for n in (512, 256))
    model = nn.Linear(16, 4, bias=False)
    with torch.no_grad():
        model.weight.copy_(teacher)
    qat = qlower.prepare_qat(model, (x_train[:1],), W4, [(x_train,)], learn_scales=learn_scales)
    weight_fq = next(m for m in qat.modules() if hasattr(m, "scale") and m.scale.numel() == 1
                     and m.activation_post_process.quant_max == 7)
    first = float(weight_fq.scale)
    opt = torch.optim.Adam([{"params": [p for p in qat.parameters() if all(p is not s for s in scale_parameters(qat))]},
                            {"params": scale_parameters(qat), "lr": 0.05}], lr=1e-3)
    qat.train()
    for step in range(150):
        index = torch.arange(step * 32, (step + 1) * 32) % len(x_train)
        opt.zero_grad()
        F.mse_loss(qat(x_train[index]), x_train[index] @ teacher.T).backward()
        opt.step()
    qat.eval()
    with torch.no_grad():
        error = float(F.mse_loss(qat(x_test), x_test @ teacher.T))
        scale = float(weight_fq.calculate_qparams()[0])
    return error, scale, first


def test_learned_weight_scale_clips_an_outlier_and_beats_min_max_qat():
    lsq, lsq_scale, lsq_first = _toy_error("weights")
    minmax, minmax_scale, minmax_first = _toy_error("none")
    assert lsq_first == pytest.approx(3.0 / 7, rel=1e-3) and minmax_first == pytest.approx(3.0 / 7, rel=1e-3)
    assert 7 * lsq_scale < 1.5  # the learned step clips the outlier weight to less than half of it
    assert 7 * minmax_scale > 2.5  # min/max keeps the outlier's range, so the small weights round to 0
    assert lsq < 0.1 * minmax, (lsq, minmax)


def test_learn_scales_option_is_validated_and_freeze_ranges_stops_learning():
    x = torch.randn(4, 3, 8, 8)
    for bad in ("weight", 1, None):
        with pytest.raises(ConfigError, match="learn_scales"):
            qlower.prepare_qat(ConvBnNet().eval(), (x[:1],), W4, learn_scales=bad)
    counts = {}
    for option in (True, False, "weights"):
        qat = qlower.prepare_qat(ConvBnNet().eval(), (x[:1],), W4, learn_scales=option)
        fqs = learned_fake_quants(qat)
        counts[option] = (len(fqs), sum(fq.is_weight for fq in fqs))
        assert qat.qlower_learn_scales == {True: "all", False: "none"}.get(option, option)
        assert all(isinstance(fq, LearnedScaleFakeQuantize) and fq.log_scale.requires_grad for fq in fqs)
        if fqs:
            freeze_ranges(qat)
            assert not any(p.requires_grad for p in scale_parameters(qat))
    assert counts[False] == (0, 0) and counts["weights"] == (3, 3)
    assert counts[True][1] == 3 and counts[True][0] > 3  # "all": the activations' scales too
