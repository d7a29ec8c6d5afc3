"""Models torch.export captures that qlower used to refuse or accept-then-fail (issue 25), one small
module per class of cause:

- export-time checks (``_assert_tensor_metadata`` of a ``.to(dtype)``) on constants blocked folding
  (an attention mask built from a buffer, a Fourier position encoding built with ``arange``);
- weights computed in the graph from parameters (weight_norm, parametrizations, concatenated and
  transposed weights) were quantized per channel as run-time values;
- a position embedding interpolated from a parameter was quantized op by op, and its integer
  arithmetic overflowed int32 at run time only;
- a forward that caches tensors on its module left fake tensors there, and the next compile died
  with a raw RuntimeError in a deep copy.

Each model is compiled and run on every integer target, bit-exact with the reference program, the
reference within a quantization step of the fake-quant model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations

import qlower
from qlower.api import lower_graph
from qlower.errors import QlowerError, UnsupportedOpError
from qlower.frontend import QuantConfig, capture_and_import
from qlower.reference import run_graph
from qlower.testing.frontend import fake_quant_agreement

SEED = 0
TARGETS = ("cpu", "tosa-1.0+int", "ethos-u85-256")


class AttentionMask(nn.Module):
    """Self-attention with an additive mask built from an int64 buffer, as BERT-style models do."""

    def __init__(self, d: int = 16, length: int = 6):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.register_buffer("attention_mask", torch.tensor([[1] * (length - 2) + [0, 0]]))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        mask = self.attention_mask[:, None, :].to(dtype=torch.float32)  # an _assert_tensor_metadata on a buffer
        mask = (1.0 - mask) * -10000.0
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]) + mask
        return self.out(scores.softmax(dim=-1) @ v)


class FourierPositions(nn.Module):
    """A conv plus a sine position encoding computed from the input's size with ``arange`` (integer
    arithmetic, a floor division, casts), as EdgeNeXt's encoding does."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        _, c, h, w = x.shape
        rows = torch.arange(1, h + 1, dtype=torch.int64).to(torch.float32) / h * 2 * math.pi
        dims = torch.arange(c // 2, dtype=torch.int64)
        freq = 10000 ** (2 * torch.div(dims, 2, rounding_mode="floor").to(torch.float32) / c)
        pos = rows[:, None] / freq  # (h, c/2)
        pos = torch.cat([pos.sin(), pos.cos()], dim=1).t()[None, :, :, None]  # (1, c, h, 1)
        return self.proj(self.conv(x) + pos)


class ComputedWeights(nn.Module):
    """Weights computed from parameters: weight_norm (the parametrization and the old hook), a
    concatenated and a transposed weight."""

    def __init__(self):
        super().__init__()
        self.pos_conv = parametrizations.weight_norm(nn.Conv1d(8, 8, 3, padding=1, groups=2), dim=2)
        with torch.no_grad():  # a g that isn't ||v||: the weight differs from v
            self.pos_conv.parametrizations.weight.original0.mul_(torch.linspace(0.5, 1.5, 3)[None, None, :])
        self.old_norm = torch.nn.utils.weight_norm(nn.Linear(8, 8))
        self.top = nn.Parameter(torch.randn(4, 8) * 0.3)
        self.bottom = nn.Parameter(torch.randn(4, 8) * 0.3)
        self.transposed = nn.Parameter(torch.randn(8, 6) * 0.3)

    def forward(self, x):
        y = F.gelu(self.pos_conv(x)) + x
        y = self.old_norm(y.transpose(1, 2))
        y = F.linear(y, torch.cat([self.top, self.bottom]))
        return F.linear(y, self.transposed.t())


class InterpolatedPositions(nn.Module):
    """A position embedding resampled from a parameter to the input's width with cubic weights
    computed from ``arange`` (what a bicubic interpolation decomposes into, as in YOLOS), and rows
    picked by int64 arithmetic on constants beyond int32."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.pos = nn.Parameter(torch.randn(1, channels, 1, 4))
        self.table = nn.Parameter(torch.randn(5, channels))

    def forward(self, x):
        y = self.conv(x)
        width = y.shape[-1]
        k = torch.arange(width)
        source = (k + 0.5) * (4 / width) - 0.5
        i = torch.div(8 * k + 4 - width, 2 * width, rounding_mode="floor")  # floor(source), in int64
        t = (source - i).clamp(0.0, 1.0)
        near = ((1.25 * t - 2.25) * t) * t + 1  # the cubic convolution weight of the nearer sample
        far = ((-0.75 * (2 - t) + 3.75) * (2 - t) - 6) * (2 - t) + 3  # and of one two away
        pos = self.pos[..., i.clamp(0, 3)] * near + self.pos[..., (i + 2).clamp(0, 3)] * far
        big = torch.arange(width, dtype=torch.int64) * 3_000_000_000  # beyond int32
        rows = torch.remainder(big // 1_000_000_000, 5)  # back in range: 0, 3, 1, 4, ...
        return y + pos + self.table[rows].t()[None, :, None, :]


def _batches(shape: tuple[int, ...], n: int = 3) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(SEED)
    return [(torch.randn(shape, generator=g),) for _ in range(n)]


CASES = {
    "attention_mask": (AttentionMask, (1, 6, 16)),
    "fourier_positions": (FourierPositions, (1, 8, 5, 4)),
    "computed_weights": (ComputedWeights, (1, 8, 10)),
    "interpolated_positions": (InterpolatedPositions, (1, 3, 6, 5)),
}


@pytest.fixture(scope="module", params=list(CASES))
def compiled(request):
    torch.manual_seed(SEED)
    model_class, shape = CASES[request.param]
    model = model_class().eval()
    batches = _batches(shape)
    prog = qlower.compile(model, batches[0], target="reference", calibration=batches, progress=False)
    return request.param, model, prog, batches


def test_compiles_and_stays_within_a_step_of_fake_quant(compiled):
    name, _, prog, batches = compiled
    assert "aten" not in prog.source.count_ops(), name  # nothing left to a float fallback
    cmp = fake_quant_agreement(prog.frontend, batches[:2])
    assert cmp.outputs.total > 0 and cmp.outputs.max_step <= 1, (name, cmp)
    if name == "computed_weights":  # quantized as weights: constants, per channel
        gemms = [op for op in prog.source.ops if op.kind in ("conv2d", "fully_connected")]
        assert len(gemms) == 4, prog.source.count_ops()
        producers = prog.source.producers()
        for op in gemms:
            weight = op.operands[1]
            assert producers[weight].kind == "constant" and weight.quant.is_per_channel, (op.kind, weight.type)


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_runs_the_reference_numbers(compiled, target):
    """Bit-exact with the reference program: also where the reference used to overflow at run time."""
    name, _, prog, batches = compiled
    lowered = lower_graph(prog.source, target)
    for batch in batches[:2]:
        want = prog.run(*batch)
        got = lowered.run(*batch)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=f"{name} on {target}")


@pytest.mark.parametrize("name", ["fourier_positions", "computed_weights", "interpolated_positions"])
def test_constant_folding_keeps_the_float_function(name):
    """Exactly: the folded values are what the graph computed (the same ops on the same tensors)."""
    from qlower.frontend.constant_fold import fold_constant_subgraphs  # (imported here: new in issue 25)

    torch.manual_seed(SEED)
    model_class, shape = CASES[name]
    model = model_class().eval()
    (x,) = _batches(shape, 1)[0]
    gm = torch.export.export(model, (x,)).module(check_guards=False)
    with torch.no_grad():
        exported = gm(x)
    assert fold_constant_subgraphs(gm) > 0
    with torch.no_grad():
        eager, got = model(x), gm(x)
    assert torch.equal(got, exported)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)  # export's decompositions round differently
    computed = [n for n in gm.graph.nodes if n.op == "call_function" and all(
        a.op == "get_attr" for a in n.all_input_nodes)]
    assert not computed, [n.format_node() for n in computed]  # nothing computed from constants only is left


class CachesAnchors(nn.Module):
    """A detection head that caches its anchors on the module the first time it sees a shape (class
    attributes as defaults, as ultralytics' Detect does)."""

    shape = None
    anchors = torch.empty(0)

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.stride = torch.tensor(8.0)

    def forward(self, x):
        y = self.conv(x)
        if self.shape != x.shape:
            self.anchors = (torch.arange(y.shape[-1], dtype=torch.float32) + 0.5) * self.stride
            self.shape = x.shape
        return y + self.anchors


def test_a_forward_that_caches_tensors_compiles_again_and_again():
    torch.manual_seed(SEED)
    model = CachesAnchors().eval()
    batches = _batches((1, 3, 4, 5))
    want = None
    for target in ("reference", *TARGETS):
        prog = qlower.compile(model, batches[0], target=target, calibration=batches, progress=False)
        got = prog.run(*batches[1])
        want = got if want is None else want
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=target)
    assert "anchors" not in vars(model) and "shape" not in vars(model)  # as it was: nothing traced stays
    with torch.no_grad():
        eager = model(*batches[1]).numpy()
    # the eager model still works, and the program computes it (to a step: 1/255 of the range)
    assert np.abs(want[0] - eager).max() <= np.abs(eager).max() / 100


def test_a_fake_tensor_left_by_an_earlier_trace_is_named():
    model = CachesAnchors().eval()
    (x,) = _batches((1, 3, 4, 5), 1)[0]
    torch.export.export(model, (x,))  # the user's own trace: leaves a FakeTensor in model.anchors
    with pytest.raises(UnsupportedOpError, match=r"model attribute\(s\) anchors, a FakeTensor"):
        qlower.compile(model, (x,), progress=False)


def test_an_unexpected_error_in_quantization_names_its_stage(monkeypatch):
    """Whatever PyTorch or torchao raise inside capture comes out as a qlower error naming the stage."""
    import qlower.frontend.capture as capture

    def broken(*args, **kwargs):
        raise RuntimeError("Cannot access data pointer of Tensor")

    monkeypatch.setattr(capture, "convert_pt2e", broken, raising=False)
    monkeypatch.setattr("torchao.quantization.pt2e.quantize_pt2e.convert_pt2e", broken)
    (x,) = _batches((1, 3, 4, 5), 1)[0]
    with pytest.raises(QlowerError, match="convert stage: RuntimeError: Cannot access data pointer"):
        capture_and_import(nn.Conv2d(3, 4, 1), (x,), QuantConfig(), [(x,)], progress=False)


class RuntimeWeight(nn.Module):
    def forward(self, x, w):
        return F.linear(x, w)


def test_a_runtime_weight_in_dynamic_mode_runs_in_float():
    """Dynamic mode quantized a run-time weight per channel, which the importer refused (at an unknown
    source line); it is left float, as in static mode."""
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    result = capture_and_import(RuntimeWeight(), (x, w), QuantConfig(mode="dynamic"), [(x, w)], progress=False)
    got = run_graph(result.graph, [x.numpy(), w.numpy()])[0]
    np.testing.assert_allclose(got, F.linear(x, w).numpy(), rtol=1e-5, atol=1e-5)


def test_an_import_error_on_a_node_pt2e_inserted_names_the_source_line():
    """Nodes PT2E inserts (a weight's scales, quantize ops) have no source line: a message about one names
    the line of the nearest node that has one (the conv they feed)."""
    from qlower.frontend.context import ImportContext
    from qlower.frontend.source import source_location

    class OneConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 3, 1, 1))

        def forward(self, x):
            return F.conv2d(x, self.weight)

    (x,) = _batches((1, 3, 4, 5), 1)[0]
    fake_quant = capture_and_import(OneConv(), (x,), QuantConfig(), [(x,)], progress=False).fake_quant
    unlocated = [n for n in fake_quant.graph.nodes if n.op in ("get_attr", "call_function") and not source_location(n)]
    assert unlocated  # the quantized weight, its scales, the input's quantize ...
    node = unlocated[0]
    message = str(ImportContext(fake_quant).unsupported("a reason", node))
    assert "unknown source line" not in message and "test_frontend_refusals.py:" in message, message
