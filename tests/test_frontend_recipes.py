"""Integer recipes of the importer, on hand-quantized models with chosen quantization parameters.

The models call PyTorch's quantize/dequantize ops themselves, so ``torch.export``
keeps them and the importer folds them exactly as it does for a converted PT2E
model; expected values come from float64 NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlower.frontend.quantizer  # noqa: F401  (registers the quantized_decomposed ops)
from qlower.frontend import capture_and_import
from qlower.frontend.rules.softmax import EXP_BITS, PROB_BITS
from qlower.reference import run_graph

QD = torch.ops.quantized_decomposed


def fake_quant(t, scale, zero_point, qmin=-128, qmax=127):
    q = QD.quantize_per_tensor(t, scale, zero_point, qmin, qmax, torch.int8)
    return QD.dequantize_per_tensor(q, scale, zero_point, qmin, qmax, torch.int8)


def codes(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    return np.clip(np.rint(x.astype(np.float64) / scale) + zero_point, -128, 127)


class ConcatDomains(nn.Module):
    def forward(self, x, y):
        return fake_quant(torch.cat((fake_quant(x, 0.02, 3), fake_quant(y, 0.035, -10)), dim=1), 0.03, -5)


def test_concat_rescales_operands_from_other_domains():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 3, 5, 5, generator=g), torch.randn(4, 2, 5, 5, generator=g)
    result = capture_and_import(ConcatDomains(), (x, y), None, progress=False)
    kinds = result.graph.count_ops()
    assert kinds["rescale"] == 2 and kinds["concat"] == 1
    out = run_graph(result.graph, [x.numpy(), y.numpy()])[0]
    xq = (codes(x.numpy(), 0.02, 3) - 3) * 0.02
    yq = (codes(y.numpy(), 0.035, -10) + 10) * 0.035
    expected = codes(np.concatenate([xq, yq], axis=1), 0.03, -5)
    diff = np.abs(codes(out, 0.03, -5) - expected)
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99


class Softmax(nn.Module):
    def __init__(self, scale, zero_point):
        super().__init__()
        self.scale, self.zero_point = scale, zero_point

    def forward(self, x):
        return fake_quant(torch.softmax(fake_quant(x, self.scale, self.zero_point), dim=-1), 1 / 256, -128)


@pytest.mark.parametrize("row,scale,zero_point", [(16, 0.05, 0), (16, 0.2, -20), (64, 0.03, 10)])
def test_integer_softmax_error_bound(row, scale, zero_point):
    """|p_int - p| <= (1/2 + N p / 2) / (2**E - N/2) + 2**-F against float64 softmax of the input codes."""
    g = torch.Generator().manual_seed(row)
    x = torch.randn(3, 5, row, generator=g) * 2
    result = capture_and_import(Softmax(scale, zero_point), (x,), None, progress=False)
    outs, env = run_graph(result.graph, [x.numpy()], keep_all=True)
    (div,) = [op for op in result.graph.ops if op.kind == "intdiv"]
    p_int = env[div.result].astype(np.float64) * 2.0**-PROB_BITS
    real = (codes(x.numpy(), scale, zero_point) - zero_point) * scale
    e = np.exp(real - real.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    bound = (0.5 + 0.5 * row * p) / (2.0**EXP_BITS - row / 2) + 2.0**-PROB_BITS
    assert np.all(np.abs(p_int - p) <= bound)
    out = codes(outs[0], 1 / 256, -128)
    diff = np.abs(out - codes(p, 1 / 256, -128))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99


class AvgPool(nn.Module):
    def forward(self, x):
        y = F.avg_pool2d(fake_quant(x, 0.04, -7), 3, 2, 1)          # count_include_pad
        return fake_quant(y, 0.013, 5), fake_quant(F.adaptive_avg_pool2d(fake_quant(x, 0.04, -7), 1), 0.011, 0)


def test_average_pooling_rounds_once():
    """Windowed and global (a mean over the whole plane, one AVG_POOL2D on NPUs): codes widened to
    int16 (x128, exact) and averaged there round at 1/256 of an input step before the output rounding."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 7, 7, generator=g)
    result = capture_and_import(AvgPool(), (x,), None, progress=False)
    assert any(v.dtype.value == "int16" for v in result.graph.values())  # windowed
    assert sum(op.kind == "avg_pool2d" for op in result.graph.ops) == 2 and "reduce_sum" not in result.graph.count_ops()
    outs = run_graph(result.graph, [x.numpy()])
    real = (codes(x.numpy(), 0.04, -7) + 7) * 0.04
    padded = np.pad(real, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.stack([padded[:, :, i:i + 7:2, j:j + 7:2] for i in range(3) for j in range(3)])
    expected = [codes(windows.mean(axis=0), 0.013, 5), codes(real.mean(axis=(2, 3), keepdims=True), 0.011, 0)]
    for out, exp, (scale, zp), share in zip(outs, expected, [(0.013, 5), (0.011, 0)], [0.97, 1.0]):
        diff = np.abs(codes(out, scale, zp) - exp)
        assert diff.max() <= 1 and (diff == 0).mean() >= share


class MulChannels(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.tensor([0.37, -1.9, 0.0, 2.6]).reshape(1, 4, 1, 1))

    def forward(self, x):
        return fake_quant(fake_quant(fake_quant(x, 0.025, 2) * self.c, 0.04, -3) + 0.3, 0.05, 1)


def test_per_channel_constant_multiplier_is_exact():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 5, 5, generator=g)
    result = capture_and_import(MulChannels(), (x,), None, progress=False)
    (mul,) = [op for op in result.graph.ops if op.kind == "mul"]
    const = [v for v in mul.operands if result.graph.constant_data(v) is not None][0]
    held = result.graph.constant_data(const).reshape(-1) * np.asarray(const.quant.scale)
    np.testing.assert_array_equal(held.astype(np.float32), np.array([0.37, -1.9, 0.0, 2.6], np.float32))
    out = run_graph(result.graph, [x.numpy()])[0]
    c = np.array([0.37, -1.9, 0.0, 2.6], np.float32).astype(np.float64).reshape(1, 4, 1, 1)
    product = (codes((codes(x.numpy(), 0.025, 2) - 2) * 0.025 * c, 0.04, -3) + 3) * 0.04
    expected = codes(product + 0.3, 0.05, 1)
    diff = np.abs(codes(out, 0.05, 1) - expected)
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99
