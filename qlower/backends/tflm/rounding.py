"""The rounding of TFLM's fused int8 kernels, as a declared rewrite of the graph.

TFLM's reference CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED requantize
their int32 accumulator inside the kernel with TFLite's
``MultiplyByQuantizedMultiplier`` (gemmlowp's two roundings, TOSA's
DOUBLE_ROUND). LiteRT's reference FULLY_CONNECTED rounds once instead, which is
why a ``litert`` program's classifier may differ from TFLM by a step (issue 27).
Measured with ``tflite-micro`` 0.dev20261023182759 on the accumulators the
reference computes (tests/test_tflm_backend.py runs the zoo bit-exact): both
convolutions and FULLY_CONNECTED round twice; TFLM's multipliers are TFLite's,
derived from the float32 scales (``PopulateConvolutionQuantizationParams``).

The int8 ADD is TFLite's (operands shifted left by 20 bits, two roundings
each), which litert's ``TfliteAdd`` rewrite writes into the graph.
"""

from __future__ import annotations

from qlower.backends.litert.rounding import with_gemm_rounding
from qlower.ir import Graph
from qlower.ir.rewrite import Rewrite, Rewritten

TFLM_ROUNDING = {"conv2d": "double", "fully_connected": "double", "matmul": "double"}


class TflmKernelRounding(Rewrite):
    """Each rescale fused into a TFLM GEMM rounds as that kernel does. Any two of TOSA's roundings of
    one product differ by at most one step: within 1 step per rescale."""

    name = "tflm.kernel_rounding"
    steps = 1
    what = ("the rescale fused into each TFLM convolution and fully connected layer rounds twice, as TFLM's "
            "kernels do (MultiplyByQuantizedMultiplier)")

    def apply(self, graph: Graph) -> Rewritten:
        return with_gemm_rounding(graph, TFLM_ROUNDING)
