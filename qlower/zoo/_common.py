"""Shared pieces of the zoo: the returned bundle, seeding, BN statistics, random batches.

Every zoo model is built deterministically: weights come from a fixed seed drawn
inside ``torch.random.fork_rng`` (the caller's global RNG state is left untouched)
and inputs from a private ``torch.Generator``. Models with BatchNorm get their
running statistics estimated on random inputs, so that in eval mode activations
are roughly normalised instead of exploding or vanishing through random layers.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch import nn

from qlower.frontend.config import QuantConfig

InputTuple = tuple[torch.Tensor, ...]


class ZooModel(NamedTuple):
    """What ``qlower.zoo.get`` returns; unpacks as a 4-tuple.

    ``model`` is float32 and in eval mode; ``example_inputs`` has batch size 1;
    every entry of ``calibration_batches`` has the same shapes as
    ``example_inputs`` (exported graphs are specialised to those shapes).
    """

    model: nn.Module
    example_inputs: InputTuple
    quant_config: QuantConfig
    calibration_batches: list[InputTuple]


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block with the global torch RNG seeded, restoring the caller's state after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def generator(seed: int) -> torch.Generator:
    """A private CPU generator, for inputs that must not depend on global RNG state."""
    return torch.Generator().manual_seed(seed)


def randn_batches(shape: Sequence[int], count: int, seed: int) -> list[InputTuple]:
    """``count`` single-input batches of standard normal data of ``shape``."""
    g = generator(seed)
    return [(torch.randn(*shape, generator=g),) for _ in range(count)]


def bn_estimation_batches(channels: int, size: int, seed: int, max_images: int = 256) -> list[InputTuple]:
    """Random images for ``estimate_bn_stats``: about as many pixels as 8 images at 224x224.

    Small inputs get more images, so that deep layers with 1x1 feature maps
    still see enough samples per channel for stable statistics.
    """
    images = min(max_images, max(8, math.ceil(8 * 224 * 224 / (size * size))))
    batch = min(images, 32)
    return randn_batches((batch, channels, size, size), math.ceil(images / batch), seed)


def kaiming_init(model: nn.Module) -> None:
    """He-normal weights for convs/linears (keeps activation scale ~1 through ReLUs), small random biases.

    BatchNorm and LayerNorm affine parameters are randomised away from (1, 0)
    so that BN folding and the norms' scale/shift are exercised with non-trivial
    values.
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.normal_(m.bias, std=0.05)
        elif isinstance(m, nn.BatchNorm2d | nn.LayerNorm) and m.weight is not None:
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.normal_(m.bias, std=0.1)


@torch.no_grad()
def estimate_bn_stats(model: nn.Module, batches: Sequence[InputTuple]) -> nn.Module:
    """Set every BatchNorm's running mean/var to the cumulative average over ``batches``.

    Runs the model in train mode with ``momentum=None`` (PyTorch's cumulative
    moving average), then restores each BN's momentum and returns the model in
    eval mode.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    for batch in batches:
        model(*batch)
    for m, momentum in zip(norms, saved):
        m.momentum = momentum
    return model.eval()


@torch.no_grad()
def fit_bn_stats_in_eval(model: nn.Module, batches: Sequence[InputTuple]) -> nn.Module:
    """Set every BatchNorm's running mean/var to the statistics of its input in eval mode, layer by layer.

    One eval-mode forward over ``batches`` concatenated along the batch axis; a
    pre-hook on each BatchNorm sets its statistics from the input it is about to
    normalise, so every BN is fitted to what the already-fitted layers before it
    produce. Unlike ``estimate_bn_stats`` (train mode, batch statistics), this
    stays exact where train and eval behaviour part ways, e.g. after
    squeeze-excitation gates on 1x1 feature maps. Returns the model in eval mode.
    """

    def fit(bn: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        x = args[0].transpose(0, 1).flatten(1)  # [C, N*H*W]
        bn.running_mean.copy_(x.mean(dim=1))
        bn.running_var.copy_(x.var(dim=1))

    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    hooks = [m.register_forward_pre_hook(fit) for m in norms]
    try:
        model.eval()
        model(*(torch.cat(parts) for parts in zip(*batches)))
    finally:
        for h in hooks:
            h.remove()
    return model


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round a channel count to a multiple of ``divisor``, never more than 10% below ``value``."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def check_size(name: str, size: int | None, default: int, minimum: int) -> int:
    """Resolve an image model's ``size`` argument, rejecting sizes the architecture can't take."""
    if size is None:
        return default
    if not isinstance(size, int) or size < minimum:
        raise ValueError(f"zoo model {name!r}: size must be an int >= {minimum}, got {size!r}")
    return size


def random_image_classifier(make: Callable[[], nn.Module], size: int, seed: int, calibration_batches: int = 4,
                            head: str | None = None, fit_bn: Callable[..., nn.Module] = estimate_bn_stats) -> ZooModel:
    """A seeded image classifier with random weights: Kaiming init (the ``head`` Linear, if named,
    N(0, 0.01) so the logits stay small), BatchNorm statistics from random images (by ``fit_bn``), and
    NCHW ``randn`` calibration batches and example input (static per-channel int8 config)."""
    with seeded(seed):
        model = make()
        kaiming_init(model)
        if head is not None:
            nn.init.normal_(getattr(model, head).weight, std=0.01)
    fit_bn(model, bn_estimation_batches(3, size, seed + 1))
    calibration = randn_batches((1, 3, size, size), calibration_batches, seed + 2)
    example = randn_batches((1, 3, size, size), 1, seed + 3)[0]
    return ZooModel(model, example, QuantConfig(), calibration)
