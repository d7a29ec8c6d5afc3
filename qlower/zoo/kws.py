"""Keyword spotting (Zhang et al. 2017, "Hello Edge"): DS-CNN and LSTM on 49 MFCC frames x 10 coefficients.

The two audio models of the zoo, 12 classes each (10 keywords, silence,
unknown), with fixed input shapes: ``ds_cnn_kws`` takes ``[1, 1, 49, 10]`` (a
one-channel image: frames x coefficients) and brings a non-square 10x4 stride-2
conv and a non-square average pool; ``lstm_kws`` takes ``[1, 49, 10]`` and
brings a recurrent layer. Inputs are standard normal, like normalised MFCCs.
"""

from __future__ import annotations

import torch
from torch import nn

from qlower.frontend.config import QuantConfig
from qlower.zoo._common import ZooModel, fit_bn_stats_in_eval, kaiming_init, randn_batches, seeded

FRAMES, COEFFICIENTS, NUM_CLASSES = 49, 10, 12


def _reject_size(name: str, size: int | None, shape: tuple[int, ...]) -> None:
    if size is not None:
        raise ValueError(
            f"zoo model {name!r} has a fixed {list(shape)} input; call get({name!r}) without size, got size={size!r}"
        )


# ---------------------------------------------------------------- DS-CNN

DS_CNN_SHAPE = (1, 1, FRAMES, COEFFICIENTS)
DS_CNN_SEED = 1600
DS_CNN_CHANNELS, DS_CNN_BLOCKS = 64, 4


class DSCNN(nn.Module):
    """Conv 10x4 stride 2 (64 ch) → 4 x (3x3 depthwise, 1x1 pointwise; each BN + ReLU) → avg pool → linear.

    The first conv pads (5, 1), which gives TensorFlow's "SAME" output size,
    25x5, for the 49x10 input (SAME would pad 4 above and 5 below).
    """

    def __init__(
        self, channels: int = DS_CNN_CHANNELS, blocks: int = DS_CNN_BLOCKS, num_classes: int = NUM_CLASSES
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(1, channels, (10, 4), stride=2, padding=(5, 1), bias=False), nn.BatchNorm2d(channels), nn.ReLU(),
        ]  # fmt: skip
        for _ in range(blocks):
            layers += [
                nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
                nn.BatchNorm2d(channels),
                nn.ReLU(),
                nn.Conv2d(channels, channels, 1, bias=False),
                nn.BatchNorm2d(channels),
                nn.ReLU(),
            ]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AvgPool2d(((FRAMES + 1) // 2, (COEFFICIENTS + 1) // 2))  # the whole 25x5 map
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def build_ds_cnn(size: int | None = None) -> ZooModel:
    """Seeded DS-CNN with BN statistics from random MFCC-shaped inputs; static per-channel int8 config."""
    _reject_size("ds_cnn_kws", size, DS_CNN_SHAPE)
    with seeded(DS_CNN_SEED):
        model = DSCNN()
        kaiming_init(model)
        nn.init.normal_(model.fc.weight, std=0.1)
    fit_bn_stats_in_eval(model, randn_batches((32, *DS_CNN_SHAPE[1:]), 8, DS_CNN_SEED + 1))
    calibration = randn_batches(DS_CNN_SHAPE, 8, DS_CNN_SEED + 2)
    example = randn_batches(DS_CNN_SHAPE, 1, DS_CNN_SEED + 3)[0]
    return ZooModel(model, example, QuantConfig(), calibration)


# ---------------------------------------------------------------- LSTM

LSTM_SHAPE = (1, FRAMES, COEFFICIENTS)
LSTM_SEED = 1700
LSTM_HIDDEN = 64
FORGET_BIAS = 3.0


class LSTMKWS(nn.Module):
    """One-layer LSTM (hidden 64) over the 49 frames; the last step's output → linear to 12 classes."""

    def __init__(self, hidden: int = LSTM_HIDDEN, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size=COEFFICIENTS, hidden_size=hidden, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)  # [N, 49, hidden]
        return self.fc(out[:, -1])


def build_lstm(size: int | None = None) -> ZooModel:
    """Seeded LSTM KWS model (Xavier-uniform gate weights, forget bias 3); static per-channel int8 config."""
    _reject_size("lstm_kws", size, LSTM_SHAPE)
    with seeded(LSTM_SEED):
        model = LSTMKWS()
        for name, p in model.lstm.named_parameters():
            if name.startswith("weight"):
                nn.init.xavier_uniform_(p)
            else:
                nn.init.uniform_(p, -0.1, 0.1)
        # Gates are stacked (input, forget, cell, output). A forget bias of 3 (sigmoid ~0.95) lets the
        # early frames reach the last step; with ~0 the state forgets them within a dozen frames.
        model.lstm.bias_ih_l0.data[LSTM_HIDDEN : 2 * LSTM_HIDDEN] += FORGET_BIAS
        nn.init.xavier_normal_(model.fc.weight)
        nn.init.normal_(model.fc.bias, std=0.05)
    model.eval()
    calibration = randn_batches(LSTM_SHAPE, 8, LSTM_SEED + 2)
    example = randn_batches(LSTM_SHAPE, 1, LSTM_SEED + 3)[0]
    return ZooModel(model, example, QuantConfig(), calibration)
