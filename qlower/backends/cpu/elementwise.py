"""Elementwise kernels: clamp, add, sub, mul, intdiv, min/max, compare, select, logical, float unary ops, softmax.

Integer ops are computed in int64 and checked to fit int32, exactly as the
reference interpreter (TOSA 1.0 semantics: MUL rounds half up before its shift,
INTDIV truncates toward zero); plain int32 add, sub and mul wrap around like
PyTorch's integer tensors. Float ops use float32 for +, -, * (IEEE, hence
identical to NumPy); the transcendental ops and softmax call the reference's kernels.
"""

from __future__ import annotations

import torch

from qlower.backends.cpu.context import BuildContext, Kernel, builder, by_reference
from qlower.backends.cpu.tensor_utils import check_int32, execution_error
from qlower.errors import UnsupportedOpError
from qlower.ir import Op, requant
from qlower.reference.elementwise import wraps


@builder("clamp")
def _clamp(op: Op, ctx: BuildContext) -> Kernel:
    lo, hi = op.attrs["min"], op.attrs["max"]
    if op.result.type.dtype.is_integer and not (float(lo).is_integer() and float(hi).is_integer()):
        raise UnsupportedOpError(f"clamp of integer codes to non-integer bounds ({lo}, {hi}) at %{op.result.name}")
    if op.result.type.dtype.is_integer:
        lo, hi = int(lo), int(hi)
    return lambda x: torch.clamp(x, lo, hi)


def _int_binary(op: Op, fn) -> Kernel:
    if op.kind in ("add", "sub", "mul") and wraps(op):
        def wrap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            r = fn(a.to(torch.int64), b.to(torch.int64))
            return torch.bitwise_and(r + 2**31, 2**32 - 1).sub_(2**31).to(torch.int32)
        return wrap

    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        r = fn(a.to(torch.int64), b.to(torch.int64))
        check_int32(op, r)
        return r.to(torch.int32)
    return run


@builder("add", "sub")
def _additive(op: Op, ctx: BuildContext) -> Kernel:
    fn = torch.add if op.kind == "add" else torch.sub
    if op.result.type.quant is None:
        return fn
    return _int_binary(op, fn)


@builder("mul")
def _mul(op: Op, ctx: BuildContext) -> Kernel:
    if op.result.type.quant is None:
        return torch.mul
    shift = op.attrs["shift"]

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        prod = a * b
        if shift > 0:  # TOSA MUL: round half up, then arithmetic shift
            prod = torch.bitwise_right_shift(prod + requant.mul_rounding(shift), shift)
        return prod
    return _int_binary(op, fn)


@builder("intdiv")
def _intdiv(op: Op, ctx: BuildContext) -> Kernel:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if bool((b == 0).any()):
            raise execution_error(op, "intdiv by zero")
        return torch.div(a, b, rounding_mode="trunc")
    return _int_binary(op, fn)


_SAME_DOMAIN = {"minimum": torch.minimum, "maximum": torch.maximum, "equal": torch.eq, "greater": torch.gt,
                "greater_equal": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
                "logical_xor": torch.logical_xor}


@builder(*_SAME_DOMAIN)
def _same_domain(op: Op, ctx: BuildContext) -> Kernel:
    """Codes of one domain (or bools) compared or picked as they are: exact. Float minimum and
    maximum run the reference's kernels: which zero wins between -0.0 and +0.0 is its definition."""
    if op.kind in ("minimum", "maximum") and op.result.type.dtype.is_float:
        return by_reference(op)
    return _SAME_DOMAIN[op.kind]


@builder("logical_not")
def _logical_not(op: Op, ctx: BuildContext) -> Kernel:
    return torch.logical_not


@builder("select")
def _select(op: Op, ctx: BuildContext) -> Kernel:
    return torch.where


@builder("sigmoid", "tanh", "exp", "erf", "reciprocal", "softmax")
def _float_by_reference(op: Op, ctx: BuildContext) -> Kernel:
    """Float transcendental ops and softmax run the reference's own kernels (float64 NumPy): one
    definition, so the CPU is bit-identical to the reference by construction, not by copying."""
    return by_reference(op)
