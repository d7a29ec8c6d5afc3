"""Binary int8 chains run as one 65,536-entry table: the residual add of quantized networks.

A quantized add or sub whose two operands each come from an int8 value through
a chain of per-tensor rescales (TFLite's form: a left shift by a rescale, then the
input multiplier), followed by per-tensor rescales and clamps down to an int8
value, is a function of two int8 codes and of nothing else: every op in it is
elementwise and per-tensor, so the result at any position depends only on the two
codes there. The table is computed once, at prepare time, by the reference
interpreter's own kernels on all 256 x 256 code pairs, so a run is one lookup per
element and equals the reference by construction. When any pair would raise in the
reference (an int32 overflow, a rescale input outside its REQUIRE range), the chain
is not fused: the ops then run one by one and raise where the reference does.
"""

from __future__ import annotations

import numpy as np
import torch

from qlower.backends.cpu.context import BuildContext, Kernel
from qlower.errors import QlowerError
from qlower.ir import DType, Op, Value
from qlower.reference.interpreter import KERNELS  # the interpreter's module registers every kernel

CODES = np.arange(-128, 128, dtype=np.int64)
CHAIN_KINDS = ("rescale", "clamp")


def _per_tensor_int(v: Value) -> bool:
    q = v.type.quant
    return v.dtype.is_integer and (q is None or not q.is_per_channel)


def _chain_kind(op: Op | None) -> bool:
    if op is None or op.kind not in CHAIN_KINDS or not _per_tensor_int(op.result):
        return False
    return op.kind != "rescale" or _per_tensor_int(op.operands[0])


def _operand_chain(facts, value: Value, user: Op) -> tuple[Value, list[Op]] | None:
    """The int8 value ``value`` is computed from through rescales/clamps whose results only the chain reads,
    and those ops (in order); None when that value is not int8."""
    chain: list[Op] = []
    while True:
        producer = facts.producer(value)
        if not _chain_kind(producer) or facts.sole_user(value) is not (chain[0] if chain else user):
            break
        chain.insert(0, producer)
        value = producer.operands[0]
    return (value, chain) if value.dtype is DType.INT8 and _per_tensor_int(value) else None


def _output_chain(facts, value: Value) -> list[Op]:
    """The sole-user rescales/clamps after ``value``, up to the last one giving int8 codes."""
    chain, best = [], 0
    while True:
        user = facts.sole_user(value)
        if not _chain_kind(user) or user.operands[0] is not value:
            return chain[:best]
        chain.append(user)
        value = user.result
        if value.dtype is DType.INT8:
            best = len(chain)


def table_of(a: Value, b: Value, ops: list[Op]) -> np.ndarray | None:
    """``ops`` (in dependency order) evaluated by the reference on every pair of codes of ``a`` and ``b``:
    the int8 results, indexed ``(a + 128) * 256 + b + 128``; None when any pair raises in the reference."""
    env = {a: np.repeat(CODES, 256), b: np.tile(CODES, 256)}
    for op in ops:
        args = [env[v] for v in op.operands]
        try:
            res = np.asarray(KERNELS[op.kind](op, *args))
        except (ArithmeticError, ValueError, QlowerError):
            return None
        dt = op.result.dtype
        if res.size and (res.min() < dt.min or res.max() > dt.max):
            return None
        env[op.result] = res.astype(dt.numpy)
    return env[ops[-1].result].astype(np.int8)


def binary_table(op: Op, facts, ctx: BuildContext) -> tuple[tuple[Op, ...], tuple[Value, Value], Value, Kernel] | None:
    """add/sub of two int8 codes through per-tensor rescale chains, down to int8, as one table lookup:
    the chain's ops, its two int8 inputs, its output and the kernel; None when ``op`` heads no such chain."""
    if op.kind not in ("add", "sub") or not _per_tensor_int(op.result):
        return None
    a, b = op.operands
    if a is b or not (a.shape == b.shape == op.result.shape):
        return None
    left, right = _operand_chain(facts, a, op), _operand_chain(facts, b, op)
    after = _output_chain(facts, op.result)
    if left is None or right is None or not after or left[0] is right[0]:
        return None
    ops = left[1] + right[1] + [op] + after
    table = table_of(left[0], right[0], ops)
    if table is None:
        return None
    return tuple(ops), (left[0], right[0]), after[-1].result, lut2_kernel(table, ctx)


def lut2_kernel(table: np.ndarray, ctx: BuildContext) -> Kernel:
    # 3 bytes past the last entry: the native kernel gathers each entry as the low byte of a dword
    t = torch.from_numpy(np.concatenate([np.ascontiguousarray(table).reshape(-1), np.zeros(3, table.dtype)]))
    native = ctx.native
    if native is None:
        t64 = t.to(torch.int64)

        def lookup(xa: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
            index = (xa.to(torch.int64) + 128) * 256 + (xb.to(torch.int64) + 128)
            return t64[index].to(torch.int8)
        return lookup

    def run(xa: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
        out = torch.empty(xa.shape, dtype=torch.int8)
        native.lut2(xa.contiguous(), xb.contiguous(), t, out)
        return out
    return run
