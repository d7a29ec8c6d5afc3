"""tiny_cnn: the smallest useful image classifier (conv-BN-ReLU x3, max pool, global average pool, linear)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qlower.zoo._common import ZooModel, check_size, random_image_classifier

DEFAULT_SIZE = 32
MIN_SIZE = 4
SEED = 101


class TinyCNN(nn.Module):
    """Input ``[N, 3, S, S]`` → logits ``[N, 10]``."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.bn3(self.conv3(x)))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(torch.flatten(x, 1))


def build(size: int | None = None) -> ZooModel:
    """Seeded TinyCNN with BN statistics from random images; static per-channel int8 config."""
    s = check_size("tiny_cnn", size, DEFAULT_SIZE, MIN_SIZE)
    return random_image_classifier(TinyCNN, s, SEED, calibration_batches=8)
