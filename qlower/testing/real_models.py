"""Hugging Face transformers models at reduced size, randomly initialised from tiny configs (nothing is
downloaded), for tests/test_real_models.py and benchmarks/real_models.py.

Each entry builds ``(model, example inputs)`` deterministically from a seed. Text models take token ids
and an attention mask with padding (the masked-attention path); vision and audio models a small input.
timm and ultralytics are not here: both import torchvision, which does not import beside torch 2.13.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class _Logits(nn.Module):
    """A transformers model returning its first output tensor (export wants tensors, not ModelOutput)."""

    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, *args):
        return getattr(self.model(*args), self.key)


def _text_inputs(seed: int, vocab: int, length: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, length), generator=g)
    mask = torch.ones(1, length, dtype=torch.long)
    mask[0, length - 2:] = 0  # two padding tokens: the attention mask matters
    return ids, mask


def _bert(seed: int):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=16, attn_implementation="eager")
    return _Logits(BertForSequenceClassification(cfg), "logits"), _text_inputs(seed, 64)


def _distilbert(seed: int):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    cfg = DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                           max_position_embeddings=16, attn_implementation="eager")
    return _Logits(DistilBertForSequenceClassification(cfg), "logits"), _text_inputs(seed, 64)


def _mobilebert(seed: int):
    from transformers import MobileBertConfig, MobileBertForSequenceClassification
    cfg = MobileBertConfig(vocab_size=64, hidden_size=32, embedding_size=16, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=32, intra_bottleneck_size=16,
                           true_hidden_size=16, max_position_embeddings=16, num_feedforward_networks=2,
                           attn_implementation="eager")
    return _Logits(MobileBertForSequenceClassification(cfg), "logits"), _text_inputs(seed, 64)


def _image(seed: int, size: int, channels: int = 3) -> tuple[torch.Tensor]:
    return (torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(seed)),)


def _vit(seed: int):
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_labels=10, attn_implementation="eager")
    return _Logits(ViTForImageClassification(cfg), "logits"), _image(seed, 32)


def _segformer(seed: int):
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    cfg = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                          num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
                          decoder_hidden_size=32, num_labels=4)
    return _Logits(SegformerForSemanticSegmentation(cfg), "logits"), _image(seed, 32)


def _mobilevit(seed: int):
    from transformers import MobileViTConfig, MobileViTForImageClassification
    cfg = MobileViTConfig(image_size=32, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                          num_attention_heads=2, num_labels=10)
    return _Logits(MobileViTForImageClassification(cfg), "logits"), _image(seed, 32)


def _mobilevitv2(seed: int):
    from transformers import MobileViTV2Config, MobileViTV2ForImageClassification
    cfg = MobileViTV2Config(image_size=64, width_multiplier=0.25, num_labels=10)
    return _Logits(MobileViTV2ForImageClassification(cfg), "logits"), _image(seed, 64)


def _wav2vec2(seed: int):
    from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification
    cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_feat_extract_layers=2,
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, classifier_proj_size=16,
                         num_labels=4, attn_implementation="eager")
    wave = torch.randn(1, 400, generator=torch.Generator().manual_seed(seed))
    return _Logits(Wav2Vec2ForSequenceClassification(cfg), "logits"), (wave,)


def _yolos(seed: int):
    from transformers import YolosConfig, YolosForObjectDetection
    cfg = YolosConfig(image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, num_detection_tokens=4, num_labels=3, attn_implementation="eager")
    return _Logits(YolosForObjectDetection(cfg), "logits"), _image(seed, 32)


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
)}
