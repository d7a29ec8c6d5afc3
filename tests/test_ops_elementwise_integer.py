"""Integer import of elementwise ops: unary lookup tables, binary, compare and select ops.

Each op family is one tiny model compiled for cpu and tosa-1.0+int and checked
with ``qlower.verify``: no op of the model runs as a float fallback, every op but
the boundary quantize/dequantize runs on the target, the target is bit-exact with
the reference interpreter at every layer and output, and the reference is within
one quantization step of PyTorch's fake-quant model at every layer (each layer
fed fake-quant's own inputs).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlower
from qlower.api import lower_graph
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph

SEED = 7
TARGETS = ("cpu", "tosa-1.0+int")
BOUNDARY = {"quantize", "dequantize"}


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_integer(model: nn.Module, shape: tuple[int, ...], layers: set[str]) -> None:
    """``layers``: fx node names without their ``_N`` suffix (as the report names layers) that must be checked."""
    torch.manual_seed(SEED)
    model = model.eval()
    calibration = [(_randn(*shape, seed=SEED + i) * s,) for i, s in enumerate((0.5, 1.0, 2.0))]
    inputs = [(_randn(*shape, seed=100 + i) * s,) for i, s in enumerate((1.0, 2.5))]
    for target in TARGETS:
        rep = qlower.verify(model, inputs[0], target=target, calibration=calibration, inputs=inputs, progress=False)
        assert not rep.float_fallbacks, rep.float_fallbacks
        on_host = [k for k, where in rep.placement if where == "host" and k not in BOUNDARY]
        assert not target.startswith("tosa") or not on_host, f"{target}: on the host: {on_host}"
        assert rep.ok, rep.problems
        rows = {}
        for r in rep.layers:
            rows.setdefault(re.sub(r"_\d+$", "", r.op), []).append(r)
        missing = layers - set(rows)
        assert not missing, f"layers not checked: {missing}; have {sorted(rows)}"
        for name in layers:
            for r in rows[name]:
                assert r.isolated_vs_fake_quant is not None and r.isolated_vs_fake_quant.max_steps <= 1, (name, r)
                assert r.target_vs_ref is not None and r.target_vs_ref.max_steps == 0, (name, r)
        for o in rep.outputs:
            assert o.target_vs_ref.max_abs == 0


class Unary(nn.Module):
    """A conv, then one branch per op (each output is the op's own quantized result)."""

    def __init__(self, fns):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.fns = fns

    def forward(self, x):
        y = self.conv(x)
        return tuple(fn(y) for fn in self.fns)


UNARY = {
    "activations": ([
        lambda y: F.leaky_relu(y, 0.2), lambda y: F.elu(y, 0.7), F.gelu, lambda y: F.gelu(y, approximate="tanh"),
        F.silu, F.mish, F.hardswish, F.hardsigmoid, lambda y: F.softplus(y, 2.0, 3.0), lambda y: F.celu(y, 0.5),
        F.selu, torch.sigmoid, torch.tanh, F.logsigmoid, nn.LeakyReLU(0.1, inplace=True),
    ], {"leaky_relu", "elu", "gelu", "silu", "mish", "hardswish", "hardsigmoid", "softplus", "celu", "selu",
        "sigmoid", "tanh", "log_sigmoid", "leaky_relu_"}),
    "arithmetic": ([
        torch.abs, torch.neg, torch.exp, lambda y: y ** 2, lambda y: y.pow(3),
        lambda y: torch.sqrt(y.abs()), lambda y: torch.rsqrt(y.abs() + 0.5), lambda y: torch.log(y.abs() + 0.25),
        lambda y: torch.reciprocal(y.abs() + 0.5),
    ], {"abs", "neg", "exp", "pow", "sqrt", "rsqrt", "log", "reciprocal"}),
}


@pytest.mark.parametrize("family", sorted(UNARY))
def test_unary_ops_are_lookup_tables(family):
    fns, layers = UNARY[family]
    model = Unary(fns)
    assert_integer(model, (1, 3, 4, 4), layers)


def test_table_only_ops_in_a_float_import_still_compute_the_op():
    """Non-core ops with only a table rule (here mish and softplus) are decomposed when nothing quantizes
    them statically: the float program matches eager PyTorch."""
    torch.manual_seed(SEED)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            y = self.fc(x)
            return F.mish(y) + F.softplus(y, 2.0, 1.0)

    model, x = M().eval(), _randn(3, 6, seed=SEED)
    prog = qlower.compile(model, (x,), target="cpu", quant=None, progress=False)
    got = prog.run(x.numpy())[0]
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


class LogSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)

    def forward(self, x):
        y = self.conv(x)
        return F.log_softmax(y, dim=1), F.log_softmax(y * 3, dim=-1), F.softmax(y, dim=1)


def test_log_softmax_and_softmax_are_integer():
    assert_integer(LogSoftmax(), (1, 3, 4, 4), {"log_softmax", "softmax"})


def test_an_op_with_nan_on_calibration_data_stays_float():
    """sqrt of negative numbers: PT2E can't quantize NaN, and nan_to_num relies on it; the op runs in float."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            y = self.fc(x)
            return torch.sqrt(y).nan_to_num() + torch.sqrt(y.abs())

    torch.manual_seed(SEED)
    model, x = M().eval(), _randn(4, 6, seed=SEED)
    prog = qlower.compile(model, (x,), target="cpu", calibration=[(x,)], progress=False)
    fallbacks = [op.attrs["target"] for op in prog.source.ops if op.kind == "aten"]
    assert "aten.sqrt.default" in fallbacks and prog.source.count_ops().get("table", 0) >= 2  # sqrt(|y|), abs
    with torch.no_grad():
        eager = model(x).numpy()
    assert np.abs(prog.run(x)[0] - eager).max() < 0.1


class Binary(nn.Module):
    """Two convs of one input, then one branch per op."""

    def __init__(self, fns):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)
        self.fns = fns

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        return tuple(fn(a, b) for fn in self.fns)


BINARY = {
    "min_max_clamp": ([
        torch.minimum, lambda a, b: torch.maximum(a, b * 2), lambda a, b: torch.clamp(a, b - 1, b + 1),
        lambda a, b: torch.clamp(a, min=b), lambda a, b: torch.maximum(a, torch.full((1, 4, 1, 1), 0.25)),
    ], {"minimum", "maximum", "clamp"}),
    "alpha": ([
        lambda a, b: torch.sub(a, b, alpha=0.5), lambda a, b: torch.add(a, b, alpha=-2),
        lambda a, b: torch.add(a, torch.ones(1, 4, 1, 1), alpha=0.3),
    ], {"sub", "add"}),
    "div": ([
        torch.div, lambda a, b: a / (b.abs() + 0.5), lambda a, b: torch.div(torch.linspace(-1, 1, 4).reshape(1, 4, 1, 1), b),
        lambda a, b: a / (b + 1.0),  # the divisor's zero code: ±inf saturates to qmax / qmin
    ], {"div"}),
    # comparisons give bools (not quantized): checked through the selects that read them
    "compare_select": ([
        lambda a, b: torch.where(a > 0.1, a, b), lambda a, b: torch.where(a <= b, a, b * 0.5),
        lambda a, b: torch.where((a > b) & (a < 0.5) | ~(b >= a), a, b), lambda a, b: torch.where(a != b, a, b),
        lambda a, b: torch.where(torch.logical_xor(a == 0.0, b.ge(-0.2)), b, a),
        lambda a, b: torch.where(torch.logical_or(a.lt(b), a.eq(b)), a, -0.5),
    ], {"where"}),
}


@pytest.mark.parametrize("family", sorted(BINARY))
def test_binary_ops_are_integer(family):
    fns, layers = BINARY[family]
    assert_integer(Binary(fns), (1, 3, 4, 4), layers)


def test_comparison_with_a_scalar_is_exact_on_every_code():
    """gt/ge/lt/le/eq/ne against a number, decided on codes, agree with PyTorch on every int8 code."""
    class M(nn.Module):
        def forward(self, x):
            return tuple((op(x, c)).to(torch.float32) for op in (torch.gt, torch.ge, torch.lt, torch.le, torch.eq,
                                                                    torch.ne) for c in (0.0, 0.3, -1.17))

    # an input whose codes cover the whole int8 range, with 0.0 and other values exactly on codes
    x = torch.linspace(-2.0, 2.0, 256).reshape(1, 256)
    prog = qlower.compile(M(), (x,), target="tosa-1.0+int", calibration=[(x,)], progress=False)
    spec = next(op.attrs["out"] for op in prog.source.ops if op.kind == "quantize")
    qd = torch.ops.quantized_decomposed  # the fake-quant values, by PyTorch
    codes = qd.quantize_per_tensor.default(x, spec.scale[0], spec.zero_point[0], -128, 127, torch.int8)
    dq = qd.dequantize_per_tensor.default(codes, spec.scale[0], spec.zero_point[0], -128, 127, torch.int8)
    compares = {"gt", "ge", "lt", "le", "eq", "ne"}
    assert not [op for op in prog.source.ops if op.kind == "aten" and op.attrs["target"].split(".")[1] in compares]
    got = prog.run(x)
    want = [op(dq, c).to(torch.float32).numpy() for op in (torch.gt, torch.ge, torch.lt, torch.le, torch.eq,
                                                             torch.ne) for c in (0.0, 0.3, -1.17)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    kinds = prog.source.count_ops()
    assert sum(kinds.get(k, 0) for k in ("greater", "greater_equal", "equal")) == 18


def test_division_by_a_zero_code_saturates_like_fake_quant():
    """x / y where y holds exact zeros at run time (never on calibration data): PyTorch's ±inf quantizes to
    qmax / qmin, and so does the integer division, on every target."""
    class M(nn.Module):
        def forward(self, x, y):
            return x / y

    g = torch.Generator().manual_seed(SEED)
    def pair(n):
        x = torch.rand(1, n, generator=g) + 0.25
        x = torch.where(torch.arange(n) % 2 == 0, x, -x)
        y = (torch.rand(1, n, generator=g) * 1.5 + 0.5) * torch.where(torch.arange(n) % 3 == 0, -1.0, 1.0)
        return x, y
    calibration = [pair(12) for _ in range(3)]
    x, y = pair(12)
    y[0, ::4] = 0.0
    for target in TARGETS:
        rep = qlower.verify(M(), (x, y), target=target, calibration=calibration, progress=False)
        assert rep.ok and not rep.float_fallbacks, (rep.problems, rep.float_fallbacks)
        div = next(r for r in rep.layers if r.op == "div")
        assert div.isolated_vs_fake_quant.max_steps == 0 and div.target_vs_ref.max_steps == 0
        assert rep.outputs[0].ref_vs_fake_quant.max_steps == 0


class PreluGlu(nn.Module):
    """PReLU (per channel and shared slope) and GLU reach the importer decomposed into integer pieces."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.prelu, self.prelu1 = nn.PReLU(4), nn.PReLU()
        with torch.no_grad():
            self.prelu.weight.copy_(torch.tensor([0.25, -0.5, 1.5, 0.0]))

    def forward(self, x):
        y = self.conv(x)
        return self.prelu(y), self.prelu1(y), F.glu(y, dim=1)


def test_prelu_and_glu_are_integer():
    assert_integer(PreluGlu(), (1, 3, 4, 4), {"where", "mul", "sigmoid"})


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_one_domain_ir_ops_on_every_code(dtype):
    """The new IR ops on random codes over the whole range (extremes included), broadcasting: cpu and TOSA
    bit-exact with the reference, and the reference equal to NumPy on the codes."""
    rng = np.random.default_rng(SEED)
    q = QuantSpec.per_tensor(0.05, 7 if dtype is DType.INT8 else 0, dtype)
    b = GraphBuilder("one_domain")
    x = b.input("x", TensorType((2, 3, 5), dtype, q))
    y = b.input("y", TensorType((1, 3, 5), dtype, q))
    lo, hi = b.op("minimum", x, y), b.op("maximum", x, y)
    gt, ge, eq = (b.op(k, x, y) for k in ("greater", "greater_equal", "equal"))
    mixed = b.op("logical_or", b.op("logical_and", gt, b.op("logical_not", eq)), b.op("logical_xor", ge, eq))
    picked = b.op("select", mixed, lo, hi)
    graph = verify_graph(b.build([lo, hi, picked]))
    info = np.iinfo(dtype.numpy)
    xs = rng.integers(info.min, info.max + 1, (2, 3, 5)).astype(dtype.numpy)
    ys = rng.integers(info.min, info.max + 1, (1, 3, 5)).astype(dtype.numpy)
    xs[0, 0, :3], ys[0, 0, :3] = (info.min, info.max, 0), (info.min, info.min, 0)
    xs[1, 1] = ys[0, 1]  # equal codes
    want = run_graph(graph, [xs, ys])
    mask = ((xs > ys) & ~(xs == ys)) | ((xs >= ys) ^ (xs == ys))
    for got, exp in zip(want, (np.minimum(xs, ys), np.maximum(xs, ys),
                               np.where(mask, np.minimum(xs, ys), np.maximum(xs, ys)))):
        np.testing.assert_array_equal(got, exp)
    for target in TARGETS:
        prog = lower_graph(graph, target, progress=False)
        assert all(p.subgraph.ops for p in prog.partitions) and (target == "cpu" or len(prog.partitions) == 1)
        for got, exp in zip(prog.run(xs, ys), want):
            np.testing.assert_array_equal(got, exp)
