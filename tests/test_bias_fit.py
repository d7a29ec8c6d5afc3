"""A conv or linear whose bias is huge beside its input's range (YOLO's detection head: class biases
near -8.5 after small activations) compiles integer: the weight scale is widened until the bias fits
int32 at ``s_in * s_w`` (qlower/frontend/bias_fit.py), where before the op stayed in float.

The input here spans about ±4e-5 (``s_in`` about 3e-7) and the weights about ±0.3 (``s_w`` about
2.4e-3): ``8.5 / (s_in * s_w)`` is about 1.2e10, beyond int32. Checked: no float op, the widened
channels' bias codes within 2**30 and the ordinary conv's scales untouched, each layer within a step
of PyTorch's fake-quant model, the huge-bias outputs within one output step of float, and every target bit-exact
with the reference interpreter.
"""

import numpy as np
import pytest
import torch
from torch import nn

import qlower
from qlower.api import lower_graph
from qlower.frontend.bias_fit import BIAS_LIMIT
from qlower.reference import run_graph
from qlower.testing.differential import program_meaning
from qlower.testing.frontend import fake_quant_agreement

TINY = 1e-5
BIG_BIAS = [8.5, -8.5, 2.0, 0.0]


class HugeBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)        # bias huge beside its input
        self.plain = nn.Conv2d(3, 4, 1)                  # an ordinary bias: its weight scales stay as observed
        self.linear = nn.Linear(8, 4)                    # the same through a linear
        with torch.no_grad():
            self.conv.bias.copy_(torch.tensor(BIG_BIAS))
            self.linear.bias.copy_(torch.tensor(BIG_BIAS[::-1]))
            self.plain.bias.mul_(TINY)

    def forward(self, x, t):
        return self.conv(x), self.plain(x), self.linear(t)


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 3, 6, 6, generator=g) * TINY, torch.randn(1, 5, 8, generator=g) * TINY


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(0)
    model = HugeBias().eval()
    return model, qlower.compile(model, _inputs(0), target="reference", calibration=[_inputs(i) for i in range(3)],
                                 progress=False)


def _gemms(graph):
    return [op for op in graph.ops if op.kind in ("conv2d", "fully_connected", "matmul")]


def _codes(producers, out):
    """The quantized value a float output dequantizes."""
    while out.quant is None:
        out = producers[out].operands[0]
    return out


def test_integer_bias_fits_and_close_to_float(compiled):
    model, prog = compiled
    graph = prog.source
    assert "aten" not in graph.count_ops(), graph.count_ops()
    gemms = _gemms(graph)
    assert [op.origin.module for op in gemms].count("plain") == 1
    assert len(gemms) == 3 and all(op.result.dtype.value == "int32" for op in gemms), gemms
    for op in gemms:
        bias = op.operands[2]
        codes = np.abs(graph.constant_data(bias).astype(np.int64))
        assert codes.max() <= BIAS_LIMIT, op
        weight = op.operands[1]
        w = graph.constant_data(weight).astype(np.int64)
        observed = np.abs(w).reshape(w.shape[0], -1).max(axis=1)
        if op.origin.module == "plain":   # untouched: max|w| quantizes to 127 in every channel
            assert (observed == 127).all(), observed
    inputs = _inputs(7)
    with torch.no_grad():
        want = [o.numpy() for o in model(*inputs)]
    got = prog.run(*inputs)
    producers = graph.producers()
    for i in (0, 2):   # the huge biases: the output's rounding and little else (bias_fit.py's doc)
        step = _codes(producers, graph.outputs[i]).quant.scale[0]
        assert np.abs(got[i] - want[i]).max() <= step, (i, np.abs(got[i] - want[i]).max(), step)


def test_within_a_step_of_fake_quant(compiled):
    cmp = fake_quant_agreement(compiled[1].frontend, [_inputs(8)])
    assert cmp.layers.total > 0 and cmp.layers.max_step <= 1, cmp


@pytest.mark.parametrize("target", ["cpu", "tosa-1.0+int", "ethos-u55-128", "litert"])
def test_exact_on_targets(compiled, target):
    graph = compiled[1].source
    inputs = _inputs(9)
    want = run_graph(program_meaning(graph, target), [t.numpy() for t in inputs])
    prog = lower_graph(graph, target)
    for got, w in zip(prog.run(*inputs), want):
        np.testing.assert_array_equal(got, w, err_msg=target)
