"""The layers of random quantized graphs: one small function per pattern (see random_graphs.py beside it).

Each layer takes the ``GraphState`` and an int8 NHWC activation whose codes lie within its
type's [qmin, qmax], and returns another such activation, emitting ops through the state's
GraphBuilder. Structural choices are hypothesis draws (``g.i``, ``g.pick``); bulk data comes
from ``g.rng``. Every int32 value gets an entry in ``g.bound`` (max |code|, computed from the
actual constants), from which every rescale of it is checked against TOSA apply_scale_32's
input range and every add, mul and reduction against int32: the reference interpreter never
fails on these graphs, whatever the inputs within the types.
"""

from __future__ import annotations

from collections.abc import Callable

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


def _centered_rms(q: QuantSpec) -> float:
    """RMS of ``code - zp`` over codes uniform in [qmin, qmax]."""
    c = np.arange(q.qmin, q.qmax + 1, dtype=np.float64) - q.zero_point[0]
    return float(np.sqrt(np.mean(c * c)))


def _max_centered(q: QuantSpec) -> int:
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
        self.bound[y] = int(np.ceil(_max_centered(x.quant) * x.quant.scale[0] / scale)) + 1
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
        return np.sqrt(fan_in) * _centered_rms(x) * w_rms, _max_centered(x) * w_max

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


Layer = Callable[[GraphState, Value], Value]
LAYERS: dict[str, Layer] = {}


def layer(name: str):
    def wrap(fn: Layer) -> Layer:
        LAYERS[name] = fn
        return fn
    return wrap


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


@layer("conv")
def _conv(g: GraphState, x: Value) -> Value:
    if g.pick([False, False, False, True]):  # int16 activations (a narrow range keeps int32 exact)
        x = g.op("rescale", x, out=QuantSpec.per_tensor(x.quant.scale[0] / 8, g.i(-100, 100), DType.INT16,
                                                         qmin=-2048, qmax=2047))
    return g.requant(*conv_acc(g, x))


@layer("rescale")
def _rescale(g: GraphState, x: Value) -> Value:
    q = x.quant
    via = g.pick([DType.INT8, DType.INT8, DType.INT16, DType.UINT8])
    ratio = 2.0 ** g.rng.uniform(-6, 6)
    rounding = g.pick(["single", "single", "double"])
    if via is DType.INT8:
        return g.op("rescale", x, out=g.act_spec(q.scale[0] / ratio), rounding=rounding)
    lo, hi = (-(2**15), 2**15 - 1) if via is DType.INT16 else (0, 255)
    zp = g.i(lo, hi) if via is DType.UINT8 else g.pick([0, 0, g.i(-1000, 1000)])
    mid = g.op("rescale", x, out=QuantSpec.per_tensor(q.scale[0] / ratio / (256 if via is DType.INT16 else 1),
                                                      zp, via), rounding=rounding)
    return g.op("rescale", mid, out=g.act_spec(), rounding=g.pick(["single", "double"]))


@layer("clamp")
def _clamp(g: GraphState, x: Value) -> Value:
    q = x.quant
    lo = g.pick([min(max(q.zero_point[0], q.qmin), q.qmax), g.i(q.qmin, q.qmax)])
    return g.op("clamp", x, min=lo, max=g.i(lo, q.qmax))


def _branch(g: GraphState, x: Value, same_channels: bool) -> Value:
    kind = g.pick(["same", "rescale", "clamp", "conv1x1" if not same_channels else "max_pool"])
    if kind == "rescale":
        return _rescale(g, x)
    if kind == "clamp":
        return _clamp(g, x)
    if kind == "max_pool":
        return g.op("max_pool2d", x, kernel=(1, 1), stride=(1, 1))
    if kind == "conv1x1":
        return g.requant(*conv_acc(g, x, groups=1, out_ch=g.i(1, 4), pointwise=True))
    return x


@layer("concat")
def _concat(g: GraphState, x: Value) -> Value:
    axis, nb, c = g.pick([3, 3, 0, 1, 2]), g.i(1, 2), x.shape[3]
    if axis == 3 and c + nb * max(c, 4) > MAX_CHANNELS:
        axis = g.i(0, 2)
    if x.type.numel // c * max(c, 4) * (1 + nb) > MAX_NUMEL:
        return x
    branches = [x] + [_branch(g, x, axis != 3) for _ in range(nb)]
    if g.draw(st.booleans()):
        ranges = [g.real_range(v.quant) for v in branches]
        spec = g.domain(min(r[0] for r in ranges), max(r[1] for r in ranges))
    else:
        spec = x.quant
    order = g.draw(st.permutations(range(len(branches))))
    ins = tuple(v if v.quant == spec else g.op("rescale", v, out=spec) for v in (branches[i] for i in order))
    return g.op("concat", ins, axis=axis)


def _broadcast_shape(g: GraphState, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d if g.draw(st.booleans()) else 1 for d in shape)


@layer("elementwise")
def _elementwise(g: GraphState, x: Value) -> Value:
    kind = g.pick(["add_const", "sub_const", "mul_const", "div_const", "add", "sub", "mul"])
    k = g.i(0, 10) if kind != "mul" else g.i(0, 2)
    if kind.endswith("_const"):
        a = g.to_int32(x, k)
        cshape = _broadcast_shape(g, x.shape)
        if kind == "div_const":  # by nonzero constants only: the reference refuses division by zero
            d = g.rng.integers(1, 10, cshape) * g.rng.choice([-1, 1], cshape)
            y = g.op("intdiv", a, g.const(d.astype(np.int32), QuantSpec.per_tensor(2.0 ** -g.i(0, 3), 0, DType.INT32)))
            g.bound[y] = g.bound[a]
        elif kind == "mul_const":
            axis = g.pick([3, 3, 1, None])
            axis = None if axis is None or cshape[axis] == 1 else axis
            n = cshape[axis] if axis is not None else 1
            cq = QuantSpec(DType.INT32, tuple(g.rng.uniform(1e-3, 1e-2, n)), (0,) * n, DType.INT32.min,
                           DType.INT32.max, axis=axis)
            cmax = g.pick([1, 30, 300])
            c = g.const(g.rng.integers(-cmax, cmax + 1, cshape).astype(np.int32), cq)
            shift = g.i(0, 8)
            y = g.op("mul", *((a, c) if g.draw(st.booleans()) else (c, a)), shift=shift)
            g.bound[y] = (g.bound[a] * cmax >> shift) + 1
        else:
            cmax = g.bound[a]
            c = g.const(g.rng.integers(-cmax, cmax + 1, cshape).astype(np.int32), a.quant)
            y = g.op(kind[:3], *((a, c) if g.draw(st.booleans()) else (c, a)))
            g.bound[y] = g.bound[a] + cmax
    else:
        other = _branch(g, x, True)
        if g.draw(st.booleans()):  # broadcast two activations: a reduced branch
            other = g.op("reduce_max", other, axis=g.i(0, 3))
        if kind == "mul":
            a, b = g.to_int32(x, k), g.to_int32(other, 0)
            shift = g.i(0, 8)
            y = g.op("mul", a, b, shift=shift)
            g.bound[y] = (g.bound[a] * g.bound[b] >> shift) + 1
        else:  # both operands rescaled to one int32 scale, finer than either
            s = min(x.quant.scale[0], other.quant.scale[0]) / 2**k
            a, b = g.to_int32_scale(x, s), g.to_int32_scale(other, s)
            y = g.op(kind, *((a, b) if g.draw(st.booleans()) else (b, a)))
            g.bound[y] = g.bound[a] + g.bound[b]
    # per-channel results (mul by a per-channel constant) are rescaled per channel
    typical = max(1.0, g.bound[y] / 4)
    return g.requant(y, typical)


def _factor_shape(g: GraphState, numel: int, rank: int) -> tuple[int, ...]:
    dims = [1] * rank
    n, p = numel, 2
    while n > 1:
        while n % p == 0:
            dims[int(g.rng.integers(rank))] *= p
            n //= p
        p += 1
    return tuple(dims)


@layer("layout")
def _layout(g: GraphState, x: Value) -> Value:
    v = x
    for _ in range(g.i(1, 3)):
        if g.draw(st.booleans()):
            v = g.op("transpose", v, perm=tuple(g.draw(st.permutations(range(v.type.rank)))))
        else:
            v = g.op("reshape", v, shape=_factor_shape(g, v.type.numel, g.i(2, 5)))
    shape = x.shape if g.draw(st.booleans()) else _factor_shape(g, x.type.numel, 4)
    if shape[3] > MAX_CHANNELS:
        shape = x.shape
    return g.op("reshape", v, shape=shape) if v.shape != shape else v


@layer("pad")
def _pad(g: GraphState, x: Value) -> Value:
    pads = tuple(g.i(0, 1 if i < 2 else 2) for i in range(8))
    grown = np.prod([d + pads[2 * i] + pads[2 * i + 1] for i, d in enumerate(x.shape)])
    if grown > MAX_NUMEL or x.shape[3] + pads[6] + pads[7] > MAX_CHANNELS:
        return x
    q = x.quant
    value = g.pick([min(max(q.zero_point[0], q.qmin), q.qmax), q.qmin, q.qmax, g.i(q.qmin, q.qmax)])
    return g.op("pad", x, pads=pads, value=value)


@layer("slice")
def _slice(g: GraphState, x: Value) -> Value:
    start, stop, step = [], [], []
    for d in x.shape:
        a = g.i(0, d - 1)
        start.append(a)
        stop.append(g.i(a + 1, d))
        step.append(g.i(1, 3))
    return g.op("slice", x, start=tuple(start), stop=tuple(stop), step=tuple(step))


@layer("pool")
def _pool(g: GraphState, x: Value) -> Value:
    kind = g.pick(["avg_pool2d", "max_pool2d"])
    kh, kw = g.i(1, min(3, x.shape[1])), g.i(1, min(3, x.shape[2]))
    pad = (g.i(0, kh - 1), g.i(0, kh - 1), g.i(0, kw - 1), g.i(0, kw - 1))
    return g.op(kind, x, kernel=(kh, kw), stride=(g.i(1, 3), g.i(1, 3)), pad=pad)


@layer("reduce")
def _reduce(g: GraphState, x: Value) -> Value:
    axis = g.i(0, 3)
    if g.draw(st.booleans()):
        return g.op("reduce_max", x, axis=axis)
    a = g.to_int32(x, g.i(0, 8))
    y = g.op("reduce_sum", a, axis=axis)
    g.bound[y] = g.bound[a] * x.shape[axis]
    return g.requant(y, g.bound[a] / 3 * np.sqrt(x.shape[axis]))


@layer("table")
def _table(g: GraphState, x: Value) -> Value:
    kind = g.pick(["int8", "int8", "to_int16", "from_int16"])
    if kind == "from_int16":
        r = g.i(1, 4) * 250
        x = g.op("rescale", x, out=QuantSpec.per_tensor(x.quant.scale[0] / 8, g.i(-50, 50), DType.INT16,
                                                         qmin=-r, qmax=r))
    q = x.quant
    out = g.act_spec() if kind != "to_int16" else QuantSpec.per_tensor(1 / 2**10, 0, DType.INT16)
    size = q.qmax - q.qmin + 1
    values = g.rng.integers(out.qmin, out.qmax, size, endpoint=True)
    if g.draw(st.booleans()):  # monotonic, like a quantized activation function
        values = np.sort(values)
    y = g.op("table", x, table=values.astype(out.dtype.numpy), offset=-q.qmin, out=out)
    return g.op("rescale", y, out=g.act_spec()) if kind == "to_int16" else y


@layer("gemm")
def _gemm(g: GraphState, x: Value) -> Value:
    n, h, w, c = x.shape
    kind = g.pick(["fc", "fc_2d", "matmul_const", "matmul"])
    if kind.startswith("fc"):
        v = g.op("reshape", x, shape=(n * h * w, c)) if kind == "fc_2d" else x
        nout = g.i(1, 8)
        wv = g.weights((nout, c), g.draw(st.booleans()), c)
        acc, typical = g.gemm("fully_connected", v, wv, c)
        return g.op("reshape", g.requant(acc, typical), shape=(n, h, w, nout))
    a = g.op("reshape", x, shape=(n, h * w, c))
    if kind == "matmul" and h * w <= MAX_CHANNELS:
        other = g.op("reshape", _rescale(g, x), shape=(n, h * w, c))
        bv = g.op("transpose", other, perm=(0, 2, 1))
        m = h * w
    else:
        m = g.i(1, 8)
        bq = QuantSpec.per_tensor(1 / (64 * np.sqrt(c)), g.pick([0, g.i(-128, 127)]))
        bv = g.const(g.rng.integers(-128, 128, (n, c, m)).astype(np.int8), bq)
    bq = bv.quant
    typical = np.sqrt(c) * _centered_rms(x.quant) * _centered_rms(bq)
    acc = g.op("matmul", a, bv)
    g.bound[acc] = c * _max_centered(x.quant) * _max_centered(bq)
    return g.op("reshape", g.requant(acc, typical), shape=(n, h, w, m))


@layer("float_island")
def _float_island(g: GraphState, x: Value) -> Value:
    """dequantize, exact float ops (one IEEE rounding each, or none), quantize."""
    f = g.op("dequantize", x, None)
    lo, hi = g.real_range(x.quant)
    kind = g.pick(["mul_const", "add_const", "max_pool", "transpose", "cast"])
    if kind == "cast":  # codes as floats, halved (exact), cast back to codes (round half to even)
        f = g.op("mul", g.op("cast", x, dtype=DType.FLOAT32), g.const(np.full((1,) * 4, 0.5, np.float32)))
        q = x.quant
        zp = int(np.rint(q.zero_point[0] / 2))  # codes c/2 rounded: in [-64, 64]
        return g.op("cast", f, dtype=DType.INT8, out=QuantSpec.per_tensor(2 * q.scale[0], zp, qmin=-64, qmax=64))
    if kind == "mul_const":
        f = g.op("mul", f, g.const(g.rng.uniform(-2, 2, _broadcast_shape(g, x.shape)).astype(np.float32)))
        lo, hi = -2 * max(-lo, hi), 2 * max(-lo, hi)
    elif kind == "add_const":
        f = g.op("add", g.const(g.rng.uniform(-1, 1, _broadcast_shape(g, x.shape)).astype(np.float32)), f)
        lo, hi = lo - 1, hi + 1
    elif kind == "max_pool":
        f = g.op("max_pool2d", f, kernel=(1, min(2, x.shape[2])), stride=(1, 1))
    else:
        f = g.op("transpose", g.op("transpose", f, perm=(0, 2, 1, 3)), perm=(0, 2, 1, 3))
    g.floats.append(f)
    return g.op("quantize", f, out=g.domain(lo * 0.8, hi * 0.8))
