"""Quantized residual adds in the form of XNNPACK's int8 ADD (LiteRT's ``xnnpack`` kernels).

XNNPACK does not add as TFLite's ADD kernel does (fused_add.py). From the float32 scales
its operator setup derives ``r_a = s_a / s_out`` and ``r_b = s_b / s_out`` in float32, a
shift ``20 - e`` (``e`` the binary exponent of the larger ratio) and the integer multipliers
``m_a = round_half_even(r_a * 2**shift)`` (likewise ``m_b``, below 2**21); its kernels then
compute ``((a - z_a) * m_a + (b - z_b) * m_b + 2**(shift-1)) >> shift`` in int32, add the
output zero point and clamp (src/microparams-init.c, the qs8-vadd microkernels: scalar, SSE,
AVX2, AVX-512 and NEON variants all compute this integer expression). In the IR that is:

- each operand rescaled to the sum domain ``S = s_out * 2**-shift`` with the
  ``integer_multiplier`` rounding (``requant.apply_scale_fp32``: its float32 ratio ``r * 2**shift``
  rounded half to even once, then an exact product),
- the int32 add,
- the rescale ``S -> s_out`` (ratio exactly ``2**-shift``) with single rounding, which is the
  kernel's ``(sum + 2**(shift-1)) >> shift``.

``XnnpackAdd`` gives every imported add that form when XNNPACK takes it (both ratios in
``[2**-10, 2**8)``, the operator's limits); others stay in TFLite's form (fused_add.py), which the
builtin ADD computes. ``xnnpack_add_groups`` finds the form again for the exporter, which writes one
ADD. Measured on LiteRT 2.3 (x86-64, AVX-512): 51,200 outputs of 200 random scale sets, all exact.
"""

from __future__ import annotations

import numpy as np

from qlower.backends.litert.fused_add import AddGroup, _int8_per_tensor, _sole_user, canonical_adds, rescaled_adds
from qlower.ir import DType, Graph, QuantSpec, rebuild, requant
from qlower.ir.rewrite import Rewrite, Rewritten

MIN_RATIO, MAX_RATIO = 2.0**-10, 2.0**8   # XNNPACK's limits on s_a / s_out and s_b / s_out
MULTIPLIER_BITS = 20


def xnnpack_add_shift(s_a: float, s_b: float, s_out: float) -> int | None:
    """The shift XNNPACK's ADD derives from the three scales, or None when it refuses them."""
    ratios = requant.xnnpack_scale(np.asarray([s_a, s_b], np.float64), s_out)
    if np.any(ratios < MIN_RATIO) or np.any(ratios >= MAX_RATIO):
        return None
    exponent = int(np.frexp(np.float64(ratios.max()))[1]) - 1   # ratio = m * 2**exponent, m in [1, 2)
    return MULTIPLIER_BITS - exponent


def xnnpack_takes(group: AddGroup) -> bool:
    """Whether XNNPACK's ADD takes an add of ``group``'s operands and output scales (the float32 ones)."""
    s_a, s_b = (float(np.float32(x.type.quant.scale[0])) for x in group.operands)
    return xnnpack_add_shift(s_a, s_b, float(np.float32(group.out.attrs["out"].scale[0]))) is not None


def _domain(s_out: float, shift: int) -> float:
    return float(np.ldexp(np.float64(s_out), -shift))


class XnnpackAdd(Rewrite):
    """The rewrite to XNNPACK's ADD form. The output differs from the canonical add's only by the
    multipliers' rounding (21 bits) and where the sum rounds: within 1 step; the operand and sum
    values are new ones (another domain)."""

    name = "litert.xnnpack_add"
    steps = 1
    what = ("each int8 residual add scales its operands by XNNPACK's integer multipliers (float32 ratios "
            "to 2**20, rounded once) and rounds the sum once at its shift, as XNNPACK's ADD does")

    def apply(self, graph: Graph) -> Rewritten:
        plan = {}
        for g in canonical_adds(graph):
            s_a, s_b = (x.type.quant.scale[0] for x in g.operands)
            shift = xnnpack_add_shift(s_a, s_b, g.out.attrs["out"].scale[0])
            if shift is not None:
                plan[id(g.add)] = _domain(g.out.attrs["out"].scale[0], shift)
                plan.update({id(r): plan[id(g.add)] for r in g.members[1:]})
                plan[id(g.out)] = None
        if not plan:
            return Rewritten(graph)
        changed = []

        def rewrite(b, op, operands):
            if id(op) not in plan:
                return None
            name = op.result.name
            if op.kind == "add":
                return (b.op("add", *operands, name=f"{name}_xnn", origin=op.result.origin),)
            if plan[id(op)] is not None:   # an operand rescale, to XNNPACK's domain
                return (b.op("rescale", *operands, name=f"{name}_xnn", origin=op.result.origin,
                             out=QuantSpec.per_tensor(plan[id(op)], 0, DType.INT32), rounding="integer_multiplier"),)
            changed.append(name)
            return (b.op("rescale", *operands, name=name, origin=op.result.origin, out=op.attrs["out"]),)

        return Rewritten(rebuild(graph, rewrite), tuple(changed))


def xnnpack_add_groups(graph: Graph) -> dict[int, AddGroup]:
    """id(output rescale) -> its group, for every add in XNNPACK's form (``XnnpackAdd``) whose
    multipliers and shift XNNPACK derives from the float32 scales a .tflite stores."""
    users, producers, outputs = graph.users(), graph.producers(), set(graph.outputs)
    groups = {}
    for op, out in rescaled_adds(graph, users, "single"):
        rescales = [producers.get(v) for v in op.operands]
        if not all(r is not None and r.kind == "rescale" and r.attrs["rounding"] == "integer_multiplier"
                   and r.result not in outputs and _sole_user(users, r.result) is op
                   and _int8_per_tensor(r.operands[0].type) and r.attrs["out"].zero_point[0] == 0
                   for r in rescales):
            continue
        s_a, s_b = (r.operands[0].type.quant.scale[0] for r in rescales)
        s_out = out.attrs["out"].scale[0]
        shift = xnnpack_add_shift(float(np.float32(s_a)), float(np.float32(s_b)), float(np.float32(s_out)))
        if shift is None or any(r.attrs["out"].scale[0] != _domain(s_out, shift) for r in rescales) \
                or op.result.type.quant.scale[0] != _domain(s_out, shift):
            continue
        groups[id(out)] = AddGroup(out, op, tuple(r.operands[0] for r in rescales), (op, *rescales))
    return groups
