"""SCENARIOS.md S0 and S2 end to end on the cpu target.

S0: dynamic quantization, convs without bias, twin convs with identical weights
(no bias / zero bias / a real bias), the same program loaded twice: runs within
1e-5 relative of the reference, and the weights cache packs each distinct
(weights, bias-or-none) once. S2: a per-channel binary op first in line, dynamic
and static: compiles and *runs*, matching the reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import qlower
from qlower import zoo
from qlower.backends.cpu import weights_cache
from qlower.frontend.config import QuantConfig
from qlower.reference import run_graph


def _random_inputs(example, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in example]


def _close(a, b, rtol=1e-5):
    scale = max(float(np.abs(b).max()), 1e-12)
    assert float(np.abs(a.astype(np.float64) - b).max()) <= rtol * scale


@pytest.mark.parametrize("granularity", ["per_tensor", "per_row"])
def test_s0_dynamic_biasless_on_cpu(granularity, tmp_path):
    model, example, cfg, calib = zoo.get("s0_dynamic_biasless")
    cfg = QuantConfig(mode="dynamic", granularity=granularity)
    prog = qlower.compile(model, example, target="cpu", quant=cfg, calibration=calib, progress=False)
    convs = [op for op in prog.source.ops if op.kind == "conv2d"]
    assert sum(op.operands[2] is None for op in convs) >= len(convs) - 2, "bias must stay absent, not zero"
    weights_cache.clear()
    for seed in range(3):
        xs = _random_inputs(example, seed)
        _close(prog.run(*xs)[0], run_graph(prog.source, xs)[0])
    first = weights_cache.stats()

    # distinct (weights, bias-or-none) pairs, computed from the graph independently of the cache
    data = {op.results[0]: op.attrs["data"] for op in prog.source.ops if op.kind == "constant"}

    def digest(v):
        return None if v is None else (data[v].tobytes(), data[v].dtype.str, data[v].shape)

    distinct = {(digest(op.operands[1]), digest(op.operands[2]) if op.operands[2] is not None else "no bias")
                for op in prog.source.ops if op.kind in ("conv2d", "fully_connected") and op.operands[1] in data}
    assert first["entries"] >= len(distinct) > 0

    path = tmp_path / "s0.qlp"
    prog.save(path)
    loaded = [qlower.load(path), qlower.load(path)]
    xs = _random_inputs(example, 7)
    expected = prog.run(*xs)[0]
    for p in loaded:
        np.testing.assert_array_equal(p.run(*xs)[0], expected)
    after = weights_cache.stats()
    assert after["entries"] == first["entries"], "loading the same program again must not pack weights again"
    assert after["hits"] > first["hits"]


def test_s0_twin_convs_keep_their_own_bias():
    """Every value, the twin convs' included (identical weights; no bias, zero bias, a real bias),
    equals the reference: a cache that handed one twin another's bias would break this."""
    model, example, cfg, calib = zoo.get("s0_dynamic_biasless")
    prog = qlower.compile(model, example, target="cpu", quant=cfg, calibration=calib, progress=False)
    xs = _random_inputs(example, 3)
    _, ref_env = run_graph(prog.source, xs, keep_all=True)
    traced = prog.runner().run_traced(xs)
    for name, array in traced.items():
        ref = next((a for v, a in ref_env.items() if v.name == name), None)
        if ref is not None and ref.dtype.kind == "f":
            _close(array, ref)
        elif ref is not None:
            np.testing.assert_array_equal(array, ref)


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_s2_perchannel_binary_first_in_line_runs_on_cpu(mode):
    model, example, cfg, calib = zoo.get("s2_perchannel_binary")
    if mode == "static":
        cfg = QuantConfig()
    prog = qlower.compile(model, example, target="cpu", quant=cfg, calibration=calib, progress=False)
    assert {"mul", "add"} <= {op.kind for op in prog.source.ops}
    for seed in range(3):
        xs = _random_inputs(example, seed)
        got, ref = prog.run(*xs)[0], run_graph(prog.source, xs)[0]
        if mode == "static":
            np.testing.assert_array_equal(got, ref)
        else:
            _close(got, ref)
