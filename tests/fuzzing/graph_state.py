"""The state of one random quantized graph under construction (see random_graphs.py and random_layers.py).

``GraphState`` holds the GraphBuilder, the hypothesis draws (``i``, ``pick``), the seeded NumPy
generator for bulk data, and ``bound``: for every int32 value the largest |code| it can hold,
computed from the actual constants, so that every rescale of it can be checked against TOSA
apply_scale_32's input range and every add, mul and reduction against int32. ``conv_acc`` makes
the int32 accumulator of a random convolution.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from qlower.ir import DType, GraphBuilder, QuantSpec, Value, requant

MAX_CHANNELS = 16
MAX_NUMEL = 1024


def _rescale_fits(bound: int, in_scales, out_scale: float) -> bool:
    """Whether a rescale of values with |v| <= bound is within TOSA apply_scale_32's range."""
    try:
        m = requant.requantize_ratio(np.asarray(in_scales, dtype=np.float64), out_scale)
    except requant.RequantRangeError:
        return False
    return bound < 2 ** (int(m.shift.min()) - 1) and bound < 2**31


def centered_rms(q: QuantSpec) -> float:
    """RMS of ``code - zp`` over codes uniform in [qmin, qmax]."""
    c = np.arange(q.qmin, q.qmax + 1, dtype=np.float64) - q.zero_point[0]
    return float(np.sqrt(np.mean(c * c)))


def max_centered(q: QuantSpec) -> int:
    """Largest ``|code - zp|`` over codes in [qmin, qmax] (per-tensor spec)."""
    return max(q.qmax - q.zero_point[0], q.zero_point[0] - q.qmin)


class GraphState:
    """Builder state of one graph: the GraphBuilder, the draws, and int32 bounds."""

    def __init__(self, draw, seed: int) -> None:
        self.draw = draw
        self.rng = np.random.default_rng(seed)
        self.b = GraphBuilder("fuzz")
        self.bound: dict[Value, int] = {}
        self.side: list[Value] = []
        self.floats: list[Value] = []  # exact float values a float tail may start from
        self.data: dict[Value, np.ndarray] = {}  # constant data, for bounds

    # -- draws ---------------------------------------------------------------------------
    def i(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def pick(self, options):
        return self.draw(st.sampled_from(options))

    def op(self, kind: str, *operands, **attrs):
        return self.b.op(kind, *operands, **attrs)

    def const(self, data: np.ndarray, quant: QuantSpec | None = None) -> Value:
        v = self.b.constant(data, quant)
        self.data[v] = data
        return v

    # -- quantization ----------------------------------------------------------------------
    def act_spec(self, scale: float | None = None, zp: int | None = None) -> QuantSpec:
        qmin = self.pick([-128, -128, -127])
        zp = self.i(qmin, 127) if zp is None else zp
        if scale is None:
            scale = float(np.exp(self.rng.uniform(np.log(0.005), np.log(0.2))))
        return QuantSpec.per_tensor(scale, zp, qmin=qmin)

    @staticmethod
    def real_range(q: QuantSpec) -> tuple[float, float]:
        return (q.qmin - q.zero_point[0]) * q.scale[0], (q.qmax - q.zero_point[0]) * q.scale[0]

    def domain(self, lo: float, hi: float) -> QuantSpec:
        """An observer's int8 spec covering [lo, hi] and 0."""
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = max(hi - lo, 1e-4) / 255
        return QuantSpec.per_tensor(scale, int(np.clip(round(-128 - lo / scale), -128, 127)))

    def to_int32(self, x: Value, shift_bits: int) -> Value:
        """``x`` rescaled to int32 with scale ``s_x / 2**shift_bits`` (zero point 0)."""
        return self.to_int32_scale(x, x.quant.scale[0] / 2**shift_bits)

    def to_int32_scale(self, x: Value, scale: float) -> Value:
        """``x`` rescaled to int32 codes of ``scale`` (zero point 0), with its bound."""
        y = self.op("rescale", x, out=QuantSpec.per_tensor(scale, 0, DType.INT32))
        self.bound[y] = int(np.ceil(max_centered(x.quant) * x.quant.scale[0] / scale)) + 1
        return y

    def requant(self, acc: Value, typical: float) -> Value:
        """Rescale an int32 value (``typical``: a typical |code|) to int8 with a random activation."""
        scales = np.asarray(acc.quant.scale)
        cover = max(typical, 1.0) * float(scales.mean()) * 2 ** self.rng.uniform(-1.5, 1.5)
        act = self.pick(["none", "none", "relu_folded", "relu", "relu_n", "clamp"])
        below = act == "none" or self.draw(st.booleans())
        lo = -cover if below else -cover * self.rng.uniform(0, 0.5)
        spec = self.domain(lo, cover)
        if act == "relu_folded":
            spec = QuantSpec.per_tensor(spec.scale[0], spec.zero_point[0], qmin=spec.zero_point[0])
        out = spec.scale[0]
        while not _rescale_fits(self.bound[acc], scales, out):
            out *= 2
        spec = QuantSpec.per_tensor(out, spec.zero_point[0], qmin=spec.qmin)
        y = self.op("rescale", acc, out=spec, rounding=self.pick(["single", "single", "double"]))
        zp = spec.zero_point[0]
        if act in ("relu", "relu_n") and zp < 127:
            y = self.op("clamp", y, min=zp, max=127 if act == "relu" else self.i(zp, 127))
        elif act == "clamp":
            lo_c = self.i(spec.qmin, 127)
            y = self.op("clamp", y, min=lo_c, max=self.i(lo_c, 127))
        return y

    def weights(self, shape: tuple[int, ...], per_channel: bool, fan_in: int) -> Value:
        o = shape[0]
        w = self.rng.integers(self.pick([-128, -127]), 128, shape).astype(np.int8)
        base = 1.0 / (64 * np.sqrt(fan_in))
        if per_channel:
            zps = None if self.pick([True, True, True, False]) else self.rng.integers(-8, 9, o)
            q = QuantSpec.per_channel(self.rng.uniform(0.5, 1.5, o) * base, zps)
        else:
            q = QuantSpec.per_tensor(base, self.pick([0, 0, 0, self.i(-128, 127)]))
        return self.const(w, q)

    def gemm_stats(self, x: QuantSpec, w: Value, fan_in: int) -> tuple[float, int]:
        """(typical |acc|, bound on |acc|) without bias, from the weight data."""
        data = self.data[w]
        centered = np.abs(data.astype(np.int64) - w.quant.zero_point_array(data.ndim))
        w_rms = float(np.sqrt(np.mean(centered.astype(np.float64) ** 2)))
        w_max = int(centered.reshape(centered.shape[0], -1).sum(axis=1).max())
        return np.sqrt(fan_in) * centered_rms(x) * w_rms, max_centered(x) * w_max

    def gemm(self, kind: str, x: Value, w: Value, fan_in: int, **attrs) -> tuple[Value, float]:
        """conv2d / fully_connected with an optional random bias; its accumulator bound is set."""
        typical, bound = self.gemm_stats(x.quant, w, fan_in)
        b = None
        if self.draw(st.booleans()):
            acc_q = QuantSpec.accumulator(x.quant, w.quant, 0 if w.quant.is_per_channel else None)
            hi = int(2 * typical) + 1
            b = self.const(self.rng.integers(-hi, hi, w.shape[0]).astype(np.int32), acc_q)
            bound += hi
        acc = self.op(kind, x, w, b, **attrs)
        self.bound[acc] = bound
        return acc, typical


def conv_geometry(g: GraphState, size: int) -> tuple[int, int, int, int, int]:
    """(kernel, stride, dilation, pad_before, pad_after) with a non-empty output along one axis."""
    k, s, d = g.i(1, 3), g.i(1, 3), 1
    if k > 1:
        d = g.i(1, 2)
    extent = (k - 1) * d + 1
    p0, p1 = g.i(0, extent - 1), g.i(0, extent - 1)
    if size + p0 + p1 < extent:
        k, d, p0, p1 = 1, 1, 0, 0
    return k, s, d, p0, p1


def conv_acc(g: GraphState, x: Value, groups: int | None = None, out_ch: int | None = None,
             pointwise: bool = False) -> tuple[Value, float]:
    """A conv2d of ``x`` (int32 accumulator) and a typical |code| of it."""
    n, h, w, c = x.shape
    if groups is None:
        kind = g.pick(["dense", "dense", "depthwise", "grouped"])
        divisors = [d for d in range(2, c) if c % d == 0]
        groups = 1 if kind == "dense" or c == 1 else c if kind == "depthwise" or not divisors else g.pick(divisors)
    if out_ch is None:
        out_ch = groups * g.i(1, 2) if groups == c and groups > 1 else groups * g.i(1, max(1, 8 // groups))
    geo_h = (1, 1, 1, 0, 0) if pointwise else conv_geometry(g, h)
    geo_w = (1, 1, 1, 0, 0) if pointwise else conv_geometry(g, w)
    (kh, sh, dh, pt, pb), (kw, sw, dw, pl, pr) = geo_h, geo_w
    fan_in = kh * kw * (c // groups)
    wv = g.weights((out_ch, kh, kw, c // groups), g.draw(st.booleans()), fan_in)
    return g.gemm("conv2d", x, wv, fan_in, stride=(sh, sw), dilation=(dh, dw), pad=(pt, pb, pl, pr),
                  groups=groups)
