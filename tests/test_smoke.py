import numpy as np

from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph


def test_conv_rescale_graph_runs_and_verifies():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, QuantSpec.per_tensor(0.5, 1)))
    w = b.constant(np.ones((3, 1, 1, 2), np.int8), QuantSpec.per_tensor(0.25), name="w")
    acc = b.op("conv2d", x, w, None)
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.125, 0))
    g = verify_graph(b.build([y]))
    xs = np.full((1, 4, 4, 2), 3, np.int8)
    (out,) = run_graph(g, [xs])
    # (3 - 1) * 0.5 * 1 * 0.25 * 2 channels = 0.5 -> 4 codes at scale 0.125
    assert out.dtype == np.int8 and np.all(out == 4)
