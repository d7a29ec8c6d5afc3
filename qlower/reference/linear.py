"""Reference semantics of the multiply-accumulate ops: conv2d, fully_connected, matmul.

Integer ops accumulate ``(x - x_zp) * (w - w_zp)`` exactly. The sums are
computed as float64 GEMMs, which is exact when every partial sum is an integer
below 2**53, whatever order the BLAS adds in: that holds when
``K * max|x - x_zp| * max|w - w_zp| < 2**53``, with the maxima taken over the
operands' whole dtype ranges (int8: 255, int16: 65535 after zero-point
subtraction). So any int8 or int8 x int16 GEMM with K < 2**37 is exact, and
int16 x int16 with K < 2**21. ``_check_exact`` proves this bound from the types
before each GEMM (no run-time cost) and refuses otherwise. The result is
converted back to int64 and must fit the int32 accumulator.
"""

from __future__ import annotations

import numpy as np

from qlower.ir import Op, TensorType
from qlower.ir.type_rules import window_output_size
from qlower.ir.verifier import gemm_exact_problem
from qlower.reference.registry import kernel


def _centered(x: np.ndarray, t: TensorType) -> np.ndarray:
    """Codes minus zero point, as float64 (exact), or the float values."""
    if t.quant is None:
        return x.astype(np.float64)
    zp = t.quant.zero_point_array(x.ndim)
    return (x.astype(np.int64) - zp).astype(np.float64)


def _check_exact(a: TensorType, b: TensorType, k: int) -> None:
    """Raise unless a float64 sum of k products of these operand types is exact (see module doc; the
    IR verifier refuses such a graph already, by the same function: ``gemm_exact_problem``)."""
    problem = gemm_exact_problem(a, b, k)
    if problem:
        raise ArithmeticError(problem)


def _finish(acc: np.ndarray, bias: np.ndarray | None, out: TensorType) -> np.ndarray:
    if out.quant is None:
        res = acc if bias is None else acc + bias.astype(np.float64)
        return res.astype(np.float32)
    res = acc.astype(np.int64)  # exact: acc holds integers below 2**53 (_check_exact)
    if bias is not None:
        res = res + bias.astype(np.int64)
    return res


def conv2d_nhwc(x: np.ndarray, w: np.ndarray, stride, dilation, pad, groups: int) -> np.ndarray:
    """Float64 convolution of already-centered operands (zero padding)."""
    n, h, wd, c = x.shape
    o, kh, kw, ci = w.shape
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = stride, dilation, pad
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    oh, ow = window_output_size(h, kh, sh, dh, pt, pb), window_output_size(wd, kw, sw, dw, pl, pr)
    out = np.zeros((n, oh, ow, o), dtype=np.float64)
    og = o // groups
    depthwise = ci == 1 and groups == c
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dh, kx * dw
            patch = xp[:, y0:y0 + sh * (oh - 1) + 1:sh, x0:x0 + sw * (ow - 1) + 1:sw, :]
            if depthwise:
                mult = o // c  # channel multiplier: output channel oc reads input channel oc // mult
                out += np.repeat(patch, mult, axis=3) * w[:, ky, kx, 0]
            elif groups == 1:
                out += patch @ w[:, ky, kx, :].T
            else:
                for g in range(groups):
                    out[..., g * og:(g + 1) * og] += patch[..., g * ci:(g + 1) * ci] @ w[g * og:(g + 1) * og, ky, kx, :].T
    return out


@kernel("conv2d")
def _conv2d(op: Op, x, w, bias):
    xt, wt, _ = (v.type if v is not None else None for v in op.operands)
    a = op.attrs
    _check_exact(xt, wt, int(np.prod(wt.shape[1:])))
    acc = conv2d_nhwc(_centered(x, xt), _centered(w, wt), a["stride"], a["dilation"], a["pad"], a["groups"])
    return _finish(acc, bias, op.result.type)


@kernel("fully_connected")
def _fully_connected(op: Op, x, w, bias):
    xt, wt = op.operands[0].type, op.operands[1].type
    _check_exact(xt, wt, wt.shape[1])
    acc = _centered(x, xt) @ _centered(w, wt).T
    return _finish(acc, bias, op.result.type)


@kernel("matmul")
def _matmul(op: Op, a, b):
    at, bt = op.operands[0].type, op.operands[1].type
    _check_exact(at, bt, at.shape[-1])
    acc = np.matmul(_centered(a, at), _centered(b, bt))
    return _finish(acc, None, op.result.type)
