"""Bias correction removes the mean shift weight quantization causes, shrunk by its standard error, and
equalization zeroes the kernel taps that read only padding (issue 28 §2).

Each expected number is computed here from the definitions (means, the standard error of per-sample
means, a gradient), never read back from the code under test.
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


def _shrunk_mean(shifts: torch.Tensor) -> torch.Tensor:
    """Per channel of ``[samples, channels]``: the mean, times ``max(0, 1 - se²/mean²)`` (positive-part
    James-Stein, ``se`` the standard error of the mean over the samples)."""
    mean, se2 = shifts.mean(0), shifts.var(0) / len(shifts)
    return mean * torch.where(mean == 0, torch.zeros_like(mean), (1 - se2 / mean ** 2).clamp_min(0))


def test_bias_correction_leaves_a_shift_within_noise_alone():
    """Rows 0-3 of a linear layer read inputs with a mean (2): their weight error shifts them, clearly.
    Rows 4-7 read zero-mean inputs of spread 3: no shift in expectation, but 8 calibration samples give
    their mean a large random value. Subtracting it (the unshrunk correction) adds error on held-out
    inputs; shrunk by its standard error it adds much less, while rows 0-3 are corrected alike."""
    g = _gen()
    fc = nn.Linear(16, 8)
    with torch.no_grad():
        fc.weight.normal_(0, 1, generator=g)
        fc.weight[:4, 4:] = 0
        fc.weight[4:, :4] = 0
        fc.weight[:4] *= 0.1  # small rows: 4-bit per-tensor steps move them most

    def inputs(n: int) -> torch.Tensor:
        x = 3 * torch.randn(n, 16, generator=g)
        x[:, :4] = 2 + 0.1 * torch.randn(n, 4, generator=g)
        return x

    x, held_out = inputs(8), inputs(2000)
    batches = [(x[i:i + 1],) for i in range(len(x))]
    w, bias = fc.weight.detach(), fc.bias.detach()
    w_q = fake_quantize_weight(w, weight_observer("minmax", False), None, -7, 7)
    shifts = F.linear(x, w_q) - F.linear(x, w)
    gm = export_module(nn.Sequential(fc).eval(), batches[0], static=True)
    assert correct_biases(gm, batches, QuantConfig(**W4)) == 1
    new = dict(gm.named_parameters())["0.bias"].detach()
    torch.testing.assert_close(new, bias - _shrunk_mean(shifts).float(), rtol=0, atol=1e-6)

    want = F.linear(held_out, w, bias)
    error = {name: ((F.linear(held_out, w_q, b) - want) ** 2).mean(0)
             for name, b in (("none", bias), ("unshrunk", bias - shifts.mean(0)), ("shrunk", new))}
    assert float(error["shrunk"][:4].sum()) < 0.01 * float(error["none"][:4].sum())  # the clear shift: removed
    noise = {name: float(e[4:].sum()) for name, e in error.items()}
    assert noise["unshrunk"] > 1.1 * noise["none"], noise  # the noise rows: the plain mean makes things worse
    assert noise["shrunk"] < noise["none"] + 0.5 * (noise["unshrunk"] - noise["none"]), noise


class Gated(nn.Module):
    """conv -> hardswish -> squeeze-excitation gate (pool, 1x1 conv, hardsigmoid, multiply) -> 1x1 conv: the
    first layer's weight error gains a mean shift through the hardswish and the gate that no correction of
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


def test_bias_correction_removes_each_layers_shift_with_the_layers_above_quantized():
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
            want[k] = biases[k] - _shrunk_mean((q - floats[i]).mean((2, 3))).to(biases[k].dtype)
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
