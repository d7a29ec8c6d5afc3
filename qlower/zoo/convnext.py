"""convnext_block: a patchify stem and two ConvNeXt blocks (Liu et al. 2022), 10 classes.

The model that brings LayerNorm over channels to the zoo, written the way
torchvision writes it for NCHW tensors: permute to NHWC, ``nn.LayerNorm`` over
the last dimension, permute back. A block is 7x7 depthwise conv → LayerNorm →
Linear (4x) → GELU → Linear → layer-scale multiply → residual add. The stem is
ConvNeXt's 4x4 stride-4 conv followed by a channels LayerNorm; the head is
global average pool → LayerNorm → Linear. Layer scales are random around 0.5
instead of ConvNeXt's 1e-6 init, so the blocks are not near-identities.
Stochastic depth is left out (identity in eval mode).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qlower.frontend.config import QuantConfig
from qlower.zoo._common import ZooModel, check_size, kaiming_init, randn_batches, seeded

DEFAULT_SIZE = 32
STEM_STRIDE = 4
MIN_SIZE = STEM_STRIDE
SEED = 808
DIM = 32


class ChannelsLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (permute to NHWC, normalise, permute back)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """``x + gamma * pwconv2(gelu(pwconv1(norm(dwconv7x7(x)))))`` on ``[N, dim, H, W]``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NHWC
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + self.gamma * y.permute(0, 3, 1, 2)


class ConvNeXtTiny(nn.Module):
    """Input ``[N, 3, S, S]`` → logits ``[N, num_classes]``."""

    def __init__(self, dim: int = DIM, depth: int = 2, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dim, STEM_STRIDE, STEM_STRIDE), ChannelsLayerNorm(dim, eps=1e-6))
        self.blocks = nn.Sequential(*(ConvNeXtBlock(dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.head(self.norm(x))


def build(size: int | None = None) -> ZooModel:
    """Seeded ConvNeXt stem + 2 blocks (dim 32); static per-channel int8 config."""
    s = check_size("convnext_block", size, DEFAULT_SIZE, MIN_SIZE)
    with seeded(SEED):
        model = ConvNeXtTiny()
        kaiming_init(model)
        for block in model.blocks:
            nn.init.uniform_(block.gamma, 0.25, 0.75)
        nn.init.normal_(model.head.weight, std=0.1)
    model.eval()
    calibration = randn_batches((1, 3, s, s), 8, SEED + 2)
    example = randn_batches((1, 3, s, s), 1, SEED + 3)[0]
    return ZooModel(model, example, QuantConfig(), calibration)
