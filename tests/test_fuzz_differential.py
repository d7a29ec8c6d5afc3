"""Differential fuzzing: random small quantized graphs (tests/fuzzing/random_graphs.py) run on
every backend target and compared with the reference interpreter (qlower.testing.differential:
integer outputs bit-exact, dynamic-quantization float outputs within 1e-5 relative, float
ops within a documented tolerance).

Budget: ``QLOWER_FUZZ_EXAMPLES`` examples per target when set (``make fuzz`` sets 2000),
else the small per-target default below, so the file stays well under a minute on 2 cores.
Examples are derandomized (the same every run) unless ``make fuzz`` runs them with a printed
seed (tests/conftest.py). A failing example is
shrunk by hypothesis and saved to tests/regressions/ (or ``QLOWER_FUZZ_SAVE_DIR``) as
``<hash>.qlp`` + ``<hash>.npz``, which tests/test_fuzz_regressions.py replays on every
target. Known, not yet fixed backend bugs (tests/regressions/known_issues.json) reject
their examples instead of failing the run; their saved cases are strict xfails.

The last test breaks the TOSA lowering of ``rescale`` on purpose and checks that the same
fuzzer finds the mismatch: the differential check can fail.
"""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from random_graphs import FuzzCase, cases
from rewrite_patterns import pattern_cases

from qlower.backends.tosa.lowering import LOWERINGS
from qlower.ir import Op
from qlower.reference import run_graph
from qlower.testing.differential import (
    APPROXIMATE_OPS,
    DifferentialMismatch,
    available_targets,
    check_against_reference,
    fuzz_check,
    load_known_issues,
)

pytestmark = pytest.mark.fuzz

REGRESSIONS = Path(__file__).parent / "regressions"
SAVE_DIR = Path(os.environ.get("QLOWER_FUZZ_SAVE_DIR", REGRESSIONS))
KNOWN = load_known_issues(REGRESSIONS / "known_issues.json")
# CI's budget per target (each VGF example converts and runs on lavapipe: ~1.4 s)
DEFAULT_EXAMPLES = {"tosa-1.0+int": 25, "tosa-1.0+int+fp": 25, "cpu": 100, "ethos-u85-256": 20, "ethos-u55-128": 20,
                    "vgf+int": 10, "vgf": 10, "litert": 50}
EXAMPLES = int(os.environ.get("QLOWER_FUZZ_EXAMPLES", "0"))


def fuzz_settings(target: str) -> settings:
    return settings(max_examples=EXAMPLES or DEFAULT_EXAMPLES[target], deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("target", available_targets())
def test_backend_matches_reference_on_random_graphs(target):
    @fuzz_settings(target)
    @given(case=cases())
    def run(case: FuzzCase) -> None:
        fuzz_check(case.graph, list(case.inputs), target, SAVE_DIR, KNOWN)

    run()


# the targets whose backends rewrite the program, each on the patterns its rewrites take
# (tests/fuzzing/rewrite_patterns.py): the target exact with its own form, that form within the
# declared bounds of the original graph, op by op (see also tests/test_rewrite_declarations.py)
REWRITING = [(t, p) for t in ("litert", "ethos-u55-128", "ethos-u85-256") if t in available_targets()
             for p in (("residual_add", "fused_gemm") if t == "litert" else ("global_mean", "int16_table"))]


@pytest.mark.parametrize(("target", "pattern"), REWRITING)
def test_rewriting_targets_on_their_patterns(target, pattern):
    @settings(max_examples=EXAMPLES or 8, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=pattern_cases(pattern, max_layers=2))
    def run(case: FuzzCase) -> None:
        fuzz_check(case.graph, list(case.inputs), target, SAVE_DIR, KNOWN)

    run()


@settings(max_examples=max(EXAMPLES, 100), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_generated_graphs_keep_the_generator_promises(case: FuzzCase):
    """The reference runs every generated graph, every code stays within its type's [qmin, qmax],
    and no approximate float result is quantized back to static codes (tests/fuzzing/random_graphs.py)."""
    _, env = run_graph(case.graph, list(case.inputs), keep_all=True)
    approximate = set()
    for op in case.graph.ops:
        if op.kind in APPROXIMATE_OPS or op.kind == "dynamic_quantize" or approximate & set(op.input_values()):
            approximate.update(op.results)
    for v, a in env.items():
        if v.quant is not None:
            assert v.quant.qmin <= a.min() and a.max() <= v.quant.qmax, f"%{v.name} leaves its type's range"
            assert v not in approximate or v.quant.dynamic, f"%{v.name} has codes of an inexact float result"


def test_every_target_of_the_fuzzer_is_available():
    """TOSA, CPU, Ethos-U, VGF and LiteRT are installed here: a missing one must not silently shrink the fuzzing."""
    assert available_targets() == ["tosa-1.0+int", "tosa-1.0+int+fp", "cpu", "ethos-u85-256", "ethos-u55-128",
                                   "vgf+int", "vgf", "litert"]


def _flip_rescale_rounding(lower):
    """The TOSA lowering of ``rescale`` with the other rounding mode (a deliberate bug)."""
    def broken(lw, op: Op):
        other = "double" if op.attrs["rounding"] == "single" else "single"
        return lower(lw, Op(op.kind, op.operands, {**op.attrs, "rounding": other}, op.results))
    return broken


def test_fuzzer_finds_a_deliberately_broken_rescale_lowering(monkeypatch):
    monkeypatch.setitem(LOWERINGS, "rescale", _flip_rescale_rounding(LOWERINGS["rescale"]))
    found: list[FuzzCase] = []

    @settings(max_examples=150, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=cases())
    def run(case: FuzzCase) -> None:
        try:
            fuzz_check(case.graph, list(case.inputs), "tosa-1.0+int", None, KNOWN)
        except DifferentialMismatch:
            found.append(case)
            raise

    with pytest.raises(DifferentialMismatch, match="differs from the reference interpreter"):
        run()
    # The mismatch is the patch's doing: with the real lowering the same case is bit-exact.
    case = found[-1]
    monkeypatch.undo()
    assert any(op.kind == "rescale" for op in case.graph.ops)
    check_against_reference(case.graph, list(case.inputs), "tosa-1.0+int")
