"""Plain integer tensors keep PyTorch's integer semantics on every target: never quantized, never
saturated. int32 ``+ - *`` wrap around on overflow (two's complement), a clamp takes any bounds,
a float bound or operand promotes to float32 as in PyTorch.

A property test draws chains of integer elementwise ops (clamp with any bounds, add / sub / mul of
tensors and Python ints near the int32 edges, broadcasting) and compares every target's outputs
with eager PyTorch exactly, dtype included. ``QLOWER_FUZZ_EXAMPLES`` examples when set (``make
fuzz``), else CI's small budget.
"""

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import nn

import qlower

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("QLOWER_FUZZ_EXAMPLES", "0"))
TARGETS = ("reference", "cpu", "tosa-1.0+int", "litert", "ethos-u55-128", "ethos-u85-256")
I32_MIN, I32_MAX = -2**31, 2**31 - 1
EDGES = (I32_MIN, I32_MIN + 1, -46341, -65536, -1, 0, 1, 2, 46341, 65536, I32_MAX - 1, I32_MAX)

ints = st.one_of(st.sampled_from(EDGES), st.integers(I32_MIN, I32_MAX), st.integers(-100, 100))
bounds = st.one_of(st.none(), ints)


class Chain(nn.Module):
    """``v = x`` then each step applied to ``v`` (and ``y``); the last step may promote to float."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def forward(self, x, y):
        v = x
        for kind, arg in self.steps:
            if kind == "clamp":
                v = torch.clamp(v, *arg)
            elif kind == "add":
                v = v + y
            elif kind == "sub":
                v = y - v
            elif kind == "mul":
                v = v * y
            elif kind == "add_alpha":
                v = torch.add(v, y, alpha=arg)
            elif kind == "add_scalar":
                v = v + arg
            elif kind == "mul_scalar":
                v = v * arg
            elif kind == "relu":
                v = torch.relu(v)
        return v, x * y


@st.composite
def chains(draw):
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple))
    # y broadcasts against x: some dims 1, maybe fewer leading dims
    y_shape = tuple(draw(st.sampled_from((d, 1))) for d in shape)[draw(st.integers(0, len(shape) - 1)):]
    x = draw(hnp.arrays(np.int32, shape, elements=ints))
    y = draw(hnp.arrays(np.int32, y_shape, elements=ints))
    step = st.one_of(
        st.tuples(st.just("clamp"), st.tuples(bounds, bounds).filter(lambda b: b != (None, None))),
        st.tuples(st.sampled_from(("add", "sub", "mul", "relu")), st.none()),
        st.tuples(st.sampled_from(("add_alpha", "add_scalar", "mul_scalar")), ints),
    )
    steps = draw(st.lists(step, min_size=1, max_size=3))
    if draw(st.booleans()):  # a float bound: the result is float32 (PyTorch's type promotion)
        lo = draw(st.one_of(st.none(), st.floats(-3e9, 3e9, width=32)))
        steps.append(("clamp", (lo, draw(st.floats(-3e9, 3e9, width=32)) if lo is None else None)))
    return Chain(steps), torch.from_numpy(x), torch.from_numpy(y)


def _assert_exact(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), w.numpy()
        assert g.dtype == w.dtype and np.array_equal(g, w), (what, i, g, w)


@settings(max_examples=EXAMPLES or 12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=chains())
def test_integer_ops_are_exact_on_every_target(case):
    model, x, y = case
    want = model(x, y)
    for target in TARGETS:
        prog = qlower.compile(model, (x, y), target=target, progress=False)
        _assert_exact(prog.run(x, y), want, (target, model.steps))


# -- regressions (issue 25) -------------------------------------------------------------------

QUICK = ("reference", "cpu", "tosa-1.0+int", "litert")


class LimitsClamp(nn.Module):
    def forward(self, x):
        return torch.clamp(x, I32_MIN, I32_MAX)


@pytest.mark.parametrize("target", QUICK)
def test_clamp_of_int32_to_the_int32_limits_returns_the_input(target):
    x = torch.tensor([[I32_MIN, -1000, 0, 999, I32_MAX]], dtype=torch.int32)
    prog = qlower.compile(LimitsClamp(), (x,), target=target, progress=False)
    _assert_exact(prog.run(x), [x], target)


class Clamps(nn.Module):
    def forward(self, x):
        return (torch.clamp(x, 5, 2), torch.clamp(x, min=-7), torch.clamp(x, max=3), torch.clamp(x, min=0.5),
                torch.clamp(x, -2.5, 1e10), torch.relu(x))


def test_clamp_of_int32_keeps_pytorch_semantics_for_any_bounds():
    x = torch.tensor([[I32_MIN, -8, -7, 0, 3, 4, 5, I32_MAX]], dtype=torch.int32)
    model = Clamps()
    for target in QUICK:
        prog = qlower.compile(model, (x,), target=target, progress=False)
        _assert_exact(prog.run(x), model(x), target)


class WideClamp(nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=-2**40, max=2**35), torch.clamp(x, 3, 2**40), torch.clamp(x, 2**40, 4)


def test_clamp_bounds_beyond_int32_on_int64_tensors():
    x = torch.tensor([I32_MIN, -5, 0, 7, I32_MAX], dtype=torch.int64)
    model = WideClamp()
    for target in ("reference", "tosa-1.0+int"):
        prog = qlower.compile(model, (x,), target=target, progress=False)
        for got, want in zip(prog.run(x), model(x)):
            assert np.array_equal(np.asarray(got), want.numpy()), (target, got, want)


class PassThrough(nn.Module):
    def forward(self, x):
        return torch.clamp(x, -5, 5), x.reshape(2, 3)


@pytest.mark.parametrize("target", ("ethos-u55-128", "ethos-u85-256"))
def test_ethos_u_copies_an_aliased_int32_output_over_its_whole_range(target):
    """Vela would alias the reshaped input; its copy can't be the identity RESCALE (|x| < 2**29)."""
    x = torch.tensor([I32_MIN, -2**29 - 1, 0, 3, 2**29, I32_MAX], dtype=torch.int32)
    prog = qlower.compile(PassThrough(), (x,), target=target, progress=False)
    _assert_exact(prog.run(x), PassThrough()(x), target)


class Arithmetic(nn.Module):
    def forward(self, x, y, z):
        return x * y, x * z, x + y, x - z, z - x


def _int32(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(I32_MIN, I32_MAX, shape, dtype=torch.int32, generator=g)


@pytest.mark.parametrize("target", QUICK)
def test_int32_arithmetic_is_exact_and_wraps_around(target):
    x, y, z = _int32(1, 2, 3, 4, seed=1), _int32(1, 2, 3, 4, seed=2), _int32(1, 1, 3, 1, seed=3)
    x[0, 0, 0, :] = torch.tensor([I32_MAX, I32_MIN, I32_MIN, -1], dtype=torch.int32)
    model = Arithmetic()
    prog = qlower.compile(model, (x, y, z), target=target, progress=False)
    assert not any(op.kind in ("quantize", "rescale") for op in prog.frontend.graph.ops), prog.frontend.graph
    _assert_exact(prog.run(x, y, z), model(x, y, z), target)


def test_wrapping_arithmetic_stays_on_the_host_where_the_target_cannot_wrap():
    x, y = _int32(2, 3, seed=4), _int32(2, 3, seed=5)
    for target, name in (("tosa-1.0+int", "TOSA 1.0 MUL"), ("litert", "TFLite's int32 MUL")):
        text = qlower.compile(Arithmetic(), (x, y, y), target=target, progress=False).explain()
        assert name in text and "wraps around" in text, text


def test_verify_replays_an_integer_model():
    x, y, z = _int32(1, 2, 3, 4, seed=6), _int32(1, 2, 3, 4, seed=7), _int32(1, 2, 3, 4, seed=8)
    rep = qlower.verify(Arithmetic(), (x, y, z), target="cpu", progress=False)
    assert rep.ok, rep.problems
    assert all(o.target_vs_ref.max_abs == 0 and o.ref_vs_fake_quant.max_abs == 0 for o in rep.outputs)


class CopyOps(nn.Module):
    def forward(self, x):
        a = torch.select_copy(x, 1, 2)
        b = torch.split_copy(x, 2, dim=1)[1]
        c = torch.split_with_sizes_copy(x, [1, 3], dim=3)[0]
        return a, b * 2, c


def test_select_copy_and_split_copy_import():
    x = torch.randn(1, 4, 5, 4)
    model = CopyOps()
    exact = qlower.compile(model, (x,), quant=None, progress=False)
    _assert_exact(exact.run(x), model(x), "float")
    prog = qlower.compile(model, (x,), target="tosa-1.0+int", progress=False)
    assert "float_reasons" not in prog.meta, prog.meta
    assert all(np.asarray(g).shape == tuple(w.shape) for g, w in zip(prog.run(x), model(x)))


def test_rank1_linear_on_litert_is_exact():
    model = nn.Sequential(nn.Linear(10, 15), nn.ReLU(), nn.Linear(15, 3)).eval()
    x = torch.randn(10)
    ref = qlower.compile(model, (x,), target="reference", progress=False).run(x)
    got = qlower.compile(model, (x,), target="litert", progress=False).run(x)
    _assert_exact(got, [torch.from_numpy(np.asarray(r)) for r in ref], "litert")


def test_only_the_models_own_integer_arithmetic_wraps(tmp_path):
    """Wrapping is an op's ``wrap`` attribute, set on a model's int32 ``+ - *``; integer arithmetic qlower
    derives itself on scale-1 values (norms) must fit, so an overflow there is an error, not a wrap.
    The attribute survives a save and load, and a forged one on other operands is refused."""
    from qlower.errors import IRError
    from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
    from qlower.reference import run_graph

    x, y, z = _int32(1, 2, 3, 4, seed=9), _int32(1, 2, 3, 4, seed=10), _int32(1, 2, 3, 4, seed=11)
    prog = qlower.compile(Arithmetic(), (x, y, z), target="cpu", progress=False)
    arith = [op for op in prog.frontend.graph.ops if op.kind in ("add", "sub", "mul")]
    assert arith and all(op.attrs["wrap"] for op in arith)
    prog.save(tmp_path / "p.qlp")
    again = qlower.load(tmp_path / "p.qlp")
    _assert_exact(again.run(x, y, z), Arithmetic()(x, y, z), "cpu (loaded)")

    plain = TensorType((1, 4), DType.INT32, QuantSpec.plain_integer())
    b = GraphBuilder()
    a = b.input("a", plain)
    g = verify_graph(b.build([b.op("add", a, a, name="twice")]))
    big = np.full((1, 4), 2**30 + 7, np.int32)
    with pytest.raises(Exception, match="overflow"):
        run_graph(g, [big])
    b = GraphBuilder()
    a = b.input("a", plain)
    g = verify_graph(b.build([b.op("add", a, a, wrap=True, name="twice")]))
    assert run_graph(g, [big])[0].tolist() == [[-2**31 + 14] * 4]

    scaled = TensorType((1, 4), DType.INT32, QuantSpec.per_tensor(0.5, 0, DType.INT32))
    b = GraphBuilder()
    a = b.input("a", scaled)
    with pytest.raises(IRError, match="wrap is for plain int32"):
        b.op("add", a, a, wrap=True)
