"""Bias correction removes the offset weight quantization adds, not the attenuation (issue 28 §2), and
equalization zeroes the kernel taps that read only padding.

Each expected number is computed here from the definitions (least squares, the standard error of
per-sample means, a gradient), never read back from the code under test.
"""

import torch
from torch import nn
from torch.nn import functional as F

from qlower import QuantConfig
from qlower.frontend.bias_correction import correct_biases
from qlower.frontend.capture import export_module
from qlower.frontend.equalization import zero_unread_taps
from qlower.frontend.observers import fake_quantize_weight, weight_observer

SEED = 28
W4 = dict(per_channel=False, weight_qmin=-7, weight_qmax=7, bias_correction=True)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


def _shrunk_offset(f: torch.Tensor, q: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Per channel (dim 1) of ``[samples, channels, ...]``: the least-squares offset of ``q - beta`` against
    ``f - beta``, shrunk by its standard error over the samples' means (positive-part James-Stein)."""
    shape = (1, -1) + (1,) * (f.dim() - 2)
    fs, qs = (f.double() - beta.double().reshape(shape)), (q.double() - beta.double().reshape(shape))
    flat_f, flat_q = (t.transpose(0, 1).reshape(t.shape[1], -1) for t in (fs, qs))
    fc, qc = flat_f - flat_f.mean(1, keepdim=True), flat_q - flat_q.mean(1, keepdim=True)
    gain = (fc * qc).sum(1) / (fc * fc).sum(1)
    offset = flat_q.mean(1) - gain * flat_f.mean(1)
    per_sample = (qs - gain.reshape(shape) * fs).reshape(f.shape[0], f.shape[1], -1).mean(2)
    se2 = per_sample.var(0) / f.shape[0]
    return offset * (1 - se2 / offset.pow(2).clamp_min(1e-300)).clamp_min(0)  # (a zero offset stays 0)


class Attenuated(nn.Module):
    """A linear layer (no bias) whose 4-bit per-tensor weights are an exact 0.8x copy in rows 1..: row 0
    holds the range (7 steps, exact), every other weight is 1.25 steps and rounds to 1 — all attenuation,
    no offset: the quantized output is 0.8x the float one, positive exactly where it is."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 6)
        step = 0.05
        signs = torch.where(torch.rand(6, 8, generator=_gen()) < 0.5, -1.0, 1.0)
        with torch.no_grad():
            self.fc.weight.copy_(1.25 * step * signs)
            self.fc.weight[0] = 7 * step * signs[0]
            self.fc.bias.zero_()

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_bias_correction_leaves_an_attenuated_layer_without_offset_alone():
    """The old correction (the mean of q - f) re-added 0.2 x the calibration mean of the signal to the
    bias, moving the ReLU's threshold: held-out inputs then switch channels on and off that the float
    model doesn't. The offset of q against f is 0 here, so nothing is corrected and the ReLU pattern
    stays the float one's."""
    model = Attenuated().eval()
    g = _gen()
    batches = [(torch.randn(1, 8, generator=g) + 1.0,) for _ in range(16)]
    held_out = torch.randn(512, 8, generator=g) + 1.0
    w, bias = model.fc.weight.detach(), model.fc.bias.detach()
    w_q = fake_quantize_weight(w, weight_observer("minmax", False), None, -7, 7)
    torch.testing.assert_close(w_q[1:], 0.8 * w[1:], rtol=0, atol=1e-7)  # the construction holds
    x = torch.cat([b[0] for b in batches])
    old_bias = bias - (F.linear(x, w_q, bias) - F.linear(x, w, bias)).mean(0)

    gm = export_module(model, batches[0], static=True)
    assert correct_biases(gm, batches, QuantConfig(**W4)) == 1
    new_bias = dict(gm.named_parameters())["fc.bias"].detach()

    assert float((old_bias - bias).abs().max()) > 0.02
    torch.testing.assert_close(new_bias, bias, rtol=0, atol=1e-6)

    def relu_pattern(b: torch.Tensor) -> torch.Tensor:
        return F.linear(held_out, w_q, b) > 0

    want = F.linear(held_out, w, bias) > 0
    flips_old = int((relu_pattern(old_bias) != want).sum())
    flips_new = int((relu_pattern(new_bias) != want).sum())
    assert flips_new == 0 and flips_old > 20, (flips_old, flips_new)


class Gated(nn.Module):
    """conv -> hardswish -> squeeze-excitation gate (pool, 1x1 conv, hardsigmoid, multiply) -> 1x1 conv: the
    first layer's weight error gains an offset through the hardswish and the gate that no correction of
    the last layer on float inputs sees."""

    def __init__(self):
        super().__init__()
        self.a, self.s, self.b = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 6, 1)
        with torch.no_grad():
            self.a.weight.mul_(torch.logspace(-2, 0, 8)[:, None, None, None])

    def forward(self, x):
        return _gated(x, {k: (getattr(self, k).weight, getattr(self, k).bias) for k in "asb"})[-1]


def _gated(x, layers) -> list[torch.Tensor]:
    ya = F.conv2d(x, *layers["a"], padding=1)
    h = F.hardswish(ya)
    ys = F.conv2d(F.adaptive_avg_pool2d(h, 1), *layers["s"])
    yb = F.conv2d(h * F.hardsigmoid(ys), *layers["b"])
    return [ya, ys, yb]


def test_bias_correction_removes_each_layers_offset_with_the_layers_above_quantized():
    torch.manual_seed(SEED)
    model = Gated().eval()
    g = _gen()
    batches = [(torch.randn(1, 8, 6, 6, generator=g) + 0.5,) for _ in range(12)]
    x = torch.cat([b[0] for b in batches])
    gm = export_module(model, batches[0], static=True)
    assert correct_biases(gm, batches, QuantConfig(**W4)) == 3
    corrected = {k: dict(gm.named_parameters())[f"{k}.bias"].detach() for k in "asb"}

    ctr = weight_observer("minmax", False)
    weights = {k: getattr(model, k).weight.detach() for k in "asb"}
    biases = {k: getattr(model, k).bias.detach() for k in "asb"}
    quantized = {k: fake_quantize_weight(weights[k], ctr, None, -7, 7) for k in "asb"}
    with torch.no_grad():
        floats = _gated(x, {k: (weights[k], biases[k]) for k in "asb"})
        want = dict(biases)
        for i, k in enumerate("asb"):  # in graph order, each against the corrected layers above it
            q = _gated(x, {j: (quantized[j], want[j] if j != k else biases[j]) for j in "asb"})[i]
            want[k] = biases[k] - _shrunk_offset(floats[i], q, biases[k]).to(biases[k].dtype)
        assert float((want["a"] - biases["a"]).abs().max()) > 1e-3  # something to correct
        for k in "asb":
            torch.testing.assert_close(corrected[k], want[k], rtol=0, atol=1e-5)


def test_unread_taps_are_zeroed_and_the_function_kept():
    """A 5x5 conv on a 2x2 map (padding 2, stride 2) and a dilated 3x3 conv on a 1x1 map: the taps that
    read only padding are those with a zero weight gradient; zeroing them changes no output."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.dw = nn.Conv2d(4, 4, 5, stride=2, padding=2, groups=4)
            self.pw = nn.Conv2d(4, 3, 3, padding=2, dilation=2)

        def forward(self, x):
            return self.pw(torch.relu(self.dw(x)))

    torch.manual_seed(SEED)
    model = Net().eval()
    x = torch.randn(2, 4, 2, 2, generator=_gen())
    out = model(x)
    (out * torch.randn(out.shape, generator=_gen())).sum().backward()
    read = {k: getattr(model, k).weight.grad.abs().sum((0, 1)) > 0 for k in ("dw", "pw")}
    assert 0 < int(read["dw"].sum()) < 25 and int(read["pw"].sum()) == 1  # something to zero in both

    gm = export_module(model, (x,), static=True)
    assert zero_unread_taps(gm) == 2
    params = dict(gm.named_parameters())
    for k in ("dw", "pw"):
        w, old = params[f"{k}.weight"].detach(), getattr(model, k).weight.detach()
        torch.testing.assert_close(w, torch.where(read[k], old, torch.zeros_like(old)), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)
