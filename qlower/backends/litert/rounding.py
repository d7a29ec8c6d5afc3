"""The rounding of LiteRT's fused int8 kernels, and the rewrite that gives a graph the same.

TFLite's fused CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED and BATCH_MATMUL
requantize their int32 accumulator inside the kernel, and the kernel families
of LiteRT 2.3 don't round alike. Measured per op on the accumulators LiteRT
itself computed (so every difference is the requantization's):

=============  ===================  ==================  ==================
kernels        conv2d (incl. dw)    fully_connected     matmul
=============  ===================  ==================  ==================
reference      double (TOSA)        single              double (TOSA)
builtin        double_half_up       double_half_up      double (TOSA)
xnnpack        single (mostly)      single              double (TOSA)
=============  ===================  ==================  ==================

("double" is TOSA's DOUBLE_ROUND, the same as gemmlowp's two roundings;
"double_half_up" rounds the second time half up, as ruy does, see
``requant.apply_scale_high_mul``. XNNPACK does not take BATCH_MATMUL, which then
runs on the builtin kernel; it requantizes some convolutions in float32, so its
row is the closest integer rounding, not a guarantee.)

A program compiled for the ``litert`` target gets these roundings on its
fused rescales *before* partitioning, so they are what the program means: the
reference interpreter computes them, and the exported model is bit-exact with
it under the chosen kernels. Each rounding is within one step of the exact
product, so fake-quant agreement is unchanged in kind.
"""

from __future__ import annotations

from qlower.ir import Graph, rebuild

KERNEL_ROUNDING: dict[str, dict[str, str]] = {
    "reference": {"conv2d": "double", "fully_connected": "single", "matmul": "double"},
    "builtin": {"conv2d": "double_half_up", "fully_connected": "double_half_up", "matmul": "double"},
    "xnnpack": {"conv2d": "single", "fully_connected": "single", "matmul": "double"},
}


# XNNPACK requantizes some convolutions in float32 (measured: 1 step near ties), so its row is the
# closest integer rounding, not a guarantee
GUARANTEED = ("reference", "builtin")


def with_kernel_rounding(graph: Graph, kernels: str) -> Graph:
    """``graph`` with every rescale that fuses into a TFLite GEMM rounding as ``kernels`` does."""
    from qlower.backends.litert.export import fused_pairs

    table = KERNEL_ROUNDING[kernels]
    pairs = fused_pairs(graph)
    if all(op.attrs["rounding"] == table[gemm.kind] for op, gemm in pairs.values()):
        return graph
    wanted = {key: table[gemm.kind] for key, (_, gemm) in pairs.items()}

    def rewrite(b, op, operands):
        want = wanted.get(id(op))
        if want is None or op.attrs["rounding"] == want:
            return None
        return (b.op("rescale", *operands, name=op.result.name, origin=op.result.origin,
                     out=op.attrs["out"], rounding=want),)

    return rebuild(graph, rewrite)


def exact_kernels(graph: Graph) -> list[str]:
    """The LiteRT kernel families guaranteed to compute ``graph``'s exported model bit-exactly."""
    from qlower.backends.litert.export import fused_pairs

    pairs = list(fused_pairs(graph).values())
    return [k for k, table in KERNEL_ROUNDING.items() if k in GUARANTEED
            and all(op.attrs["rounding"] == table[gemm.kind] for op, gemm in pairs)]
