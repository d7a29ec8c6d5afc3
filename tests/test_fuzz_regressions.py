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

import qlower.backends.ethosu.backend as ethosu_backend
from qlower.api import lower_graph
from qlower.backends.ethosu import EthosUBackend
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, print_graph, verify_graph
from qlower.reference import run_graph
from qlower.testing.differential import (
    DifferentialMismatch,
    available_targets,
    check_against_reference,
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
    check_against_reference(graph, inputs, target)


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


# -- issue 14: partition outputs that Vela dropped or laid over another output ------------------

ETHOS_U = ("ethos-u85-256", "ethos-u55-128")
Q = QuantSpec.per_tensor(0.05, 3)


def issue14_graph():
    """The fuzzer's counter-example (saved as 3d386392c4caf2cc): a strided slice that is a partition
    output and is also read by a transpose. Vela folded the slice's trailing RESHAPE into the
    TRANSPOSE and the output had no buffer: "Vela reports 1 outputs, the TOSA graph has 2"."""
    b = GraphBuilder("main")
    x = b.input("x", TensorType((1, 1, 3, 2), DType.FLOAT32))
    c = b.op("clamp", b.op("quantize", x, out=Q, name="q"), min=-100, max=100, name="c")
    p = b.op("pad", c, pads=(0, 0, 1, 1, 0, 1, 0, 0), value=3, name="p")
    s = b.op("slice", p, start=(0, 0, 0, 0), stop=p.type.shape, step=(1, 2, 2, 1), name="s")
    t = b.op("transpose", s, perm=(0, 3, 1, 2), name="t")
    r = b.op("reshape", t, shape=(1, t.type.numel), name="r")
    return verify_graph(b.build([b.op("dequantize", r, None, name="d"), s]))


def _output_buffers(payload) -> list[tuple[int, int, int]]:
    return [(io["region"], io["offset"], io["offset"] + io["size"]) for io in payload.meta["io"]
            if io["kind"] == "output"]


def assert_own_buffers(payload, n_outputs: int) -> None:
    """Vela's command stream writes every output of the partition to bytes of its own."""
    spans = _output_buffers(payload)
    assert len(spans) == n_outputs
    for i, (ra, a0, a1) in enumerate(spans):
        for rb, b0, b1 in spans[i + 1:]:
            assert ra != rb or a1 <= b0 or b1 <= a0, f"outputs share bytes: {spans}"


def test_issue14_counterexample_is_the_saved_case():
    graph, _, meta = load_counterexample(REGRESSIONS / "3d386392c4caf2cc.qlp")
    assert print_graph(graph) == print_graph(issue14_graph())
    assert "Vela reports 1 outputs, the TOSA graph has 2" in meta["failure"]


@pytest.mark.parametrize("target", ETHOS_U)
def test_issue14_counterexample_is_bit_exact_with_a_buffer_per_output(target):
    g = issue14_graph()
    prog = lower_graph(g, target)
    assert [len(p.subgraph.ops) for p in prog.partitions] == [5]   # clamp .. reshape on the NPU
    assert_own_buffers(prog.partitions[0].payload, 2)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 1, 3, 2)).astype(np.float32)
        for got, want in zip(prog.run(x), run_graph(g, [x]), strict=True):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def _movement(b: GraphBuilder, v, kind: str):
    """One data-movement op of ``kind`` on ``v`` (shapes chosen so that each pattern below is one
    Vela mishandled without the copies: measured over all chains of up to three such ops)."""
    rank, shape = v.type.rank, v.type.shape
    if kind == "reshape":
        return b.op("reshape", v, shape=(1, v.type.numel) if rank != 2 else (1, 1, 1, v.type.numel))
    if kind == "transpose":
        return b.op("transpose", v, perm=(0, 3, 1, 2) if rank == 4 else tuple(reversed(range(rank))))
    if kind == "slice":  # one row less along axis 1, or (for [n, 1]) the whole tensor: a no-op slice
        stop = tuple(d - 1 if i == 1 and d > 1 else d for i, d in enumerate(shape))
        return b.op("slice", v, start=(0,) * rank, stop=stop)
    if kind == "strided":
        step = tuple(2 if i and d > 1 else 1 for i, d in enumerate(shape))
        return b.op("slice", v, start=(0,) * rank, stop=shape, step=step)
    raise ValueError(kind)


# chains whose every link is a partition output; without the copies Vela 5.2 drops one output
# (transposes) or gives two the same bytes (no-op slices), on U55 and U85 alike
CHAINS = [("transpose", "transpose"), ("transpose", "strided", "transpose"), ("reshape", "transpose", "slice"),
          ("slice", "strided", "slice"), ("strided", "strided", "strided")]


def chain_graph(kinds: tuple[str, ...]):
    b = GraphBuilder("chain")
    x = b.input("x", TensorType((1, 3, 4, 2), DType.INT8, Q))
    v = b.op("rescale", x, out=QuantSpec.per_tensor(0.07, 1))
    links = []
    for kind in kinds:
        v = _movement(b, v, kind)
        links.append(v)
    return verify_graph(b.build(links))


def _check_partition(g, target: str):
    """``g`` as one Ethos-U partition: a buffer per output, simulated run bit-exact; the payload."""
    be = EthosUBackend()
    payload = be.lower(g, target)
    assert_own_buffers(payload, len(g.outputs))
    x = np.random.default_rng(0).integers(-128, 128, g.inputs[0].shape).astype(np.int8)
    for got, want in zip(be.execute(payload, [x]), run_graph(g, [x]), strict=True):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    return payload


@pytest.mark.parametrize("target", ETHOS_U)
@pytest.mark.parametrize("kinds", CHAINS, ids="-".join)
def test_every_output_of_a_movement_chain_has_its_own_buffer(kinds, target):
    _check_partition(chain_graph(kinds), target)


@pytest.mark.parametrize("target", ETHOS_U)
@pytest.mark.parametrize("kinds", CHAINS, ids="-".join)
def test_outputs_the_copy_rules_miss_are_caught_in_vela_s_result(kinds, target, monkeypatch):
    """The class, not the known patterns: with the movement rule of ``aliased_outputs`` switched
    off, ``lower`` sees the dropped or shared output in Vela's result and copies every output."""
    monkeypatch.setattr(ethosu_backend, "MOVEMENT_KINDS", frozenset())
    payload = _check_partition(chain_graph(kinds), target)
    # compiled a second time, every output copied (the first result dropped one or shared bytes)
    assert all(io["value"].endswith("_copy") for io in payload.meta["io"] if io["kind"] == "output")


def test_a_partition_vela_cannot_give_own_buffers_is_a_compile_error(monkeypatch):
    """When even copying every output leaves one without a buffer, lowering fails (it never
    returns a program whose NPU outputs are missing or overwritten)."""
    monkeypatch.setattr(ethosu_backend, "materialize_aliased_outputs", lambda g, every=False: g)
    with pytest.raises(ethosu_backend.CompileError, match="no buffer of their own"):
        EthosUBackend().lower(chain_graph(("transpose", "transpose")), "ethos-u85-256")


def test_the_vela_crash_case_stays_off_the_npu_on_u55_and_u65():
    """tests/regressions/ed96618fcf3cb1ce: Vela 5.2 segfaults on a batched grouped convolution with
    its requantization for U55/U65; the conv stays on the host there and goes to the NPU on U85."""
    graph, _, meta = load_counterexample(REGRESSIONS / "ed96618fcf3cb1ce.qlp")
    assert "segmentation fault" in meta["failure"]
    for target, on_npu in (("ethos-u55-128", False), ("ethos-u65-256", False), ("ethos-u85-256", True)):
        prog = lower_graph(graph, target)
        kinds = {op.kind for p in prog.partitions for op in p.subgraph.ops}
        assert ("conv2d" in kinds) == on_npu, target


def test_a_vela_segfault_is_a_compile_error_and_the_process_lives_on():
    """The same graph handed to Vela for U55 without the guard: Vela segfaults in its worker process,
    the caller gets a CompileError naming the signal, and the next compile works (a fresh worker)."""
    from qlower.backends.ethosu.backend import _lower_unvalidated
    from qlower.backends.ethosu.vela import compile_tosa, vela_config
    from qlower.errors import CompileError

    graph, _, _ = load_counterexample(REGRESSIONS / "ed96618fcf3cb1ce.qlp")
    tosa, _ = _lower_unvalidated(graph)
    with pytest.raises(CompileError, match="Vela crashed .* killed by SIGSEGV; the calling process is unaffected"):
        compile_tosa(tosa, vela_config("ethos-u55-128"))
    assert compile_tosa(tosa, vela_config("ethos-u85-256")).perf["total_cycles"] > 0
