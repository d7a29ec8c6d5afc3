"""Per-op import: small models, quantized (vs the fake-quant model, in codes) and float (vs eager).

Quantized: the IR, run by the reference interpreter, must be within one
quantization step of the converted PT2E model at the outputs (both quantized
with the output's QuantSpec) and at every quantized layer with its inputs
teacher-forced to PyTorch's codes, with at least 99% of elements exact.
Float: the IR must match the eager model to 1e-4 of the output's magnitude.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qlower.frontend import QuantConfig, capture_and_import
from qlower.ir import verify_graph
from qlower.reference import run_graph
from qlower.testing.frontend import fake_quant_agreement, float_error


def _batches(shapes, count: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(*s, generator=g) for s in shapes) for _ in range(count)]


class ConvReluCat(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv_y = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(3, 4, 1, bias=False)
        self.conv2 = nn.Conv2d(10, 5, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.cat((F.relu(self.conv1(x)), self.conv_y(x)), dim=1))


class LinearTokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 16), nn.Linear(16, 6, bias=False)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = F.relu(self.a(x) + self.b(x))
        return y - self.c(x) + 0.25


class MulPerChannel(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("gain", torch.tensor([0.5, -1.25, 2.0, 0.0, 3.0]).reshape(1, 5, 1, 1))
        self.conv, self.other = nn.Conv2d(3, 5, 3, padding=1), nn.Conv2d(3, 5, 1)

    def forward(self, x):
        y = self.conv(x) * self.gain
        return (y * self.other(x)) / 4.0 * 0.75


class Pools(nn.Module):
    def forward(self, x):
        a = F.max_pool2d(x, 3, 2, 1, ceil_mode=True)
        b = F.avg_pool2d(x, 3, 2, 1)                       # count_include_pad
        c = F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
        d = F.adaptive_avg_pool2d(x, (2, 2))
        e = x.mean(dim=(2, 3), keepdim=True)
        return a, b, c, d, e, x.mean(dim=1)


class Pointwise(nn.Module):
    """``fn`` straight on the quantized input: the table is then the only rounding, and must be exact.
    (After a conv, a 1-step input difference can move a steep ``fn`` by 2 output steps; the
    teacher-forced layer comparison covers that case.)"""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn, self.conv = fn, nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.fn(x * 3.0), self.fn(self.conv(x))


class Softmaxes(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.conv = nn.Linear(8, 8), nn.Linear(8, 8), nn.Conv2d(3, 6, 1)

    def forward(self, tokens, image):
        scores = torch.matmul(self.q(tokens), self.k(tokens).transpose(1, 2)) * 0.5
        return torch.softmax(scores, dim=-1), torch.softmax(self.conv(image), dim=1)


class ReshapeChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.fc, self.conv2 = nn.Conv2d(3, 6, 3, padding=1), nn.Linear(6, 6), nn.Conv2d(6, 4, 1)

    def forward(self, x):
        n, _, h, w = x.shape
        y = self.conv1(x).view(n, 6, h * w).permute(0, 2, 1)       # [N, HW, C]
        y = self.fc(y).transpose(1, 2).reshape(n, 6, h, w)
        return self.conv2(y).flatten(1)


class Conv1dModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv1d(4, 6, 3, padding=1), nn.Conv1d(6, 5, 4, stride=2, dilation=2, bias=False)

    def forward(self, x):
        return self.b(F.relu6(self.a(x)))


class SameEvenKernel(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 2, padding="same")
        self.b = nn.Conv2d(4, 4, (4, 3), padding="same", dilation=(1, 2))

    def forward(self, x):
        return self.b(self.a(x))


class SliceStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.a(x)[:, 1:7:2, ::2, 1:]
        return self.b(y), y[:, :, :, -2:].select(1, 0)


class Grouped(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=4)
        self.g2 = nn.Conv2d(8, 6, 3, padding=1, groups=2, bias=False)

    def forward(self, x):
        return self.g2(F.hardtanh(self.dw(x), -0.5, 1.5))


class Movement(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        z = torch.stack((y[:, 0], y[:, 1]), dim=1)               # [N, 2, H, W]
        p = F.pad(y, (1, 2, 0, -1), value=0.5)
        e = y[:, :1].expand(-1, 3, -1, -1)
        return z, p, torch.cat((e, y.clone()), dim=1).contiguous()


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], nn.Module]
    shapes: tuple[tuple[int, ...], ...]
    expect: tuple[str, ...] = ()  # IR op kinds the quantized import must use


CASES = [
    Case("conv_relu_cat", ConvReluCat, ((2, 3, 8, 8),), ("conv2d", "clamp", "concat", "rescale")),
    Case("linear", LinearTokens, ((2, 5, 12),), ("fully_connected", "clamp")),
    Case("add_sub", Residual, ((2, 4, 6, 6),), ("add", "sub", "clamp")),
    Case("mul_per_channel", MulPerChannel, ((2, 3, 6, 6),), ("mul",)),
    Case("pools", Pools, ((2, 3, 8, 8),), ("max_pool2d", "avg_pool2d", "pad", "reduce_sum")),
    Case("hardswish", lambda: Pointwise(F.hardswish), ((2, 3, 6, 6),), ("table",)),
    Case("hardsigmoid", lambda: Pointwise(F.hardsigmoid), ((2, 3, 6, 6),), ("table",)),
    Case("sigmoid", lambda: Pointwise(torch.sigmoid), ((2, 3, 6, 6),), ("table",)),
    Case("tanh", lambda: Pointwise(torch.tanh), ((2, 3, 6, 6),), ("table",)),
    Case("gelu", lambda: Pointwise(F.gelu), ((2, 3, 6, 6),), ("table",)),
    Case("gelu_tanh", lambda: Pointwise(lambda t: F.gelu(t, approximate="tanh")), ((2, 3, 6, 6),), ("table",)),
    Case("silu", lambda: Pointwise(F.silu), ((2, 3, 6, 6),), ("table",)),
    Case("exp", lambda: Pointwise(torch.exp), ((2, 3, 6, 6),), ("table",)),
    Case("softmax", Softmaxes, ((2, 6, 8), (2, 3, 5, 5)), ("reduce_max", "table", "intdiv")),
    Case("reshape_permute", ReshapeChain, ((2, 3, 4, 5),), ("reshape", "transpose")),
    Case("conv1d", Conv1dModel, ((2, 4, 17),), ("conv2d", "reshape")),
    Case("same_even_kernel", SameEvenKernel, ((2, 3, 7, 8),), ("conv2d",)),
    Case("slice_step", SliceStep, ((2, 3, 8, 8),), ("slice",)),
    Case("grouped", Grouped, ((2, 4, 8, 8),), ("conv2d", "clamp")),
    Case("movement", Movement, ((2, 3, 5, 6),), ("concat", "pad", "slice")),
]


def _model(case: Case) -> nn.Module:
    torch.manual_seed(0)
    return case.build().eval()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_quantized_import_matches_fake_quant(case: Case):
    model = _model(case)
    calibration = _batches(case.shapes, 6, seed=1)
    result = capture_and_import(model, calibration[0], QuantConfig(), calibration, progress=False)
    verify_graph(result.graph)
    kinds = result.graph.count_ops()
    assert set(case.expect) <= set(kinds), f"expected {case.expect} in {kinds}"
    cmp = fake_quant_agreement(result, calibration + _batches(case.shapes, 3, seed=2))
    assert cmp.outputs.total > 0 and cmp.layers.total > 0
    assert cmp.layers.max_step <= 1 and cmp.layers.exact_share >= 0.99, str(cmp)
    if case.expect == ("table",):  # fn(input): the table is bit-identical to the fake-quant op
        direct = fake_quant_agreement(result, calibration, outputs=[0]).outputs
        assert direct.total > 0 and direct.max_step == 0, str(direct)
    else:
        assert cmp.outputs.max_step <= 1 and cmp.outputs.exact_share >= 0.99, str(cmp)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_float_import_matches_eager(case: Case):
    model = _model(case)
    batches = _batches(case.shapes, 3, seed=3)
    result = capture_and_import(model, batches[0], None, progress=False)
    verify_graph(result.graph)
    assert result.fake_quant is None
    assert all(v.quant is None for v in result.graph.values())
    assert float_error(result, model, batches) <= 1e-4


def test_same_padding_with_even_kernel_pads_after():
    """PyTorch puts the odd padding element after (bottom/right): kernel 2 → (0, 1), kernel 4 → (1, 2)."""
    result = capture_and_import(_model(CASES[16]), _batches(((1, 3, 7, 8),), 1, 0)[0], None, progress=False)
    pads = [op.attrs["pad"] for op in result.graph.ops if op.kind == "conv2d"]
    assert pads == [(0, 1, 0, 1), (1, 2, 2, 2)]  # second: kernel (4, 3), dilation (1, 2) → totals 3 and 4


def test_relu6_keeps_explicit_clamp_with_code_of_six():
    model = _model(CASES[15])  # conv1d → relu6
    calibration = _batches(((2, 4, 17),), 4, seed=1)
    result = capture_and_import(model, calibration[0], QuantConfig(), calibration, progress=False)
    (clamp,) = [op for op in result.graph.ops if op.kind == "clamp"]
    q = clamp.result.quant
    six = round(6.0 / q.scale[0]) + q.zero_point[0]
    assert clamp.attrs["min"] == q.zero_point[0]
    assert clamp.attrs["max"] == min(six, q.qmax)


def test_bias_is_int32_at_accumulator_scale_and_absent_bias_stays_none():
    model = _model(CASES[0])
    calibration = _batches(((2, 3, 8, 8),), 4, seed=1)
    result = capture_and_import(model, calibration[0], QuantConfig(), calibration, progress=False)
    convs = [op for op in result.graph.ops if op.kind == "conv2d"]
    by_out = {op.result.shape[-1]: op for op in convs}
    assert by_out[4].operands[2] is None  # conv_y has no bias: None, not zeros
    conv1 = by_out[6]
    bias = result.graph.constant_data(conv1.operands[2])
    x_scale = conv1.operands[0].quant.scale[0]
    w_scales = torch.tensor(conv1.operands[1].quant.scale, dtype=torch.float64)
    expected = torch.round(model.conv1.bias.detach().double() / (x_scale * w_scales)).to(torch.int32)
    assert bias.dtype.name == "int32" and bias.tolist() == expected.tolist()


class Half(nn.Module):
    def forward(self, x):
        return x * 0.5


def test_ties_round_half_up():
    """An exact tie (code/2 with equal scales) rounds half up in the IR (TOSA RESCALE) and half to
    even in PyTorch: the two differ by exactly one step on those ties and agree elsewhere."""
    spec = (1 / 64, 0, -128, 127)
    config = QuantConfig(fixed={"input": spec, "output": spec})
    codes = torch.arange(-128, 128, dtype=torch.float32)
    x = (codes / 64).reshape(1, 256)
    result = capture_and_import(Half(), (x,), config, [(x,)], progress=False)
    ir = run_graph(result.graph, [x.numpy()])[0] * 64
    half_up = torch.floor(codes / 2 + 0.5)
    half_even = torch.round(codes / 2)
    assert ir.reshape(-1).tolist() == half_up.tolist()
    assert (result.fake_quant(x) * 64).reshape(-1).tolist() == half_even.tolist()
    assert (half_up - half_even).abs().max() == 1
