"""Wide LayerNorm, GroupNorm of one and of G groups, InstanceNorm and masked attention softmax
(``masked_fill`` with -inf, ``scaled_dot_product_attention`` with a bool mask) compile with no float
op (issue 25) and run bit-exact with the reference interpreter on every target.

One model holds every case, so each target compiles once. Checked: the optimised IR has no float
fallback and nothing but the boundary quantize / dequantize computes in float; on each target the
host runs no float op but those; every output equals the reference interpreter's on the target's form
(LiteRT and TFLM give fused rescales their kernels' rounding, a declared rewrite); each layer of the
reference, run on fake-quant's inputs, is within one step of PyTorch's fake-quant model.
"""

import numpy as np
import pytest
import torch
from torch import nn

import qlower
from qlower.api import lower_graph
from qlower.reference import run_graph
from qlower.testing.coverage import is_float_op, on_host
from qlower.testing.differential import available_targets, program_meaning
from qlower.testing.frontend import FLOAT_BOUNDARY, fake_quant_agreement

SEED = 0
WIDTH = 640   # N²·max|d|² is about 2**35: no int32 headroom for the textbook formula


class NormsAndMasks(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.gn1, self.gn4 = nn.GroupNorm(1, 16), nn.GroupNorm(4, 16)
        self.inorm, self.head = nn.InstanceNorm2d(16, affine=True), nn.Conv2d(16, 4, 1)
        self.up, self.ln, self.down = nn.Linear(16, WIDTH), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 16)
        self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)
        with torch.no_grad():
            for norm in (self.gn1, self.gn4, self.inorm, self.ln):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)

    def forward(self, image, tokens, mask):
        y = self.head(self.inorm(self.gn4(torch.relu(self.gn1(self.conv(image))))))
        t = self.down(self.ln(self.up(tokens)))
        q, k = self.q(t), self.k(t)
        scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
        sdpa = nn.functional.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), k.unsqueeze(1),
                                                          attn_mask=mask)
        return y, scores.softmax(-1), sdpa


def _inputs(seed: int, full_row: bool = False):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(6, 6, generator=g) > 0.4
    mask[:, 0] = True
    if full_row:  # a fully masked row (SDPA gives zeros; masked_fill's -inf would give NaN: not drawn)
        mask[3, 1:] = False
    return torch.randn(1, 3, 8, 8, generator=g), torch.randn(1, 6, 16, generator=g), mask


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(SEED)
    model = NormsAndMasks().eval()
    calibration = [_inputs(SEED + i) for i in range(3)]
    return qlower.compile(model, calibration[0], target="reference", calibration=calibration, progress=False)


@pytest.mark.slow
def test_integer_and_within_a_step_of_fake_quant(compiled):
    graph = compiled.source
    ops = graph.count_ops()
    assert "aten" not in ops and {"reduce_sum", "table", "select", "intdiv"} <= set(ops), ops
    assert [op.kind for op in graph.ops if op.kind not in FLOAT_BOUNDARY and is_float_op(op)] == []
    assert graph.count_ops()["table"] >= 4 + 2  # an rsqrt per norm (4), an exp per softmax (2)
    cmp = fake_quant_agreement(compiled.frontend, [_inputs(SEED + 7), _inputs(SEED + 8, full_row=True)])
    assert cmp.layers.total > 0 and cmp.layers.max_step <= 1, cmp  # per layer (end to end, steps add up)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "tosa-1.0+int", "ethos-u55-128", "ethos-u85-256", "vgf+int", "litert",
                                    "tflm"])
def test_every_target_exact(compiled, target):
    if target not in available_targets() and target != "tflm":
        pytest.fail(f"{target} can't run here")
    inputs = _inputs(SEED + 9, full_row=True)
    want = run_graph(program_meaning(compiled.source, target), [t.numpy() for t in inputs])
    options = {"execution": "vulkan"} if target.startswith("vgf") else None
    prog = lower_graph(compiled.source, target, backend_options=options)
    host_float = [op.kind for op in prog.source.ops
                  if op.kind not in FLOAT_BOUNDARY and on_host(prog, op) and is_float_op(op)]
    assert host_float == [], host_float
    for got, w in zip(prog.run(*inputs), want):
        assert got.dtype == w.dtype and got.shape == w.shape
        np.testing.assert_array_equal(got, w, err_msg=target)
