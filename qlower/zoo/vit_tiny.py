"""timm_vit_tiny: a two-block ViT written the way timm writes ``VisionTransformer``, 10 classes.

Unlike ``vit_block`` this one has everything a real ViT graph has: a class token
(an expanded parameter concatenated in front of the patch tokens), a position
embedding add, pre-norm blocks with LayerNorm, a fused qkv Linear split by
``reshape → permute → unbind``, an explicit ``q @ k^T * scale`` (the scale is
not folded), a final LayerNorm and the class token picked by ``x[:, 0]``.
Embed dim 64, 2 heads, MLP ratio 4, patch 8.
"""

from __future__ import annotations

import torch
from torch import nn

from qlower.frontend.config import QuantConfig
from qlower.zoo._common import ZooModel, check_size, randn_batches, seeded

DEFAULT_SIZE = 32
PATCH = 8
MIN_SIZE = PATCH
SEED = 909
DIM, HEADS, DEPTH, MLP_RATIO = 64, 2, 2, 4
QK_GAIN = 2.5  # q/k weights sharper than xavier, so attention logits have std ~1


class Attention(nn.Module):
    """timm's ``Attention``: fused qkv, heads, explicit scaled dot product, softmax, projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention dim {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, N, D]
        attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    """Linear → GELU → Linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, mlp_ratio * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """Input ``[N, 3, S, S]`` (S a multiple of ``patch``) → logits ``[N, num_classes]``."""

    def __init__(
        self,
        size: int,
        patch: int = PATCH,
        dim: int = DIM,
        heads: int = HEADS,
        depth: int = DEPTH,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (size // patch) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, MLP_RATIO) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # [N, T, D]
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.blocks(x + self.pos_embed)
        return self.head(self.norm(x)[:, 0])


def build(size: int | None = None) -> ZooModel:
    """Seeded ViT (17 tokens of dim 64 at the default size 32); static per-channel int8 config."""
    s = check_size("timm_vit_tiny", size, DEFAULT_SIZE, MIN_SIZE)
    if s % PATCH:
        raise ValueError(f"zoo model 'timm_vit_tiny': size must be a multiple of the patch size {PATCH}, got {s}")
    with seeded(SEED):
        model = VisionTransformer(s)
        for m in model.modules():
            if isinstance(m, nn.Linear | nn.Conv2d):
                nn.init.xavier_normal_(m.weight)
                nn.init.normal_(m.bias, std=0.05)
            elif isinstance(m, nn.LayerNorm):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.normal_(m.bias, std=0.1)
        nn.init.normal_(model.cls_token, std=0.5)
        nn.init.normal_(model.pos_embed, std=0.2)
        for block in model.blocks:
            block.attn.qkv.weight.data[: 2 * DIM].mul_(QK_GAIN)
        nn.init.normal_(model.head.weight, std=0.1)
    model.eval()
    calibration = randn_batches((1, 3, s, s), 8, SEED + 2)
    example = randn_batches((1, 3, s, s), 1, SEED + 3)[0]
    return ZooModel(model, example, QuantConfig(), calibration)
