"""The native int8 max pooling and float32 -> int8 quantization kernels compute the reference's integers.

Each graph runs on the plan with the native kernels and without them (the torch kernels), and both
must equal ``run_graph`` bit for bit: windows over padding at the image's edges, int8 extremes,
quantization ties (x * 1/scale exactly half-way), values far outside the int8 range, infinities.
"""

import numpy as np
import pytest

from qlower.backends.cpu import native, prepare
from qlower.errors import ExecutionError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.testing.cpu_checks import assert_cpu_matches_reference

CONFIGS = ({}, {"native": False})

pytestmark = pytest.mark.skipif(native.load() is None, reason="no C compiler: the native kernels aren't built")


def maxpool_graph(shape, kernel, stride, pad):
    b = GraphBuilder("maxpool")
    x = b.input("x", TensorType(shape, DType.INT8, QuantSpec.per_tensor(0.05, 3)))
    return verify_graph(b.build([b.op("max_pool2d", x, kernel=kernel, stride=stride, pad=pad, name="y")]))


@pytest.mark.parametrize("shape,kernel,stride,pad", [
    ((1, 9, 8, 64), (3, 3), (2, 2), (1, 1, 1, 1)),       # ResNet's stem pool, at 9x8
    ((2, 5, 7, 3), (2, 3), (1, 2), (1, 0, 2, 1)),        # asymmetric padding, odd channels, batch 2
    ((1, 4, 4, 17), (4, 4), (1, 1), (3, 3, 3, 3)),       # corner windows holding one in-image tap
])
def test_int8_max_pool_matches_reference(shape, kernel, stride, pad):
    graph = maxpool_graph(shape, kernel, stride, pad)
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, shape).astype(np.int8)
    x.reshape(-1)[::5] = -128    # the padding's own value inside the image
    x.reshape(-1)[1::7] = 127
    assert_cpu_matches_reference(graph, [x], configs=CONFIGS)


def quantize_graph(shape, scale, zp):
    b = GraphBuilder("quantize")
    x = b.input("x", TensorType(shape, DType.FLOAT32))
    return verify_graph(b.build([b.op("quantize", x, out=QuantSpec.per_tensor(scale, zp), name="y")]))


@pytest.mark.parametrize("scale,zp", [(0.05, 0), (1 / 64, -128), (0.0371, 127), (3.0, -7)])
@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_float32_to_int8_quantize_matches_reference(scale, zp):
    rng = np.random.default_rng(11)
    n = 40_000   # more than one of the kernel's 16384-value blocks
    x = (rng.standard_normal(n) * 200 * scale).astype(np.float32)
    halves = (np.arange(-300, 300) + 0.5) * np.float32(scale)     # near x * (1 / scale) = k + 0.5
    x[:600] = halves.astype(np.float32)
    x[600:606] = [np.inf, -np.inf, 3e38, -3e38, 0.0, -0.0]
    x[606:612] = np.nextafter(x[:6], np.float32(np.inf))
    assert_cpu_matches_reference(quantize_graph((n,), scale, zp), [x.astype(np.float32)], configs=CONFIGS)


def test_quantize_of_nan_raises_on_both_kernels():
    graph = quantize_graph((3, 5), 0.1, 0)
    x = np.zeros((3, 5), np.float32)
    x[2, 4] = np.nan
    for cfg in CONFIGS:
        with pytest.raises(ExecutionError, match="NaN"):
            prepare(graph, **cfg).run([x])
