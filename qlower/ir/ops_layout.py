"""Op definitions that move data: concat, reshape, transpose, pad, slice, gather."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qlower.ir.dtypes import DType
from qlower.ir.graph import TensorType
from qlower.ir.opdefs import REQUIRED, register
from qlower.ir.type_rules import (
    fail,
    same_domain,
    unchanged_quant,
)


@register("concat", ("inputs*",), axis=REQUIRED)
def _concat(ops, attrs):
    """Concatenate along ``axis``; every operand has its own type, all in one domain."""
    (xs,) = ops
    axis = attrs["axis"]
    if not xs:
        raise fail("concat", "needs at least one operand")
    same_domain("concat", xs)
    ref = xs[0]
    for t in xs:
        if t.rank != ref.rank or any(d != e for i, (d, e) in enumerate(zip(t.shape, ref.shape)) if i != axis):
            raise fail("concat", f"shapes {ref.shape} and {t.shape} differ off axis {axis}")
    shape = list(ref.shape)
    shape[axis] = sum(t.shape[axis] for t in xs)
    if ref.quant is not None and ref.quant.is_per_channel and ref.quant.axis == axis:
        raise fail("concat", "can't concatenate along the per-channel axis")
    return (TensorType(shape, ref.dtype, ref.quant),)


@register("reshape", ("input",), shape=REQUIRED)
def _reshape(ops, attrs):
    """Row-major reshape (NHWC order)."""
    (x,) = ops
    shape = tuple(attrs["shape"])
    if int(np.prod(shape, dtype=np.int64)) != x.numel:
        raise fail("reshape", f"can't reshape {x.shape} to {shape}")
    return (unchanged_quant("reshape", x, shape),)


@register("transpose", ("input",), perm=REQUIRED)
def _transpose(ops, attrs):
    """``out.shape[i] = in.shape[perm[i]]``."""
    (x,) = ops
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise fail("transpose", f"perm {perm} is not a permutation of rank {x.rank}")
    quant = x.quant
    if quant is not None and quant.is_per_channel:
        quant = quant.with_axis(perm.index(quant.axis))
    return (TensorType(tuple(x.shape[p] for p in perm), x.dtype, quant),)


@register("pad", ("input",), pads=REQUIRED, value=0)
def _pad(ops, attrs):
    """Constant padding; ``pads`` is (before, after) per dim; value in the input's domain."""
    (x,) = ops
    pads = tuple(attrs["pads"])
    if len(pads) != 2 * x.rank or min(pads) < 0:
        raise fail("pad", f"pads {pads} must be 2 non-negative numbers per dim of {x.shape}")
    shape = tuple(d + pads[2 * i] + pads[2 * i + 1] for i, d in enumerate(x.shape))
    return (unchanged_quant("pad", x, shape),)


@register("slice", ("input",), start=REQUIRED, stop=REQUIRED, step=None)
def _slice(ops, attrs):
    """``input[start:stop:step]`` per dim (positive steps, bounds within the shape)."""
    (x,) = ops
    start, stop = tuple(attrs["start"]), tuple(attrs["stop"])
    step = tuple(attrs["step"] or (1,) * x.rank)
    if not (len(start) == len(stop) == len(step) == x.rank):
        raise fail("slice", f"start/stop/step must have one entry per dim of {x.shape}")
    shape = []
    for d, s0, s1, st in zip(x.shape, start, stop, step):
        if st < 1 or not 0 <= s0 <= s1 <= d:
            raise fail("slice", f"bad slice {s0}:{s1}:{st} of a dim of size {d}")
        shape.append(len(range(s0, s1, st)))
    quant = x.quant
    if quant is not None and quant.is_per_channel:  # keep the scales of the channels kept
        sel = slice(start[quant.axis], stop[quant.axis], step[quant.axis])
        quant = replace(quant, scale=quant.scale[sel], zero_point=quant.zero_point[sel])
    return (TensorType(tuple(shape), x.dtype, quant),)


@register("gather", ("input", "indices"), axis=REQUIRED)
def _gather(ops, attrs):
    """``numpy.take(input, indices, axis)``: ``out.shape = in.shape[:axis] + indices.shape + in.shape[axis+1:]``.
    Indices are int32 integers (scale 1, zero point 0) that must lie in ``[0, in.shape[axis])`` (anything
    else is an execution error); their type's ``[qmin, qmax]`` narrower than int32 states a proven range
    (constant indices), which backends without a run-time check rely on."""
    x, idx = ops
    axis = attrs["axis"]
    if not isinstance(axis, int) or not 0 <= axis < x.rank:
        raise fail("gather", f"axis {axis} out of range for {x.shape}")
    q = idx.quant
    if idx.dtype is not DType.INT32 or q is None or q.scale != (1.0,) or q.zero_point != (0,) or q.axis is not None \
            or q.dynamic:
        raise fail("gather", f"indices must be int32 integers (scale 1, zero point 0), got {idx}")
    shape = tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1:])
    return (unchanged_quant("gather", x, shape),)
