"""digits_cnn: a small CNN trained on scikit-learn's bundled 8x8 digits (no download), cached on disk.

Training is deterministic in its data (fixed stratified split, seed ``SEED``)
and takes a few seconds on a CPU. The trained weights are stored as
safetensors (no pickle) in ``$QLOWER_CACHE_DIR`` or ``~/.cache/qlower``; the file
name carries a version, so a change of architecture or recipe never loads stale
weights. A cache file that can't be read, or doesn't match the architecture, is
retrained and overwritten. Writes are atomic, so concurrent test workers are safe.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from qlower.frontend.config import QuantConfig
from qlower.zoo._common import ZooModel
from qlower.zoo.training import fit
from qlower.zoo.weights_cache import cache_dir, cached_or_trained, load_cached

SEED = 505
CACHE_VERSION = 2  # 2: trained on one thread (the same weights on every machine)
TEST_FRACTION = 0.2
EPOCHS = 15
BATCH = 64


class DigitsCNN(nn.Module):
    """Input ``[N, 1, 8, 8]`` (values in [-1, 1]) → logits ``[N, 10]``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def dataset() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_train, y_train, x_test, y_test)``: x float32 ``[N, 1, 8, 8]`` in [-1, 1], y int64 labels.

    The split is fixed (stratified, ``random_state=0``, 20% test): 1437 train, 360 test images.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0  # pixels 0..16 → [-1, 1]
    y = torch.tensor(digits.target, dtype=torch.int64)
    idx_train, idx_test = train_test_split(
        torch.arange(len(y)).numpy(), test_size=TEST_FRACTION, random_state=0, stratify=digits.target
    )
    idx_train, idx_test = torch.from_numpy(idx_train), torch.from_numpy(idx_test)
    return x[idx_train], y[idx_train], x[idx_test], y[idx_test]


HARD_SEED = 2811  # the digits-hard distortion's draws
HARD_COPIES = 2  # distorted copies of each held-out image


def distort(x: torch.Tensor, seed: int = HARD_SEED, *, rotate: float = 2.0, scale: float = 0.03, shear: float = 0.03,
            shift: float = 0.0, noise: float = 0.15, occlude: float = 0.25) -> torch.Tensor:
    """``x`` ``[N, C, H, W]`` (background -1, ink +1) under a fixed random distortion per image, drawn from
    ``seed``: an affine map (rotation up to ``rotate`` degrees, scale ``1 ± scale``, shear, shift by up to
    ``shift`` of the size; outside the image is background), Gaussian noise of std ``noise``, and a
    rectangle of background-to-ink grey covering up to ``occlude`` of each side at a random place.
    Deterministic: the same images and seed give the same result on every machine (one private generator,
    CPU bilinear sampling)."""
    g = torch.Generator().manual_seed(seed)
    n, c, h, w = x.shape

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)

    angle = torch.deg2rad(uniform(-rotate, rotate))
    zoom = uniform(1 - scale, 1 + scale)
    sh = uniform(-shear, shear)
    tx, ty = uniform(-2 * shift, 2 * shift), uniform(-2 * shift, 2 * shift)  # in [-1, 1] grid units
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack([torch.stack([cos, -sin + sh, tx], 1), torch.stack([sin, cos, ty], 1)], 1).float()
    grid = F.affine_grid(theta, [n, c, h, w], align_corners=False)
    out = F.grid_sample(x + 1, grid, mode="bilinear", padding_mode="zeros", align_corners=False) - 1
    out = out + noise * torch.randn(out.shape, generator=g)
    bh, bw = (uniform(0.15, occlude) * h).ceil().long(), (uniform(0.15, occlude) * w).ceil().long()
    y0 = (torch.rand(n, generator=g, dtype=torch.float64) * (h - bh + 1)).long()
    x0 = (torch.rand(n, generator=g, dtype=torch.float64) * (w - bw + 1)).long()
    grey = uniform(-1, 1).float()
    rows, cols = torch.arange(h), torch.arange(w)
    box = (((rows >= y0[:, None]) & (rows < (y0 + bh)[:, None]))[:, :, None]
           & ((cols >= x0[:, None]) & (cols < (x0 + bw)[:, None]))[:, None, :])[:, None]
    out = torch.where(box, grey[:, None, None, None], out)
    return out.clamp(-1.5, 1.5).contiguous()


def hard_split(x_test: torch.Tensor, y_test: torch.Tensor, copies: int = HARD_COPIES) -> tuple[torch.Tensor, torch.Tensor]:
    """digits-hard: ``copies`` distorted copies of each held-out image (``distort``, copy k drawn from
    ``HARD_SEED + k``, so the first ``HARD_COPIES`` are the standard split), and their labels."""
    xs = [distort(x_test, HARD_SEED + k) for k in range(copies)]
    return torch.cat(xs), y_test.repeat(copies)


def cache_path() -> Path:
    """Where the trained weights live (versioned file name)."""
    return cache_dir() / f"digits_cnn-v{CACHE_VERSION}.safetensors"


def train(x_train: torch.Tensor, y_train: torch.Tensor) -> DigitsCNN:
    """Train a fresh DigitsCNN with Adam; deterministic shuffling from ``SEED``."""
    return fit(DigitsCNN, x_train, y_train, seed=SEED, epochs=EPOCHS, lr=3e-3, batch=BATCH)


def _load_cached(path: Path) -> DigitsCNN | None:
    """The cached model, or None if there is no usable cache file."""
    return load_cached(DigitsCNN, path)


def trained_model() -> DigitsCNN:
    """The trained DigitsCNN: from the cache if present, else trained now and cached."""
    return cached_or_trained(DigitsCNN, cache_path(), lambda: train(*dataset()[:2]))


def build(size: int | None = None) -> ZooModel:
    """Trained DigitsCNN; calibration batches are training images; static per-channel int8 config."""
    if size not in (None, 8):
        raise ValueError(
            f"zoo model 'digits_cnn' has a fixed 8x8 input; call get('digits_cnn') without size, got {size}"
        )
    model = trained_model()
    x_train, _, x_test, _ = dataset()
    calibration = [(x_train[i : i + 1],) for i in range(8)]
    return ZooModel(model, (x_test[:1],), QuantConfig(), calibration)
