"""The rounding of TFLM's fused int8 kernels, and the rewrite that gives a graph the same.

TFLM's reference CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED requantize
their int32 accumulator inside the kernel with TFLite's
``MultiplyByQuantizedMultiplier`` (gemmlowp's two roundings, TOSA's
DOUBLE_ROUND). LiteRT's reference FULLY_CONNECTED rounds once instead, which is
why a ``litert`` program's classifier may differ from TFLM by a step (issue 27).
Measured on the zoo with ``tflite-micro`` 0.dev20261023182759
(tests/test_tflm_backend.py): every fused kernel below is bit-exact with the
reference interpreter once its rescale carries this rounding.

The int8 ADD is TFLite's (its operands shifted left by 20 bits, then two
roundings each), which ``litert.fused_add.to_tflite_add`` writes into the graph.
"""

from __future__ import annotations

from qlower.backends.litert.export import fused_pairs
from qlower.backends.litert.fused_add import to_tflite_add
from qlower.ir import Graph, rebuild

TFLM_ROUNDING = {"conv2d": "double", "fully_connected": "double", "matmul": "double"}


def with_tflm_rounding(graph: Graph) -> Graph:
    """``graph`` with residual adds in TFLite ADD's form and every rescale fused into a TFLM GEMM
    rounding as that kernel does."""
    graph = to_tflite_add(graph)
    wanted = {key: TFLM_ROUNDING[gemm.kind] for key, (op, gemm) in fused_pairs(graph).items()
              if op.attrs["rounding"] != TFLM_ROUNDING[gemm.kind]}
    if not wanted:
        return graph

    def rewrite(b, op, operands):
        want = wanted.get(id(op))
        if want is None:
            return None
        return (b.op("rescale", *operands, name=op.result.name, origin=op.result.origin,
                     out=op.attrs["out"], rounding=want),)

    return rebuild(graph, rewrite)
