"""efficientnet_lite: the first five stages of EfficientNet-Lite0 (Tan & Le 2019), 1000 classes.

Lite variants replace swish with ReLU6 and drop squeeze-excitation so they
quantize well; one block here keeps an EfficientNet SE (SiLU reduce, sigmoid
gate) so that SiLU and sigmoid are exercised too. MBConv blocks: 1x1 expand →
3x3/5x5 depthwise → 1x1 linear projection, residual when shapes match. The
stages are B0's with fewer repeats (total stride 16 instead of 32), to keep it
small. ``size`` only changes the input resolution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qlower.zoo._common import ZooModel, check_size, fit_bn_stats_in_eval, random_image_classifier

DEFAULT_SIZE = 224
MIN_SIZE = 32
SEED = 707

# (expansion, kernel, first stride, output channels, repeats, squeeze-excitation)
STAGES: tuple[tuple[int, int, int, int, int, bool], ...] = (
    (1, 3, 1, 16, 1, False),
    (6, 3, 2, 24, 2, False),
    (6, 5, 2, 40, 2, False),
    (6, 3, 2, 80, 2, False),
    (6, 5, 1, 112, 1, True),
)
HEAD_CHANNELS = 1280


class ConvBNReLU6(nn.Sequential):
    """Conv (no bias) → BatchNorm → ReLU6 (``act=False``: linear)."""

    def __init__(
        self, cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1, act: bool = True
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act:
            layers.append(nn.ReLU6())
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """EfficientNet's gate: ``x * sigmoid(expand(silu(reduce(mean(x)))))``, squeeze to ``block input / 4``."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeeze, 1)
        self.expand = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class MBConv(nn.Module):
    """1x1 expand (skipped when the expansion is 1) → depthwise → optional SE → 1x1 projection (+ residual)."""

    def __init__(self, cin: int, cout: int, expansion: int, kernel: int, stride: int, se: bool) -> None:
        super().__init__()
        hidden = cin * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(ConvBNReLU6(cin, hidden))
        layers.append(ConvBNReLU6(hidden, hidden, kernel, stride, groups=hidden))
        if se:
            layers.append(SqueezeExcitation(hidden, max(1, cin // 4)))
        layers.append(ConvBNReLU6(hidden, cout, act=False))
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_residual else y


class EfficientNetLite(nn.Module):
    """Input ``[N, 3, S, S]`` → logits ``[N, num_classes]``."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        cin = 32
        layers: list[nn.Module] = [ConvBNReLU6(3, cin, 3, 2)]
        for expansion, kernel, stride, cout, repeats, se in STAGES:
            for i in range(repeats):
                layers.append(MBConv(cin, cout, expansion, kernel, stride if i == 0 else 1, se))
                cin = cout
        layers.append(ConvBNReLU6(cin, HEAD_CHANNELS))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(HEAD_CHANNELS, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def build(size: int | None = None) -> ZooModel:
    """Seeded EfficientNet-Lite (5 stages) with BN statistics from random images; static per-channel int8."""
    s = check_size("efficientnet_lite", size, DEFAULT_SIZE, MIN_SIZE)
    return random_image_classifier(EfficientNetLite, s, SEED, head="classifier", fit_bn=fit_bn_stats_in_eval)
