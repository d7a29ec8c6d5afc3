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
from graph_state import MAX_CHANNELS, MAX_NUMEL, GraphState, centered_rms, conv_acc, max_centered
from hypothesis import strategies as st

from qlower.ir import DType, QuantSpec, Value

Layer = Callable[[GraphState, Value], Value]
LAYERS: dict[str, Layer] = {}


def layer(name: str):
    def wrap(fn: Layer) -> Layer:
        LAYERS[name] = fn
        return fn
    return wrap


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
    typical = np.sqrt(c) * centered_rms(x.quant) * centered_rms(bq)
    acc = g.op("matmul", a, bv)
    g.bound[acc] = c * max_centered(x.quant) * max_centered(bq)
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
