"""Integer linear algebra, convolution variants, resampling and pooling variants, end to end.

Families: mm / addmm / bmm / baddbmm / matmul with batch broadcasting and 1-D operands;
scaled_dot_product_attention without a mask and with a constant float mask (and with a bool mask:
matmuls integer, the softmax of -inf-filled scores in float); conv1d, dilated grouped conv2d;
conv_transpose1d / conv_transpose2d (stride, padding, output padding, dilation, groups);
upsample nearest (integer factors, sizes, fractional factors); bilinear (align_corners both ways,
scale factors and sizes, exact int32 blends); avg_pool2d with count_include_pad,
ceil_mode and divisor_override; adaptive_avg_pool2d to uniform and non-uniform windows; dilated
max_pool2d.

Each family is quantized once; its optimised IR runs on the reference interpreter, the cpu backend and
tosa-1.0+int (TOSA reference model). Checked per family: the ops are integer (no float ``aten``
fallback, nothing float between the boundary quantize / dequantize, and on TOSA nothing left on the
host), every target is bit-exact with the reference, and the reference is within 1 quantization step
of PyTorch's fake-quant model, per layer (teacher-forced) and at the outputs.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlower
from qlower.reference import run_graph
from qlower.testing.frontend import (
    FLOAT_BOUNDARY,
    assert_integer_program,
    assert_targets_bit_exact,
    fake_quant_agreement,
)

SEED = 0
TARGETS = ("cpu", "tosa-1.0+int")
BOUNDARY = FLOAT_BOUNDARY


class Family(nn.Module):
    """``x * 1.5 + 0.25`` for every input before ``f``: the ops read integer intermediates."""

    def __init__(self, f, *mods, **params):
        super().__init__()
        self.f, self.mods = f, nn.ModuleList(mods)
        for name, value in params.items():
            if value.dtype == torch.bool:
                self.register_buffer(name, value)
            else:
                self.register_parameter(name, nn.Parameter(value))

    def forward(self, *xs):
        return self.f(self, *(x * 1.5 + 0.25 for x in xs))


def _randn(*shape):
    return torch.randn(*shape)


def _linalg():
    def f(m, a, b, c):
        return (torch.mm(a[0], b[0]),                       # [4, 6] @ [6, 5]
                torch.addmm(m.bias, a[1], m.w),             # a decomposed linear: constant mat2 [K, N]
                torch.bmm(a, b),
                torch.baddbmm(c, a, b, beta=0.5),
                a.unsqueeze(1) @ b.unsqueeze(0),            # batch broadcasting [2,1,4,6] @ [1,2,6,5]
                a[0, 0] @ b,                                # 1-D @ batched
                a @ b[1, :, 0],                             # batched @ 1-D
                a @ m.w)                                    # batched @ constant 2-D
    return Family(f, bias=_randn(5), w=_randn(6, 5)), [(2, 4, 6), (2, 6, 5), (2, 4, 5)]


def _attention():
    mask = torch.tensor([[0, -2.0, 0, 1], [0, 0, 0, 0], [1, 1, 1, -3], [0.5, 1, 1, 1]])

    def f(m, q, k, v):
        return (F.scaled_dot_product_attention(q, k, v),
                F.scaled_dot_product_attention(q, k, v, attn_mask=m.mask, scale=0.3))
    model = Family(f)
    model.register_buffer("mask", mask)
    return model, [(1, 2, 4, 8)] * 3


def _convs():
    mods = (nn.Conv1d(3, 4, 3, padding=1), nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2),
            nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1),
            nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
            nn.ConvTranspose2d(4, 2, (3, 2), stride=(2, 3), padding=(2, 0), output_padding=(1, 2), dilation=2),
            nn.ConvTranspose2d(4, 3, 3, padding=2, bias=False))

    def f(m, x1, x2):
        c1, c2, t1, t2, t3, t4 = m.mods
        return c1(x1), c2(x2), F.relu(t1(x1)), t2(x2), t3(x2), t4(x2)
    return Family(f, *mods), [(2, 3, 7), (1, 4, 6, 5)]


def _nearest():
    def f(m, x):
        return (F.interpolate(x, scale_factor=2, mode="nearest"), F.interpolate(x, size=(7, 3), mode="nearest"),
                F.interpolate(x, scale_factor=(1.5, 3), mode="nearest"), F.interpolate(x, size=(2, 5)))
    return Family(f), [(2, 3, 4, 5)]


def _bilinear():
    def f(m, x, wide):
        return (F.interpolate(wide, scale_factor=2, mode="bilinear"),   # 70 columns: taps as shifted repeats
                F.interpolate(wide, scale_factor=3, mode="nearest"),
                F.interpolate(x, scale_factor=2, mode="bilinear"),
                F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True),
                F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True),
                F.interpolate(x, size=(6, 10), mode="bilinear"), F.interpolate(x, scale_factor=1.5, mode="bilinear"),
                F.interpolate(x, size=(3, 2), mode="bilinear"),
                F.interpolate(x, size=(3, 129), mode="bilinear"))  # 7 → 129 columns: weights k/129
    return Family(f), [(2, 3, 4, 7), (1, 2, 3, 70)]


def _pools():
    def f(m, x):
        return (F.avg_pool2d(x, 3, 2, 1, count_include_pad=True), F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=True),
                F.avg_pool2d(x, 2, ceil_mode=True), F.avg_pool2d(x, 3, 2, 1, divisor_override=5),
                F.avg_pool2d(x, (2, 3), 2, (1, 0), ceil_mode=True, divisor_override=4),
                F.adaptive_avg_pool2d(x, (3, 2)), F.adaptive_avg_pool2d(x, (4, 5)), F.adaptive_avg_pool2d(x, (7, 1)),
                F.max_pool2d(x, 3, 1, 1, dilation=2), F.max_pool2d(x, (3, 2), 2, 1, dilation=(2, 3), ceil_mode=True))
    return Family(f), [(2, 3, 7, 9)]


FAMILIES = {
    # name: (model and input shapes, IR op kinds that must appear)
    "linalg": (_linalg, {"matmul", "fully_connected", "concat"}),
    "attention": (_attention, {"matmul", "table", "intdiv"}),
    "convs": (_convs, {"conv2d", "pad"}),
    "nearest": (_nearest, {"concat", "slice"}),
    "bilinear": (_bilinear, {"mul", "add", "rescale"}),
    "pools": (_pools, {"avg_pool2d", "max_pool2d", "conv2d", "slice", "pad"}),
}


def _inputs(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s, generator=g) for s in shapes)


def _compile(name):
    factory, kinds = FAMILIES[name]
    torch.manual_seed(SEED)
    model, shapes = factory()
    model = model.eval()
    x = _inputs(shapes, SEED)
    calibration = [x, tuple(t * 1.2 for t in _inputs(shapes, SEED + 1))]
    prog = qlower.compile(model, x, target="reference", calibration=calibration, progress=False)
    return model, shapes, x, prog, kinds


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return (request.param, *_compile(request.param))


def test_integer_ops_and_no_float_fallback(family):
    name, _, _, _, prog, kinds = family
    assert_integer_program(prog.source, kinds, name)


def _check_targets(name, prog, x, host_allowed=frozenset()):
    assert_targets_bit_exact(name, prog.source, x, TARGETS, host_allowed)


def test_targets_bit_exact_with_reference(family):
    name, _, _, x, prog, _ = family
    _check_targets(name, prog, x)


def test_reference_within_one_step_of_fake_quant(family):
    name, _, shapes, x, prog, _ = family
    batches = [x, _inputs(shapes, SEED + 7)]
    cmp = fake_quant_agreement(prog.frontend, batches)
    assert cmp.layers.total > 0 and cmp.layers.max_step <= 1, f"{name}: {cmp}"
    assert cmp.outputs.max_step <= 1, f"{name}: {cmp}"


def test_transpose_conv_weights_per_output_channel():
    """The rewritten weight of a grouped transposed conv holds PyTorch's axis-1 scales once per group."""
    torch.manual_seed(SEED)
    conv = nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2).eval()
    x = _inputs([(1, 4, 5, 5)], SEED)
    prog = qlower.compile(conv, x, target="reference", progress=False)
    weights = [op.operands[1].quant for op in prog.source.ops if op.kind == "conv2d"]
    assert len(weights) == 1 and weights[0].axis == 0 and len(weights[0].scale) == 6
    assert weights[0].scale[:3] == weights[0].scale[3:] and len(set(weights[0].scale)) == 3
    expected = conv.weight.detach().abs().amax(dim=(0, 2, 3)).numpy() / 127.0
    np.testing.assert_allclose(weights[0].scale[:3], expected, rtol=1e-5)


def test_attention_with_bool_mask_and_causal():
    """-inf-filled scores have no code: their softmax (and the where) run in float, the matmuls stay
    integer; a row masked everywhere is 0 as in PyTorch; targets bit-exact, reference within a step."""
    mask = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)

    def f(m, q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=m.mask),
                F.scaled_dot_product_attention(q, k, v, is_causal=True))
    model = Family(f, mask=mask).eval()
    shapes = [(1, 2, 4, 8)] * 3
    x = _inputs(shapes, SEED)
    prog = qlower.compile(model, x, target="reference", progress=False)
    matmuls = [op for op in prog.source.ops if op.kind == "matmul"]
    assert len(matmuls) == 4 and all(op.results[0].dtype.is_integer for op in matmuls)
    fallbacks = {op.attrs["target"] for op in prog.source.ops if op.kind == "aten"}
    assert fallbacks <= {"aten.where.self"}, fallbacks
    _check_targets("bool-masked attention", prog, x, host_allowed={"aten", "softmax"})
    cmp = fake_quant_agreement(prog.frontend, [x, _inputs(shapes, SEED + 3)])
    assert cmp.layers.max_step <= 1 and cmp.outputs.max_step <= 1, cmp
    out = prog.run(*x)[0]
    np.testing.assert_array_equal(out[:, :, 1], 0.0)  # the row masked everywhere


def test_float_attention_masks_match_eager():
    """quant=None: qlower's decomposition equals PyTorch's sdpa, rows masked everywhere included."""
    fmask = torch.tensor([[0, -2.0, 0, 1], [float("-inf")] * 4, [1, 1, 1, -3], [0.5, 1, float("-inf"), 1]])
    bmask = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)

    def f(m, q, k, v, fm, bm):
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=fm),
                F.scaled_dot_product_attention(q, k, v, attn_mask=bm, scale=0.5))

    class Plain(nn.Module):
        def forward(self, q, k, v, fm, bm):
            return f(self, q, k, v, fm, bm)

    x = _inputs([(1, 2, 4, 8)] * 3, SEED) + (fmask, bmask)
    prog = qlower.compile(Plain(), x, target="reference", quant=None, progress=False)
    with torch.no_grad():
        want = Plain()(*x)
    for got, w in zip(prog.run(*x), want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-6)


def test_bilinear_without_exact_ratio_falls_back_to_float():
    """A scale factor without an exact ratio (1/1.37 in float32): no small denominator holds its
    weights, the float fallback takes the op, says so, and the program still matches the reference."""
    model = Family(lambda m, x: F.interpolate(x, scale_factor=(1.0, 1.37), mode="bilinear")).eval()
    x = _inputs([(1, 2, 3, 7)], SEED)
    prog = qlower.compile(model, x, target="cpu", progress=False)
    fallbacks = [op.attrs["target"] for op in prog.source.ops if op.kind == "aten"]
    assert fallbacks == ["aten.upsample_bilinear2d.vec"], fallbacks
    np.testing.assert_array_equal(prog.run(*x)[0], run_graph(prog.source, [x[0].numpy()])[0])
    cmp = fake_quant_agreement(prog.frontend, [x])
    assert cmp.outputs.max_step <= 1, cmp


def test_dynamic_matmuls_broadcast_and_vectors():
    """Dynamic quantization: equal-batch matmuls are integer with run-time scales; broadcast, 1-D and
    constant operands take the dequantized values (what the dynamic fake-quant model computes); cpu
    matches the reference to float rounding."""
    from qlower.frontend import QuantConfig

    torch.manual_seed(SEED)
    model, shapes = _linalg()
    x = _inputs(shapes, SEED)
    report = qlower.verify(model.eval(), x, target="cpu", quant=QuantConfig(mode="dynamic"), progress=False)
    assert report.ok, report.problems
    assert not report.float_fallbacks, report.float_fallbacks
    with torch.no_grad():
        want = model(*x)
    prog = qlower.compile(model, x, target="cpu", quant=QuantConfig(mode="dynamic"), progress=False)
    assert "dynamic_quantize" in prog.source.count_ops()
    for got, w in zip(prog.run(*x), want):  # dynamic int8 error only
        assert np.abs(got - w.numpy()).max() <= 0.05 * np.abs(w.numpy()).max()
