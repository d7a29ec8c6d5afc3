"""Integer LayerNorm of any width (issue 25): the error bound of ``normalization.layer_norm`` holds.

The rule's IR graph is built directly (no export: widths up to 8,192 stay fast) for drawn widths,
input and output quantizations, eps, weights and input rows (uniform codes, constant rows, one outlier,
a narrow spread around any level), run on the reference interpreter and compared with LayerNorm
computed in float64 on the dequantized codes: every output is within the plan's static bound plus half
an output step of the exact value (so at most one step from the fake-quant model's code), and the bound
itself is below half a step (otherwise the rule refuses and the op runs in float).
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qlower.errors import UnsupportedOpError
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.rules import normalization
from qlower.ir import DType, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph


def _context() -> ImportContext:
    return ImportContext(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()), "layer_norm")


def _graph(rows: int, n: int, spec: QuantSpec, w, b, eps: float, out: QuantSpec):
    ctx = _context()
    x = ctx.b.input("x", TensorType((rows, n), DType.INT8, spec))
    y = normalization.layer_norm(ctx, Ref.of(x, (0, 1)), 1, w, b, eps, out)
    return verify_graph(ctx.b.build([y.value]))


def _rows(rng: np.random.Generator, kind: int, rows: int, n: int) -> np.ndarray:
    if kind == 0:   # any codes
        return rng.integers(-128, 128, (rows, n))
    level = rng.integers(-128, 128, (rows, 1))
    if kind == 1:   # constant rows
        return np.broadcast_to(level, (rows, n)).copy()
    if kind == 2:   # one outlier by one code: the smallest non-zero variance, V = N - 1
        x = np.broadcast_to(level, (rows, n)).copy()
        x[np.arange(rows), rng.integers(0, n, rows)] += np.where(level[:, 0] < 127, 1, -1)
        return x
    if kind == 3:   # a narrow spread around any level
        return level + rng.integers(-2, 3, (rows, n))
    return np.rint(rng.normal(0, rng.uniform(1, 60), (rows, n))) + level // 4


@settings(max_examples=30, deadline=None, derandomize=True)
@given(n=st.one_of(st.integers(2, 64), st.integers(65, 1024), st.integers(1025, 8192)),
       seed=st.integers(0, 2**31 - 1), kind=st.integers(0, 4),
       eps=st.sampled_from([1e-12, 1e-6, 1e-5, 1e-3]), affine=st.booleans())
def test_layer_norm_within_bound(n, seed, kind, eps, affine):
    _check(n, seed, kind, eps, affine, float(np.random.default_rng(seed + 1).uniform(-6, 0)))


@pytest.mark.parametrize("n,eps", [(32, 1e-5), (700, 1e-3), (4096, 1e-5)])
@pytest.mark.parametrize("kind", range(5))
def test_eps_dominates(n, eps, kind):
    """Input steps of 3e-7: N·eps/s² passes 2**30, U is held 4**c times coarser (K_c below 1)."""
    plan = _check(n, 7 + kind, kind, eps, True, -6.5)
    assert plan.coarse < 1


def _check(n, seed, kind, eps, affine, log_scale):
    rng = np.random.default_rng(seed)
    rows = 3
    # input steps down to 1e-6: N·eps/s² passes 2**30 (eps dominates the variance)
    spec = QuantSpec.per_tensor(float(10 ** log_scale), int(rng.integers(-100, 100)))
    w_max, b_max = (float(rng.uniform(0.1, 4)), float(rng.uniform(0, 2))) if affine else (1.0, 0.0)
    w = rng.uniform(-w_max, w_max, n) if affine else None
    b = rng.uniform(-b_max, b_max, n) if affine else None
    reach = 4 * w_max + b_max   # what a calibrated output range of a LayerNorm usually covers
    out = QuantSpec.per_tensor(reach * 2 / 255 * float(rng.uniform(0.5, 2)), int(rng.integers(-20, 20)))
    graph = _graph(rows, n, spec, w, b, eps, out)

    codes = np.clip(_rows(rng, kind, rows, n), -128, 127).astype(np.int8)
    got = run_graph(graph, [codes])[0].astype(np.float64)
    x = spec.scale[0] * (codes.astype(np.float64) - spec.zero_point[0])
    exact = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + eps)
    if affine:
        exact = exact * w + b
    s, zp = out.scale[0], out.zero_point[0]
    exact = np.clip(exact, s * (out.qmin - zp), s * (out.qmax - zp))
    plan = normalization._plan(_context(), n, 255, n * eps / spec.scale[0] ** 2,
                               (np.ones(n) if w is None else w).reshape(1, n),
                               (np.zeros(n) if b is None else b).reshape(1, n), out)
    assert plan.error < s / 2
    worst = np.abs(s * (got - zp) - exact).max()
    assert worst <= plan.error + s / 2 + 1e-9 * s, (worst / s, plan)
    fake_quant = np.clip(np.rint(exact / s) + zp, out.qmin, out.qmax)
    assert np.abs(got - fake_quant).max() <= 1
    return plan


def test_constant_rows_give_the_bias():
    """V = 0: D = 0 whatever the rsqrt table reads, so the result is the bias exactly (also at eps 0)."""
    n, out = 3000, QuantSpec.per_tensor(0.02, 0)
    b = np.linspace(-1, 1, n)
    graph = _graph(2, n, QuantSpec.per_tensor(0.1, 0), np.ones(n), b, 0.0, out)
    got = run_graph(graph, [np.stack([np.full(n, -128), np.full(n, 127)]).astype(np.int8)])[0]
    np.testing.assert_array_equal(got, np.broadcast_to(np.rint(b / 0.02), (2, n)))


def test_too_wide_is_refused_with_the_reason():
    """Past int32's sum of squares (about 66,000 int8 codes) the rule refuses; the op then runs in float."""
    n = 70_000
    with pytest.raises(UnsupportedOpError, match="sum of squares"):
        _graph(1, n, QuantSpec.per_tensor(0.1, 0), None, None, 1e-5, QuantSpec.per_tensor(0.03, 0))
