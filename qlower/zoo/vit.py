"""vit_block: one ViT encoder block on patch tokens, without LayerNorm.

Patch embedding (conv, stride = patch) → tokens ``[N, T, D]`` + learned
position embedding → multi-head self-attention (linear q/k/v, reshape to heads,
permute, matmul, softmax, matmul, permute, reshape, linear projection) →
residual add → MLP (linear, GELU, linear) → residual add → mean over tokens →
linear head. LayerNorm is left out on purpose (qlower doesn't lower it yet);
the attention scale ``1/sqrt(head_dim)`` is folded into the q projection, so
the graph holds exactly the ops listed above.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from qlower.frontend.config import QuantConfig
from qlower.zoo._common import ZooModel, check_size, randn_batches, seeded

DEFAULT_SIZE = 32
PATCH = 8
MIN_SIZE = PATCH
SEED = 404
QK_GAIN = 2.5


class MultiHeadSelfAttention(nn.Module):
    """Attention over ``[N, T, D]`` with ``heads`` heads; q is pre-scaled by ``1/sqrt(D/heads)``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention dim {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    @torch.no_grad()
    def fold_query_scale(self) -> None:
        """Multiply q's weight and bias by ``1/sqrt(head_dim)`` (call once, after initialisation)."""
        scale = 1.0 / math.sqrt(self.q.out_features // self.heads)
        self.q.weight.mul_(scale)
        self.q.bias.mul_(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        hd = d // self.heads
        q = self.q(x).reshape(n, t, self.heads, hd).permute(0, 2, 1, 3)  # [N, H, T, hd]
        k = self.k(x).reshape(n, t, self.heads, hd).permute(0, 2, 3, 1)  # [N, H, hd, T]
        v = self.v(x).reshape(n, t, self.heads, hd).permute(0, 2, 1, 3)  # [N, H, T, hd]
        attn = torch.softmax(torch.matmul(q, k), dim=-1)
        out = torch.matmul(attn, v).permute(0, 2, 1, 3).reshape(n, t, d)
        return self.proj(out)


class ViTBlock(nn.Module):
    """Input ``[N, 3, S, S]`` (S a multiple of ``patch``) → logits ``[N, num_classes]``."""

    def __init__(self, size: int, patch: int = PATCH, dim: int = 32, heads: int = 2, num_classes: int = 10) -> None:
        super().__init__()
        tokens = (size // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, dim))
        self.attn = MultiHeadSelfAttention(dim, heads)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # [N, D, S/p, S/p]
        x = x.flatten(2).permute(0, 2, 1) + self.pos_embed  # [N, T, D]
        x = x + self.attn(x)
        x = x + self.fc2(self.act(self.fc1(x)))
        return self.head(x.mean(dim=1))


def build(size: int | None = None) -> ZooModel:
    """Seeded ViT block (16 tokens of dim 32, 2 heads at the default size 32); static per-channel int8 config."""
    s = check_size("vit_block", size, DEFAULT_SIZE, MIN_SIZE)
    if s % PATCH:
        raise ValueError(f"zoo model 'vit_block': size must be a multiple of the patch size {PATCH}, got {s}")
    with seeded(SEED):
        model = ViTBlock(s)
        for m in model.modules():
            if isinstance(m, nn.Linear | nn.Conv2d):
                nn.init.xavier_normal_(m.weight)
                nn.init.normal_(m.bias, std=0.05)
        nn.init.normal_(model.pos_embed, std=0.2)
        for proj in (model.attn.q, model.attn.k):  # sharper attention than xavier gives: logits std ~1
            proj.weight.data.mul_(QK_GAIN)
        model.attn.fold_query_scale()
    model.eval()
    calibration = randn_batches((1, 3, s, s), 8, SEED + 2)
    example = randn_batches((1, 3, s, s), 1, SEED + 3)[0]
    return ZooModel(model, example, QuantConfig(), calibration)
