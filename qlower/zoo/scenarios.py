"""The acceptance-scenario models of shared/SCENARIOS.md (S0–S4), plus the S3 variants.

Each builder returns a ``ZooModel`` whose quantization config is the one the
scenario names. The properties a scenario depends on (S0's bias-less and twin
convs, S1's relu zero point away from qmin, S3's exact ramps) are built in here
and checked by tests/test_zoo.py with independent arithmetic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qlower.frontend.config import QuantConfig
from qlower.zoo._common import ZooModel, check_size, generator, kaiming_init, randn_batches, seeded
from qlower.zoo.vit import MultiHeadSelfAttention

# ---------------------------------------------------------------- S0


class S0DynamicBiasless(nn.Module):
    """MobileNet-style backbone without BatchNorm in which every conv but two has ``bias=False``.

    ``twin_nobias``, ``twin_bias`` and ``twin_zerobias`` hold identical weights
    (separate tensors, equal values); their biases are absent, non-zero, and
    all-zero. Their outputs are concatenated, so a backend that confuses "no
    bias" with another op's bias changes the output. Input ``[N, 3, S, S]`` →
    logits ``[N, 10]``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, 2, 1, bias=False)
        blocks: list[nn.Module] = []
        for cin, cout, stride in ((16, 32, 1), (32, 64, 2), (64, 64, 1)):
            blocks += [
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),  # depthwise
                nn.ReLU6(),
                nn.Conv2d(cin, cout, 1, bias=False),  # pointwise
                nn.ReLU(),
            ]
        self.blocks = nn.Sequential(*blocks)
        self.twin_nobias = nn.Conv2d(64, 32, 1, bias=False)
        self.twin_bias = nn.Conv2d(64, 32, 1, bias=True)
        self.twin_zerobias = nn.Conv2d(64, 32, 1, bias=True)
        self.mix = nn.Conv2d(96, 64, 1, bias=False)
        self.fc = nn.Linear(64, 10)

    @torch.no_grad()
    def tie_twins(self) -> None:
        """Copy ``twin_nobias``'s weights into the other twins and zero ``twin_zerobias``'s bias."""
        self.twin_bias.weight.copy_(self.twin_nobias.weight)
        self.twin_zerobias.weight.copy_(self.twin_nobias.weight)
        self.twin_zerobias.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu6(self.stem(x)))
        x = torch.cat((self.twin_nobias(x), self.twin_bias(x), self.twin_zerobias(x)), dim=1)
        x = F.relu(self.mix(F.relu6(x)))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(torch.flatten(x, 1))


def build_s0(size: int | None = None) -> ZooModel:
    """S0; dynamic per-tensor config (pass ``granularity="per_row"`` yourself for the per-row case)."""
    s = check_size("s0_dynamic_biasless", size, 32, 8)
    with seeded(1000):
        model = S0DynamicBiasless()
        kaiming_init(model)
        nn.init.normal_(model.twin_bias.bias, mean=0.2, std=0.1)
        model.tie_twins()
    model.eval()
    config = QuantConfig(mode="dynamic", granularity="per_tensor")
    return ZooModel(model, randn_batches((1, 3, s, s), 1, 1001)[0], config, randn_batches((1, 3, s, s), 8, 1002))


# ---------------------------------------------------------------- S1

S1_Y_SHIFT = 0.065
S1_RELU_MAX = 0.95  # the concat's range is [min(y), max(relu)] ~ [-0.065, 0.95]: zero point -127 + 16.27 → -111


class S1ConvReluCat(nn.Module):
    """``conv2(cat((relu(conv1(x)), y), dim=1))``: x ``[N, 3, S, S]``, y ``[N, 4, S, S]`` → ``[N, 8, S, S]``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(12, 8, 3, padding=1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r = F.relu(self.conv1(x))
        return self.conv2(torch.cat((r, y), dim=1))


def s1_inputs(size: int, count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches ``(x, y)``: x uniform in [0, 1), y uniform in [-0.065, 0.935)."""
    g = generator(seed)
    return [
        (torch.rand(1, 3, size, size, generator=g), torch.rand(1, 4, size, size, generator=g) - S1_Y_SHIFT)
        for _ in range(count)
    ]


def build_s1(size: int | None = None) -> ZooModel:
    """S1; conv1 is rescaled so relu's output peaks at 0.95 over calibration.

    The concat's observed range is then [min(y), 0.95] ~ [-0.065, 0.95], whose
    asymmetric zero point for [-127, 127] is -127 + round(0.065 * 254 / 1.015)
    = -111, not qmin; 16.27 sits far enough from a rounding tie that sampling
    noise in min(y) can't move it. (With relu below y's max, the range would be
    ~[-0.065, 0.935] and the zero point a coin toss between -110 and -111.)
    """
    s = check_size("s1_conv_relu_cat", size, 16, 4)
    with seeded(1100):
        model = S1ConvReluCat()
        kaiming_init(model)
    calibration = s1_inputs(s, 8, 1101)
    with torch.no_grad():
        peak = max(float(model.conv1(x).max()) for x, _ in calibration)
        model.conv1.weight.mul_(S1_RELU_MAX / peak)
        model.conv1.bias.mul_(S1_RELU_MAX / peak)
    model.eval()
    config = QuantConfig(act_qmin=-127, act_qmax=127, weight_qmin=-127, weight_qmax=127, per_channel=True)
    return ZooModel(model, s1_inputs(s, 1, 1102)[0], config, calibration)


# ---------------------------------------------------------------- S2


class S2PerChannelBinary(nn.Module):
    """The input feeds ``x * scale`` and ``x + shift`` (per-channel constants ``[1, 3, 1, 1]``) and a side conv.

    ``x * scale`` → conv → relu → conv, ``x + shift`` → conv, and ``side(x)``
    are summed. ``scale`` is a buffer, ``shift`` a parameter. Input
    ``[N, 3, S, S]`` → ``[N, 8, S, S]``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor([0.5, -1.25, 2.0]).reshape(1, 3, 1, 1))
        self.shift = nn.Parameter(torch.tensor([0.1, -0.3, 0.25]).reshape(1, 3, 1, 1))
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv_shift = nn.Conv2d(3, 8, 1)
        self.side = nn.Conv2d(3, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        main = self.conv2(F.relu(self.conv1(x * self.scale)))
        shifted = self.conv_shift(x + self.shift)
        return main + shifted + self.side(x)


def build_s2(size: int | None = None) -> ZooModel:
    """S2; dynamic w8a8 config (the scenario also runs it static: pass ``QuantConfig()`` yourself)."""
    s = check_size("s2_perchannel_binary", size, 16, 4)
    with seeded(1200):
        model = S2PerChannelBinary()
        kaiming_init(model)
    model.eval()
    return ZooModel(
        model,
        randn_batches((1, 3, s, s), 1, 1201)[0],
        QuantConfig(mode="dynamic"),
        randn_batches((1, 3, s, s), 8, 1202),
    )


# ---------------------------------------------------------------- S3

S3_KINDS = ("hv", "hh", "vh", "three_scales", "const_runtime")
S3_CONFIG = QuantConfig(symmetric_acts=True, act_qmin=-127, act_qmax=127, fixed={"output": (1 / 127, 0, -127, 127)})


class S3ConstCat(nn.Module):
    """Concatenation (dim 1) of constant ramps, ``[1, k, 4, 5]`` out.

    ``h`` = linspace(-1+1/5, 1-1/5, 5) along width, ``v`` = linspace(-1+1/4, 1-1/4, 4)
    along height, both stored 1-D and reshaped + expanded to ``[1, 1, 4, 5]`` in
    forward. Parts: ``"h"``, ``"v"``, ``"v_half"`` (v / 2), ``"small"``
    (linspace(-0.1, 0.1, 20) as ``[1, 1, 4, 5]``), ``"x"`` (the runtime input).
    """

    def __init__(self, parts: tuple[str, ...]) -> None:
        super().__init__()
        unknown = set(parts) - {"h", "v", "v_half", "small", "x"}
        if unknown:
            raise ValueError(f"S3ConstCat: unknown parts {sorted(unknown)}")
        self.parts = parts
        self.register_buffer("h_ramp", torch.linspace(-1 + 1 / 5, 1 - 1 / 5, 5))
        self.register_buffer("v_ramp", torch.linspace(-1 + 1 / 4, 1 - 1 / 4, 4))
        if "v_half" in parts:
            self.register_buffer("v_half_ramp", torch.linspace(-1 + 1 / 4, 1 - 1 / 4, 4) / 2)
        if "small" in parts:
            self.register_buffer("small_ramp", torch.linspace(-0.1, 0.1, 20).reshape(1, 1, 4, 5))

    def _part(self, name: str, x: torch.Tensor | None) -> torch.Tensor:
        if name == "h":
            return self.h_ramp.reshape(1, 1, 1, 5).expand(1, 1, 4, 5)
        if name == "v":
            return self.v_ramp.reshape(1, 1, 4, 1).expand(1, 1, 4, 5)
        if name == "v_half":
            return self.v_half_ramp.reshape(1, 1, 4, 1).expand(1, 1, 4, 5)
        if name == "small":
            return self.small_ramp
        if x is None:
            raise ValueError("S3ConstCat: part 'x' needs a runtime input")
        return x

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        x = inputs[0] if inputs else None
        return torch.cat(tuple(self._part(p, x) for p in self.parts), dim=1)


_S3_PARTS = {
    "hv": ("h", "v"),
    "hh": ("h", "h"),
    "vh": ("v", "h"),
    "three_scales": ("h", "v_half", "small"),  # ranges 0.8, 0.375, 0.1: three different input scales
    "const_runtime": ("h", "x"),
}


def s3_variant(kind: str) -> ZooModel:
    """S3 (``kind="hv"``) or one of its variants: ``hh``, ``vh``, ``three_scales``, ``const_runtime``.

    All share S3's fixed output quantization (scale 1/127, zero point 0, [-127, 127]).
    ``const_runtime`` takes one input ``x`` of shape ``[1, 1, 4, 5]`` (calibrated
    on uniform [-1, 1)); the others take no inputs and calibrate on ``[()]``.
    """
    if kind not in _S3_PARTS:
        raise ValueError(f"unknown S3 variant {kind!r}; choose one of {', '.join(S3_KINDS)}")
    model = S3ConstCat(_S3_PARTS[kind]).eval()
    if kind != "const_runtime":
        return ZooModel(model, (), S3_CONFIG, [()])
    g = generator(1300)
    batches = [(torch.rand(1, 1, 4, 5, generator=g) * 2 - 1,) for _ in range(5)]
    return ZooModel(model, batches[0], S3_CONFIG, batches[1:])


def build_s3(size: int | None = None) -> ZooModel:
    """S3 itself: ``cat((h, v), dim=1)``, no inputs."""
    if size is not None:
        raise ValueError("zoo model 's3_const_cat' has no inputs; call get('s3_const_cat') without size")
    return s3_variant("hv")


# ---------------------------------------------------------------- S4

S4_TOKENS, S4_DIM, S4_HEADS = 16, 32, 2


def build_s4(size: int | None = None) -> ZooModel:
    """S4: attention over ``[1, 16, 32]`` with 2 heads; static int8 config."""
    if size not in (None, S4_TOKENS):
        raise ValueError(
            f"zoo model 's4_attention' has a fixed [1, {S4_TOKENS}, {S4_DIM}] input; call get('s4_attention') without size"
        )
    with seeded(1400):
        model = MultiHeadSelfAttention(S4_DIM, S4_HEADS)
        for lin in (model.q, model.k, model.v, model.proj):
            nn.init.xavier_normal_(lin.weight)
            nn.init.normal_(lin.bias, std=0.05)
        for lin in (model.q, model.k):  # logits with std ~1, so softmax is neither flat nor one-hot
            lin.weight.data.mul_(2.0)
        model.fold_query_scale()
    model.eval()
    shape = (1, S4_TOKENS, S4_DIM)
    return ZooModel(model, randn_batches(shape, 1, 1401)[0], QuantConfig(), randn_batches(shape, 8, 1402))
