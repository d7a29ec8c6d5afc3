"""Model zoo: the models qlower is tested and benchmarked on, built deterministically.

``get(name, size=None)`` returns ``(model, example_inputs, quant_config,
calibration_batches)`` (a ``ZooModel``): an eval-mode float32 module, a tuple of
batch-1 input tensors, the ``QuantConfig`` the model is meant to be quantized
with, and a few calibration input tuples of the same shapes as the example.
``size`` sets the input resolution of image models (the architecture is
unchanged); models with a fixed input shape reject it. Weights are random with
a fixed seed (BatchNorm statistics estimated on random inputs), except
``digits_cnn``, which is trained on scikit-learn's digits and cached.

``get(name, trained=True)`` gives a trained, narrow version of ``mobilenet_v2``,
``resnet18``, ``timm_vit_tiny`` or ``mobilenet_v3_small`` instead (digits at
3x32x32, 10 classes; ``trained_names()`` lists them), and ``held_out(name)``
the labelled images to measure its accuracy on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from qlower.zoo import (
    cnn,
    convnext,
    digits,
    efficientnet,
    kws,
    mobilenet_v2,
    mobilenet_v3,
    mobilevit,
    resnet,
    scenarios,
    trained,
    unet,
    vit,
    vit_tiny,
)
from qlower.zoo._common import ZooModel
from qlower.zoo.trained import LabelledData, held_out
from qlower.zoo.trained import build as build_trained

__all__ = ["LabelledData", "ZooModel", "default_size", "describe", "get", "held_out", "names", "trained_description",
           "trained_names"]


@dataclass(frozen=True)
class _Entry:
    build: Callable[[int | None], ZooModel]
    description: str
    default_size: int | None  # input height/width when ``size`` may change it, else None


_REGISTRY: dict[str, _Entry] = {
    "tiny_cnn": _Entry(cnn.build, "3x conv-BN-ReLU, max pool, global avg pool, linear; 1x3x32x32 → 10", 32),
    "mobilenet_v2": _Entry(
        mobilenet_v2.build, "MobileNetV2 width 1.0, inverted residuals, ReLU6, BN; 1x3x224x224 → 1000", 224
    ),
    "resnet18": _Entry(resnet.build, "ResNet-18, BasicBlocks, BN; 1x3x224x224 → 1000", 224),
    "vit_block": _Entry(
        vit.build, "ViT block without LayerNorm: patch conv, 2-head attention, GELU MLP; 1x3x32x32 → 10", 32
    ),
    "digits_cnn": _Entry(digits.build, "CNN trained on sklearn digits (cached); 1x1x8x8 → 10", None),
    "s0_dynamic_biasless": _Entry(
        scenarios.build_s0, "S0: bias-less MobileNet-style convs + identical-weight twins; dynamic per-tensor", 32
    ),
    "s1_conv_relu_cat": _Entry(
        scenarios.build_s1, "S1: conv → relu → cat((relu, y)) → conv; acts [-127, 127], relu zp ~ -111", 16
    ),
    "s2_perchannel_binary": _Entry(
        scenarios.build_s2, "S2: x*c and x+c (per-channel c) first in line, conv chain + side conv; dynamic", 16
    ),
    "s3_const_cat": _Entry(
        scenarios.build_s3, "S3: no inputs, cat of two constant ramps; output fixed at scale 1/127 in [-127, 127]", None
    ),
    "s4_attention": _Entry(
        scenarios.build_s4, "S4: attention (q/k/v linear, heads, matmul, softmax, matmul, linear); 1x16x32", None
    ),
    "mobilenet_v3_small": _Entry(
        mobilenet_v3.build,
        "MobileNetV3-Small width 0.5, hardswish, hardsigmoid SE, 5x5 depthwise, BN; 1x3x224x224 → 1000",
        224,
    ),
    "efficientnet_lite": _Entry(
        efficientnet.build,
        "EfficientNet-Lite0 first 5 stages, MBConv, ReLU6, one SiLU/sigmoid SE, BN; 1x3x224x224 → 1000",
        224,
    ),
    "convnext_block": _Entry(
        convnext.build,
        "ConvNeXt stem + 2 blocks: 7x7 depthwise, channels LayerNorm, GELU MLP, layer scale; 1x3x32x32 → 10",
        32,
    ),
    "timm_vit_tiny": _Entry(
        vit_tiny.build, "timm-style ViT, dim 64, 2 heads, 2 pre-norm blocks, cls token, qkv unbind; 1x3x32x32 → 10", 32
    ),
    "mobilevit_block": _Entry(
        mobilevit.build,
        "Conv stem + MobileViT block: 2x2 unfold/fold, chunked-qkv attention, SiLU MLP, fusion; 1x3x32x32 → 10",
        32,
    ),
    "unet_tiny": _Entry(
        unet.build,
        "2-level U-Net: conv-BN-ReLU, max pool, ConvTranspose2d + bilinear up, skip cat; 1x3x32x32 → 1x4x32x32",
        32,
    ),
    "ds_cnn_kws": _Entry(
        kws.build_ds_cnn, "Keyword spotting DS-CNN: 10x4 conv, 4 depthwise-separable blocks; 1x1x49x10 → 12", None
    ),
    "lstm_kws": _Entry(
        kws.build_lstm, "Keyword spotting LSTM (hidden 64) over 49 MFCC frames, last step → linear; 1x49x10 → 12", None
    ),
}


def names() -> list[str]:
    """Every model name, in a fixed order."""
    return list(_REGISTRY)


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; known models: {', '.join(_REGISTRY)}") from None


def describe(name: str) -> str:
    """One line saying what the model is."""
    return f"{name}: {_entry(name).description}"


def default_size(name: str) -> int | None:
    """The default input height/width of an image model; None when the input shape is fixed (``size`` rejected)."""
    return _entry(name).default_size


def trained_names() -> list[str]:
    """The models ``get(name, trained=True)`` takes."""
    return trained.names()


def trained_description(name: str) -> str | None:
    """What the trained version of ``name`` is (None for digits_cnn, trained as it is, or an untrained model)."""
    recipe = trained.RECIPES.get(name)
    return recipe.description if recipe else None


def get(name: str, size: int | None = None, trained: bool = False) -> ZooModel:
    """Build ``name``: ``(model, example_inputs, quant_config, calibration_batches)``.

    ``size`` (image models only) sets the square input resolution, e.g. 32 for
    fast tests. ``trained=True``: the trained version (see ``trained_names()``;
    trained once and cached), calibrated on training images. Raises ValueError
    for an unknown name, an unusable size, or a model without trained weights.
    """
    entry = _entry(name)
    if trained:
        return build_trained(name, size)
    return entry.build(size)

