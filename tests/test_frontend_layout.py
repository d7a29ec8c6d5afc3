"""NCHW → NHWC import: values are right whatever the layout, and transposes appear only where needed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qlower.frontend import QuantConfig, capture_and_import, layout
from qlower.testing.frontend import fake_quant_agreement, float_error

# -- the permutation algebra, checked against NumPy ------------------------------------------------

def test_layout_algebra_agrees_with_numpy():
    rng = np.random.default_rng(0)
    t = rng.standard_normal((2, 3, 4, 5))
    for perm in [(0, 2, 3, 1), (3, 1, 0, 2), (0, 1, 2, 3)]:
        ir = np.transpose(t, perm)
        assert layout.ir_shape(t.shape, perm) == ir.shape
        assert layout.torch_shape(ir.shape, perm) == t.shape
        for axis in range(4):  # reducing torch axis a == reducing IR axis ir_axis(perm, a)
            np.testing.assert_array_equal(np.transpose(t.sum(axis, keepdims=True), perm),
                                          ir.sum(layout.ir_axis(perm, axis), keepdims=True))
        for dst in [(0, 2, 3, 1), (1, 0, 3, 2)]:
            np.testing.assert_array_equal(np.transpose(ir, layout.transpose_between(perm, dst)),
                                          np.transpose(t, dst))
        dims = (0, 3, 1, 2)  # torch permute: same IR data, new layout
        np.testing.assert_array_equal(np.transpose(np.transpose(t, dims), layout.after_permute(perm, dims)), ir)
        kept = layout.drop_dims(perm, [1])
        np.testing.assert_array_equal(np.transpose(t.sum(1), kept), ir.sum(perm.index(1)))
    assert layout.prepend_dims((1, 0), 2) == (0, 1, 3, 2)


def test_row_major_order_check():
    assert layout.keeps_row_major_order((2, 1, 1, 8), layout.NHWC)      # [N,C,1,1] as NHWC
    assert not layout.keeps_row_major_order((2, 3, 3, 8), layout.NHWC)
    assert layout.keeps_row_major_order((2, 3, 1, 8), (0, 1, 3, 2))


# -- models -------------------------------------------------------------------------------------

class ConvFlattenLinear(nn.Module):
    """flatten of a 4x4 feature map: element order matters, a transpose back to NCHW is required."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 6, 3, padding=1), nn.Linear(6 * 16, 5)

    def forward(self, x):
        y = F.relu(self.conv(x))
        return self.fc(y.view(y.shape[0], -1)), self.fc(torch.flatten(y, 1))


class ConvPoolLinear(nn.Module):
    """flatten of a 1x1 map: NHWC and NCHW agree, so no transpose is needed after the input."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 6, 3, padding=1), nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.conv(x), 1), 1))


class ChannelsLastLinear(nn.Module):
    """permute to channels-last, a linear over channels, permute back, conv: permutes move no data."""

    def __init__(self):
        super().__init__()
        self.fc, self.conv = nn.Linear(4, 4), nn.Conv2d(4, 3, 1)

    def forward(self, x):
        y = self.fc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.conv(y)


class ConvOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        # not powers of two: with dyadic gains the exact product often lands on a rounding tie, which
        # the IR's rescale rounds half up (TOSA) and PyTorch half to even (see test_ties_round_half_up)
        self.register_buffer("gain", torch.tensor([0.6, 1.1, 1.7, 0.35]).reshape(1, 4, 1, 1))

    def forward(self, x):
        return self.b(F.relu(self.a(x)) * self.gain)


CASES = [
    (ConvFlattenLinear, (2, 3, 4, 4), 2),
    (ConvPoolLinear, (2, 3, 5, 5), 1),
    (ChannelsLastLinear, (2, 4, 3, 5), 2),
    (ConvOut, (2, 3, 6, 6), 2),
]


def _batches(shape, count, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g),) for _ in range(count)]


@pytest.mark.parametrize("cls,shape,transposes", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "int8"])
def test_layout_results_and_transpose_count(cls, shape, transposes, quantized):
    torch.manual_seed(0)
    model = cls().eval()
    batches = _batches(shape, 5, seed=1)
    result = capture_and_import(model, batches[0], QuantConfig() if quantized else None, batches, progress=False)
    assert result.graph.count_ops().get("transpose", 0) == transposes, str(result.graph)
    if quantized:
        cmp = fake_quant_agreement(result, batches)
        assert cmp.outputs.max_step <= 1 and cmp.outputs.exact_share >= 0.99, str(cmp)
        assert cmp.layers.max_step <= 1 and cmp.layers.exact_share >= 0.99, str(cmp)
    else:
        assert float_error(result, model, batches) <= 1e-4


def test_conv_values_are_nhwc_and_origins_record_the_layout():
    torch.manual_seed(0)
    model = ConvOut().eval()
    batches = _batches((1, 3, 6, 6), 3, seed=1)
    result = capture_and_import(model, batches[0], QuantConfig(), batches, progress=False)
    convs = [op for op in result.graph.ops if op.kind == "conv2d"]
    for op in convs:
        assert op.operands[0].shape == (1, 6, 6, op.operands[1].shape[-1])  # NHWC input, OHWI weight
        assert op.result.origin.layout == layout.NHWC
    # the per-channel [1, C, 1, 1] buffer became an NHWC [1, 1, 1, C] constant (no op permutes it)
    (mul,) = [op for op in result.graph.ops if op.kind == "mul"]
    gain = [v for v in mul.operands if result.graph.constant_data(v) is not None][0]
    assert gain.shape == (1, 1, 1, 4) and gain.quant.axis == 3
    np.testing.assert_allclose(np.asarray(gain.quant.scale) * result.graph.constant_data(gain).reshape(-1),
                               model.gain.reshape(-1).numpy(), rtol=1e-7)
    # boundary: inputs and outputs are float32 in PyTorch layout
    assert result.graph.inputs[0].type.shape == (1, 3, 6, 6)
    assert result.graph.outputs[0].type.shape == (1, 4, 6, 6) and result.graph.outputs[0].quant is None
    value, perm = result.node_values["conv2d_1"]
    assert perm == layout.NHWC and value.shape == (1, 6, 6, 4)
