"""Every backend rewrite meets its declaration on random graphs (DESIGN.md rule 10).

Each property test draws random graphs holding the rewrite's pattern (tests/fuzzing/
rewrite_patterns.py, or the differential fuzzer's graphs) and inputs, applies the rewrite (the
cost-driven choices forced on: every candidate is rewritten where the rewrite may apply), and
checks its declaration with the reference interpreter (``qlower.reference.forms``): every value
the two graphs share, computed op by op from the original graph's codes, is exact, or within
the declared steps where the rewrite names it; outputs of an exact rewrite are exact end to end.
Each test also counts where the rewrite applied (it must apply somewhere, or the test proves
nothing) and, where the rewrite has an applicability proof, where it rightly refused.

Budget: ``QLOWER_FUZZ_EXAMPLES`` examples when set (``make fuzz``), else the small default below.
The last tests break rewrites on purpose: a rewrite beyond its declaration is caught by the same
check, by ``lower_graph`` (the IR verifier), by verification (``report.ok``) and by the
differential fuzzer.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from random_graphs import FuzzCase, cases
from rewrite_patterns import pattern_cases

from qlower.backends.ethosu import means, tables
from qlower.backends.ethosu.backend import OutputCopies
from qlower.backends.ethosu.channels import ChannelWidening, runs
from qlower.backends.global_means import global_means
from qlower.backends.litert.fused_add import TfliteAdd
from qlower.backends.litert.rounding import KERNEL_ROUNDING, KernelRounding
from qlower.backends.litert.xnnpack_add import XnnpackAdd
from qlower.errors import VerificationError
from qlower.ir import DType, Graph, GraphBuilder, QuantSpec, TensorType, rebuild
from qlower.ir.rewrite import Rewrite, Rewritten, apply_rewrite, apply_rewrites
from qlower.reference import run_graph
from qlower.reference.forms import form_steps, output_steps

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("QLOWER_FUZZ_EXAMPLES", "0"))
COUNTS: dict[str, list[int]] = {}   # rewrite -> [graphs checked, graphs where it applied]


def fuzz_settings(default: int) -> settings:
    return settings(max_examples=EXAMPLES or default, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def check_declaration(rewrite: Rewrite, case: FuzzCase) -> Rewritten:
    """Apply ``rewrite`` (verified) to the case's graph and assert its declaration on its inputs."""
    out = apply_rewrite(rewrite, case.graph)
    count = COUNTS.setdefault(rewrite.name, [0, 0])
    count[0] += 1
    if out.graph is case.graph:
        return out
    count[1] += 1
    inputs = list(case.inputs)
    bounds = {name: (rewrite.steps, (rewrite.name,)) for name in out.values}
    bad = [r for r in form_steps(case.graph, out.graph, inputs, bounds) if not r.within]
    assert not bad, f"{rewrite.name} ({rewrite.bound}) broke its declaration: {bad[:5]}"
    if rewrite.steps == 0:
        steps = output_steps(case.graph, out.graph, run_graph(case.graph, inputs), run_graph(out.graph, inputs))
        assert max(steps, default=0) == 0, f"{rewrite.name} is declared exact, its outputs moved {steps}"
    return out


def _report(name: str) -> None:
    checked, applied = COUNTS.get(name, [0, 0])
    print(f"\n{name}: declaration held on {applied} rewritten random graphs ({checked} drawn)")
    assert applied > 0, f"{name} never applied: the property test checks nothing"


@pytest.mark.parametrize("rewrite", [TfliteAdd(), XnnpackAdd()], ids=lambda r: r.name)
def test_litert_add_forms(rewrite):
    @fuzz_settings(40)
    @given(case=pattern_cases("residual_add"))
    def run(case):
        check_declaration(rewrite, case)

    run()
    _report(rewrite.name)


@pytest.mark.parametrize("kernels", sorted(KERNEL_ROUNDING))
def test_litert_kernel_rounding(kernels):
    @fuzz_settings(40)
    @given(case=pattern_cases("fused_gemm"))
    def run(case):
        check_declaration(KernelRounding(kernels), case)

    before = COUNTS.get(KernelRounding.name, [0, 0])[1]
    run()
    _report(KernelRounding.name)
    assert COUNTS[KernelRounding.name][1] > before


def test_tflm_kernel_rounding():
    from qlower.backends.tflm.rounding import TflmKernelRounding

    @fuzz_settings(40)
    @given(case=pattern_cases("fused_gemm"))
    def run(case):
        check_declaration(TflmKernelRounding(), case)

    run()
    _report(TflmKernelRounding.name)


@pytest.mark.parametrize("kernel", ["tflm", "xnnpack"])
def test_kernel_means(kernel):
    """Every global mean TFLM's (XNNPACK's) MEAN can stand for becomes its sum-and-table form, within a step."""
    from qlower.backends.litert.xnnpack_mean import XnnpackMean
    from qlower.backends.tflm.mean import TflmMean

    rewrite = TflmMean() if kernel == "tflm" else XnnpackMean()

    @fuzz_settings(15)
    @given(case=pattern_cases("global_mean"))
    def run(case):
        check_declaration(rewrite, case)

    run()
    _report(rewrite.name)


def test_ethosu_mean_form():
    """Every global mean the proof admits becomes the sum form; those it refuses keep the pool."""
    refused = [0]

    @fuzz_settings(60)
    @given(case=pattern_cases("global_mean"))
    def run(case):
        found = global_means(case.graph)
        refused[0] += sum(not means.within_a_step(m) for m in found)
        out = check_declaration(means.MeanForms(lambda m: True), case)
        assert set(out.values) == {m.final.result.name for m in found if means.within_a_step(m)}

    run()
    _report(means.MeanForms.name)
    assert refused[0] > 0, "no mean beyond the proof was drawn"


def test_ethosu_pool_limit():
    """Every global mean with a side beyond Vela's 256 that the proof admits becomes the sum form;
    narrower ones keep their pool (the cost-driven mean form decides those)."""
    @fuzz_settings(30)
    @given(case=pattern_cases("wide_global_mean", max_layers=2))
    def run(case):
        found = global_means(case.graph)
        out = check_declaration(means.PoolLimit(), case)
        assert set(out.values) == {m.final.result.name for m in found
                                   if means.within_a_step(m) and not means.fits_vela(m)}
        assert all(max(m.pool.attrs["kernel"]) <= means.MAX_POOL_SIDE for m in global_means(out.graph)
                   if means.within_a_step(m))

    run()
    _report(means.PoolLimit.name)


def test_ethosu_interpolated_table():
    """Every int16 table with a proven interpolation is rewritten; random tables are refused."""
    refused = [0]

    @fuzz_settings(30)
    @given(case=pattern_cases("int16_table", max_layers=2))
    def run(case):
        found = tables.candidates(case.graph)
        refused[0] += sum(tables.proven_form(op) is None for op in found)
        out = check_declaration(tables.InterpolatedTables(lambda op, form: True), case)
        assert set(out.values) == {op.result.name for op in found if tables.proven_form(op) is not None}

    run()
    _report(tables.InterpolatedTables.name)
    assert refused[0] > 0, "no table beyond the proof was drawn"


def test_ethosu_widen_channels():
    """Exact: every shared value keeps its codes, and a widened value's own channels are the
    original's (its extra channels hold the zero point)."""
    @fuzz_settings(40)
    @given(case=pattern_cases("conv_run"))
    def run(case):
        found = runs(case.graph)
        rng = np.random.default_rng(len(case.graph.ops))
        widths = {r.name: int(rng.integers(r.channels + 1, min(4 * r.channels, 2 * r.channels + 8) + 1)) for r in found}
        out = check_declaration(ChannelWidening(widths), case)
        if not widths:
            return
        _, before = run_graph(case.graph, list(case.inputs), keep_all=True)
        _, after = run_graph(out.graph, list(case.inputs), keep_all=True)
        named = {v.name: a for v, a in after.items()}
        for r in found:
            for v in r.values:
                wide = named[v.name]
                assert wide.shape[3] == widths[r.name]
                assert np.array_equal(wide[..., :r.channels], before[v])
                assert np.all(wide[..., r.channels:] == v.quant.zero_point[0])

    run()
    _report(ChannelWidening.name)


def test_ethosu_output_copies():
    @fuzz_settings(40)
    @given(case=cases())
    def run(case):
        check_declaration(OutputCopies(every=True), case)

    run()
    _report(OutputCopies.name)


# -- the checks can fail ---------------------------------------------------------------------

def _chain() -> tuple[Graph, list[np.ndarray]]:
    """int8 -> rescale to another int8 domain -> rescale back."""
    b = GraphBuilder("chain")
    x = b.input("x", TensorType((1, 4, 4, 8), DType.INT8, QuantSpec.per_tensor(0.05, 3)))
    y = b.op("rescale", x, out=QuantSpec.per_tensor(0.031, -7), name="y")
    z = b.op("rescale", y, out=QuantSpec.per_tensor(0.07, 1), name="z")
    g = b.build([z])
    return g, [np.random.default_rng(0).integers(-128, 128, (1, 4, 4, 8)).astype(np.int8)]


def _shifted(b: GraphBuilder, op, operands, shift: int):
    """``op`` (a rescale to int8) computed exactly, then its codes moved by ``shift`` (same type)."""
    q = op.attrs["out"]
    acc = QuantSpec.per_tensor(q.scale[0], 0, DType.INT32)
    codes = b.op("rescale", *operands, out=acc, rounding=op.attrs["rounding"])
    moved = b.op("add", codes, b.constant(np.full((1,) * op.result.type.rank, shift, np.int32), acc))
    return b.op("rescale", moved, out=q, name=op.result.name, origin=op.result.origin)


class ShiftedZeroPoint(Rewrite):
    """Wrong on purpose: moves %y's codes by ``shift`` while declaring ``steps``."""

    name = "test.shifted_zero_point"
    what = "a broken rewrite"

    def __init__(self, shift: int, steps: int, declare: bool = True):
        self.shift, self.steps, self.declare = shift, steps, declare

    def apply(self, graph: Graph) -> Rewritten:
        def rewrite(b, op, operands):
            if op.result.name != "y":
                return None
            return (_shifted(b, op, operands, self.shift),)
        return Rewritten(rebuild(graph, rewrite), ("y",) if self.declare else ())


def test_form_steps_catch_a_rewrite_beyond_its_declaration():
    g, inputs = _chain()
    case = FuzzCase(g, tuple(inputs))
    check_declaration(ShiftedZeroPoint(1, 1), case)   # within its declared step
    with pytest.raises(AssertionError, match="broke its declaration"):
        check_declaration(ShiftedZeroPoint(2, 1), case)
    with pytest.raises(AssertionError, match="broke its declaration"):
        check_declaration(ShiftedZeroPoint(1, 1, declare=False), case)   # an undeclared change
    # %z reads %y: forced to the original codes, it stays exact (the difference is %y's alone)
    rows = {r.name: r for r in form_steps(g, ShiftedZeroPoint(2, 2).apply(g).graph, inputs,
                                          {"y": (2, ("test",))})}
    assert rows["y"].steps == 2 and rows["z"].steps == 0


def test_the_mean_proof_is_needed(monkeypatch):
    """Without ``within_a_step`` a mean whose output is 2**11 times finer than its input would be
    rewritten many steps from the pool form: the property test above would fail."""
    b = GraphBuilder("mean")
    x = b.input("x", TensorType((1, 5, 7, 4), DType.INT8, QuantSpec.per_tensor(0.05, 0)))
    wide = b.op("rescale", x, out=QuantSpec.per_tensor(0.05 / 128, 0, DType.INT16))
    pooled = b.op("avg_pool2d", wide, kernel=(5, 7), stride=(5, 7))
    g = b.build([b.op("rescale", pooled, out=QuantSpec.per_tensor(0.05 / 2048, 0))])
    assert means.MeanForms(lambda m: True).apply(g).graph is g   # refused by the proof
    monkeypatch.setattr(means, "within_a_step", lambda m: True)
    rewritten = means.MeanForms(lambda m: True).apply(g)
    x = np.zeros((1, 5, 7, 4), np.int8)
    x[0, 0, :3, :] = 1   # channels 1-3: a mean of 2/35 codes, 117.03 output steps; the pool rounds the
    x[0, 0, 2, 1:] = 0   # widened average 256/35 to 7, 112 output steps (channel 0 clips either way)
    rows = form_steps(g, rewritten.graph, [x], {n: (1, ("mean",)) for n in rewritten.values})
    assert max(r.steps for r in rows) > 1


def test_lower_graph_verifies_each_rewrite_and_names_it():
    g, _ = _chain()

    class Invalid(Rewrite):
        name, steps, what = "test.invalid", 0, "returns a graph that reads a value nothing defines"

        def apply(self, graph):
            y = graph.producers()[graph.outputs[0]].operands[0]
            return Rewritten(Graph(graph.inputs, tuple(op for op in graph.ops if y not in op.results), graph.outputs))

    class Lies(Rewrite):
        name, steps, what = "test.lies", 1, "declares a value it removed"

        def apply(self, graph):
            return Rewritten(rebuild(graph, lambda b, op, operands: None), ("nowhere",))

    with pytest.raises(VerificationError, match="test.invalid"):
        apply_rewrites(g, [Invalid()])
    with pytest.raises(VerificationError, match="test.lies.*%nowhere"):
        apply_rewrites(g, [Lies()])


@pytest.fixture
def broken_litert(monkeypatch):
    """The LiteRT backend with a rewrite beyond its declaration appended (the fc's output moved 3
    codes, declared within 1)."""
    from qlower.backends.litert.backend import LiteRtBackend

    class Broken(Rewrite):
        name, steps, what = "test.broken", 1, "moves the last rescale 3 codes"

        def apply(self, graph):
            last = [op for op in graph.ops if op.kind == "rescale" and op.result.dtype is DType.INT8][-1]

            def rewrite(b, op, operands):
                return None if op is not last else (_shifted(b, op, operands, 3),)
            return Rewritten(rebuild(graph, rewrite), (last.result.name,))

    original = LiteRtBackend.rewrites
    monkeypatch.setattr(LiteRtBackend, "rewrites", lambda self, target: (*original(self, target), Broken()))


class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc((y + self.conv(x)).mean((2, 3)))


def test_verification_fails_a_form_beyond_its_declaration(broken_litert):
    import qlower

    report = qlower.verify(_Small().eval(), (torch.randn(1, 3, 8, 8),), target="litert", progress=False)
    assert all(r.target_vs_ref is None or r.target_vs_ref.max_steps == 0 for r in report.layers)
    assert not report.ok
    assert any("test.broken" in p and "3 steps from the canonical program" in p for p in report.problems)
    assert "test.broken" in report.to_json()


def test_the_differential_fuzzer_compares_with_the_original_graph(broken_litert):
    from qlower.testing.differential import DifferentialMismatch, check_against_reference

    g, inputs = _chain()
    with pytest.raises(DifferentialMismatch, match="declared 1 by test.broken"):
        check_against_reference(g, inputs, "litert")


def _conv_pair(w_zp: int = 0, clamp: tuple[int, int] | None = None, per_channel_one: bool = False) -> Graph:
    """conv -> rescale [-> clamp] -> conv -> rescale: one run of tensors between the convolutions."""
    b = GraphBuilder("pair")
    c = 1 if per_channel_one else 3
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, QuantSpec.per_tensor(0.05, 0)))
    rng = np.random.default_rng(3)
    wq = QuantSpec.per_channel((0.01,)) if per_channel_one else QuantSpec.per_tensor(0.01, w_zp)
    w = b.constant(rng.integers(-127, 128, (c, 1, 1, 2)).astype(np.int8), wq)
    bias = b.constant(rng.integers(-99, 99, (c,)).astype(np.int32), QuantSpec.per_tensor(0.0005, 0, DType.INT32))
    y = b.op("rescale", b.op("conv2d", x, w, bias), out=QuantSpec.per_tensor(0.02, 0))
    if clamp is not None:
        y = b.op("clamp", y, min=clamp[0], max=clamp[1])
    if per_channel_one:   # the reader too: one output channel, per-channel weights, a per-tensor bias
        w2 = b.constant(rng.integers(-127, 128, (1, 1, 1, c)).astype(np.int8), QuantSpec.per_channel((0.01,)))
        bias2 = b.constant(np.array([77], np.int32), QuantSpec.per_tensor(0.0002, 0, DType.INT32))
    else:
        w2 = b.constant(rng.integers(-127, 128, (2, 1, 1, c)).astype(np.int8), QuantSpec.per_tensor(0.01, 0))
        bias2 = None
    return b.build([b.op("rescale", b.op("conv2d", y, w2, bias2), out=QuantSpec.per_tensor(0.03, 0))])


def test_widening_refuses_what_it_cannot_keep_exact():
    """Found by the property test: a weight zero point (a padded zero code is not 0.0) and a clamp
    that leaves out the zero point (the extra channels would not hold 0.0) end no run; convolutions
    whose one channel is per-channel quantized, their biases per tensor, widen exactly (the writer's
    bias becomes per channel with its channels, the reader's stays as it is)."""
    assert len(runs(_conv_pair())) == 1
    assert runs(_conv_pair(w_zp=3)) == [] and runs(_conv_pair(clamp=(2, 100))) == []
    g = _conv_pair(per_channel_one=True)
    [run] = runs(g)
    x = np.random.default_rng(4).integers(-128, 128, (1, 4, 4, 2)).astype(np.int8)
    check_declaration(ChannelWidening({run.name: 4}), FuzzCase(g, (x,)))
