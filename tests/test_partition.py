"""Partitioner: grouping without cycles, explicit boundary conversions, host reasons."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from seeds import blocks, suite_seeds

from qlower.contract import Backend, Payload, Verdict
from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.partition import partition
from qlower.reference import run_graph
from qlower.runtime.runner import Runner

Q = QuantSpec.per_tensor(0.05, 3)
I8 = TensorType((1, 4, 4, 8), DType.INT8, Q)


class BoxBackend(Backend):
    """A test backend: takes the op kinds it is given, runs subgraphs on the reference interpreter.

    ``float_io`` makes it declare float32 boundaries (as a backend that reads
    floats would), so the partitioner must insert explicit conversions.
    """

    name = "box"
    targets = ("box",)

    def __init__(self, kinds: set[str], float_io: bool = False, wrong_output_dtype: bool = False):
        self.kinds, self.float_io, self.wrong_output_dtype = kinds, float_io, wrong_output_dtype
        self.lowered = []

    def supports(self, op, target):
        return Verdict.yes() if op.kind in self.kinds else Verdict.no(f"box does not take {op.kind}")

    def lower(self, subgraph, target, trace=False):
        self.lowered.append(subgraph)
        ins = tuple(v.type for v in subgraph.inputs)
        outs = tuple(v.type for v in subgraph.outputs)
        if self.float_io:
            ins = tuple(TensorType(t.shape, DType.FLOAT32) for t in ins)
            outs = tuple(TensorType(t.shape, DType.FLOAT32) for t in outs)
        return Payload("box", target, {}, ins, outs, meta={"subgraph": subgraph})

    def check_loaded(self, subgraph, payload):
        return "box payloads are never saved"

    def execute_traced(self, payload, inputs, tensors):
        return {}   # a box: nothing inside to show

    def execute(self, payload, inputs):
        sub = payload.meta["subgraph"]
        args = []
        for v, x in zip(sub.inputs, inputs):
            if self.float_io:  # the box reads floats: quantize them itself
                q = v.quant
                x = np.clip(np.rint(x / q.scale[0]) + q.zero_point[0], q.qmin, q.qmax).astype(np.int8)
            args.append(x)
        outs = run_graph(sub, args)
        if self.float_io:
            outs = [((o.astype(np.float32) - v.quant.zero_point[0]) * np.float32(v.quant.scale[0])).astype(np.float32)
                    for o, v in zip(outs, sub.outputs)]
        if self.wrong_output_dtype:
            outs = [o.view(np.uint8) for o in outs]
        return outs


def _chain_graph():
    """x → rescale a → [table b: host] → rescale c, and c also reads a: a naive grouping {a, c} would cycle."""
    b = GraphBuilder()
    x = b.input("x", I8)
    a = b.op("rescale", x, out=QuantSpec.per_tensor(0.1, 0), name="a")
    t = b.op("table", a, table=np.arange(-128, 128, dtype=np.int8)[::-1].copy(), offset=128,
             out=QuantSpec.per_tensor(0.1, 0), name="t")
    c = b.op("concat", (a, t), axis=3, name="c")
    d = b.op("rescale", c, out=QuantSpec.per_tensor(0.2, -5), name="d")
    return verify_graph(b.build([d]))


def _inputs(seed=0):
    return [np.random.default_rng(seed).integers(-128, 128, I8.shape).astype(np.int8)]


def test_no_cycle_through_the_host_and_bit_exact():
    g = _chain_graph()
    backend = BoxBackend({"rescale", "concat"})
    result = partition(g, backend, "box")
    verify_graph(result.host)
    # a is in one partition; c and d can't join it (they depend on a through the host's table)
    assert len(result.partitions) == 2
    assert [p.values for p in result.partitions] == [("a",), ("c", "d")]
    assert [d.op.kind for d in result.decisions] == ["table"]
    assert "box does not take table" in result.decisions[0].reason
    runner = Runner(result.host, result.partitions, {"box": backend})
    for seed in range(3):
        np.testing.assert_array_equal(runner.run(_inputs(seed))[0], run_graph(g, _inputs(seed))[0])


def test_float_boundaries_get_explicit_conversions():
    g = _chain_graph()
    backend = BoxBackend({"rescale", "concat"}, float_io=True)
    result = partition(g, backend, "box")
    kinds = [op.kind for op in result.host.ops]
    # each partition input is dequantized on the host and each output quantized back
    assert kinds.count("dequantize") == 3 and kinds.count("quantize") == 2
    for op in result.host.ops:
        if op.kind == "delegate":
            assert all(t.dtype is DType.FLOAT32 for t in op.attrs["in_types"] + op.attrs["out_types"])
    runner = Runner(result.host, result.partitions, {"box": backend})
    np.testing.assert_array_equal(runner.run(_inputs())[0], run_graph(g, _inputs())[0])


def test_a_backend_writing_other_than_its_declared_type_is_an_error():
    g = _chain_graph()
    backend = BoxBackend({"rescale", "concat"}, wrong_output_dtype=True)
    result = partition(g, backend, "box")
    runner = Runner(result.host, result.partitions, {"box": backend})
    with pytest.raises(ExecutionError, match=r"uint8\[1, 4, 4, 8\], expected int8"):
        runner.run(_inputs())
    with pytest.raises(ExecutionError, match=r"uint8\[1, 4, 4, 8\], expected int8"):
        runner.run_traced(_inputs())  # the same plan, traced


def test_constants_are_copied_into_each_partition_that_reads_them():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4, 4, 8), DType.INT32, QuantSpec.per_tensor(0.01, 0, DType.INT32)))
    k = b.constant(np.full((1, 1, 1, 8), 7, np.int32), QuantSpec.per_tensor(0.01, 0, DType.INT32), name="k")
    y = b.op("add", x, k, name="y")
    z = b.op("rescale", y, out=Q, name="z")
    w = b.op("table", z, table=np.arange(-128, 128, dtype=np.int8), offset=128, out=Q, name="w")
    r = b.op("rescale", w, out=QuantSpec.per_tensor(0.01, 0, DType.INT32), name="r")
    s = b.op("sub", r, k, name="s")
    g = verify_graph(b.build([s]))
    backend = BoxBackend({"add", "sub", "rescale"})
    result = partition(g, backend, "box")
    assert len(result.partitions) == 2
    for p in result.partitions:
        assert [op.kind for op in p.subgraph.ops].count("constant") == 1
    assert not any(op.kind == "constant" for op in result.host.ops)
    xs = np.random.default_rng(1).integers(-1000, 1000, (1, 4, 4, 8)).astype(np.int32)
    np.testing.assert_array_equal(Runner(result.host, result.partitions, {"box": backend}).run([xs])[0],
                                  run_graph(g, [xs])[0])


def test_everything_supported_is_one_partition_and_nothing_on_the_host():
    g = _chain_graph()
    backend = BoxBackend({"rescale", "concat", "table"})
    result = partition(g, backend, "box")
    assert len(result.partitions) == 1 and not result.decisions
    assert [op.kind for op in result.host.ops] == ["delegate"]


def test_a_model_folded_to_a_constant_is_emitted_by_the_backend():
    b = GraphBuilder()
    codes = np.array([[-102, -51, 0, 51, 102]], np.int8)
    k = b.constant(codes, QuantSpec.per_tensor(1 / 127, 0, qmin=-127, qmax=127), name="k")
    out = b.op("dequantize", k, None, name="out")
    g = verify_graph(b.build([out]))
    backend = BoxBackend({"constant"})
    result = partition(g, backend, "box")
    assert len(result.partitions) == 1
    assert [op.kind for op in result.partitions[0].subgraph.ops] == ["constant"]
    assert [op.kind for op in result.host.ops] == ["delegate", "dequantize"]
    got = Runner(result.host, result.partitions, {"box": backend}).run([])[0]
    np.testing.assert_array_equal(got, run_graph(g, [])[0])
    # a backend that doesn't take the constant leaves the model on the host
    assert not partition(g, BoxBackend(set()), "box").partitions


def test_progress_bar_counts_every_op_then_every_partition(capsys, monkeypatch):
    g = _chain_graph()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)   # bars show on terminals only
    partition(g, BoxBackend({"rescale", "concat"}), "box")
    assert capsys.readouterr().err == ""  # quiet unless asked
    partition(g, BoxBackend({"rescale", "concat"}), "box", progress=True)
    steps = capsys.readouterr().err.split("\r")
    total = len(g.ops) + 2  # a verdict per op, then the two partitions
    assert any("box: lowering p1" in s for s in steps)
    assert "box: lowered: 100%" in steps[-1] and f" {total}/{total} " in steps[-1]


def test_ops_reading_only_host_values_share_one_partition():
    """Three rescales of the same host value (q, k, v projections in attention) and their concat:
    one partition, not one per rescale joined by delegate calls."""
    b = GraphBuilder()
    x = b.op("table", b.input("x", I8), table=np.arange(-128, 128, dtype=np.int8), offset=128, out=Q, name="host")
    qkv = [b.op("rescale", x, out=QuantSpec.per_tensor(0.1, -3), rounding=r, name=f"r{i}")
           for i, r in enumerate(("single", "double", "single"))]
    g = verify_graph(b.build([b.op("concat", tuple(qkv), axis=3, name="cat")]))
    backend = BoxBackend({"rescale", "concat"})
    result = partition(g, backend, "box")
    assert [p.values for p in result.partitions] == [("r0", "r1", "r2", "cat")]
    runner = Runner(result.host, result.partitions, {"box": backend})
    np.testing.assert_array_equal(runner.run(_inputs())[0], run_graph(g, _inputs())[0])


def _random_dag(seed: int):
    """Rescales and concats (the box takes them) between host tables, each reading values drawn
    from anywhere earlier: partitions meet through the host in every order."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    values = [b.input("x", I8)]
    for i in range(int(rng.integers(4, 14))):
        x = values[int(rng.integers(len(values)))]
        kind = rng.choice(["rescale", "table", "concat"], p=[0.45, 0.3, 0.25])
        if kind == "rescale":
            values.append(b.op("rescale", x, out=QuantSpec.per_tensor(0.05, int(rng.integers(-5, 5))), name=f"r{i}"))
        elif kind == "table":
            values.append(b.op("table", x, table=rng.integers(-128, 128, 256).astype(np.int8), offset=128,
                               out=Q, name=f"t{i}"))
        else:
            y = values[int(rng.integers(len(values)))]
            if y.type != x.type:
                y = b.op("rescale", y, out=x.type.quant, name=f"rc{i}")
            both = b.op("concat", (x, y), axis=3, name=f"c{i}")
            k = int(rng.integers(0, 9))
            values.append(b.op("slice", both, start=(0, 0, 0, k), stop=(1, 4, 4, k + 8), name=f"s{i}"))
    outs = values[-1:] + [values[int(rng.integers(1, len(values)))]]
    return verify_graph(b.build(outs))


@pytest.mark.fuzz
@pytest.mark.parametrize("block", blocks(suite_seeds(120, "partition-dag"), 40))
def test_random_graphs_partition_without_cycles_and_run_exactly(block):
    """Found by the s2 scenario on litert: an op joining an older partition made it wait for a
    partition that already waited for it through the host ('a cycle between host and partitions')."""
    for seed in block:
        g = _random_dag(seed)
        backend = BoxBackend({"rescale", "concat", "slice"})
        result = partition(g, backend, "box")
        verify_graph(result.host)
        runner = Runner(result.host, result.partitions, {"box": backend})
        for got, want in zip(runner.run(_inputs(seed)), run_graph(g, _inputs(seed))):
            np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}")


@pytest.mark.parametrize("target", ["litert", "tflm"])
def test_scenario_s2_partitions_on_the_tflite_targets(target):
    """S2's dynamic branches left host ops between partitions that the greedy grouping joined into a
    cycle on litert and tflm; the program must compile and compute the reference program's numbers."""
    import qlower
    from qlower import zoo

    model, example, quant, calibration = zoo.get("s2_perchannel_binary")
    kwargs = dict(quant=quant, calibration=calibration, progress=False)
    got = qlower.compile(model, example, target=target, **kwargs).run(*example)
    want = qlower.compile(model, example, target="reference", **kwargs).run(*example)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()))
