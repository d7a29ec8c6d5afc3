"""The default pipeline on random small graphs: verified after every pass, bit-identical outputs.

Graphs mix the patterns the passes rewrite (transposes back and forth, order-blind
ops, clamps, constants, concats sharing a domain, reshapes) with inputs and
constants at random, so rewrites meet each other in combinations no hand-written
case lists.
"""

import numpy as np
import pytest
from seeds import blocks, suite_seeds

from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, Value
from qlower.passes import default_pipeline
from qlower.testing.graph_checks import assert_same_outputs


def _spec(rng) -> QuantSpec:
    qmin = int(rng.choice([-128, -127]))
    return QuantSpec.per_tensor(float(rng.uniform(0.01, 0.2)), int(rng.integers(qmin, 20)), qmin=qmin, qmax=127)


def _perm(rng, rank: int) -> tuple[int, ...]:
    if rng.random() < 0.5:   # mostly the NCHW <-> NHWC pair, so that transposes meet
        return (0, 3, 1, 2) if rng.random() < 0.5 else (0, 2, 3, 1)
    return tuple(int(i) for i in rng.permutation(rank))


def _step(b: GraphBuilder, rng, ints: list[Value], floats: list[Value]) -> None:
    x = ints[int(rng.integers(len(ints)))]
    f = floats[int(rng.integers(len(floats)))]
    kind = rng.choice(["transpose", "transpose_f", "rescale", "clamp", "relu", "quantize", "dequantize",
                       "mul_const", "sigmoid", "concat", "reshape", "const"])
    if kind == "transpose":
        ints.append(b.op("transpose", x, perm=_perm(rng, 4)))
    elif kind == "transpose_f":
        floats.append(b.op("transpose", f, perm=_perm(rng, 4)))
    elif kind == "rescale":
        ints.append(b.op("rescale", x, out=_spec(rng)))
    elif kind == "clamp":
        lo = int(rng.integers(-128, 0))
        ints.append(b.op("clamp", x, min=lo, max=int(rng.integers(lo, 128))))
    elif kind == "relu":
        ints.append(b.op("clamp", x, min=x.quant.zero_point[0], max=127))
    elif kind == "quantize":
        ints.append(b.op("quantize", f, out=_spec(rng)))
    elif kind == "dequantize":
        floats.append(b.op("dequantize", x, None))
    elif kind == "mul_const":
        shape = tuple(d if rng.random() < 0.5 else 1 for d in f.shape)
        c = b.constant(rng.uniform(-2, 2, shape).astype(np.float32))
        floats.append(b.op("mul", f, c) if rng.random() < 0.5 else b.op("mul", c, f))
    elif kind == "sigmoid":
        floats.append(b.op("sigmoid", f))
    elif kind == "concat":
        other = b.op("rescale", ints[int(rng.integers(len(ints)))], out=x.quant)
        if other.shape == x.shape:
            ints.append(b.op("concat", (x, other), axis=int(rng.integers(4))))
    elif kind == "reshape":
        ints.append(b.op("reshape", x, shape=tuple(int(d) for d in rng.permutation(list(x.shape)))))
    else:
        shape = x.shape
        ints.append(b.constant(rng.integers(-128, 128, shape).astype(np.int8), _spec(rng)))
        floats.append(b.constant(rng.uniform(-1, 1, shape).astype(np.float32)))


def random_graph(seed: int):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    shape = (1, 2, 3, 1) if rng.random() < 0.3 else (1, 2, 3, 4)
    ints = [b.input("x", TensorType(shape, DType.INT8, _spec(rng)))]
    floats = [b.input("f", TensorType(shape, DType.FLOAT32))]
    if rng.random() < 0.3:   # an all-constant start: whole regions fold
        ints[0] = b.constant(rng.integers(-128, 128, shape).astype(np.int8), _spec(rng), name="k")
    for _ in range(int(rng.integers(4, 14))):
        _step(b, rng, ints, floats)
    outs = [ints[-1], floats[-1]] if rng.random() < 0.5 else [ints[-1]]
    return b.build(outs)


@pytest.mark.fuzz
@pytest.mark.parametrize("seeds", blocks(suite_seeds(240, "passes"), 60), ids=lambda s: f"seeds{s[0]}")
def test_default_pipeline_preserves_random_graphs(seeds):
    changed = 0
    for seed in seeds:
        before = random_graph(seed)
        result = default_pipeline(verify=True)(before)
        assert_same_outputs(before, result.graph, trials=2)
        changed += result.changed
        assert len(result.graph.ops) <= len(before.ops)
    assert changed > len(seeds) // 2   # the generator really exercises the passes
