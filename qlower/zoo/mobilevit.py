"""mobilevit_block: a conv stem and one MobileViT block (Mehta & Rastegari 2022), 10 classes.

The model that brings MobileViT's unfold/fold to the zoo: the feature map is cut
into 2x2 patches with reshape/permute (no ``nn.Unfold``), so that each of the 4
pixel positions of a patch attends over all patches; a transformer layer (qkv
split by ``torch.chunk``, SiLU MLP) runs on ``[N*4, H*W/4, d]``; the inverse
reshape/permute folds it back. Around it: local 3x3 conv + 1x1 conv to the
transformer dim, 1x1 conv back, concat with the block's input, 3x3 fusion conv.
Convs are conv-BN-SiLU as in MobileViT.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qlower.zoo._common import ZooModel, check_size, fit_bn_stats_in_eval, random_image_classifier

DEFAULT_SIZE = 32
STEM_STRIDE = 2
PATCH = 2
MULTIPLE = STEM_STRIDE * PATCH  # the block's input must be divisible by the patch size
SEED = 1010
CHANNELS, DIM, HEADS = 16, 32, 2


class ConvBNSiLU(nn.Sequential):
    """Conv (no bias) → BatchNorm → SiLU."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU()
        )


class TransformerLayer(nn.Module):
    """Pre-norm: ``x + attn(ln1(x))`` with qkv split by ``torch.chunk``, then ``x + mlp(ln2(x))`` (SiLU)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (
            t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2) for t in torch.chunk(self.qkv(x), 3, dim=-1)
        )
        attn = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
        return self.proj(torch.matmul(attn, v).transpose(1, 2).reshape(b, n, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.fc2(F.silu(self.fc1(self.norm2(x))))


class MobileViTBlock(nn.Module):
    """``[N, C, H, W]`` → ``[N, C, H, W]`` (H and W multiples of ``patch``)."""

    def __init__(self, channels: int, dim: int, heads: int, patch: int = PATCH) -> None:
        super().__init__()
        self.patch = patch
        self.local = ConvBNSiLU(channels, channels, 3)
        self.to_dim = nn.Conv2d(channels, dim, 1, bias=False)
        self.transformer = TransformerLayer(dim, heads)
        self.norm = nn.LayerNorm(dim)
        self.from_dim = ConvBNSiLU(dim, channels, 1)
        self.fusion = ConvBNSiLU(2 * channels, channels, 3)

    def unfold(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, d, H, W]`` → ``[N*p*p, H*W/(p*p), d]``: one sequence of patches per pixel position in a patch."""
        n, d, h, w = x.shape
        p = self.patch
        x = x.reshape(n, d, h // p, p, w // p, p).permute(0, 3, 5, 2, 4, 1)  # [N, p, p, H/p, W/p, d]
        return x.reshape(n * p * p, (h // p) * (w // p), d)

    def fold(self, x: torch.Tensor, n: int, h: int, w: int) -> torch.Tensor:
        """The inverse of ``unfold``."""
        p = self.patch
        x = x.reshape(n, p, p, h // p, w // p, -1).permute(0, 5, 3, 1, 4, 2)  # [N, d, H/p, p, W/p, p]
        return x.reshape(n, -1, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        y = self.to_dim(self.local(x))
        y = self.norm(self.transformer(self.unfold(y)))
        y = self.from_dim(self.fold(y, n, h, w))
        return self.fusion(torch.cat((x, y), dim=1))


class MobileViTTiny(nn.Module):
    """Input ``[N, 3, S, S]`` (S a multiple of 4) → logits ``[N, num_classes]``."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = ConvBNSiLU(3, CHANNELS, 3, STEM_STRIDE)
        self.block = MobileViTBlock(CHANNELS, DIM, HEADS)
        self.fc = nn.Linear(CHANNELS, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(size: int | None = None) -> ZooModel:
    """Seeded stem + MobileViT block with BN statistics from random images; static per-channel int8."""
    s = check_size("mobilevit_block", size, DEFAULT_SIZE, MULTIPLE)
    if s % MULTIPLE:
        raise ValueError(
            f"zoo model 'mobilevit_block': size must be a multiple of {MULTIPLE} "
            f"(stem stride {STEM_STRIDE} x patch {PATCH}), got {s}"
        )
    return random_image_classifier(MobileViTTiny, s, SEED, calibration_batches=8, fit_bn=fit_bn_stats_in_eval)
