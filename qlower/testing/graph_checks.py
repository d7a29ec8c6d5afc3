"""Checks for graph-rewriting tests: structural (printed text) and numeric (bit-identical runs).

A pass test states the graph it expects as a short hand-written text and
compares it with ``print_graph``; it then runs the graph before and after the
pass on random inputs with the reference interpreter, whose outputs must be
bit-identical.
"""

from __future__ import annotations

import textwrap

import numpy as np

from qlower.ir import Graph, print_graph
from qlower.reference import run_graph


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    """Random inputs of the graph's types: codes anywhere in the dtype's range (not only
    [qmin, qmax], so a pass that relies on an unchecked range is caught; int32 within +-2**20 so
    that arithmetic on them doesn't overflow), floats ~ N(0, 2)."""
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        if v.dtype.is_integer:
            lo, hi = max(v.dtype.min, -(2**20)), min(v.dtype.max, 2**20)
            out.append(rng.integers(lo, hi, size=v.shape, endpoint=True).astype(v.dtype.numpy))
        else:
            out.append((rng.standard_normal(v.shape) * 2).astype(v.dtype.numpy))
    return out


def assert_same_outputs(before: Graph, after: Graph, trials: int = 3) -> None:
    """Both graphs give bit-identical outputs (same dtypes, same bits) on ``trials`` random inputs."""
    for seed in range(trials):
        inputs = random_inputs(before, seed)
        expected, got = run_graph(before, inputs), run_graph(after, inputs)
        assert len(expected) == len(got)
        for i, (e, g) in enumerate(zip(expected, got)):
            assert e.dtype == g.dtype and e.shape == g.shape, f"output {i}: {g.dtype}{g.shape} vs {e.dtype}{e.shape}"
            same_bits = np.ascontiguousarray(e).tobytes() == np.ascontiguousarray(g).tobytes()
            assert same_bits, f"output {i} differs (seed {seed})"


def assert_graph_text(graph: Graph, expected: str, show_types: bool = False) -> None:
    """``print_graph(graph)`` equals ``expected`` (dedented, surrounding blank lines ignored)."""
    got = print_graph(graph, show_types=show_types).strip()
    want = textwrap.dedent(expected).strip()
    assert got == want, f"graph differs from the expected text.\n--- got\n{got}\n--- expected\n{want}"
