"""Random small int8 graphs through the Ethos-U backend: Vela compiles every partition,
every boundary type has Vela's element size, and the simulated program is bit-exact
with the reference interpreter.

Graphs interleave NPU ops (convs, depthwise convs, rescales, clamps, int8 adds spelled
the TOSA way, pools, inner transposes, concats, lookups) with ops that stay on the host
(float islands; int32 division on U55), so partitions start and end at random places.
"""

from __future__ import annotations

import numpy as np
import pytest
from seeds import suite_seeds

from qlower.backends.ethosu import EthosUBackend
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, Value, verify_graph
from qlower.partition import partition
from qlower.reference import run_graph
from qlower.runtime.runner import Runner


def _spec(rng) -> QuantSpec:
    return QuantSpec.per_tensor(float(rng.uniform(0.02, 0.2)), int(rng.integers(-128, 30)))


def _conv(b: GraphBuilder, rng, x: Value, depthwise: bool) -> Value:
    c = x.shape[3]
    cout = c if depthwise else int(rng.integers(2, 9))
    k = int(rng.choice([1, 3]))
    stride = 2 if x.shape[1] >= 6 and rng.random() < 0.3 else 1
    wq = QuantSpec.per_channel(rng.uniform(0.002, 0.02, cout), axis=0)
    w = b.constant(rng.integers(-127, 128, (cout, k, k, 1 if depthwise else c)).astype(np.int8), wq)
    bias = None
    if rng.random() < 0.7:
        bias = b.constant(rng.integers(-2000, 2000, cout).astype(np.int32), QuantSpec.accumulator(x.quant, wq, axis=0))
    p = k // 2
    acc = b.op("conv2d", x, w, bias, stride=(stride, stride), pad=(p, p, p, p), groups=c if depthwise else 1)
    return b.op("rescale", acc, out=_spec(rng))


def _add(b: GraphBuilder, rng, x: Value, y: Value) -> Value:
    s = QuantSpec.per_tensor(min(x.quant.scale[0], y.quant.scale[0]) / 256, 0, DType.INT32)
    acc = b.op("add", b.op("rescale", x, out=s), b.op("rescale", y, out=s))
    return b.op("rescale", acc, out=_spec(rng))


def _step(b: GraphBuilder, rng, vals: list[Value]) -> None:
    x = vals[-1] if rng.random() < 0.7 else vals[int(rng.integers(len(vals)))]
    same = [v for v in vals if v.shape == x.shape and v is not x]
    kind = rng.choice(["conv", "dwconv", "rescale", "relu", "add", "pool", "transpose", "concat", "table",
                       "float_island", "intdiv"])
    if kind in ("conv", "dwconv"):
        vals.append(_conv(b, rng, x, kind == "dwconv"))
    elif kind == "rescale":
        vals.append(b.op("rescale", x, out=_spec(rng)))
    elif kind == "relu":
        vals.append(b.op("clamp", x, min=x.quant.zero_point[0], max=127))
    elif kind == "add" and same:
        vals.append(_add(b, rng, x, same[int(rng.integers(len(same)))]))
    elif kind == "pool" and min(x.shape[1:3]) >= 2:
        if rng.random() < 0.5:
            vals.append(b.op("max_pool2d", x, kernel=(2, 2), stride=(2, 2)))
        else:
            vals.append(b.op("avg_pool2d", x, kernel=(3, 3), stride=(1, 1), pad=(1, 1, 1, 1)))
    elif kind == "transpose":
        vals.append(b.op("transpose", x, perm=(0, 2, 1, 3)))
    elif kind == "concat" and same:
        other = b.op("rescale", same[0], out=x.quant)
        vals.append(b.op("concat", (x, other), axis=3))
    elif kind == "table":
        table = np.clip(rng.integers(-128, 128) + np.arange(256) // int(rng.integers(1, 4)), -128, 127)
        vals.append(b.op("table", x, table=table.astype(np.int8), offset=128, out=_spec(rng)))
    elif kind == "float_island":
        f = b.op("sigmoid", b.op("dequantize", x, None))
        vals.append(b.op("quantize", f, out=QuantSpec.per_tensor(1 / 256, -128)))
    elif kind == "intdiv":
        wide = b.op("rescale", x, out=QuantSpec.per_tensor(x.quant.scale[0] / 64, 0, DType.INT32))
        d = b.constant(np.full((1, 1, 1, 1), int(rng.integers(2, 9)), np.int32),
                       QuantSpec.per_tensor(1.0, 0, DType.INT32))
        vals.append(b.op("rescale", b.op("intdiv", wide, d), out=_spec(rng)))


def random_graph(seed: int):
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"rand{seed}")
    hw = int(rng.choice([4, 6, 8]))
    vals = [b.input("x", TensorType((1, hw, hw, int(rng.integers(2, 9))), DType.INT8, _spec(rng)))]
    for _ in range(int(rng.integers(4, 11))):
        _step(b, rng, vals)
    # every value nobody reads is an output (no dead code, as after the pass pipeline)
    g = b.build([])
    read = {v for op in g.ops for v in op.input_values()}
    sinks = [r for op in g.ops if op.kind != "constant" for r in op.results if r not in read]
    if rng.random() < 0.5:
        sinks[0] = b.op("dequantize", sinks[0], None)
    return verify_graph(b.build(sinks))


@pytest.mark.fuzz
@pytest.mark.parametrize("target", ["ethos-u85-256", "ethos-u55-128"])
@pytest.mark.parametrize("seed", suite_seeds(6, "ethos-u"))
def test_random_graph_is_bit_exact_through_vela(seed, target):
    g = random_graph(seed)
    be = EthosUBackend()
    res = partition(g, be, target)
    assert res.partitions, "every random graph has NPU work"
    for p in res.partitions:
        io = p.payload.meta["io"]
        assert [t.dtype.itemsize for t in p.input_types + p.output_types] == [e["element_size"] for e in io]
        assert p.payload.meta["perf"]["total_cycles"] > 0
    runner = Runner(res.host, res.partitions, {be.name: be})
    rng = np.random.default_rng(100 + seed)
    x = rng.integers(-128, 128, g.inputs[0].shape).astype(np.int8)
    for got, want in zip(runner.run([x]), run_graph(g, [x])):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
