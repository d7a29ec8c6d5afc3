"""MobileNetV2 (Sandler et al. 2018): width 1.0, 1000 classes, inverted residuals with ReLU6 and BatchNorm.

The architecture is the standard one; ``size`` only changes the input
resolution (the network is fully convolutional up to the global pool). The
classifier's dropout is left out: it is the identity in eval mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qlower.zoo._common import ZooModel, check_size, make_divisible, random_image_classifier

DEFAULT_SIZE = 224
MIN_SIZE = 32
SEED = 202

# (expansion t, output channels c, repeats n, first stride s) — Table 2 of the paper.
INVERTED_RESIDUAL_SETTING: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class ConvBNReLU6(nn.Sequential):
    """Conv (no bias) → BatchNorm → ReLU6."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(),
        )


class InvertedResidual(nn.Module):
    """1x1 expand (skipped when t == 1) → 3x3 depthwise → 1x1 linear projection, residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = cin * expand_ratio
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(cin, hidden, kernel=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_residual:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """Input ``[N, 3, S, S]`` → logits ``[N, num_classes]``; ``width`` scales every channel count but the last."""

    def __init__(self, num_classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        cin = make_divisible(32 * width)
        layers: list[nn.Module] = [ConvBNReLU6(3, cin, stride=2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            c = make_divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        last = make_divisible(1280 * max(1.0, width))  # the paper keeps 1280 features below width 1
        layers.append(ConvBNReLU6(cin, last, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, 1)
        return self.classifier(torch.flatten(x, 1))


def build(size: int | None = None) -> ZooModel:
    """Seeded MobileNetV2 with BN statistics from random images; static per-channel int8 config."""
    s = check_size("mobilenet_v2", size, DEFAULT_SIZE, MIN_SIZE)
    return random_image_classifier(MobileNetV2, s, SEED, head="classifier")
