"""mobilenet_v3_small: MobileNetV3-Small (Howard et al. 2019) at width 0.5, 1000 classes.

The model that brings hardswish, hardsigmoid-gated squeeze-excitation (global
pool → 1x1 conv → ReLU → 1x1 conv → hardsigmoid → channel multiply) and 5x5
depthwise convs to the zoo. The block table is the paper's (Table 2); width
0.5 keeps it fast. ``size`` only changes the input resolution; dropout is left
out (identity in eval mode).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qlower.zoo._common import ZooModel, check_size, fit_bn_stats_in_eval, make_divisible, random_image_classifier

DEFAULT_SIZE = 224
MIN_SIZE = 32
SEED = 606
WIDTH = 0.5

# (kernel, expanded channels, output channels, squeeze-excitation, activation, stride) — Table 2.
BLOCKS: tuple[tuple[int, int, int, bool, str, int], ...] = (
    (3, 16, 16, True, "relu", 2),
    (3, 72, 24, False, "relu", 2),
    (3, 88, 24, False, "relu", 1),
    (5, 96, 40, True, "hardswish", 2),
    (5, 240, 40, True, "hardswish", 1),
    (5, 240, 40, True, "hardswish", 1),
    (5, 120, 48, True, "hardswish", 1),
    (5, 144, 48, True, "hardswish", 1),
    (5, 288, 96, True, "hardswish", 2),
    (5, 576, 96, True, "hardswish", 1),
    (5, 576, 96, True, "hardswish", 1),
)


def _activation(name: str) -> nn.Module:
    return nn.Hardswish() if name == "hardswish" else nn.ReLU()


class ConvBNAct(nn.Sequential):
    """Conv (no bias) → BatchNorm → activation (``None``: linear)."""

    def __init__(
        self, cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1, act: str | None = "relu"
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act is not None:
            layers.append(_activation(act))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """Channel gate: ``x * hardsigmoid(fc2(relu(fc1(mean(x)))))``, squeeze to ``channels / 4``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        squeeze = make_divisible(channels / 4)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))
        return x * s


class InvertedResidual(nn.Module):
    """1x1 expand (skipped when expanded == input) → kxk depthwise → SE → 1x1 linear projection (+ residual)."""

    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, act: str, stride: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvBNAct(cin, expanded, act=act))
        layers.append(ConvBNAct(expanded, expanded, kernel, stride, groups=expanded, act=act))
        if se:
            layers.append(SqueezeExcitation(expanded))
        layers.append(ConvBNAct(expanded, cout, act=None))
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_residual else y


class MobileNetV3Small(nn.Module):
    """Input ``[N, 3, S, S]`` → logits ``[N, num_classes]``."""

    def __init__(self, width: float = WIDTH, num_classes: int = 1000) -> None:
        super().__init__()
        cin = make_divisible(16 * width)
        layers: list[nn.Module] = [ConvBNAct(3, cin, 3, 2, act="hardswish")]
        for kernel, expanded, cout, se, act, stride in BLOCKS:
            cout = make_divisible(cout * width)
            layers.append(InvertedResidual(cin, kernel, make_divisible(expanded * width), cout, se, act, stride))
            cin = cout
        last = 6 * cin
        layers.append(ConvBNAct(cin, last, act="hardswish"))
        self.features = nn.Sequential(*layers)
        hidden = make_divisible(1024 * width)
        self.pre_logits = nn.Linear(last, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        x = F.hardswish(self.pre_logits(torch.flatten(x, 1)))
        return self.fc(x)


def build(size: int | None = None) -> ZooModel:
    """Seeded MobileNetV3-Small (width 0.5) with BN statistics from random images; static per-channel int8."""
    s = check_size("mobilenet_v3_small", size, DEFAULT_SIZE, MIN_SIZE)
    return random_image_classifier(MobileNetV3Small, s, SEED, head="fc", fit_bn=fit_bn_stats_in_eval)
