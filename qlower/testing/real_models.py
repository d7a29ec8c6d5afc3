"""Models from the ecosystem at reduced size, randomly initialised (nothing is downloaded), for
tests/test_real_models.py and benchmarks/real_models.py: Hugging Face transformers from tiny configs, timm
backbones by name, ultralytics YOLO11n detection and segmentation from their yaml.

Each entry builds ``(model, example inputs)`` deterministically from a seed. Text models take token ids
and an attention mask with padding (the masked-attention path); vision and audio models a small input.
timm and ultralytics import torchvision, whose native extension may not load beside the CPU torch:
``torchvision_shim.import_torchvision`` imports its Python part first.

``REAL_MODELS`` is benchmarks/real_models.py's set; ``CI_MODELS`` the smaller forms tests/test_real_models.py
compiles for every target within CI's time. Lowering cost grows with the op count (Vela's one-op support
checks, the Vulkan emulation layer compiling a shader per TOSA op), not with widths, so the CI forms cut
depth first: one encoder layer per transformer, one block per stage for timm's staged backbones, and narrow
widths where the architecture takes them; each keeps the ops its architecture is known by:
  - bert, distilbert: embeddings, LayerNorm, attention under a padding mask, GELU (bert: the tanh pooler);
    mobilebert: its bottlenecks, NoNorm and stacked feed-forward networks; vit: patch conv, class token;
    wav2vec2: the convolutional feature encoder and the weight-normed positional conv; yolos: the detection
    tokens and the interpolated position embedding;
  - resnet18 (basic blocks, strided 1x1 shortcuts), mobilenetv3_small (depthwise, squeeze-excite,
    hard-swish, hard-sigmoid), efficientnet_b0 (MBConv, SE, SiLU), convnext_atto (7x7 depthwise,
    channels-last LayerNorm, GELU, layer scale), vit_tiny (class token, attention), edgenext (its split
    depthwise-transposed attention with the Fourier position encoding, in stage 2), resnest14d (split
    attention: grouped conv, softmax over the radix), regnetx_002 (grouped convs, 4 stages), repvgg_a0
    (the three-branch training form: 3x3, 1x1 and identity BatchNorm summed), ghostnet (ghost modules'
    cheap depthwise and concat, SE);
YOLO11n is not in the CI set: the smallest YOLO11 scale at its smallest input (32x32, stride 32) costs
about as much as four of the models above on every target (it is exact and integer on all of them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from qlower.testing.torchvision_shim import import_torchvision


class _Logits(nn.Module):
    """A transformers model returning its first output tensor (export wants tensors, not ModelOutput)."""

    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, *args):
        return getattr(self.model(*args), self.key)


def _transformers(*names: str) -> tuple:
    """The named classes of transformers, imported after torchvision's shim (transformers imports an
    installed torchvision, whose native extension may not load)."""
    import_torchvision()
    import transformers
    return tuple(getattr(transformers, name) for name in names)


def _text_inputs(seed: int, vocab: int, length: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, length), generator=g)
    mask = torch.ones(1, length, dtype=torch.long)
    mask[0, length - 2:] = 0  # two padding tokens: the attention mask matters
    return ids, mask


def _bert(seed: int, layers: int = 2):
    BertConfig, BertForSequenceClassification = _transformers("BertConfig", "BertForSequenceClassification")
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=16, attn_implementation="eager")
    return _Logits(BertForSequenceClassification(cfg), "logits"), _text_inputs(seed, 64)


def _distilbert(seed: int, layers: int = 2):
    DistilBertConfig, DistilBertForSequenceClassification = _transformers("DistilBertConfig", "DistilBertForSequenceClassification")
    cfg = DistilBertConfig(vocab_size=64, dim=32, n_layers=layers, n_heads=2, hidden_dim=64,
                           max_position_embeddings=16, attn_implementation="eager")
    return _Logits(DistilBertForSequenceClassification(cfg), "logits"), _text_inputs(seed, 64)


def _mobilebert(seed: int, layers: int = 2):
    MobileBertConfig, MobileBertForSequenceClassification = _transformers("MobileBertConfig", "MobileBertForSequenceClassification")
    cfg = MobileBertConfig(vocab_size=64, hidden_size=32, embedding_size=16, num_hidden_layers=layers,
                           num_attention_heads=2, intermediate_size=32, intra_bottleneck_size=16,
                           true_hidden_size=16, max_position_embeddings=16, num_feedforward_networks=2,
                           attn_implementation="eager")
    return _Logits(MobileBertForSequenceClassification(cfg), "logits"), _text_inputs(seed, 64)


def _image(seed: int, size: int, channels: int = 3) -> tuple[torch.Tensor]:
    return (torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(seed)),)


def _vit(seed: int, layers: int = 2):
    ViTConfig, ViTForImageClassification = _transformers("ViTConfig", "ViTForImageClassification")
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                    intermediate_size=64, num_labels=10, attn_implementation="eager")
    return _Logits(ViTForImageClassification(cfg), "logits"), _image(seed, 32)


def _segformer(seed: int):
    SegformerConfig, SegformerForSemanticSegmentation = _transformers("SegformerConfig", "SegformerForSemanticSegmentation")
    cfg = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                          num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
                          decoder_hidden_size=32, num_labels=4)
    return _Logits(SegformerForSemanticSegmentation(cfg), "logits"), _image(seed, 32)


def _mobilevit(seed: int):
    MobileViTConfig, MobileViTForImageClassification = _transformers("MobileViTConfig", "MobileViTForImageClassification")
    cfg = MobileViTConfig(image_size=32, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                          num_attention_heads=2, num_labels=10)
    return _Logits(MobileViTForImageClassification(cfg), "logits"), _image(seed, 32)


def _mobilevitv2(seed: int):
    MobileViTV2Config, MobileViTV2ForImageClassification = _transformers("MobileViTV2Config", "MobileViTV2ForImageClassification")
    cfg = MobileViTV2Config(image_size=64, width_multiplier=0.25, num_labels=10)
    return _Logits(MobileViTV2ForImageClassification(cfg), "logits"), _image(seed, 64)


def _wav2vec2(seed: int, layers: int = 2):
    Wav2Vec2Config, Wav2Vec2ForSequenceClassification = _transformers("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification")
    cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
                         conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_feat_extract_layers=2,
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, classifier_proj_size=16,
                         num_labels=4, attn_implementation="eager")
    wave = torch.randn(1, 400, generator=torch.Generator().manual_seed(seed))
    return _Logits(Wav2Vec2ForSequenceClassification(cfg), "logits"), (wave,)


def _yolos(seed: int, layers: int = 2):
    YolosConfig, YolosForObjectDetection = _transformers("YolosConfig", "YolosForObjectDetection")
    cfg = YolosConfig(image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                      intermediate_size=64, num_detection_tokens=4, num_labels=3, attn_implementation="eager")
    return _Logits(YolosForObjectDetection(cfg), "logits"), _image(seed, 32)


def _timm(name: str, size: int, **config) -> Callable[[int], tuple[nn.Module, tuple[torch.Tensor]]]:
    """A timm model by name, random init, 10 classes, on a ``size`` x ``size`` image."""
    def make(seed: int):
        import_torchvision()
        import timm
        return timm.create_model(name, pretrained=False, num_classes=10, **config), _image(seed, size)
    return make


def _timm_built(size: int, build: Callable[[], nn.Module]) -> Callable[[int], tuple[nn.Module, tuple[torch.Tensor]]]:
    """A timm model from its classes (``build()``, after timm's import), on a ``size`` x ``size`` image: for
    architectures whose registered names fix the config that create_model's keywords can't change."""
    def make(seed: int):
        import_torchvision()
        return build(), _image(seed, size)
    return make


def _efficientnet_b0_slim() -> nn.Module:
    from timm.models.efficientnet import _gen_efficientnet  # the builder efficientnet_b0 calls, with its multipliers
    return _gen_efficientnet("efficientnet_b0", channel_multiplier=0.25, depth_multiplier=0.1, num_classes=10)


def _regnetx_002_shallow() -> nn.Module:
    from timm.models.regnet import RegNet, model_cfgs
    return RegNet(dataclasses.replace(model_cfgs["regnetx_002"], depth=8), num_classes=10)


def _repvgg_a0_slim() -> nn.Module:
    from timm.models.byobnet import ByobNet, model_cfgs
    cfg = model_cfgs["repvgg_a0"]
    blocks = tuple(dataclasses.replace(b, d=1, c=b.c // 4) for b in cfg.blocks)
    return ByobNet(dataclasses.replace(cfg, blocks=blocks, stem_chs=16), num_classes=10)


def _ghostnet_short() -> nn.Module:
    from timm.models.ghostnet import GhostNet
    # kernel, expansion, out channels, squeeze-excite ratio, stride per block: ghostnet's first blocks
    cfgs = [[[3, 16, 16, 0, 1]], [[3, 48, 24, 0, 2]], [[5, 72, 40, 0.25, 2]], [[3, 120, 48, 0.25, 2]]]
    return GhostNet(cfgs=cfgs, width=0.5, num_classes=10)


class NetworkUsed(RuntimeError):
    """A model builder tried to reach the network (nothing may be downloaded)."""


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """No connection and no name lookup while building: either raises NetworkUsed."""
    def refuse(*args, **kwargs):
        raise NetworkUsed(f"a real-model builder tried to reach the network: {args[:2]}")
    saved = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo, socket.create_connection
    socket.socket.connect = socket.socket.connect_ex = socket.getaddrinfo = socket.create_connection = refuse
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo, socket.create_connection = saved


def _import_ultralytics() -> None:
    """ultralytics offline, quiet, with its settings file in a temporary folder (set before its first import:
    it reads them then)."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_VERBOSE", "False")
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="qlower-ultralytics-"))
    import_torchvision()
    with _offline():
        import ultralytics  # noqa: F401


class _Tensors(nn.Module):
    """YOLO's head in export mode returns a tensor (detect) or a tuple with a list (segment): its tensors."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x)
        return out if isinstance(out, torch.Tensor) else tuple(t for t in torch.utils._pytree.tree_leaves(out)
                                                               if isinstance(t, torch.Tensor))


def _yolo(kind: str, size: int) -> Callable[[int], tuple[nn.Module, tuple[torch.Tensor]]]:
    """YOLO11n (``kind`` "" for detection, "-seg" for segmentation) from its yaml, 4 classes, in export mode
    (the head's decoded boxes, as deployed)."""
    def make(seed: int):
        _import_ultralytics()
        from ultralytics.nn.tasks import DetectionModel, SegmentationModel
        with _offline():
            cls = SegmentationModel if kind == "-seg" else DetectionModel
            model = cls(f"yolo11n{kind}.yaml", nc=4, verbose=False)
        model.model[-1].export = True  # the deployed form: one tensor of boxes and scores, no training outputs
        return _Tensors(model), _image(seed, size)
    return make


@dataclass(frozen=True)
class RealModel:
    name: str
    make: Callable[[int], tuple[nn.Module, tuple[torch.Tensor, ...]]]

    def build(self, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(seed)
        model, inputs = self.make(seed)
        return model.eval(), inputs

    def calibration(self, n: int = 2) -> list[tuple[torch.Tensor, ...]]:
        return [self.make_inputs(100 + i) for i in range(n)]

    def make_inputs(self, seed: int) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(0)
        return self.make(seed)[1]


REAL_MODELS = {m.name: m for m in (
    RealModel("bert", _bert), RealModel("distilbert", _distilbert), RealModel("mobilebert", _mobilebert),
    RealModel("vit", _vit), RealModel("segformer", _segformer), RealModel("mobilevit", _mobilevit),
    RealModel("mobilevitv2", _mobilevitv2), RealModel("wav2vec2", _wav2vec2), RealModel("yolos", _yolos),
    RealModel("resnet18", _timm("resnet18", 32)),
    RealModel("mobilenetv3_small", _timm("mobilenetv3_small_100", 32)),
    RealModel("efficientnet_b0", _timm("efficientnet_b0", 32)),
    RealModel("mobilenetv4_small", _timm("mobilenetv4_conv_small", 32)),
    RealModel("convnext_atto", _timm("convnext_atto", 32)),
    RealModel("vit_tiny", _timm("vit_tiny_patch16_224", 32, img_size=32, patch_size=8, depth=2)),
    RealModel("deit_tiny", _timm("deit_tiny_patch16_224", 32, img_size=32, patch_size=8, depth=2)),
    RealModel("mobilevit_xxs", _timm("mobilevit_xxs", 64)),
    RealModel("edgenext_xx_small", _timm("edgenext_xx_small", 64)),
    RealModel("regnetx_002", _timm("regnetx_002", 32)),
    RealModel("ghostnet", _timm("ghostnet_050", 32)),
    RealModel("repvgg_a0", _timm("repvgg_a0", 32)),
    RealModel("fastvit_t8", _timm("fastvit_t8", 64)),
    RealModel("yolo11n", _yolo("", 32)), RealModel("yolo11n_seg", _yolo("-seg", 32)),
)}

CI_MODELS = {m.name: m for m in (
    # one encoder layer each (2 heads): embeddings, LayerNorm, masked attention, GELU, pooler and head stay
    RealModel("bert", functools.partial(_bert, layers=1)),
    RealModel("distilbert", functools.partial(_distilbert, layers=1)),
    RealModel("mobilebert", functools.partial(_mobilebert, layers=1)),  # bottlenecks, NoNorm, 2 stacked FFNs
    RealModel("vit", functools.partial(_vit, layers=1)),
    RealModel("wav2vec2", functools.partial(_wav2vec2, layers=1)),  # conv feature encoder, weight-norm pos conv
    RealModel("yolos", functools.partial(_yolos, layers=1)),  # detection tokens, interpolated position embedding
    # timm: one block per stage where the architecture has a depth, narrow where it has widths
    RealModel("resnet18", _timm("resnet18", 32, layers=(1, 1, 1, 1), channels=(8, 16, 32, 64), stem_width=8)),
    RealModel("mobilenetv3_small", _timm("mobilenetv3_small_050", 32, depth_multiplier=0.25)),  # SE, hard-swish
    RealModel("efficientnet_b0", _timm_built(32, _efficientnet_b0_slim)),  # MBConv, SE, SiLU, one block a stage
    RealModel("convnext_atto", _timm("convnext_atto", 32, depths=(1, 1, 1, 1), dims=(8, 16, 24, 32))),
    RealModel("vit_tiny", _timm("vit_tiny_patch16_224", 32, img_size=32, patch_size=8, depth=1, embed_dim=32,
                                num_heads=2)),  # class token, LayerNorm, attention, GELU
    RealModel("edgenext_xx_small", _timm("edgenext_xx_small", 32, depths=(1, 1, 1, 1), dims=(16, 24, 32, 48),
                                         global_block_counts=(0, 1, 0, 0), heads=(2, 2, 2, 2))),  # + Fourier pos. enc.
    RealModel("resnest14d", _timm("resnest14d", 32, layers=(1, 1, 1, 1), channels=(8, 16, 32, 64),
                                  stem_width=8)),  # split attention: grouped conv, softmax over the radix
    RealModel("regnetx_002", _timm_built(32, _regnetx_002_shallow)),  # grouped convs, 4 stages
    RealModel("repvgg_a0", _timm_built(32, _repvgg_a0_slim)),  # the 3-branch training form (3x3, 1x1, identity)
    RealModel("ghostnet", _timm_built(32, _ghostnet_short)),  # ghost modules (cheap depthwise + concat), SE
)}
"""The reduced set that tests/test_real_models.py compiles for every target in CI (REAL_MODELS is the
benchmark's larger set). Each reduction keeps what makes the architecture itself, as commented."""
