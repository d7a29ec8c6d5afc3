"""Quantized residual adds in the form of TFLite's int8 ADD kernel.

qlower imports ``a + b`` of int8 codes as TFLite does (both operands rescaled to
int32 at ``S = 2 * max(s_a, s_b) / 2**20``, ``qlower.ir.add_domain``, added,
rescaled to the output), but each operand's rescale rounds once, at its final shift.
An add is recognised by that domain, from the same definition the importer uses.
TFLite's kernel first shifts the centered codes left by 20 bits and then requantizes
them with gemmlowp's two roundings (TOSA's DOUBLE_ROUND), and rounds the sum
the same way. So for the ``litert`` target each operand rescale becomes an
exact ``x 2**20`` rescale followed by a double-rounding one, and the output
rescale rounds twice (``to_tflite_add``). The IR then says exactly what
TFLite's ADD computes, and ``add_groups`` finds those groups for the exporter,
which writes each as one ADD on the int8 tensors (checking that TFLite derives
the same multipliers from the float32 scales it stores).

Measured with LiteRT 2.3: the reference and the optimized builtin ADD are both
exact with this form.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qlower.ir import DType, Graph, Op, QuantSpec, rebuild, requant
from qlower.ir.add_domain import ADD_SHIFT, add_domain_scale
from qlower.ir.rewrite import Rewrite, Rewritten


@dataclass(frozen=True)
class AddGroup:
    """``out = rescale(add(rescale(rescale(x1)), rescale(rescale(x2))))`` in TFLite's ADD form."""

    out: Op
    add: Op
    operands: tuple  # the int8 values x1, x2
    members: tuple[Op, ...]   # every op of the group but ``out``


def _sole_user(users, v) -> Op | None:
    u = users.get(v, [])
    return u[0] if len(u) == 1 else None


def _int8_per_tensor(t) -> bool:
    return t.dtype is DType.INT8 and t.quant is not None and not t.quant.is_per_channel and not t.quant.dynamic


def to_tflite_add(graph: Graph) -> Graph:
    """``graph`` with every imported int8 add (or sub) in TFLite ADD's rounding form (module doc)."""
    return TfliteAdd().apply(graph).graph


class TfliteAdd(Rewrite):
    """The rewrite to TFLite ADD's rounding form. Each operand rescale (to the int32 sum domain)
    and the output rescale only round another way: within 1 step per rescale."""

    name = "litert.tflite_add"
    steps = 1
    what = ("each int8 residual add's operand rescales shift left 20 bits then round twice, and its output "
            "rescale rounds twice, as TFLite's int8 ADD kernel does")

    def apply(self, graph: Graph) -> Rewritten:
        split, double = _add_rescales(graph)
        if not double:
            return Rewritten(graph)
        changed = []

        def rewrite(b, op, operands):
            if id(op) in split:
                changed.append(op.result.name)
                src = op.operands[0].type.quant
                shifted = b.op("rescale", *operands, name=f"{op.result.name}_shifted", origin=op.result.origin,
                               out=QuantSpec.per_tensor(src.scale[0] / 2**ADD_SHIFT, 0, DType.INT32))
                return (b.op("rescale", shifted, name=op.result.name, origin=op.result.origin,
                             out=op.attrs["out"], rounding="double"),)
            if id(op) in double:
                changed.append(op.result.name)
                return (b.op("rescale", *operands, name=op.result.name, origin=op.result.origin,
                             out=op.attrs["out"], rounding="double"),)
            return None

        return Rewritten(rebuild(graph, rewrite), tuple(changed))


def _add_rescales(graph: Graph) -> tuple[set[int], set[int]]:
    """(ids of the operand rescales to split, ids of the output rescales to round twice)."""
    adds = canonical_adds(graph)
    return {id(r) for a in adds for r in a.members[1:]}, {id(a.out) for a in adds}


def rescaled_adds(graph: Graph, users, rounding: str):
    """(add, its output rescale) for each int32 add that is not a graph output and is read only by a
    rescale to int8 rounding as ``rounding`` (``users``: the graph's)."""
    outputs = set(graph.outputs)
    for op in graph.ops:
        if op.kind != "add" or op.result.dtype is not DType.INT32 or op.result in outputs:
            continue
        out = _sole_user(users, op.result)
        if out is not None and out.kind == "rescale" and out.attrs["rounding"] == rounding \
                and out.attrs["out"].dtype is DType.INT8:
            yield op, out


def canonical_adds(graph: Graph) -> list[AddGroup]:
    """The int8 adds as the frontend imports them: ``rescale(add(rescale(x1), rescale(x2)))``, each
    operand rescaled once (single rounding) to the sum domain ``add_domain_scale``, the output rescale
    rounding once; members are the add and the two operand rescales."""
    users, producers, outputs = graph.users(), graph.producers(), set(graph.outputs)
    found = []
    for op, out in rescaled_adds(graph, users, "single"):
        rescales = [producers.get(v) for v in op.operands]
        if not all(r is not None and r.kind == "rescale" and r.attrs["rounding"] == "single"
                   and _sole_user(users, r.result) is op and r.result not in outputs
                   and _int8_per_tensor(r.operands[0].type) for r in rescales):
            continue
        domain = add_domain_scale([r.operands[0].type.quant.scale[0] for r in rescales])
        if any(r.attrs["out"].scale[0] != domain or r.attrs["out"].zero_point[0] != 0 for r in rescales):
            continue
        found.append(AddGroup(out, op, tuple(r.operands[0] for r in rescales), (op, *rescales)))
    return found


def add_groups(graph: Graph) -> dict[int, AddGroup]:
    """id(output rescale) -> its group, for every add in TFLite ADD's form whose multipliers TFLite
    would derive from the float32 scales exactly."""
    users, producers, outputs = graph.users(), graph.producers(), set(graph.outputs)
    groups = {}
    for op, out in rescaled_adds(graph, users, "double"):
        members, xs = [op], []
        for v in op.operands:
            r = producers.get(v)
            t = producers.get(r.operands[0]) if r is not None and r.kind == "rescale" else None
            if t is None or t.kind != "rescale" or r.attrs["rounding"] != "double" or r.result in outputs \
                    or t.result in outputs or _sole_user(users, r.result) is not op \
                    or _sole_user(users, t.result) is not r or not _int8_per_tensor(t.operands[0].type):
                break
            x = t.operands[0].type.quant
            if t.attrs["out"].scale[0] != x.scale[0] / 2**ADD_SHIFT or t.attrs["out"].zero_point[0] != 0:
                break
            members += [r, t]
            xs.append(t.operands[0])
        if len(xs) != 2 or not _same_multipliers(xs, members, out):
            continue
        groups[id(out)] = AddGroup(out, op, tuple(xs), tuple(members))
    return groups


def _stored(scale: float) -> float:
    return float(np.float32(scale))


def _same_multipliers(xs, members, out: Op) -> bool:
    """Whether TFLite's ADD, from the float32 scales, requantizes with the IR's multipliers and shifts."""
    from qlower.backends.litert.emit import tflite_multiplier

    s1, s2 = (_stored(x.type.quant.scale[0]) for x in xs)
    s_out = _stored(out.attrs["out"].scale[0])
    twice_max = 2.0 * max(s1, s2)
    wanted = [(s1 / twice_max, members[1]), (s2 / twice_max, members[3]),
              (twice_max / ((1 << ADD_SHIFT) * s_out), out)]
    for real, rescale in wanted:
        src = rescale.operands[0].type.quant
        ir = requant.requantize_ratio(np.asarray(src.scale), rescale.attrs["out"].scale[0])
        q, e = tflite_multiplier(real)
        if q == 0 or e > 0 or q != int(ir.multiplier[0]) or 31 - e != int(ir.shift[0]):
            return False
    return True
