"""Op definitions: constants, convolution, fully connected, matmul, pools and reductions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qlower.ir.dtypes import DType
from qlower.ir.graph import TensorType
from qlower.ir.opdefs import OPS, REQUIRED, register
from qlower.ir.quant import QuantSpec
from qlower.ir.type_rules import (
    fail,
    gemm_result,
    is_float,
    require_float,
    require_quantized,
    unchanged_quant,
    window_output_size,
)


@register("constant", (), data=REQUIRED, quant=None)
def _constant(ops, attrs):
    """A constant tensor; integer data carries its QuantSpec."""
    data = attrs["data"]
    if not isinstance(data, np.ndarray):
        raise fail("constant", "data must be a numpy array")
    return (TensorType(data.shape, DType.from_numpy(data.dtype), attrs["quant"]),)


@register("conv2d", ("input", "weight", "bias?"), stride=(1, 1), dilation=(1, 1), pad=(0, 0, 0, 0), groups=1)
def _conv2d(ops, attrs):
    """2-D convolution, NHWC input, OHWI weight (I = C / groups), pad (top, bottom, left, right)."""
    x, w, b = ops
    if x.rank != 4 or w.rank != 4:
        raise fail("conv2d", f"expects NHWC input and OHWI weight, got {x.shape} and {w.shape}")
    n, h, wd, c = x.shape
    o, kh, kw, ci = w.shape
    g = attrs["groups"]
    if c % g or o % g or ci * g != c:
        raise fail("conv2d", f"input channels {c}, weight {w.shape} and groups {g} disagree")
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = attrs["stride"], attrs["dilation"], attrs["pad"]
    oh, ow = window_output_size(h, kh, sh, dh, pt, pb), window_output_size(wd, kw, sw, dw, pl, pr)
    if oh <= 0 or ow <= 0:
        raise fail("conv2d", f"empty output {oh}x{ow} for input {x.shape}")
    return (gemm_result("conv2d", x, w, b, (n, oh, ow, o), o),)


@register("fully_connected", ("input", "weight", "bias?"))
def _fully_connected(ops, attrs):
    """``input[..., K] @ weight[N, K].T (+ bias[N])``."""
    x, w, b = ops
    if w.rank != 2 or x.shape[-1] != w.shape[1]:
        raise fail("fully_connected", f"input {x.shape} and weight {w.shape} disagree")
    return (gemm_result("fully_connected", x, w, b, x.shape[:-1] + (w.shape[0],), w.shape[0]),)


@register("matmul", ("a", "b"))
def _matmul(ops, attrs):
    """Batched ``a[..., M, K] @ b[..., K, N]``; batch dims equal."""
    a, b = ops
    if a.rank < 2 or a.rank != b.rank or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise fail("matmul", f"shapes {a.shape} and {b.shape} disagree")
    shape = a.shape[:-1] + (b.shape[-1],)
    if is_float(a):
        require_float("matmul", a, b)
        return (TensorType(shape, DType.FLOAT32),)
    aq = require_quantized("matmul", a, DType.INT8, DType.INT16)
    bq = require_quantized("matmul", b, DType.INT8, DType.INT16)
    if aq.is_per_channel or bq.is_per_channel:
        raise fail("matmul", "operands must be quantized per tensor")
    return (TensorType(shape, DType.INT32, QuantSpec.accumulator(aq, bq, None)),)


# TOSA's SINGLE_ROUND and DOUBLE_ROUND, and the rounding of TFLite's optimized kernels (requant.py)


def _pool(kind):
    def infer(ops, attrs):
        (x,) = ops
        if x.rank != 4:
            raise fail(kind, f"expects NHWC input, got {x.shape}")
        if x.quant is not None and x.quant.is_per_channel:
            raise fail(kind, "input must be quantized per tensor")
        n, h, w, c = x.shape
        (kh, kw), (sh, sw), (pt, pb, pl, pr) = attrs["kernel"], attrs["stride"], attrs["pad"]
        if max(pt, pb) >= kh or max(pl, pr) >= kw:
            raise fail(kind, f"padding {attrs['pad']} must be smaller than the kernel {attrs['kernel']}: "
                              "a window made only of padding has no value")
        oh, ow = window_output_size(h, kh, sh, 1, pt, pb), window_output_size(w, kw, sw, 1, pl, pr)
        if oh <= 0 or ow <= 0:
            raise fail(kind, f"empty output for input {x.shape}")
        if kind == "avg_pool2d" and x.quant is not None and x.dtype not in (DType.INT8, DType.INT16):
            raise fail(kind, f"expects int8/int16 codes, got {x}")
        return (TensorType((n, oh, ow, c), x.dtype, x.quant),)
    return infer


register("avg_pool2d", ("input",), kernel=REQUIRED, stride=REQUIRED, pad=(0, 0, 0, 0))(_pool("avg_pool2d"))
register("max_pool2d", ("input",), kernel=REQUIRED, stride=REQUIRED, pad=(0, 0, 0, 0))(_pool("max_pool2d"))
OPS["avg_pool2d"] = replace(OPS["avg_pool2d"], doc="Average pooling; padding is not counted (TOSA); integer rounding as TOSA.")
OPS["max_pool2d"] = replace(OPS["max_pool2d"], doc="Max pooling; padding never wins.")


@register("reduce_sum", ("input",), axis=REQUIRED)
def _reduce_sum(ops, attrs):
    """Sum along ``axis`` keeping the dim; int32 codes keep their scale."""
    (x,) = ops
    if not is_float(x):
        q = require_quantized("reduce_sum", x, DType.INT32)
        if q.is_per_channel and q.axis == attrs["axis"]:
            raise fail("reduce_sum", "can't sum along the per-channel axis")
        if any(q.zero_point):
            raise fail("reduce_sum", "int32 input must have zero point 0")
    shape = list(x.shape)
    shape[attrs["axis"]] = 1
    return (TensorType(tuple(shape), x.dtype, x.quant),)


def _reduce_extreme(kind, what):
    def infer(ops, attrs):
        (x,) = ops
        shape = list(x.shape)
        shape[attrs["axis"]] = 1
        return (unchanged_quant(kind, x, tuple(shape)),)
    infer.__doc__ = f"{what} along ``axis`` keeping the dim."
    return infer


register("reduce_max", ("input",), axis=REQUIRED)(_reduce_extreme("reduce_max", "Max"))
register("reduce_min", ("input",), axis=REQUIRED)(_reduce_extreme("reduce_min", "Min"))


def _arg_reduce(kind):
    def infer(ops, attrs):
        (x,) = ops
        axis = attrs["axis"]
        q = require_quantized(kind, x, DType.INT8, DType.INT16, DType.INT32)
        if q.is_per_channel:
            raise fail(kind, "codes quantized per channel don't compare across the axis")
        if not isinstance(axis, int) or not 0 <= axis < x.rank:
            raise fail(kind, f"axis {axis} out of range for {x.shape}")
        shape = list(x.shape)
        shape[axis] = 1
        return (TensorType(tuple(shape), DType.INT32, QuantSpec.plain_integer(DType.INT32)),)
    which = "largest" if kind == "argmax" else "smallest"
    infer.__doc__ = (f"Index of the {which} code along ``axis`` (the first one on ties), keeping the dim; "
                     "per-tensor codes in, plain int32 out.")
    return infer


register("argmax", ("input",), axis=REQUIRED)(_arg_reduce("argmax"))
register("argmin", ("input",), axis=REQUIRED)(_arg_reduce("argmin"))
