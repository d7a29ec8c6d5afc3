"""unet_tiny: a two-level U-Net (Ronneberger et al. 2015) for dense per-pixel outputs, 4 classes.

The model that brings upsampling and skip concatenation to the zoo, with both
ways of upsampling a decoder uses: the deeper up step is a learned
``ConvTranspose2d(k=2, s=2)``, the shallower one a fixed bilinear
``nn.Upsample(scale_factor=2, align_corners=False)``. Each level is two
conv-BN-ReLU; max pool goes down; skips join by ``torch.cat``; a 1x1 conv gives
the per-pixel logits. Input ``[1, 3, S, S]`` → ``[1, 4, S, S]``, S a multiple of 4.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from qlower.frontend.config import QuantConfig
from qlower.zoo._common import (
    ZooModel,
    bn_estimation_batches,
    check_size,
    fit_bn_stats_in_eval,
    kaiming_init,
    randn_batches,
    seeded,
)

DEFAULT_SIZE = 32
LEVELS = 2
MULTIPLE = 2**LEVELS
SEED = 1500
NUM_CLASSES = 4


class DoubleConv(nn.Sequential):
    """(3x3 conv, no bias → BatchNorm → ReLU) twice."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
        )  # fmt: skip


class UNetTiny(nn.Module):
    """Encoder 16 → 32 → 64 channels, decoder back to 16, 1x1 conv to ``num_classes``."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.enc1 = DoubleConv(3, 16)
        self.enc2 = DoubleConv(16, 32)
        self.bottleneck = DoubleConv(32, 64)
        self.up2 = nn.ConvTranspose2d(64, 32, 2, stride=2)
        self.dec2 = DoubleConv(64, 32)
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec1 = DoubleConv(32 + 16, 16)
        self.out = nn.Conv2d(16, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.enc1(x)  # [N, 16, S, S]
        s2 = self.enc2(F.max_pool2d(s1, 2))  # [N, 32, S/2, S/2]
        b = self.bottleneck(F.max_pool2d(s2, 2))  # [N, 64, S/4, S/4]
        d2 = self.dec2(torch.cat((self.up2(b), s2), dim=1))  # [N, 32, S/2, S/2]
        d1 = self.dec1(torch.cat((self.up1(d2), s1), dim=1))  # [N, 16, S, S]
        return self.out(d1)


def build(size: int | None = None) -> ZooModel:
    """Seeded two-level U-Net with BN statistics from random images; static per-channel int8 config."""
    s = check_size("unet_tiny", size, DEFAULT_SIZE, MULTIPLE)
    if s % MULTIPLE:
        raise ValueError(f"zoo model 'unet_tiny': size must be a multiple of {MULTIPLE} ({LEVELS} max pools), got {s}")
    with seeded(SEED):
        model = UNetTiny()
        kaiming_init(model)
        # Each output pixel of a k=2, s=2 transposed conv sees one tap per input channel: fan-in = in_channels.
        nn.init.normal_(model.up2.weight, std=math.sqrt(2.0 / model.up2.in_channels))
        nn.init.normal_(model.up2.bias, std=0.05)
    fit_bn_stats_in_eval(model, bn_estimation_batches(3, s, SEED + 1, max_images=64))  # dense: 64 images suffice
    calibration = randn_batches((1, 3, s, s), 4, SEED + 2)
    example = randn_batches((1, 3, s, s), 1, SEED + 3)[0]
    return ZooModel(model, example, QuantConfig(), calibration)
