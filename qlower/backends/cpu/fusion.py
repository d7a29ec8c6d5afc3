"""Fusion: op chains a plan runs as one kernel, each bit-identical to its ops run one by one.

* conv2d | fully_connected -> rescale [-> clamp]: the GEMM's folded offsets, the
  rescale and the clamp in one pass over the accumulator (conv.py).
* int8 a, b -> per-tensor rescale chains -> add | sub -> rescales / clamps -> int8, same
  shapes: the quantized residual add as one lookup in a table of all 256 x 256 code
  pairs made by the reference's kernels (lut.py); when a pair would raise, the same
  chain with one rescale per side runs as one native pass (the reference's arithmetic).
* [dynamic_quantize] -> conv2d | fully_connected -> dequantize [-> add(float const)]
  (dynamic.py).

A chain is fused only when every intermediate value has exactly one user, inside
the chain, and is not a graph output, so no other op can observe the difference.
The fused kernel runs at the position of the chain's last op: its external inputs
are all computed by then, and nothing else reads its intermediates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from qlower.backends.cpu import lut
from qlower.backends.cpu import native as native_mod
from qlower.backends.cpu.context import BuildContext, Kernel
from qlower.backends.cpu.conv import DirectConv, GemmConv
from qlower.backends.cpu.dynamic import dynamic_kernel
from qlower.backends.cpu.quantization import TOSA_ROUNDINGS, rescale_params
from qlower.backends.cpu.tensor_utils import execution_error
from qlower.ir import DType, Graph, Op, Value, requant


@dataclass(frozen=True)
class FusedGroup:
    ops: tuple[Op, ...]
    inputs: tuple[Value | None, ...]
    outputs: tuple[Value, ...]
    kernel: Kernel

    @property
    def label(self) -> str:
        return "+".join(op.kind for op in self.ops)


class FusionContext:
    """What the fusion matchers read about the graph: each value's users and producer, and its outputs."""

    def __init__(self, graph: Graph) -> None:
        self.users = graph.users()
        self.producers = graph.producers()
        self.outputs = set(graph.outputs)

    def sole_user(self, value: Value) -> Op | None:
        users = self.users.get(value, [])
        return users[0] if len(users) == 1 and value not in self.outputs else None

    def producer(self, value: Value | None) -> Op | None:
        return None if value is None else self.producers.get(value)


Matcher = Callable[[Op, FusionContext, dict[Op, Kernel], BuildContext], FusedGroup | None]


def _int_clamp(facts: FusionContext, value: Value) -> Op | None:
    user = facts.sole_user(value)
    if user is None or user.kind != "clamp":
        return None
    lo, hi = user.attrs["min"], user.attrs["max"]
    return user if float(lo).is_integer() and float(hi).is_integer() else None


def match_conv_requant(op: Op, facts: FusionContext, kernels: dict[Op, Kernel], ctx: BuildContext) -> FusedGroup | None:
    if op.kind not in ("conv2d", "fully_connected") or op.result.type.quant is None:
        return None
    if op.result.type.quant.dynamic or not isinstance(kernels[op], GemmConv | DirectConv):
        return None
    rescale = facts.sole_user(op.result)
    if rescale is None or rescale.kind != "rescale" or rescale.attrs["rounding"] not in TOSA_ROUNDINGS:
        return None
    clamp = _int_clamp(facts, rescale.result)
    params = rescale_params(op.result.type.quant, rescale.attrs["out"], rescale.attrs["rounding"])
    bounds = (int(clamp.attrs["min"]), int(clamp.attrs["max"])) if clamp is not None else None
    kernel = kernels[op].with_requant(params, clamp or rescale, bounds)
    ops = (op, rescale) + ((clamp,) if clamp is not None else ())
    return FusedGroup(ops, tuple(op.operands), (ops[-1].result,), kernel)


def _int8_to_int32_rescale(facts: FusionContext, value: Value, add: Op) -> Op | None:
    op = facts.producer(value)
    if op is None or op.kind != "rescale" or facts.sole_user(value) is not add:
        return None
    src = op.operands[0].type
    if src.dtype is not DType.INT8 or src.quant.is_per_channel or op.result.dtype is not DType.INT32:
        return None
    return op


def _rescale_vector(op: Op) -> list[int]:
    p = rescale_params(op.operands[0].type.quant, op.attrs["out"], op.attrs["rounding"])
    rp, rn = requant.rounding_terms(p.shift[0], p.double_round)
    return [int(p.in_zp[0]), int(p.mult[0]), int(p.shift[0]), int(requant.require_bound(p.shift[0])), int(rp), int(rn),
            p.out_zp, p.qmin, p.qmax]


def match_quantized_add(op: Op, facts: FusionContext, kernels: dict[Op, Kernel], ctx: BuildContext) -> FusedGroup | None:
    if ctx.native is None or op.kind not in ("add", "sub") or op.result.type.quant is None:
        return None
    a, b = op.operands
    if not (a.shape == b.shape == op.result.shape) or a is b:
        return None
    ra, rb = _int8_to_int32_rescale(facts, a, op), _int8_to_int32_rescale(facts, b, op)
    out = facts.sole_user(op.result)
    if ra is None or rb is None or out is None or out.kind != "rescale" or out.result.dtype is not DType.INT8:
        return None
    if any(r.attrs["rounding"] not in TOSA_ROUNDINGS for r in (ra, rb, out)):
        return None
    clamp = _int_clamp(facts, out.result)
    po = _rescale_vector(out)
    lo2, hi2 = (int(clamp.attrs["min"]), int(clamp.attrs["max"])) if clamp is not None else (po[7], po[8])
    params = torch.tensor(_rescale_vector(ra) + _rescale_vector(rb) + [int(op.kind == "sub")] + po[:6]
                          + [po[6], po[7], po[8], lo2, hi2, 0], dtype=torch.int64)
    last = clamp or out
    native = ctx.native

    def kernel(xa: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
        result = torch.empty(xa.shape, dtype=torch.int8)
        flags = native.qadd(xa.contiguous(), xb.contiguous(), params, result)
        if flags & native_mod.FLAG_INT32:
            raise execution_error(op, "overflows int32")
        if flags:
            raise execution_error(out, "rescale input out of range for its shift or int32 "
                                       "(TOSA apply_scale_32 REQUIRE)")
        return result
    ops = (ra, rb, op, out) + ((clamp,) if clamp is not None else ())
    return FusedGroup(ops, (ra.operands[0], rb.operands[0]), (last.result,), kernel)


def match_dynamic(op: Op, facts: FusionContext, kernels: dict[Op, Kernel], ctx: BuildContext) -> FusedGroup | None:
    if op.kind not in ("conv2d", "fully_connected") or op.result.type.quant is None:
        return None
    codes = op.operands[0]
    if not codes.quant.dynamic:
        return None
    deq = facts.sole_user(op.result)
    if deq is None or deq.kind != "dequantize" or deq.operands[0] is not op.result:
        return None
    scale = deq.operands[1]
    dq = facts.producer(codes)
    if not (dq is not None and dq.kind == "dynamic_quantize" and scale is dq.results[1]
            and facts.sole_user(codes) is op and facts.sole_user(scale) is deq):
        dq = None
    add = facts.sole_user(deq.result)
    bias = None
    if add is not None and add.kind == "add":
        other = add.operands[1] if add.operands[0] is deq.result else add.operands[0]
        if other is not deq.result and facts.producer(other) is not None and facts.producer(other).kind == "constant":
            bias = other
    if bias is None:
        add = None
    ops = ((dq,) if dq else ()) + (op, deq) + ((add,) if add else ())
    head = (dq.operands[0],) if dq else (codes, scale)
    inputs = head + (op.operands[1], op.operands[2]) + ((bias,) if bias is not None else ())
    return FusedGroup(ops, inputs, (ops[-1].result,), dynamic_kernel(dq, op, deq, add, ctx))


def match_binary_table(op: Op, facts: FusionContext, kernels: dict[Op, Kernel], ctx: BuildContext
                       ) -> FusedGroup | None:
    found = lut.binary_table(op, facts, ctx)
    if found is None:
        return None
    ops, inputs, output, kernel = found
    return FusedGroup(ops, inputs, (output,), kernel)


MATCHERS: tuple[Matcher, ...] = (match_dynamic, match_conv_requant, match_binary_table, match_quantized_add)


def find_groups(graph: Graph, kernels: dict[Op, Kernel], ctx: BuildContext) -> list[FusedGroup]:
    """Non-overlapping fused groups, found by trying each matcher on each op in order."""
    facts = FusionContext(graph)
    claimed: set[Op] = set()
    groups = []
    for op in graph.ops:
        if op in claimed:
            continue
        for matcher in MATCHERS:
            group = matcher(op, facts, kernels, ctx)
            if group is not None and not claimed.intersection(group.ops):
                claimed.update(group.ops)
                groups.append(group)
                break
    return groups

