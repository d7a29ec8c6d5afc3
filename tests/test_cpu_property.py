"""Property test: random small int8 graphs run bit-exactly on the CPU plan.

Hypothesis draws chains of convolutions (any kernel, stride, dilation, asymmetric
padding, groups, depthwise multipliers), pools, quantized residual adds, concats
and pads/slices, with random zero points and scales. ``QLOWER_FUZZ_EXAMPLES``
raises the number of examples (default 25).
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from qlower.errors import IRError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, Value, verify_graph
from qlower.testing.cpu_checks import assert_cpu_matches_reference
from qlower.testing.graph_checks import random_inputs

EXAMPLES = int(os.environ.get("QLOWER_FUZZ_EXAMPLES", "25"))
pytestmark = pytest.mark.fuzz
I8 = DType.INT8


class _Builder:
    def __init__(self, draw, seed):
        self.draw, self.b, self.rng = draw, GraphBuilder("fuzz"), np.random.default_rng(seed)

    def spec(self):
        return QuantSpec.per_tensor(float(self.rng.uniform(0.01, 0.1)), self.draw(st.integers(-128, 127)))

    def requant(self, acc: Value, k: int) -> Value:
        s_acc = float(np.mean(acc.quant.scale))
        out = QuantSpec.per_tensor(s_acc * np.sqrt(k) * 74 * 74 / 40, self.draw(st.integers(-60, 60)))
        y = self.b.op("rescale", acc, out=out, rounding=self.draw(st.sampled_from(["single", "double"])))
        if self.draw(st.booleans()):
            y = self.b.op("clamp", y, min=out.zero_point[0], max=self.draw(st.integers(out.zero_point[0], 127)))
        return y

    def conv(self, h: Value) -> Value:
        draw, c = self.draw, h.shape[3]
        kind = draw(st.sampled_from(["dense", "depthwise", "grouped"]))
        groups = 1 if kind == "dense" else c if kind == "depthwise" else draw(st.sampled_from(
            [g for g in range(2, c + 1) if c % g == 0] or [1]))
        o = groups * (draw(st.integers(1, 2)) if kind == "depthwise" else draw(st.integers(1, 3)))
        kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        pad = tuple(draw(st.integers(0, k - 1)) if k > 1 else 0 for k in (kh, kh, kw, kw))
        per_channel = draw(st.booleans())
        w_scale = self.rng.uniform(0.002, 0.02, o)
        w_q = QuantSpec.per_channel(w_scale) if per_channel else QuantSpec.per_tensor(
            float(w_scale[0]), draw(st.integers(-5, 5)))
        w = self.b.constant(self.rng.integers(-128, 128, (o, kh, kw, c // groups)).astype(np.int8), w_q)
        bias = None
        if draw(st.booleans()):
            acc_q = QuantSpec.accumulator(h.quant, w_q, axis=0 if per_channel else None)
            bias = self.b.constant(self.rng.integers(-3000, 3000, o).astype(np.int32), acc_q)
        acc = self.b.op("conv2d", h, w, bias, stride=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
                        dilation=(draw(st.integers(1, 2)), draw(st.integers(1, 2))), pad=pad, groups=groups)
        return self.requant(acc, kh * kw * (c // groups))

    def pool(self, h: Value) -> Value:
        draw = self.draw
        kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        pad = tuple(draw(st.integers(0, k - 1)) for k in (kh, kh, kw, kw))
        kind = draw(st.sampled_from(["avg_pool2d", "max_pool2d"]))
        return self.b.op(kind, h, kernel=(kh, kw), stride=(draw(st.integers(1, 2)), draw(st.integers(1, 2))), pad=pad)

    def add(self, h: Value) -> Value:
        other = self.b.op("clamp", h, min=self.draw(st.integers(-128, 0)), max=127)
        common = QuantSpec.per_tensor(h.quant.scale[0] / 2**self.draw(st.integers(4, 12)), 0, DType.INT32)
        kind = self.draw(st.sampled_from(["add", "sub"]))
        s = self.b.op(kind, self.b.op("rescale", h, out=common), self.b.op("rescale", other, out=common))
        return self.b.op("rescale", s, out=self.spec())

    def concat_pad_slice(self, h: Value) -> Value:
        other = self.b.op("rescale", h, out=h.quant) if self.draw(st.booleans()) else h
        cat = self.b.op("concat", (h, other), axis=self.draw(st.integers(1, 3)))
        p = self.b.op("pad", cat, pads=(0, 0, 1, 0, 0, 2, 0, 1), value=self.draw(st.integers(-128, 127)))
        n, hh, ww, cc = p.shape
        return self.b.op("slice", p, start=(0, 0, 1, 0), stop=(n, hh, ww, cc), step=(1, 2, 1, 1))


@st.composite
def graphs(draw):
    nb = _Builder(draw, draw(st.integers(0, 2**32 - 1)))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 8)))
    h = nb.b.input("x", TensorType(shape, I8, nb.spec()))
    for _ in range(draw(st.integers(1, 3))):
        layer = draw(st.sampled_from([nb.conv, nb.conv, nb.pool, nb.add, nb.concat_pad_slice]))
        try:
            h = layer(h)
        except IRError:
            assume(False)  # e.g. an empty convolution output
    return verify_graph(nb.b.build([h]))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), seed=st.integers(0, 1000))
def test_random_graphs_are_bit_exact(graph, seed):
    configs = ({}, {"native": False}, {"gemm_engine": "float32", "native": False}, {"fuse": False})
    assert_cpu_matches_reference(graph, random_inputs(graph, seed), configs=configs)
