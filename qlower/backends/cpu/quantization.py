"""Kernels that change a value's domain: rescale, quantize, dequantize, dynamic_quantize, cast, table.

Requantization multipliers and shifts come from ``qlower.ir.requant`` (never
re-derived here). ``ScaleConstants`` is the same int64 arithmetic as
``qlower.ir.requant.apply_scale_32`` written with torch tensor ops (multithreaded);
``Requantizer`` applies a whole RESCALE (optionally preceded by a GEMM's folded
per-channel offset and followed by a clamp) with the native kernel when the
channels are the last axis, else with torch ops. Tests check all of them equal
``qlower.ir.requant`` / the reference interpreter bit for bit.

quantize / dequantize / dynamic_quantize use float32 operations in the same order
as the reference (IEEE float32 multiply, divide and round-half-even are exact
operations), so they are bit-exact too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from qlower.backends.cpu import native as native_mod
from qlower.backends.cpu.context import BuildContext, Kernel, builder
from qlower.backends.cpu.tensor_utils import (
    INT32_MAX,
    INT32_MIN,
    channel_shape,
    check_int32,
    execution_error,
    param_tensor,
    torch_dtype,
)
from qlower.errors import UnsupportedOpError
from qlower.ir import DType, Op, QuantSpec, requant

_EPS = float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class ScaleConstants:
    """One ``apply_scale_32``'s constants as int64 torch tensors that broadcast against the values.

    Every number comes from ``qlower.ir.requant`` (multiplier and shift from ``quantize_multiplier``,
    the rounding terms from ``rounding_terms``, the REQUIRE bound from ``require_bound``); calling
    it is the same int64 arithmetic as ``requant.apply_scale_32``, written with torch ops.
    """

    multiplier: torch.Tensor
    shift: torch.Tensor
    round_pos: torch.Tensor
    round_neg: torch.Tensor | None   # None: the same as round_pos (single rounding)
    bound: torch.Tensor

    @classmethod
    def of(cls, multiplier: np.ndarray, shift: np.ndarray, double_round: bool = False,
           shape: tuple[int, ...] = (-1,)) -> ScaleConstants:
        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.array(a, dtype=np.int64)).reshape(shape)
        pos, neg = requant.rounding_terms(shift, double_round)
        return cls(tensor(multiplier), tensor(shift), tensor(pos), tensor(neg) if double_round else None,
                   tensor(requant.require_bound(shift)))

    def __call__(self, value: torch.Tensor, check: bool = True) -> torch.Tensor:
        """``(value * multiplier + round) >> shift``; raises RequantRangeError outside the REQUIRE
        (``check=False`` when the caller proved every possible value inside it)."""
        value = value.to(torch.int64)
        if check and value.numel() and bool(((value < -self.bound) | (value >= self.bound)).any()):
            raise requant.RequantRangeError("rescale input out of range for its shift or int32 "
                                            "(TOSA apply_scale_32 REQUIRE)")
        rnd = self.round_pos if self.round_neg is None else torch.where(value >= 0, self.round_pos, self.round_neg)
        return torch.bitwise_right_shift(value * self.multiplier + rnd, self.shift)


@dataclass(frozen=True)
class RescaleParams:
    """One RESCALE, per channel (arrays of one entry per channel) or per tensor (one entry)."""

    in_zp: np.ndarray   # int64
    mult: np.ndarray    # int64
    shift: np.ndarray   # int64
    out_zp: int
    qmin: int
    qmax: int
    out_dtype: DType
    axis: int | None
    double_round: bool

    @property
    def channels(self) -> int:
        return max(self.in_zp.size, self.mult.size)


TOSA_ROUNDINGS = ("single", "double")   # what the torch and C requantizers implement


def rescale_params(in_spec: QuantSpec, out_spec: QuantSpec, rounding: str = "single") -> RescaleParams:
    if rounding not in TOSA_ROUNDINGS:
        raise ValueError(f"the cpu requantizer has no {rounding!r} rounding")
    m = requant.requantize_ratio(np.asarray(in_spec.scale), out_spec.scale[0])
    return RescaleParams(np.asarray(in_spec.zero_point, dtype=np.int64), m.multiplier.astype(np.int64),
                         m.shift.astype(np.int64), out_spec.zero_point[0], out_spec.qmin, out_spec.qmax,
                         out_spec.dtype, in_spec.axis if in_spec.is_per_channel else None, rounding == "double")


class Requantizer:
    """``clamp(rescale(x + offset))`` for tensors of one rank, exact as the reference's op chain.

    ``offset`` (int64 per channel of the last axis) is a GEMM's folded bias and
    zero-point terms: ``x + offset`` is the true accumulator, which must fit int32
    (checked, reported against ``acc_op``). ``clamp`` is a following clamp op's
    (min, max), applied after the rescale's own [qmin, qmax].
    """

    def __init__(self, params: RescaleParams, rank: int, in_dtype: DType, op: Op,
                 native: native_mod.NativeKernels | None = None, offset: np.ndarray | None = None,
                 acc_op: Op | None = None, clamp: tuple[int, int] | None = None) -> None:
        self.params, self.op, self.acc_op = params, op, acc_op or op
        self.out_dtype = torch_dtype(params.out_dtype)
        self.in_dtype = torch_dtype(in_dtype)
        lo2, hi2 = clamp if clamp is not None else (params.qmin, params.qmax)
        self.clamp = (lo2, hi2) if clamp is not None else None
        self.has_offset = offset is not None
        axis = params.axis if params.axis is not None else (rank - 1 if offset is not None else None)
        channels = max(params.channels, 1 if offset is None else offset.size)
        rp, rn = requant.rounding_terms(params.shift, params.double_round)
        half = requant.require_bound(params.shift)
        arrays = [np.zeros(1, np.int64) if offset is None else offset.astype(np.int64),
                  params.in_zp, params.mult, params.shift, half, rp, rn]
        # Native path: channels along the last axis (or none), integer types it implements.
        self.native = native if (native is not None and native.can_rescale(self.in_dtype, self.out_dtype)
                                 and (channels == 1 or axis == rank - 1)) else None
        self.channels = channels
        # The native kernel's parameters repeat with a period of whole channel rows, >= 256 values when
        # there are channels, so that its vector loop stays long even for 8 or 16 channels.
        self.period = channels * -(-256 // channels) if channels > 1 else 1
        self.chan = torch.from_numpy(np.concatenate(
            [np.tile(np.broadcast_to(a, (channels,)), self.period // channels) for a in arrays]).astype(np.int64))
        # One period of exactly one row of channels, for kernels that walk channels themselves (depthwise).
        self.chan_row = torch.from_numpy(np.concatenate([np.broadcast_to(a, (channels,)) for a in arrays]).astype(np.int64))
        self.scalars = torch.tensor([params.out_zp, params.qmin, params.qmax, lo2, hi2, int(offset is not None)],
                                    dtype=torch.int64)
        shape = channel_shape(rank, axis, channels)
        self.offset_t, self.zp_t = (torch.from_numpy(np.broadcast_to(a, (channels,)).astype(np.int64).copy())
                                    .reshape(shape) for a in arrays[:2])
        self.scale = ScaleConstants.of(params.mult, params.shift, params.double_round,
                                       channel_shape(rank, axis, params.mult.size))
        self.any_zp = bool(np.any(params.in_zp))
        # The REQUIRE check is skipped only when the input's whole range provably satisfies it.
        lo = INT32_MIN if offset is not None else in_dtype.min
        hi = INT32_MAX if offset is not None else in_dtype.max
        half = int(requant.require_bound(params.shift.min()))
        self.check_range = not (lo - int(params.in_zp.max()) >= -half and hi - int(params.in_zp.min()) < half)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None and x.dtype == self.in_dtype:
            x = x.contiguous()
            out = torch.empty(x.shape, dtype=self.out_dtype)
            flags = self.native.rescale(x, self.period, self.chan, self.scalars, out)
            if flags:
                self._raise(flags)
            return out
        return self.torch_path(x)

    def torch_path(self, x: torch.Tensor) -> torch.Tensor:
        v = x.to(torch.int64)
        if self.has_offset:
            v = v + self.offset_t
            check_int32(self.acc_op, v)
        if self.any_zp:
            v = v - self.zp_t
        try:
            v = self.scale(v, check=self.check_range)
        except requant.RequantRangeError as e:
            raise execution_error(self.op, str(e)) from None
        v += self.params.out_zp
        v.clamp_(self.params.qmin, self.params.qmax)
        if self.clamp is not None:
            v.clamp_(*self.clamp)
        return v.to(self.out_dtype)

    def _raise(self, flags: int) -> None:
        if flags & native_mod.FLAG_INT32:
            raise execution_error(self.acc_op, "overflows int32 (accumulator out of range)")
        raise execution_error(self.op, "rescale input out of range for its shift or int32 "
                                       "(TOSA apply_scale_32 REQUIRE)")


@builder("rescale")
def _rescale(op: Op, ctx: BuildContext) -> Kernel:
    src = op.operands[0].type
    if op.attrs["rounding"] not in TOSA_ROUNDINGS:   # TFLite's optimized rounding: the reference's own code
        out = op.attrs["out"]
        mult = requant.requantize_ratio(np.asarray(src.quant.scale), out.scale[0])

        def run(x: torch.Tensor) -> torch.Tensor:
            codes = requant.rescale(x.numpy(), np.asarray(src.quant.zero_point), out.zero_point[0], mult,
                                    out.qmin, out.qmax, axis=src.quant.axis, rounding=op.attrs["rounding"])
            return torch.from_numpy(codes.astype(out.dtype.numpy))
        return run
    params = rescale_params(src.quant, op.attrs["out"], op.attrs["rounding"])
    return Requantizer(params, src.rank, src.dtype, op, ctx.native)


@builder("quantize")
def _quantize(op: Op, ctx: BuildContext) -> Kernel:
    q: QuantSpec = op.attrs["out"]
    rank = op.result.type.rank
    inv = param_tensor((1.0 / np.asarray(q.scale, dtype=np.float64)).astype(np.float32),
                       channel_shape(rank, q.axis, len(q.scale)), np.float32)
    zp = param_tensor(q.zero_point, channel_shape(rank, q.axis, len(q.zero_point)), np.float32)
    dtype = torch_dtype(q.dtype)
    wide = max(abs(q.qmin), abs(q.qmax)) > 2**24  # clip where the bounds are exact, as the reference
    if ctx.native is not None and dtype == torch.int8 and len(q.scale) == 1 and len(q.zero_point) == 1:
        params = torch.cat([inv.reshape(1), zp.reshape(1), torch.tensor([q.qmin, q.qmax], dtype=torch.float32)])
        native = ctx.native

        def run_native(x: torch.Tensor) -> torch.Tensor:  # the same float32 operations (_native.c)
            out = torch.empty(op.result.shape, dtype=torch.int8)
            if not native.quantize(x.to(torch.float32).contiguous(), params, out):
                raise execution_error(op, "can't quantize NaN")
            return out
        return run_native

    def run(x: torch.Tensor) -> torch.Tensor:
        y = torch.round(x * inv) + zp
        if bool(torch.isnan(y).any()):
            raise execution_error(op, "can't quantize NaN")
        return (y.to(torch.float64) if wide else y).clamp_(q.qmin, q.qmax).to(dtype)
    return run


class Dequantizer:
    """``(x - zp) * scale [* runtime_scale]`` in float32 in the reference's order.

    ``x - zp`` is exact (int64, or float32 for int8/int16 codes, whose differences
    are below 2**24) and rounded to float32 once, like the reference.
    """

    def __init__(self, spec: QuantSpec, rank: int, dtype: DType) -> None:
        shape = channel_shape(rank, spec.axis, len(spec.zero_point))
        self.small = dtype in (DType.INT8, DType.UINT8, DType.INT16)
        self.zp = param_tensor(spec.zero_point, shape, np.float32 if self.small else np.int64)
        self.any_zp = any(spec.zero_point)
        self.scale = param_tensor(np.asarray(spec.scale, dtype=np.float64).astype(np.float32),
                                  channel_shape(rank, spec.axis, len(spec.scale)), np.float32)

    def centered(self, x: torch.Tensor) -> torch.Tensor:
        if self.small:
            return x.to(torch.float32) - self.zp if self.any_zp else x.to(torch.float32)
        return (x.to(torch.int64) - self.zp).to(torch.float32) if self.any_zp else x.to(torch.float32)

    def __call__(self, x: torch.Tensor, runtime_scale: torch.Tensor | None = None) -> torch.Tensor:
        s = self.scale if runtime_scale is None else runtime_scale * self.scale
        return self.centered(x) * s


@builder("dequantize")
def _dequantize(op: Op, ctx: BuildContext) -> Kernel:
    src = op.operands[0].type
    return Dequantizer(src.quant, src.rank, src.dtype)


def dynamic_scale(x: torch.Tensor, granularity: str, qmax: int) -> torch.Tensor:
    """``max(max|x| / qmax, eps)`` in float32, per tensor or per row (as the reference)."""
    if x.numel() == 0:
        shape = (1,) * x.dim() if granularity == "per_tensor" else tuple(x.shape[:-1]) + (1,)
        amax = torch.zeros(shape, dtype=torch.float32)
    elif granularity == "per_tensor":
        amax = x.abs().amax().reshape((1,) * x.dim())
    else:
        amax = x.abs().amax(dim=-1, keepdim=True)
    return torch.clamp_min(amax / float(qmax), _EPS)


def dynamic_codes(x: torch.Tensor, scale: torch.Tensor, qmax: int, dtype: torch.dtype, op: Op) -> torch.Tensor:
    y = torch.round(x / scale)
    if bool(torch.isnan(y).any()):
        raise execution_error(op, "can't quantize NaN")
    return y.clamp_(-qmax, qmax).to(dtype)


@builder("dynamic_quantize")
def _dynamic_quantize(op: Op, ctx: BuildContext) -> Kernel:
    g, qmax, dtype = op.attrs["granularity"], op.attrs["qmax"], torch_dtype(op.attrs["dtype"])

    def run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = dynamic_scale(x, g, qmax)
        return dynamic_codes(x, scale, qmax, dtype, op), scale
    return run


@builder("cast")
def _cast(op: Op, ctx: BuildContext) -> Kernel:
    src, out = op.operands[0].type, op.result.type
    if out.dtype is DType.BOOL:  # the reference has no meaning for it either
        raise UnsupportedOpError(f"cast to bool (%{op.result.name}) is not supported")
    dtype = torch_dtype(out.dtype)
    if out.dtype.is_float:
        return lambda x: x.to(torch.float32)
    lo, hi = out.dtype.min, out.dtype.max
    if src.dtype.is_float:
        def run(x: torch.Tensor) -> torch.Tensor:
            y = torch.round(x.to(torch.float64)).clamp_(lo, hi)  # float64: int32's bounds are exact
            if bool(torch.isnan(y).any()):
                raise execution_error(op, f"can't cast NaN to {out.dtype.value}")
            return y.to(dtype)
        return run
    return lambda x: x.to(torch.int64).clamp_(lo, hi).to(dtype)


@builder("table_interp")
def _table_interp(op: Op, ctx: BuildContext) -> Kernel:
    table = torch.from_numpy(np.asarray(op.attrs["table"]).astype(np.int64))

    def run(x: torch.Tensor) -> torch.Tensor:   # the reference's arithmetic, in int64
        v = x.to(torch.int64).clamp_(-32768, 32767) + 32768
        i = v >> 7
        base = table[i]
        return ((base << 7) + (table[i + 1] - base) * (v & 127)).to(torch.int32)
    return run


@builder("table")
def _table(op: Op, ctx: BuildContext) -> Kernel:
    table = torch.from_numpy(np.asarray(op.attrs["table"]).astype(op.result.type.dtype.numpy))
    offset = int(op.attrs["offset"])
    last = table.numel() - 1
    return lambda x: table[(x.to(torch.int64) + offset).clamp_(0, last)]  # nearest entry, as the reference
