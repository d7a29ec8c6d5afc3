"""Saved counter-examples of the differential fuzzer, replayed on every backend target.

Each ``tests/regressions/<hash>.qlp`` (the graph, as a program file) with its
``<hash>.npz`` (the inputs) was written by ``save_counterexample`` when
tests/test_fuzz_differential.py found a mismatch (or reduced by hand from such a case).
Every case must now match the reference interpreter on every available target, except
the (case, target) pairs of tests/regressions/known_issues.json: bugs not fixed yet, run
as strict xfails so that the fix is noticed.
"""

from pathlib import Path

import numpy as np
import pytest

from qlower.ir import print_graph
from qlower.reference import run_graph
from qlower.testing.differential import (
    DifferentialMismatch,
    available_targets,
    check_target,
    load_counterexample,
    load_known_issues,
    save_counterexample,
)

pytestmark = pytest.mark.fuzz

REGRESSIONS = Path(__file__).parent / "regressions"
CASES = sorted(REGRESSIONS.glob("*.qlp"))
KNOWN = load_known_issues(REGRESSIONS / "known_issues.json")


@pytest.mark.parametrize("target", available_targets())
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_saved_counterexample_matches_reference(path, target, request):
    graph, inputs, meta = load_counterexample(path)
    assert meta["target"] and meta["failure"]  # what it failed on when it was saved
    for issue in KNOWN:
        if issue.target == target and path.stem in issue.cases:
            request.applymarker(pytest.mark.xfail(raises=DifferentialMismatch, strict=True, reason=issue.what))
    check_target(graph, inputs, target)


def test_regressions_directory_is_consistent():
    """Every case has its inputs, and every known issue names saved cases."""
    assert CASES
    for p in CASES:
        assert p.with_suffix(".npz").exists(), p
    stems = {p.stem for p in CASES}
    for issue in KNOWN:
        assert set(issue.cases) <= stems, issue


def test_a_saved_counterexample_loads_back_identical(tmp_path):
    graph, inputs, _ = load_counterexample(CASES[0])
    path = save_counterexample(graph, inputs, "cpu", "a message", tmp_path)
    again, inputs2, meta = load_counterexample(path)
    assert print_graph(again) == print_graph(graph)
    assert meta == {"target": "cpu", "failure": "a message"}
    for a, b in zip(inputs, inputs2, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    for a, b in zip(run_graph(graph, inputs), run_graph(again, inputs2), strict=True):
        assert a.tobytes() == b.tobytes()
    # same graph and inputs: same file name; other inputs: another one
    assert save_counterexample(graph, inputs, "cpu", "again", tmp_path) == path
    other = [x.copy() for x in inputs]
    other[0].flat[0] = 1 if other[0].flat[0] != 1 else 2
    assert save_counterexample(graph, other, "cpu", "other", tmp_path) != path
