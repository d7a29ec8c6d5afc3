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
xnnpack        fp32                 fp32                double (TOSA)
=============  ===================  ==================  ==================

("double" is TOSA's DOUBLE_ROUND, the same as gemmlowp's two roundings;
"double_half_up" rounds the second time half up, as ruy does, see
``requant.apply_scale_high_mul``; "fp32" is XNNPACK's float32 requantization,
``requant.apply_scale_fp32``. XNNPACK does not take BATCH_MATMUL, which then
runs on the builtin kernel. A GEMM whose float32 requantization scale is 256 or
more fails XNNPACK's operator setup, and with it the whole model: the backend
leaves such a GEMM to the host.)

A program compiled for the ``litert`` target gets these roundings on its
fused rescales *before* partitioning, so they are what the program means: the
reference interpreter computes them, and the exported model is bit-exact with
it under the chosen kernels. Each rounding is within one step of the exact
product, so fake-quant agreement is unchanged in kind.

XNNPACK on x86-64 is measured (tests/test_litert_xnnpack.py: the AVX-512 and AMX
kernels LiteRT 2.3 picks here). On Arm64 it is read from XNNPACK's source (its
2026 tree: src/configs, the microkernels and src/operators), not run:

- GEMMs (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED): per-channel weights run
  the ``qs8_qc8w`` kernels, and so do per-tensor weights (XNNPACK's ``qs8``
  convolution takes the same configuration, one scale for every channel). Every
  Arm64 variant, whatever the core offers (NEON ``mlal``, ``neondot``,
  ``neoni8mm``, the Cortex-tuned assembly, depthwise ``neonv8_mla8``),
  requantizes with the ``neonv8`` fp32 parameters: SCVTF (int32 to float32,
  to nearest even), FMUL by the float32 scale, FCVTNS (to nearest even,
  saturating), SQXTN to int16, SQADD of the zero point, SQXTN to int8,
  SMAX/SMIN. That is ``fp32`` here: saturating at int16 before the zero point
  can't move a code the final clamp keeps. (32-bit ARMv7 cores without v8 add
  a magic bias instead of FCVTNS, which rounds the same wherever the result
  isn't clamped.)
- The exception: with KleidiAI on cores with SME or SME2, XNNPACK runs these
  GEMMs on KleidiAI's ``qai8`` SME kernels: SCVTF, FMUL, FRINTN, FCVTZS, then a
  plain (wrapping) int32 add of the zero point and SCLAMP. The same codes,
  except where ``|acc * scale|`` reaches ``2**31 - |zp|`` (a code far beyond
  int8 either way): FCVTZS saturates and the add can wrap to the other end.
- ``rndnu`` (integer rounding-doubling requantization) is what XNNPACK's
  *uint8* GEMMs use on Arm; qlower writes int8 only, so it never runs.
- ADD (``qs8-vadd`` NEON): VSUBL, 32-bit multiply-accumulate by the integer
  multipliers, VRSHL (adds half, then shifts), saturating narrow and zero
  point: xnnpack_add.py's integer expression, as on x86.
- QUANTIZE (``f32-qs8-vcvt`` ``neonv8``: FMUL, FCVTNS, saturating narrow)
  and DEQUANTIZE (exact int to float, one FMUL): the same as on x86.
- MEAN is the one not guaranteed. Its sum is exact, but the conversion
  ``float(sum) * scale + zp`` (src/reference/unary-elementwise.cc) and the
  zero point ``zp_out - (N * zp_in) * scale`` (src/operators/reduce-nd.c) are
  portable C/C++. An Arm64 compiler may contract either into one fused
  multiply-add, which rounds once where xnnpack_mean.py rounds twice. XNNPACK's
  own CMake and .bazelrc builds pass ``-ffp-contract=off``, but a Bazel build
  from another workspace (LiteRT's) gets that flag only on the scalar
  microkernels. Then a mean's code can differ by one where the product lands
  within an ulp of a half: check such a program on the device.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qlower.ir import Graph, Op, rebuild, requant
from qlower.ir.rewrite import Rewrite, Rewritten

KERNEL_ROUNDING: dict[str, dict[str, str]] = {
    "reference": {"conv2d": "double", "fully_connected": "single", "matmul": "double"},
    "builtin": {"conv2d": "double_half_up", "fully_connected": "double_half_up", "matmul": "double"},
    "xnnpack": {"conv2d": "fp32", "fully_connected": "fp32", "matmul": "double"},
}
XNNPACK_MAX_SCALE = 256.0   # XNNPACK refuses a quantized GEMM whose requantization scale is this or more


def kernel_rounding(kernels: str) -> Callable[[Op, Op], str]:
    """The rounding ``kernels`` give the rescale fused into a GEMM: ``choose(rescale, gemm)``."""
    table = KERNEL_ROUNDING[kernels]
    if kernels != "xnnpack":
        return lambda op, gemm: table[gemm.kind]

    def xnnpack(op: Op, gemm: Op) -> str:
        # (a GEMM XNNPACK refuses stays on the host: the backend doesn't take it, see xnnpack_refuses)
        return KERNEL_ROUNDING["builtin"][gemm.kind] if xnnpack_refuses(op) else table[gemm.kind]
    return xnnpack


def xnnpack_refuses(rescale: Op) -> bool:
    """Whether XNNPACK refuses the GEMM fused with ``rescale``: its float32 requantization scale is 256 or
    more (the delegate takes the node, then fails to create the runtime: the whole model wouldn't load)."""
    src, out = rescale.operands[0].type.quant, rescale.attrs["out"]
    return bool(np.any(requant.xnnpack_scale(np.asarray(src.scale), out.scale[0]) >= XNNPACK_MAX_SCALE))


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
        return with_gemm_rounding(graph, kernel_rounding(self.kernels))


def with_gemm_rounding(graph: Graph, table: dict[str, str] | Callable[[Op, Op], str]) -> Rewritten:
    """``graph`` with each rescale fused into a TFLite GEMM rounding as ``table`` says for that GEMM's
    kind, or as ``table(rescale, gemm)`` chooses (the rewrite of every kernel family, LiteRT's and
    TFLM's), and the rescales it changed."""
    from qlower.backends.litert.export import fused_pairs

    choose = table if callable(table) else (lambda op, gemm: table[gemm.kind])
    chosen = {key: (op, choose(op, gemm)) for key, (op, gemm) in fused_pairs(graph).items()}
    wanted = {key: want for key, (op, want) in chosen.items() if op.attrs["rounding"] != want}
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
    """The LiteRT kernel families guaranteed to compute ``graph``'s exported model bit-exactly: each
    fused GEMM rounds as the family does, and each residual add has the form of the ADD that runs it
    (XNNPACK's where the delegate takes it, TFLite's elsewhere); XNNPACK's MEAN runs under XNNPACK only."""
    from qlower.backends.litert.export import fused_pairs
    from qlower.backends.litert.fused_add import add_groups
    from qlower.backends.litert.xnnpack_add import xnnpack_add_groups, xnnpack_takes
    from qlower.backends.litert.xnnpack_mean import xnnpack_means

    pairs = list(fused_pairs(graph).values())
    xnnpack_forms = bool(xnnpack_add_groups(graph) or xnnpack_means(graph))   # its ADD and MEAN
    forms_ok = {"xnnpack": not any(xnnpack_takes(g) for g in add_groups(graph).values())}
    return [k for k in KERNEL_ROUNDING if forms_ok.get(k, not xnnpack_forms)
            and all(op.attrs["rounding"] == kernel_rounding(k)(op, gemm) for op, gemm in pairs)]
