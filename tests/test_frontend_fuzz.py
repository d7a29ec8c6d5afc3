"""Fuzzing the frontend's rewrites of PyTorch models: random stacks of convs, BatchNorms, shared
and re-read modules, transposed convs, branches, activations and ops the frontend decomposes
(chunk, unbind, in-place ops, LayerNorm, GroupNorm, abs, div, flip, roll, softmax ...).

Two properties per model:
- the prepared model (exported, BatchNorms folded or made channel_affine, annotated, observers
  inserted) computes what the eager float model computes, up to float rounding: observers pass
  their input through, so any difference is a rewrite that changed the function (torchao 0.18's
  own BatchNorm fold does, on a conv read twice or a weight used twice: the last test shows this
  fuzzer finds it);
- the compiled reference program is within 1 quantization step of PyTorch's fake-quant model per
  layer (the importer's promise); under dynamic quantization, whose scales are chosen at run time,
  its float outputs agree with fake-quant's to 1e-5 of their magnitude.

Each model is drawn with one of the configurations in CONFIGS: int8, A16W8, per-tensor weights, dynamic,
and the range setting / equalization / bias correction methods.

``QLOWER_FUZZ_EXAMPLES`` examples when set (``make fuzz``), else CI's small budget below.
"""

import os
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch import nn

import qlower
from qlower import QuantConfig
from qlower.frontend.capture import export_module, prepare
from qlower.testing.frontend import fake_quant_agreement

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("QLOWER_FUZZ_EXAMPLES", "0"))
CONFIGS = {"int8": QuantConfig(), "A16W8": QuantConfig(act_dtype="int16"), "per-tensor weights": QuantConfig(per_channel=False),
           "dynamic": QuantConfig(mode="dynamic"),
           # range setting, equalization, bias correction (issue 28): every method stays within a step
           "histogram": QuantConfig(observer="histogram"), "percentile": QuantConfig(observer="percentile", percentile=99.9),
           "mse": QuantConfig(per_channel=False, observer="mse", weight_observer="mse"),
           "bias correction": QuantConfig(per_channel=False, bias_correction=True),
           "equalize": QuantConfig(per_channel=False, equalize=True, absorb_bias=True, bias_correction=True)}
ACTIVATIONS = {"none": nn.Identity, "relu": nn.ReLU, "relu6": nn.ReLU6, "hardswish": nn.Hardswish}


def _batch_norm(channels: int, gen: torch.Generator, dims: int = 2) -> nn.Module:
    bn = (nn.BatchNorm2d if dims == 2 else nn.BatchNorm1d)(channels)
    bn.running_mean.copy_(torch.rand(channels, generator=gen) * 2 - 1)
    bn.running_var.copy_(torch.rand(channels, generator=gen) * 1.5 + 0.25)
    bn.weight.data.copy_(torch.rand(channels, generator=gen) * 1.5 + 0.25)
    bn.bias.data.copy_(torch.rand(channels, generator=gen) * 2 - 1)
    return bn


class ConvBN(nn.Module):
    def __init__(self, c, gen, kernel, depthwise, bias, act):
        super().__init__()
        self.conv = nn.Conv2d(c, c, kernel, padding=kernel // 2, groups=c if depthwise else 1, bias=bias)
        self.bn, self.act = _batch_norm(c, gen), ACTIVATIONS[act]()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class ReadTwice(nn.Module):
    def __init__(self, c, gen):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1), _batch_norm(c, gen)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class SharedConv(nn.Module):
    def __init__(self, c, gen):
        super().__init__()
        self.conv, self.bn1, self.bn2 = nn.Conv2d(c, c, 3, padding=1), _batch_norm(c, gen), _batch_norm(c, gen)

    def forward(self, x):
        return self.bn2(self.conv(torch.relu(self.bn1(self.conv(x)))))


class TwoBatchNorms(nn.Module):
    def __init__(self, c, gen):
        super().__init__()
        self.conv, self.bn1, self.bn2 = nn.Conv2d(c, c, 1, bias=False), _batch_norm(c, gen), _batch_norm(c, gen)

    def forward(self, x):
        return self.bn2(self.bn1(self.conv(x)))


class TransposedConvBN(nn.Module):
    def __init__(self, c, gen):
        super().__init__()
        self.conv, self.bn = nn.ConvTranspose2d(c, c, 3, padding=1), _batch_norm(c, gen)

    def forward(self, x):
        return self.bn(self.conv(x))


class Branches(nn.Module):
    def __init__(self, c, gen):
        super().__init__()
        self.a, self.b = ConvBN(c, gen, 1, False, True, "relu"), ConvBN(c, gen, 3, True, False, "none")
        self.merge, self.bn = nn.Conv2d(2 * c, c, 1), _batch_norm(c, gen)

    def forward(self, x):
        return self.bn(self.merge(torch.cat([self.a(x), self.b(x)], dim=1)))


class BatchNormAfterAdd(nn.Module):
    """A BatchNorm no conv feeds: channel_affine."""

    def __init__(self, c, gen):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, c, 1), _batch_norm(c, gen)

    def forward(self, x):
        return self.bn(x + self.conv(x))


class LoneBatchNorm(nn.Module):
    """A BatchNorm on the block's input (the model's own input when first): channel_affine."""

    def __init__(self, c, gen):
        super().__init__()
        self.bn = _batch_norm(c, gen)

    def forward(self, x):
        return self.bn(x)


class Conv1dBN(nn.Module):
    """A grouped conv1d and a BatchNorm1d over the flattened plane."""

    def __init__(self, c, gen):
        super().__init__()
        self.conv, self.bn = nn.Conv1d(c, c, 3, padding=1, groups=c if c % 2 else 2), _batch_norm(c, gen, dims=1)

    def forward(self, x):
        return self.bn(self.conv(x.flatten(2))).reshape(x.shape)


class Misc(nn.Module):
    """One of the ops the frontend rewrites or decomposes, between two 1x1 convs (so it reads and
    writes quantized activations)."""

    OPS = {
        "chunk_swap": lambda m, x: torch.cat(list(reversed(x.chunk(2, dim=1))), dim=1),
        "unbind_stack": lambda m, x: torch.stack([t * (i + 1) for i, t in enumerate(x.unbind(1))], dim=1),
        "inplace": lambda m, x: x.clone().mul_(0.5).add_(1.0).clamp_(-2.0, 3.0),
        "layer_norm": lambda m, x: m.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
        "group_norm": lambda m, x: m.gn(x),
        "squeeze_excite": lambda m, x: x * nn.functional.hardsigmoid(x.mean(dim=(2, 3), keepdim=True)),
        "abs_div": lambda m, x: x.abs() / 3.0 - x / 4.0,
        "flip_roll": lambda m, x: torch.roll(torch.flip(x, dims=[3]), shifts=1, dims=2),
        "upsample_pool": lambda m, x: nn.functional.max_pool2d(nn.functional.interpolate(x, scale_factor=2.0), 2),
        "max_min": lambda m, x: torch.maximum(x, x.flip(2)) - torch.minimum(x, x.amax(dim=1, keepdim=True)),
        "softmax": lambda m, x: x.softmax(dim=1) * 4.0,
        "sigmoid_tanh": lambda m, x: torch.sigmoid(x) + torch.tanh(x),
    }

    def __init__(self, c, gen, op):
        super().__init__()
        self.op = op
        self.pre, self.post = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 1)
        self.ln, self.gn = nn.LayerNorm(c), nn.GroupNorm(1, c)

    def forward(self, x):
        return self.post(self.OPS[self.op](self, self.pre(x)))


BLOCKS = {"lone": LoneBatchNorm, "conv1d": Conv1dBN, "read_twice": ReadTwice, "shared_conv": SharedConv, "two_batch_norms": TwoBatchNorms,
          "transposed": TransposedConvBN, "branches": Branches, "after_add": BatchNormAfterAdd}

UNFOLDED = {"lone", "after_add"}  # BatchNorms no conv feeds: channel_affine


class RandomNet(nn.Module):
    def __init__(self, blocks, c, gen):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.fc, self.bn = nn.Linear(c, 5), _batch_norm(5, gen, dims=1)

    def forward(self, x):
        return self.bn(self.fc(self.blocks(x).mean(dim=(2, 3))))


@st.composite
def nets(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the modules' initial weights
    c = draw(st.sampled_from([3, 4, 8]))
    quant = draw(st.sampled_from(list(CONFIGS.values())))
    # an unfolded BatchNorm on int16 codes is up to 2 steps off (test_a16w8_unfolded_batch_norm_within_a_step)
    kinds = ["conv_bn", "misc", *(k for k in BLOCKS if quant.act_dtype != "int16" or k not in UNFOLDED)]
    blocks = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(kinds))
        if kind == "misc":
            blocks.append(Misc(c, gen, draw(st.sampled_from(list(Misc.OPS)))))
        elif kind == "conv_bn":
            blocks.append(ConvBN(c, gen, draw(st.sampled_from([1, 3])), draw(st.booleans()), draw(st.booleans()),
                                 draw(st.sampled_from(list(ACTIVATIONS)))))
        else:
            blocks.append(BLOCKS[kind](c, gen))
    model = RandomNet(blocks, c, gen).eval()
    size = draw(st.sampled_from([4, 6]))
    batches = [(torch.randn(2, c, size, size, generator=gen),) for _ in range(2)]
    return model, batches, quant


def _prepared_matches_eager(model, batches, quant, fast_paths=True):
    quant = replace(quant, bias_correction=False)  # which changes the float function on purpose
    gm = prepare(export_module(model, batches[0], static=quant.mode == "static"), quant, batches, fast_paths)
    with torch.no_grad():
        for (x,) in batches:
            want, got = model(x), gm(x)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * max(1.0, want.abs().max().item()))


def _settings(examples: int) -> settings:
    return settings(max_examples=EXAMPLES or examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_settings(60)
@given(net=nets())
def test_prepared_model_computes_the_float_function(net):
    _prepared_matches_eager(*net)


@_settings(30)
@given(net=nets())
def test_equalization_keeps_the_float_function(net):
    """Equalization exactly; high-bias absorption on the calibration data (what the batches are)."""
    model, batches, _ = net
    _prepared_matches_eager(model, batches, QuantConfig(per_channel=False, equalize=True, absorb_bias=True))


@_settings(25)
@given(net=nets())
def test_reference_is_within_a_step_of_fake_quant_per_layer(net):
    model, batches, quant = net
    prog = qlower.compile(model, batches[0], target="reference", quant=quant, calibration=batches, progress=False)
    if quant.mode == "dynamic":  # run-time scales: no step per layer; the float outputs agree (1e-5 relative)
        for (x,) in batches:
            with torch.no_grad():
                want = prog.frontend.fake_quant(x)
            torch.testing.assert_close(torch.from_numpy(prog.run(x)[0]), want, rtol=0,
                                       atol=1e-5 * max(1.0, want.abs().max().item()))
        return
    cmp = fake_quant_agreement(prog.frontend, batches)
    assert cmp.layers.total > 0 and cmp.layers.max_step <= 1, cmp


def test_fuzzer_finds_torchaos_batch_norm_fold_changing_the_function():
    """With torchao's own fold (``fast_paths=False``) the first property fails on some example."""
    failures = []

    @settings(max_examples=40, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow])
    @given(net=nets())
    def run(net):
        try:
            _prepared_matches_eager(*net, fast_paths=False)
        except AssertionError:
            failures.append(net)

    run()
    assert failures, "no example caught torchao's fold changing the function"


@pytest.mark.xfail(strict=True, reason="channel_affine on int16 codes holds its per-channel multiplier in about "
                   "14 bits (int32 headroom over 16-bit codes): up to 2 steps from fake-quant; a per-channel "
                   "rescale (31-bit multipliers) would keep it within 1")
def test_a16w8_unfolded_batch_norm_within_a_step():
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    model = RandomNet([BatchNormAfterAdd(3, gen)], 3, gen).eval()
    batches = [(torch.randn(2, 3, 4, 4, generator=gen),) for _ in range(2)]
    prog = qlower.compile(model, batches[0], target="reference", quant=CONFIGS["A16W8"], calibration=batches,
                          progress=False)
    cmp = fake_quant_agreement(prog.frontend, batches)
    assert cmp.layers.max_step <= 1, cmp
