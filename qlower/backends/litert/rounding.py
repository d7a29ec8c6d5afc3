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
from qlower.ir.rewrite import Rewrite, Rewritten

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
    return KernelRounding(kernels).apply(graph).graph


class KernelRounding(Rewrite):
    """The rewrite giving each rescale that fuses into a TFLite GEMM its kernels' rounding. Any
    two of TOSA's roundings of one product differ by at most one step: within 1 step per rescale."""

    name = "litert.kernel_rounding"
    steps = 1

    def __init__(self, kernels: str):
        self.kernels = kernels
        self.what = (f"the rescale fused into each TFLite GEMM rounds as LiteRT's {kernels} kernels do "
                     f"(conv {KERNEL_ROUNDING[kernels]['conv2d']}, fully connected "
                     f"{KERNEL_ROUNDING[kernels]['fully_connected']}, matmul {KERNEL_ROUNDING[kernels]['matmul']})")

    def apply(self, graph: Graph) -> Rewritten:
        return with_gemm_rounding(graph, KERNEL_ROUNDING[self.kernels])


def with_gemm_rounding(graph: Graph, table: dict[str, str]) -> Rewritten:
    """``graph`` with each rescale fused into a TFLite GEMM rounding as ``table`` says for that GEMM's
    kind (the rewrite of every kernel family, LiteRT's and TFLM's), and the rescales it changed."""
    from qlower.backends.litert.export import fused_pairs

    wanted = {key: table[gemm.kind] for key, (op, gemm) in fused_pairs(graph).items()
              if op.attrs["rounding"] != table[gemm.kind]}
    if not wanted:
        return Rewritten(graph)
    changed = []

    def rewrite(b, op, operands):
        want = wanted.get(id(op))
        if want is None:
            return None
        changed.append(op.result.name)
        return (b.op("rescale", *operands, name=op.result.name, origin=op.result.origin,
                     out=op.attrs["out"], rounding=want),)

    return Rewritten(rebuild(graph, rewrite), tuple(changed))


def exact_kernels(graph: Graph) -> list[str]:
    """The LiteRT kernel families guaranteed to compute ``graph``'s exported model bit-exactly."""
    from qlower.backends.litert.export import fused_pairs

    pairs = list(fused_pairs(graph).values())
    return [k for k, table in KERNEL_ROUNDING.items() if k in GUARANTEED
            and all(op.attrs["rounding"] == table[gemm.kind] for op, gemm in pairs)]
