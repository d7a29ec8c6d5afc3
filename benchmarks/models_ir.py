"""int8 IR graphs of benchmark networks, built directly with GraphBuilder (random int8 weights).

* ``build_mobilenet_v2`` — reused from ``reference_speed.py`` (the real layer list at
  224x224x3, int8 residual adds as rescale-to-int32 / add / rescale back).
* ``build_resnet18`` — ResNet-18 (BasicBlocks [2, 2, 2, 2]) in the same style: 7x7
  stride-2 conv, 3x3 stride-2 max pool, 3x3 convs, 1x1 stride-2 downsampling convs,
  int8 residual adds followed by ReLU (the output zero point at qmin), average
  pooling over the whole feature map, a 1000-way fully connected layer.

Weights are random int8 with per-channel scales ~ 1/(73 sqrt(K)) and int32 biases,
so that activations keep a useful spread of codes through the random layers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from qlower.ir import DType, Graph, GraphBuilder, QuantSpec, TensorType, Value, verify_graph

sys.path.insert(0, str(Path(__file__).parent))
from reference_speed import build_mobilenet_v2, macs  # noqa: E402

RELU = QuantSpec.per_tensor(4 / 255, -128)    # zero point at qmin: ReLU is the rescale's clamp
LINEAR = QuantSpec.per_tensor(0.05, 0)

__all__ = ["build_mobilenet_v2", "build_resnet18", "macs"]


class _ResNet:
    def __init__(self, seed: int) -> None:
        self.b = GraphBuilder("resnet18")
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def conv(self, x: Value, out_c: int, k: int, stride: int, out: QuantSpec) -> Value:
        in_c = x.shape[3]
        self.n += 1
        name = f"conv{self.n}"
        w_scale = (1.0 + 0.1 * self.rng.random(out_c)) / (73.0 * np.sqrt(k * k * in_c))
        w = self.b.constant(self.rng.integers(-127, 128, size=(out_c, k, k, in_c), dtype=np.int8),
                            QuantSpec.per_channel(w_scale, axis=0), name=name + "_w")
        bias = self.b.constant(self.rng.integers(-1000, 1000, size=out_c, dtype=np.int32),
                               QuantSpec.accumulator(x.quant, w.quant, axis=0), name=name + "_b")
        acc = self.b.op("conv2d", x, w, bias, stride=(stride, stride), pad=(k // 2,) * 4, name=name)
        return self.b.op("rescale", acc, out=out, name=name + "_q")

    def add_relu(self, a: Value, c: Value) -> Value:
        common = QuantSpec.per_tensor(min(a.quant.scale[0], c.quant.scale[0]) / 2**10, 0, DType.INT32)
        a32 = self.b.op("rescale", a, out=common, name="res_a")
        c32 = self.b.op("rescale", c, out=common, name="res_b")
        return self.b.op("rescale", self.b.op("add", a32, c32, name="res_add"), out=RELU, name="res_q")

    def block(self, x: Value, out_c: int, stride: int) -> Value:
        identity = x
        if stride != 1 or x.shape[3] != out_c:
            identity = self.conv(x, out_c, 1, stride, LINEAR)
        h = self.conv(x, out_c, 3, stride, RELU)
        h = self.conv(h, out_c, 3, 1, LINEAR)
        return self.add_relu(h, identity)

    def build(self, size: int) -> Graph:
        b = self.b
        x = b.input("image", TensorType((1, size, size, 3), DType.INT8, QuantSpec.per_tensor(1 / 64, 0)))
        h = self.conv(x, 64, 7, 2, RELU)
        h = b.op("max_pool2d", h, kernel=(3, 3), stride=(2, 2), pad=(1, 1, 1, 1), name="maxpool")
        for out_c, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            h = self.block(h, out_c, stride)
            h = self.block(h, out_c, 1)
        pooled = b.op("avg_pool2d", h, kernel=h.shape[1:3], stride=(1, 1), name="gap")
        flat = b.op("reshape", pooled, shape=(1, 512), name="flatten")
        fc_w = b.constant(self.rng.integers(-127, 128, size=(1000, 512), dtype=np.int8),
                          QuantSpec.per_channel(np.full(1000, 1 / (73 * np.sqrt(512))), axis=0), name="fc_w")
        fc_b = b.constant(self.rng.integers(-1000, 1000, size=1000, dtype=np.int32),
                          QuantSpec.accumulator(flat.quant, fc_w.quant, axis=0), name="fc_b")
        logits = b.op("rescale", b.op("fully_connected", flat, fc_w, fc_b, name="fc"),
                      out=QuantSpec.per_tensor(0.1, 0), name="logits")
        return b.build([logits])


def build_resnet18(seed: int = 0, size: int = 224) -> Graph:
    return verify_graph(_ResNet(seed).build(size))
