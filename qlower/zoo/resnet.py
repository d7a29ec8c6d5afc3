"""ResNet-18 (He et al. 2016): BasicBlocks [2, 2, 2, 2], BatchNorm, 1000 classes.

``size`` only changes the input resolution; the architecture is unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qlower.zoo._common import ZooModel, check_size, random_image_classifier

DEFAULT_SIZE = 224
MIN_SIZE = 32
SEED = 303


class BasicBlock(nn.Module):
    """3x3 conv-BN-ReLU → 3x3 conv-BN, plus identity (or 1x1 conv-BN when the shape changes), then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class ResNet18(nn.Module):
    """Input ``[N, 3, S, S]`` → logits ``[N, num_classes]``; ``width`` channels in the first stage (64 in the paper)."""

    def __init__(self, num_classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        stages: list[nn.Module] = []
        cin = width
        for cout, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)):
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(8 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(torch.flatten(x, 1))


def build(size: int | None = None) -> ZooModel:
    """Seeded ResNet-18 with BN statistics from random images; static per-channel int8 config."""
    s = check_size("resnet18", size, DEFAULT_SIZE, MIN_SIZE)
    return random_image_classifier(ResNet18, s, SEED, head="fc")
