"""The exporter's building blocks: a graph under construction and exact integer arithmetic in TFLite ops.

TFLite's quantized kernels fuse requantization into the op that produces a
tensor, while qlower's IR (like TOSA) writes it as explicit int32 arithmetic and
``rescale``. Where a fused TFLite kernel computes exactly the IR's numbers,
``export.py`` uses it. Everything else is written here with TFLite's *plain*
integer kernels (int32/int64 ADD, SUB, MUL, FLOOR_MOD, MAXIMUM, MINIMUM, CAST),
which compute exact integer arithmetic, so the result is the reference's by
construction. TFLite has no int64 shift or division; ``floor_shift`` divides by
``2**s`` exactly anyway: it first subtracts the remainder (FLOOR_MOD), which
leaves ``k * 2**s``, and a float32 holds that exactly while ``|k| < 2**24`` (a
power-of-two multiple of a 24-bit integer), so a float multiply by ``2**-s``
and a cast give ``k``; wider results are split into two 16-bit limbs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
from tflite.BuiltinOperator import BuiltinOperator as Op
from tflite.BuiltinOptions import BuiltinOptions

from qlower.backends.litert.flatbuffer import TFLITE_TYPES, ModelWriter, Quant, table
from qlower.ir import TensorType

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT_EXACT = 2**24   # integers below this are exact in float32


class NotExact(Exception):
    """The exporter can't write an exact TFLite form of an op (the message says why)."""


def options(name: str, **fields: int) -> Callable[[flatbuffers.Builder], tuple[int, int]]:
    """Builder of the ``{name}`` options table (e.g. ``Conv2DOptions``) with CamelCase ``fields``."""
    def build(b: flatbuffers.Builder) -> tuple[int, int]:
        return getattr(BuiltinOptions, name), table(b, name, **fields)
    return build


def tflite_quant(t: TensorType) -> Quant | None:
    """TFLite quantization of an IR tensor that a quantized TFLite kernel reads or writes (int8/int16)."""
    q = t.quant
    if q is None or t.dtype.value not in ("int8", "int16") or q.dynamic:
        return None
    return Quant(tuple(float(np.float32(s)) for s in q.scale), tuple(int(z) for z in q.zero_point),
                 q.axis if q.axis is not None else 0)


@dataclass
class Builder:
    """A TFLite subgraph under construction: named tensors and operators."""

    writer: ModelWriter = field(default_factory=ModelWriter)
    _names: set[str] = field(default_factory=set)

    def tensor(self, name: str, shape, dtype: str, quant: Quant | None = None, data=None) -> int:
        unique, k = name, 1
        while unique in self._names:
            unique, k = f"{name}:{k}", k + 1
        self._names.add(unique)
        return self.writer.tensor(unique, shape, dtype, quant, data)

    def const(self, name: str, data, dtype: str, quant: Quant | None = None) -> int:
        arr = np.asarray(data)
        return self.tensor(name, arr.shape, dtype, quant, arr)

    def shape(self, t: int) -> tuple[int, ...]:
        return self.writer.tensors[t].shape

    def dtype(self, t: int) -> str:
        return self.writer.tensors[t].dtype

    def op(self, code: int, inputs, out_name: str, shape, dtype: str, quant: Quant | None = None,
           opts=None) -> int:
        out = self.tensor(out_name, shape, dtype, quant)
        self.writer.operator(code, inputs, [out], opts)
        return out

    # -- elementwise helpers on plain tensors ---------------------------------------------------
    def binary(self, code: int, a: int, b: int, name: str, dtype: str | None = None,
               quant: Quant | None = None) -> int:
        shape = np.broadcast_shapes(self.shape(a), self.shape(b))
        opts = {Op.ADD: options("AddOptions"), Op.SUB: options("SubOptions"),
                Op.MUL: options("MulOptions")}.get(code)
        return self.op(code, [a, b], name, shape, dtype or self.dtype(a), quant, opts)

    def binary_const(self, code: int, a: int, value, name: str, quant: Quant | None = None) -> int:
        """``a <op> value`` with ``value`` a constant of ``a``'s dtype (broadcast)."""
        c = self.const(f"{name}/c", value, self.dtype(a), quant)
        return self.binary(code, a, c, name, quant=quant)

    def cast(self, a: int, dtype: str, name: str, quant: Quant | None = None) -> int:
        if self.dtype(a) == dtype and quant is None:
            return a
        opts = options("CastOptions", InDataType=TFLITE_TYPES[self.dtype(a)], OutDataType=TFLITE_TYPES[dtype])
        return self.op(Op.CAST, [a], name, self.shape(a), dtype, quant, opts)

    def clamp(self, a: int, lo, hi, name: str, quant: Quant | None = None) -> int:
        """``min(max(a, lo), hi)`` (constants broadcast); a bound outside ``a``'s dtype is left out."""
        dt = np.dtype(self.dtype(a))
        info = np.iinfo(dt) if dt.kind in "iu" else None
        lo, hi = np.asarray(lo), np.asarray(hi)
        if info is None or np.any(lo > info.min):
            a = self.binary_const(Op.MAXIMUM, a, lo.astype(dt), f"{name}/max", quant)
        if info is None or np.any(hi < info.max):
            a = self.binary_const(Op.MINIMUM, a, hi.astype(dt), f"{name}/min", quant)
        return a


def channel_shape(values, rank: int, axis: int | None) -> np.ndarray:
    """Per-channel ``values`` shaped to broadcast along ``axis`` of a rank-``rank`` tensor (scalars stay 0-d)."""
    v = np.asarray(values)
    if v.size == 1 or axis is None:
        return v.reshape(())
    shape = [1] * rank
    shape[axis] = v.size
    return v.reshape(shape)


def floor_shift(b: Builder, p: int, shift: np.ndarray, lo: np.ndarray, hi: np.ndarray, name: str) -> int:
    """int32 ``clamp(floor(p / 2**shift), lo, hi)`` of an int64 tensor ``p`` (module doc).

    ``shift``, ``lo`` and ``hi`` are integer arrays broadcastable to ``p`` (per channel)."""
    shift = np.asarray(shift, dtype=np.int64)
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    if np.any(shift < 0) or np.any(shift > 62):
        raise NotExact(f"shift {int(shift.max())} is outside [0, 62]")
    scale = np.left_shift(np.int64(1), shift)
    if np.all(shift > 0):
        remainder = b.binary_const(Op.FLOOR_MOD, p, scale, f"{name}/mod")
        p = b.binary(Op.SUB, p, remainder, f"{name}/floor")
    # clamp while still scaled: bounds beyond int64 can't be reached, so they are capped there
    lo_s, hi_s = _scaled_bound(lo, shift), _scaled_bound(hi, shift)
    p = b.clamp(p, lo_s, hi_s, f"{name}/clamp")
    reach = np.maximum(np.abs(lo), np.abs(hi))                    # largest |k| after the clamp
    reach = np.minimum(reach, np.right_shift(np.int64(INT64_MAX), shift) + 1)
    if np.all(reach < FLOAT_EXACT):
        return _exact_quotient(b, p, shift, name)
    if np.any(shift + 16 > 62):
        raise NotExact(f"a quotient of up to {int(reach.max())} with shift {int(shift.max())} has no exact split")
    low = b.binary_const(Op.FLOOR_MOD, p, np.left_shift(np.int64(1), shift + 16), f"{name}/lowmod")
    high = b.binary(Op.SUB, p, low, f"{name}/high")
    k_low = _exact_quotient(b, low, shift, f"{name}/lo")
    k_high = _exact_quotient(b, high, shift + 16, f"{name}/hi")
    k_high = b.binary_const(Op.MUL, k_high, np.int32(1 << 16), f"{name}/hi16")
    return b.binary(Op.ADD, k_high, k_low, f"{name}/join")


def _scaled_bound(bound: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``bound * 2**shift`` (broadcast), capped to int64: a bound beyond int64 can't be reached."""
    bound, shift = np.broadcast_arrays(bound, shift)
    scaled = [min(max(int(v) << int(s), INT64_MIN), INT64_MAX) for v, s in zip(bound.flat, shift.flat)]
    return np.asarray(scaled, dtype=np.int64).reshape(bound.shape)


def _exact_quotient(b: Builder, p: int, shift: np.ndarray, name: str) -> int:
    """int32 ``p / 2**shift`` for an int64 ``p`` that is ``k * 2**shift`` with ``|k| < 2**24``."""
    f = b.cast(p, "float32", f"{name}/f32")
    f = b.binary_const(Op.MUL, f, np.exp2(-shift.astype(np.float64)).astype(np.float32), f"{name}/unscale")
    return b.cast(f, "int32", f"{name}/i32")


ROUNDING_MAGIC = 1.5 * 2**23   # float32 x + M - M rounds x half to even while |x| <= 2**22


def round_half_even(b: Builder, x: int, lo: np.ndarray, hi: np.ndarray, offset: np.ndarray, name: str) -> int:
    """float32 ``round_half_even(x) + offset`` for the integers ``[lo, hi]`` that matter (below or above
    them the result only needs to stay below or above: it is clamped afterwards).

    LiteRT's reference kernels have no ROUND, and float32 addition rounds half to even: after a clamp
    to ``[lo - 1, hi + 1]`` (which keeps every result that the later clamp doesn't change),
    ``(x + M) - (M - offset)`` is exact (both sums are integers near M)."""
    lo, hi, offset = np.asarray(lo, np.float64), np.asarray(hi, np.float64), np.asarray(offset, np.float64)
    if np.any(np.abs(lo) > 2**21) or np.any(np.abs(hi) > 2**21) or np.any(np.abs(offset) > 2**21):
        raise NotExact("rounding to integers beyond 2**21 has no exact float32 form")
    x = b.clamp(x, (lo - 1).astype(np.float32), (hi + 1).astype(np.float32), f"{name}/bound")
    x = b.binary_const(Op.ADD, x, np.float32(ROUNDING_MAGIC), f"{name}/magic")
    return b.binary_const(Op.SUB, x, (ROUNDING_MAGIC - offset).astype(np.float32), f"{name}/rint")


def rescale(b: Builder, x: int, in_zp: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, out_zp: int,
            qmin: int, qmax: int, out_dtype: str, name: str, out_quant: Quant | None = None,
            double_round: bool = False) -> int:
    """``requant.rescale`` (TOSA RESCALE with single or double rounding, clamp) of the codes in ``x``, exactly.

    Per-channel arrays must already be shaped to broadcast (``channel_shape``)."""
    multiplier, shift = np.asarray(multiplier, np.int64), np.asarray(shift, np.int64)
    in_zp = np.asarray(in_zp, np.int64)
    power = multiplier * np.exp2(-shift.astype(np.float64))
    narrow = b.dtype(x) in ("int8", "int16", "uint8")
    identity = np.all(power == 1) and not np.any(in_zp) and out_zp == 0
    exact_power = np.all(power == np.round(power)) and np.all(power >= 1) and np.all(power < 2**15)
    if exact_power and (narrow or identity):   # (double rounding adds nothing: there is no fraction)
        # an integer ratio 2**k (the zero-point removal of a widening rescale): no rounding at all
        v = b.cast(x, "int32", f"{name}/i32")
        if np.any(in_zp != 0):
            v = b.binary_const(Op.SUB, v, in_zp.astype(np.int32), f"{name}/center")
        if np.any(power != 1):
            v = b.binary_const(Op.MUL, v, power.astype(np.int32), f"{name}/scale")
        if out_zp:
            v = b.binary_const(Op.ADD, v, np.int32(out_zp), f"{name}/zp")
    else:
        v = b.cast(x, "int64", f"{name}/i64")
        if np.any(in_zp != 0):
            v = b.binary_const(Op.SUB, v, in_zp, f"{name}/center")
        centered = v
        v = b.binary_const(Op.MUL, v, multiplier, f"{name}/mul")
        v = b.binary_const(Op.ADD, v, np.left_shift(np.int64(1), shift - 1), f"{name}/round")
        if double_round and np.any(shift > 31):
            # TOSA DOUBLE_ROUND: a further +2**30 for values >= 0 and -2**30 below, where shift > 31
            zero = b.const(f"{name}/0", np.int64(0), "int64")
            sign = b.binary(Op.GREATER_EQUAL, centered, zero, f"{name}/nonneg", dtype="bool")
            extra = b.binary_const(Op.MUL, b.cast(sign, "int64", f"{name}/nonneg64"),
                                   np.where(shift > 31, np.int64(1 << 31), np.int64(0)), f"{name}/up")
            v = b.binary(Op.ADD, v, extra, f"{name}/double")
            v = b.binary_const(Op.SUB, v, np.where(shift > 31, np.int64(1 << 30), np.int64(0)), f"{name}/down")
        v = floor_shift(b, v, shift, np.int64(qmin - out_zp), np.int64(qmax - out_zp), name)
        if out_zp:
            v = b.binary_const(Op.ADD, v, np.int32(out_zp), f"{name}/zp")
    v = b.clamp(v, np.int32(qmin), np.int32(qmax), f"{name}/range")
    return b.cast(v, out_dtype, name, out_quant) if out_dtype != "int32" or out_quant is not None else v


def tflite_multiplier(real: float) -> tuple[int, int]:
    """TFLite's ``QuantizeMultiplier`` of a double: (q31 multiplier, left shift), as its kernels compute it."""
    if real == 0.0:
        return 0, 0
    mant, exp = np.frexp(np.float64(real))
    q = int(np.round(np.float64(mant) * (1 << 31)))   # half away from zero; mant > 0 here
    if q == 1 << 31:
        q //= 2
        exp += 1
    if exp < -31:
        return 0, 0
    return q, int(exp)


def same_multiplier(ratio_real: np.ndarray, ir_multiplier: np.ndarray, ir_shift: np.ndarray) -> bool:
    """Whether TFLite's multiplier for each ``ratio_real`` (computed from float32 scales) is the IR's."""
    for r, m, s in zip(np.atleast_1d(ratio_real), np.atleast_1d(ir_multiplier), np.atleast_1d(ir_shift)):
        q, e = tflite_multiplier(float(r))
        if q == 0 or not -31 < e <= 30 or q != int(m) or 31 - e != int(s):
            return False
    return True
