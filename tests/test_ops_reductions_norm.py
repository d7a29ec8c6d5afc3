"""Integer reductions and normalisation, end to end: sum / mean / amax / amin / max / min (values and
indices) / argmax / argmin / var over various dims with keepdim both ways, and an unfolded BatchNorm.

Each family is quantized once; its optimised IR runs on the reference interpreter, the cpu backend and
tosa-1.0+int (TOSA reference model). Checked per family: the ops are integer (no float ``aten``
fallback, and on TOSA none of them is left on the host), every target is bit-exact with the reference,
and the reference is within 1 quantization step of PyTorch's fake-quant model, per layer (teacher-forced)
and at the outputs. Index results must equal fake-quant's exactly.
"""

import numpy as np
import pytest
import torch
from torch import nn

import qlower
from qlower.api import lower_graph
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
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


class Prefix(nn.Module):
    """``x * 1.5 + 0.25`` before ``f``: the reduced tensor is an integer intermediate, not a graph input."""

    def __init__(self, f, *mods):
        super().__init__()
        self.f, self.mods = f, nn.ModuleList(mods)

    def forward(self, x):
        return self.f(self, x * 1.5 + 0.25)


def _sum_mean(m, x):
    return (x.sum(dim=1), x.sum(dim=(2, 3), keepdim=True), x.mean(dim=-1), x.mean(dim=(1, 2), keepdim=True),
            x.mean())


def _extremes(m, x):
    return (x.amax(dim=1), x.amin(dim=(2, 3), keepdim=True), x.amax(dim=(0, -1)), x.max(), x.min(),
            x.max(dim=2)[0], x.min(dim=1, keepdim=True)[0])


def _indices(m, x):
    return (x.argmax(dim=1), x.argmin(dim=3, keepdim=True), x.argmax(), x.argmin(dim=0),
            x.max(dim=2)[1], x.min(dim=1, keepdim=True)[1])


def _max_dim_both(m, x):
    values, index = x.max(dim=-1, keepdim=True)
    return values * 2.0, index


def _var(m, x):
    return (x.var(dim=1), x.var(dim=(2, 3), keepdim=True, correction=0), torch.var(x, dim=-1, unbiased=True))


def _whole_tensor(m, x):
    return x.var(), x.max(), x.min(), x.amin(), x.argmin()


def _batch_norm(m, x):
    return m.mods[0](x), m.mods[1](x.mean(dim=2))


class TokenNorm(nn.Module):
    """LayerNorm over the last dim (weights of both signs), and over the last two dims without affine."""

    def __init__(self):
        super().__init__()
        self.ln, self.ln2 = nn.LayerNorm(6), nn.LayerNorm((5, 6), elementwise_affine=False)
        self.ln.weight.data.uniform_(-2, 2)
        self.ln.bias.data.uniform_(-1, 1)

    def forward(self, x):
        x = x * 0.5 + 0.1
        return self.ln(x), self.ln2(x)


def _layer_norm_input(shape, seed):
    """Rows of every spread: normal, nearly constant, constant, alternating ±1."""
    x = _normal(shape, seed)
    x[0, 0, 0] = 0.01 * x[0, 0, 1]
    x[0, 0, 2] = 0.3
    x[1, 1, 3] = torch.tensor([1.0, -1.0]).repeat(3)
    return x


def _coarse(shape, seed):
    """Values on a coarse grid: many equal codes, so ties in max / min / argmax are exercised."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).float() * 0.5


def _normal(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


class AfterConv(nn.Module):
    """Reductions of an NHWC conv output (reduced axes move in the IR's layout)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 5, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return y.amax(dim=1), y.argmax(dim=1, keepdim=True), y.var(dim=(2, 3)), y.min(dim=-1)[1], y.mean(dim=1)


def _seeded(cls):
    torch.manual_seed(SEED)
    return cls()


def _bn_model():
    torch.manual_seed(SEED)
    bn2, bn1 = nn.BatchNorm2d(4), nn.BatchNorm1d(4)
    for bn in (bn2, bn1):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.3, 2.0)
        bn.weight.data.uniform_(-2, 2)
        bn.bias.data.uniform_(-1, 1)
    return Prefix(_batch_norm, bn2, bn1)


FAMILIES = {
    # name: (model factory, input factory, IR op kinds that must appear)
    "sum_mean": (lambda: Prefix(_sum_mean), _normal, {"reduce_sum"}),
    "extremes": (lambda: Prefix(_extremes), _coarse, {"reduce_max", "reduce_min"}),
    "indices": (lambda: Prefix(_indices), _coarse, {"argmax", "argmin"}),
    "max_dim_both": (lambda: Prefix(_max_dim_both), _coarse, {"reduce_max", "argmax"}),
    "var": (lambda: Prefix(_var), _normal, {"reduce_sum", "sub"}),
    "whole_tensor": (lambda: Prefix(_whole_tensor), _normal, {"reduce_max", "reduce_min", "argmin"}),
    "batch_norm": (_bn_model, _normal, {"mul", "add"}),
    "after_conv": (lambda: _seeded(AfterConv), _normal, {"conv2d", "reduce_max", "argmax", "argmin", "sub"}),
    "layer_norm": (lambda: _seeded(TokenNorm), _layer_norm_input, {"reduce_sum", "intdiv", "table"}),
}
SHAPE = (2, 4, 5, 6)


def _compile(name):
    factory, make_input, kinds = FAMILIES[name]
    model = factory().eval()
    x = make_input(SHAPE, SEED)
    calibration = [(x,), (make_input(SHAPE, SEED + 1) * 1.2,)]
    prog = qlower.compile(model, (x,), target="reference", calibration=calibration, progress=False)
    return model, x, prog, kinds


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return (request.param, *_compile(request.param))


def test_integer_ops_and_no_float_fallback(family):
    name, _, _, prog, kinds = family
    assert_integer_program(prog.source, kinds, name)


def test_targets_bit_exact_with_reference(family):
    name, _, x, prog, kinds = family
    assert_targets_bit_exact(name, prog.source, (x,), TARGETS)


def test_reference_within_one_step_of_fake_quant(family):
    name, model, x, prog, kinds = family
    _, make_input, _ = FAMILIES[name]
    batches = [(x,), (make_input(SHAPE, SEED + 7),)]
    cmp = fake_quant_agreement(prog.frontend, batches)
    assert cmp.layers.total > 0 and cmp.layers.max_step <= 1, f"{name}: {cmp}"
    assert cmp.outputs.max_step <= 1, f"{name}: {cmp}"
    for (xb,) in batches:  # integer results (indices) must be exactly fake-quant's
        with torch.no_grad():
            fq = prog.frontend.fake_quant(xb)
        fq = fq if isinstance(fq, (tuple, list)) else (fq,)
        for ours, theirs in zip(run_graph(prog.source, [xb.numpy()]), fq):
            if not theirs.dtype.is_floating_point:
                np.testing.assert_array_equal(ours, theirs.numpy())
                assert ours.shape == tuple(theirs.shape)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_float_import_matches_eager(name):
    """quant=None: the same ops in float (IR float ops or core-ATen fallbacks), never refused."""
    factory, make_input, _ = FAMILIES[name]
    model = factory().eval()
    x = make_input(SHAPE, SEED)
    prog = qlower.compile(model, (x,), target="reference", quant=None, progress=False)
    with torch.no_grad():
        want = model(x)
    for got, w in zip(prog.run(x), want if isinstance(want, tuple) else (want,)):
        assert got.shape == tuple(w.shape)
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-5)


def test_folded_batch_norm_is_untouched():
    """A BatchNorm after a conv is still folded into it (no channel_affine left)."""
    x = _normal(SHAPE, SEED)
    torch.manual_seed(SEED)
    folded = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)).eval()
    prog = qlower.compile(folded, (x,), target="reference", progress=False)
    ops = prog.source.count_ops()
    assert ops.get("conv2d") == 1 and "add" not in ops and "aten" not in ops, ops


def test_var_beyond_int32_falls_back_to_float():
    """N²·max|d|² beyond int32: the float fallback takes var, and says so."""
    model = Prefix(lambda m, x: x.var(dim=-1)).eval()
    x = _normal((1, 2, 512), SEED)
    prog = qlower.compile(model, (x,), target="cpu", progress=False)
    fallbacks = [op.attrs["target"] for op in prog.source.ops if op.kind == "aten"]
    assert len(fallbacks) == 1 and fallbacks[0].startswith("aten.var."), fallbacks
    np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x.numpy()])[0])


@pytest.mark.parametrize("kind", ["reduce_max", "reduce_min", "argmax", "argmin"])
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_order_reductions_over_the_whole_code_range(kind, dtype):
    """Every code including both extremes (the complement trick of TOSA's argmin must not overflow), with ties."""
    rng = np.random.default_rng(SEED)
    info = np.iinfo(dtype.numpy)
    shape = (3, 4, 6)
    data = rng.choice(np.array([info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max]), shape)
    data[0, 0, :] = info.min  # a row of equal codes: the first index wins
    data[1, :, 2] = info.max
    b = GraphBuilder()
    x = b.input("x", TensorType(shape, dtype, QuantSpec.per_tensor(0.1, 3, dtype)))
    graph = verify_graph(b.build([b.op(kind, x, axis=axis) for axis in range(3)]))
    want = run_graph(graph, [data.astype(dtype.numpy)])
    expect = {"reduce_max": np.max, "reduce_min": np.min, "argmax": np.argmax, "argmin": np.argmin}[kind]
    for axis in range(3):
        np.testing.assert_array_equal(want[axis], expect(data, axis=axis, keepdims=True))
    for target in TARGETS:
        got = lower_graph(graph, target).run(data.astype(dtype.numpy))
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w, err_msg=f"{kind} on {target}")


def test_other_overloads_are_still_decomposed():
    """max.other / min.other (elementwise) and var() have no rule here: they reach other rules or the
    float fallback, as before, and the program still agrees with the reference and with eager PyTorch."""
    model = Prefix(lambda m, x: (torch.max(x, x * 0.5), torch.min(x, -x), x.var(dim=None), x.std())).eval()
    x = _normal(SHAPE, SEED)
    prog = qlower.compile(model, (x,), target="cpu", progress=False)
    got, want = prog.run(x), run_graph(prog.source, [x.numpy()])
    with torch.no_grad():
        eager = model(x)
    for g, w, e in zip(got, want, eager):
        np.testing.assert_array_equal(g, w)
        assert np.abs(g - e.numpy()).max() < 0.1 * max(1.0, float(e.abs().max()))


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.ln, self.b = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 8)

    def forward(self, x):
        return self.b(self.ln(self.a(x)))


class Image(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.gn, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.Conv2d(8, 8, 1)
        self.inorm, self.c3 = nn.InstanceNorm2d(8, affine=True), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.c3(self.inorm(self.c2(torch.relu(self.gn(self.c1(x))))))


@pytest.mark.parametrize("model_cls,shape,tables", [(Tokens, (2, 5, 8), 1), (Image, (2, 3, 6, 6), 2)])
def test_norms_between_integer_ops(model_cls, shape, tables):
    """LayerNorm between linears, GroupNorm and InstanceNorm between convs: all integer (one rsqrt table
    each), exact on every target (one TOSA partition) and within 1 step of fake-quant."""
    torch.manual_seed(SEED)
    model = model_cls().eval()
    x = _normal(shape, SEED)
    prog = qlower.compile(model, (x,), target="reference", calibration=[(x,), (x * 1.5,)], progress=False)
    ops = prog.source.count_ops()
    assert "aten" not in ops and ops.get("table") == tables, ops
    for op in prog.source.ops:
        if op.kind not in BOUNDARY:
            assert all(r.dtype.is_integer for r in op.results), op.kind
    want = run_graph(prog.source, [x.numpy()])
    for target in TARGETS:
        lowered = lower_graph(prog.source, target)
        for g, w in zip(lowered.run(x), want):
            np.testing.assert_array_equal(g, w)
        if target.startswith("tosa"):
            assert len(lowered.partitions) == 1 and not {d.op.kind for d in lowered.decisions} - BOUNDARY
    cmp = fake_quant_agreement(prog.frontend, [(x,), (_normal(shape, SEED + 3),)])
    assert cmp.layers.total > 0 and cmp.layers.max_step <= 1, cmp  # per layer (end to end, steps add up)


def test_layer_norm_over_512_elements_is_integer():
    """Over 512 elements N²·max|d|² passes 2**30, but the variance is never formed as such (issue 25): integer."""
    torch.manual_seed(SEED)
    model = Prefix(lambda m, x: m.mods[0](x), nn.LayerNorm(512)).eval()
    x = _normal((1, 2, 512), SEED)
    prog = qlower.compile(model, (x,), target="cpu", progress=False)
    assert "aten" not in prog.source.count_ops()
    np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x.numpy()])[0])
