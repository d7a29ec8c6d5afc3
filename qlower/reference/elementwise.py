"""Reference semantics of elementwise ops (integer ops exactly as TOSA 1.0 defines them)."""

from __future__ import annotations

import math

import numpy as np

from qlower.ir import Op, requant
from qlower.reference.registry import kernel


@kernel("rescale")
def _rescale(op: Op, x):
    src, out = op.operands[0].type.quant, op.attrs["out"]
    mult = requant.requantize_ratio(np.asarray(src.scale), out.scale[0])
    return requant.rescale(x, np.asarray(src.zero_point), out.zero_point[0], mult, out.qmin, out.qmax,
                           axis=src.axis, rounding=op.attrs["rounding"])


@kernel("clamp")
def _clamp(op: Op, x):
    return np.clip(x, op.attrs["min"], op.attrs["max"]).astype(x.dtype)


def _is_int(op: Op) -> bool:
    return op.result.type.quant is not None


def wraps(op: Op) -> bool:
    """An add / sub / mul of PyTorch's int32 tensors (``wrap``, set by the frontend), which wraps around
    on overflow (two's complement). Every other integer result (codes, accumulators, the integer steps
    of norms) must fit: overflow is an error."""
    return bool(op.attrs.get("wrap")) and op.kind in ("add", "sub", "mul")


def wrapped(op: Op, r: np.ndarray) -> np.ndarray:
    return ((r + 2**31) & (2**32 - 1)) - 2**31 if wraps(op) else r


@kernel("add")
def _add(op: Op, a, b):
    return wrapped(op, a.astype(np.int64) + b) if _is_int(op) else (a + b).astype(np.float32)


@kernel("sub")
def _sub(op: Op, a, b):
    return wrapped(op, a.astype(np.int64) - b) if _is_int(op) else (a - b).astype(np.float32)


@kernel("mul")
def _mul(op: Op, a, b):
    if not _is_int(op):
        return (a * b).astype(np.float32)
    prod = a.astype(np.int64) * b.astype(np.int64)
    shift = op.attrs["shift"]
    if shift > 0:  # TOSA MUL: round half up, then arithmetic shift
        prod = (prod + requant.mul_rounding(shift)) >> shift
    return wrapped(op, prod)


@kernel("intdiv")
def _intdiv(op: Op, a, b):
    a, b = a.astype(np.int64), b.astype(np.int64)
    if np.any(b == 0):
        raise ZeroDivisionError("intdiv by zero")
    q = np.abs(a) // np.abs(b)  # truncate toward zero, as TOSA INTDIV
    return np.where((a < 0) != (b < 0), -q, q)


def tosa_maximum(a, b):
    """TOSA 1.0 ``apply_max_s``: NaN if either is NaN, else ``a >= b ? a : b`` (so max(-0.0, +0.0) is
    -0.0 and max(+0.0, -0.0) is +0.0). Integers: the plain maximum."""
    if a.dtype.kind != "f":
        return np.maximum(a, b)
    return _nan_or(a, b, np.where(a >= b, a, b))


def tosa_minimum(a, b):
    """TOSA 1.0 ``apply_min_s``: NaN if either is NaN, else ``a < b ? a : b``."""
    if a.dtype.kind != "f":
        return np.minimum(a, b)
    return _nan_or(a, b, np.where(a < b, a, b))


def _nan_or(a, b, picked):
    return np.where(np.isnan(a) | np.isnan(b), np.float32(np.nan), picked).astype(np.float32)


_SAME_DOMAIN = {"minimum": tosa_minimum, "maximum": tosa_maximum, "equal": np.equal, "greater": np.greater,
                "greater_equal": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
                "logical_xor": np.logical_xor}


def _same_domain_kernel(kind: str, fn):
    def run(op: Op, a, b):
        return np.asarray(fn(a, b)).astype(op.result.type.dtype.numpy)
    kernel(kind)(run)


for _kind, _fn in _SAME_DOMAIN.items():
    _same_domain_kernel(_kind, _fn)


@kernel("logical_not")
def _logical_not(op: Op, x):
    return np.logical_not(x)


@kernel("select")
def _select(op: Op, c, a, b):
    return np.where(c, a, b).astype(op.result.type.dtype.numpy)


def _float_unary(kind: str, fn):
    def run(op: Op, x):
        return fn(x.astype(np.float64)).astype(np.float32)
    kernel(kind)(run)


_erf = np.frompyfunc(math.erf, 1, 1)
_float_unary("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)))
_float_unary("tanh", np.tanh)
_float_unary("exp", np.exp)
_float_unary("erf", lambda x: np.asarray(_erf(x), dtype=np.float64))  # asarray: 0-d input gives a float
_float_unary("reciprocal", lambda x: 1.0 / x)


@kernel("softmax")
def _softmax(op: Op, x):
    axis = op.attrs["axis"]
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)
