"""Checks for CPU-backend tests: a plan must reproduce the reference interpreter bit for bit.

``assert_cpu_matches_reference`` prepares the graph under several configurations
(native kernels on/off, each exact GEMM engine, fusion off) and compares every
output, and with ``trace`` every intermediate value, with ``run_graph``.
Float results of float GEMMs are compared to ``float_rtol`` (they accumulate in
float64 like the reference, in another order); everything else must be
bit-identical (for floats: the same values and signed zeros; NaN is NaN whatever its sign and
payload, which IEEE 754 leaves to the hardware).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qlower.backends.cpu import CpuPlan, prepare
from qlower.ir import Graph
from qlower.reference import run_graph

CONFIGS: tuple[dict, ...] = (
    {},
    {"native": False},
    {"gemm_engine": "float32", "native": False},
    {"gemm_engine": "float64"},
    {"fuse": False},
)


def assert_same(expected: np.ndarray, got: np.ndarray, what: str, float_rtol: float = 0.0) -> None:
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    if float_rtol and expected.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, rtol=float_rtol, atol=0, err_msg=what)
        return
    if np.ascontiguousarray(expected).tobytes() == np.ascontiguousarray(got).tobytes():
        return
    if expected.dtype.kind == "f":
        # same values and same signed zeros; which NaN a NaN is (sign, payload) is not semantics
        same = ((expected == got) & (np.signbit(expected) == np.signbit(got))) | (np.isnan(expected) & np.isnan(got))
    else:
        same = expected == got
    bad = np.argwhere(~same)
    if len(bad):
        first = tuple(bad[0])
        raise AssertionError(f"{what}: {len(bad)} element(s) differ, first at {first}: "
                             f"got {got[first]!r}, expected {expected[first]!r}")


def assert_cpu_matches_reference(graph: Graph, inputs: Sequence[np.ndarray], configs: Sequence[dict] = CONFIGS,
                                 trace: bool = True, float_rtol: float = 0.0) -> list[CpuPlan]:
    """Every configuration's outputs (and traced values) equal the reference's; returns the plans."""
    expected, env = run_graph(graph, inputs, keep_all=True)
    plans = []
    for cfg in configs:
        plan = prepare(graph, **cfg)
        for i, (e, g) in enumerate(zip(expected, plan.run(inputs), strict=True)):
            assert_same(e, g, f"output {i} with {cfg}", float_rtol)
        if trace:
            traced, names = plan.run_traced(inputs, each_op=True), plan.trace_names()
            for value, e in env.items():
                assert_same(e, traced[names[value]], f"%{value.name} traced with {cfg}", float_rtol)
        plans.append(plan)
    return plans
