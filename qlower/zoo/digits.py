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
