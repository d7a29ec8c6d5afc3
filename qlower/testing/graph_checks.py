"""Checks for graph-rewriting tests: structural (printed text, or exact texts parsed and compared
up to names and order: ``assert_rewrites``) and numeric (bit-identical runs).

A pass test states the graph it expects as a short hand-written text and
compares it with ``print_graph``; it then runs the graph before and after the
pass on random inputs with the reference interpreter, whose outputs must be
bit-identical.
"""

from __future__ import annotations

import textwrap

import numpy as np

from qlower.ir import Graph, print_graph, verify_graph
from qlower.ir.compare import graph_difference
from qlower.ir.parser import parse_graph
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


def assert_structure(graph: Graph, expected: str) -> None:
    """``graph`` is the computation the exact text ``expected`` describes (``qlower.ir.parser``),
    up to value names and op order (``qlower.ir.compare``)."""
    want = verify_graph(parse_graph(textwrap.dedent(expected)))
    problem = graph_difference(graph, want)
    assert problem is None, (f"graph differs from the expected text: {problem}\n--- got\n"
                             f"{print_graph(graph, exact=True)}\n--- expected\n{print_graph(want, exact=True)}")


def assert_rewrites(run, before: str, after: str) -> Graph:
    """A before/after test of a pass as two texts: ``run`` (Graph -> Graph) takes the graph
    ``before`` describes to the one ``after`` describes, with bit-identical outputs; returns it."""
    graph = verify_graph(parse_graph(textwrap.dedent(before)))
    result = run(graph)
    assert_structure(result, after)
    assert_same_outputs(graph, result)
    return result
