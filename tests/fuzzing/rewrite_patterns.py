"""Random graphs holding the patterns backend rewrites take (hypothesis strategies), between the
random layers of random_layers.py: the frontend's residual int8 add (LiteRT's TFLite ADD form),
its global average (Ethos-U's mean form, and a plane too wide for Vela's pool), an int16 lookup (Ethos-U's interpolated table) and a
run of dense convolutions (Ethos-U's channel widening). Each pattern is drawn on both sides of
its rewrite's applicability (a mean whose output is finer than the proof allows, a table no
interpolation stays within a step of), so that the tests also see where a rewrite must not apply.
"""

from __future__ import annotations

import numpy as np
from graph_state import GraphState, _rescale_fits, conv_acc
from hypothesis import strategies as st
from random_graphs import FuzzCase, _span, random_inputs
from random_layers import LAYERS

from qlower.ir import DType, QuantSpec, TensorType, Value, verify_graph

PATTERNS = {}


def pattern(name: str):
    def wrap(fn):
        PATTERNS[name] = fn
        return fn
    return wrap


def _to_int8(g: GraphState, acc: Value, lo: float, hi: float) -> Value:
    """``acc`` rescaled (rounding once, as the frontend does) to an int8 domain covering [lo, hi]."""
    spec = g.domain(lo, hi)
    out = spec.scale[0]
    while not _rescale_fits(g.bound[acc], acc.quant.scale, out):
        out *= 2
    return g.op("rescale", acc, out=QuantSpec.per_tensor(out, spec.zero_point[0]))


@pattern("residual_add")
def _residual_add(g: GraphState, x: Value) -> Value:
    """``x + f(x)`` as the frontend imports an int8 add: both operands rescaled to int32 at
    ``2 * max(s1, s2) / 2**20``, added, rescaled to int8."""
    kind = g.pick(["conv", "rescale", "same"])
    if kind == "conv":
        other = g.requant(*conv_acc(g, x, groups=1, out_ch=x.shape[3], pointwise=True))
    elif kind == "rescale":
        other = g.op("rescale", x, out=g.act_spec())
    else:
        other = x
    s = 2 * max(x.quant.scale[0], other.quant.scale[0]) / 2**20
    a, b = g.to_int32_scale(x, s), g.to_int32_scale(other, s)
    y = g.op("add", *((a, b) if g.draw(st.booleans()) else (b, a)))
    g.bound[y] = g.bound[a] + g.bound[b]
    (lo1, hi1), (lo2, hi2) = g.real_range(x.quant), g.real_range(other.quant)
    shrink = g.rng.uniform(0.3, 1.0)   # some sums clip at the output's range
    return _to_int8(g, y, (lo1 + lo2) * shrink, (hi1 + hi2) * shrink)


@pattern("global_mean")
def _global_mean(g: GraphState, x: Value) -> Value:
    """A mean over H and W as the frontend writes it: codes widened to int16 (x128, zero point 0),
    an average pool over the whole plane, a rescale to int8 (its scale up to 2**8 finer than the
    input's: beyond 2**7 the sum form is not proven within a step, so Ethos-U must keep the pool)."""
    n, h, w, c = x.shape
    q = x.quant
    wide = g.op("rescale", x, out=QuantSpec.per_tensor(q.scale[0] / 128, 0, DType.INT16))
    pooled = g.op("avg_pool2d", wide, kernel=(h, w), stride=(h, w))
    ratio = 2.0 ** g.pick([g.rng.uniform(-3, 1), g.rng.uniform(-3, 1), g.rng.uniform(-8, -7)])
    return g.op("rescale", pooled, out=g.act_spec(q.scale[0] * ratio))


@pattern("wide_global_mean")
def _wide_global_mean(g: GraphState, x: Value) -> Value:
    """A global mean over a plane with a side beyond 256 (Vela's average-pool limit): ``x`` laid
    out as one row, repeated along W past 256 pixels (with copies of itself, so that no value
    but the mean's is new), then the frontend's mean as in ``global_mean``."""
    n, h, w, c = x.shape
    row = g.op("reshape", x, shape=(n, 1, h * w, c)) if h > 1 else x
    copies = 256 // (h * w) + g.i(1, 3)
    wide = g.op("concat", (row,) * copies, axis=2)
    if g.pick([False, True]):   # the long side along H as well
        wide = g.op("reshape", wide, shape=(n, wide.shape[2], 1, c))
    return _global_mean(g, wide)


_CODES = np.arange(-32768, 32768, dtype=np.float64)


@pattern("int16_table")
def _int16_table(g: GraphState, x: Value) -> Value:
    """An int16 -> int16 lookup of a quantized activation function (or of random codes, which no
    interpolation follows), between rescales from and to int8."""
    q = x.quant
    s_in = q.scale[0] / 256 * 2.0 ** g.i(-2, 2)
    v = g.op("rescale", x, out=QuantSpec.per_tensor(s_in, 0, DType.INT16))
    real = _CODES * s_in
    fn = g.pick(["sigmoid", "tanh", "hardswish", "hardsigmoid", "gelu", "random"])
    if fn == "random":
        codes = g.rng.integers(-32768, 32768, _CODES.size)
        s_out = 2.0 ** -12
    else:
        f = {"sigmoid": lambda t: 1 / (1 + np.exp(-t)), "tanh": np.tanh,
             "hardswish": lambda t: t * np.clip(t + 3, 0, 6) / 6, "hardsigmoid": lambda t: np.clip(t / 6 + 0.5, 0, 1),
             "gelu": lambda t: 0.5 * t * (1 + np.tanh(0.7978845608 * (t + 0.044715 * t**3)))}[fn](real)
        s_out = max(float(np.abs(f).max()), 1e-3) / 32767
        codes = np.rint(f / s_out)
    out = QuantSpec.per_tensor(s_out, 0, DType.INT16)
    table = np.clip(codes, -32768, 32767).astype(np.int16)
    y = g.op("table", v, table=table, offset=32768, out=out)
    return g.op("rescale", y, out=g.act_spec())


def _f32(x: float) -> float:
    return float(np.float32(x))


@pattern("fused_gemm")
def _fused_gemm(g: GraphState, x: Value) -> Value:
    """A convolution (dense or depthwise), fully connected layer or batched matmul requantized to
    int8 as TFLite fuses it: int8 operands, symmetric weights, every scale a float32 (PyTorch's)."""
    n, h, w, c = x.shape
    x = g.op("rescale", x, out=QuantSpec.per_tensor(_f32(x.quant.scale[0] * g.rng.uniform(0.8, 1.25)),
                                                    g.i(-20, 20)))
    kind = g.pick(["conv", "depthwise", "fc", "matmul"] if c > 1 else ["conv", "fc", "matmul"])
    out_ch = c if kind == "depthwise" else g.i(1, 8)
    k = 1 if kind in ("fc", "matmul") else g.i(1, min(3, h, w))
    fan_in = k * k * (1 if kind == "depthwise" else c)
    shape = {"conv": (out_ch, k, k, c), "depthwise": (c, k, k, 1), "fc": (out_ch, c), "matmul": (n, c, out_ch)}[kind]
    data = g.rng.integers(-127, 128, shape).astype(np.int8)
    base = 1.0 / (64 * np.sqrt(fan_in))
    per_channel = kind != "matmul" and g.draw(st.booleans())
    wq = (QuantSpec.per_channel(tuple(_f32(s) for s in g.rng.uniform(0.5, 1.5, shape[0]) * base)) if per_channel
          else QuantSpec.per_tensor(_f32(base), 0))
    wv = g.const(data, wq)
    if kind in ("conv", "depthwise"):
        acc = g.op("conv2d", x, wv, None, stride=(1, 1), dilation=(1, 1), pad=(0, 0, 0, 0),
                   groups=c if kind == "depthwise" else 1)
    elif kind == "fc":
        acc = g.op("fully_connected", x, wv, None)
    else:
        acc = g.op("matmul", g.op("reshape", x, shape=(n, h * w, c)), wv)
    g.bound[acc] = fan_in * 148 * 127
    typical = float(np.sqrt(fan_in) * 74 * 73)
    cover = typical * float(np.mean(acc.quant.scale)) * 2 ** g.rng.uniform(-1.5, 1.5)
    spec = g.domain(-cover, cover)
    out = _f32(spec.scale[0])
    while not _rescale_fits(g.bound[acc], acc.quant.scale, out):
        out = _f32(out * 2)
    y = g.op("rescale", acc, out=QuantSpec.per_tensor(out, spec.zero_point[0]),
             rounding=g.pick(["single", "double", "double_half_up"]))
    if kind == "matmul":
        y = g.op("reshape", y, shape=(n, h, w, out_ch))
    return y


@pattern("conv_run")
def _conv_run(g: GraphState, x: Value) -> Value:
    """Two dense convolutions in a row: the tensors between them are a run Ethos-U may widen."""
    for _ in range(2):
        x = g.requant(*conv_acc(g, x, groups=1))
    return x


@st.composite
def pattern_graphs(draw, name: str, max_layers: int = 4):
    """A random graph with pattern ``name`` (one of PATTERNS) at least once among random layers."""
    g = GraphState(draw, draw(st.integers(0, 2**32 - 1)))
    shape = (g.i(1, 2), g.i(1, 8), g.i(1, 8), g.i(1, 8))
    x = g.b.input("x", TensorType(shape, DType.INT8, g.act_spec()))
    count = g.i(1, max_layers)
    patterns = {g.i(0, count - 1)} | {i for i in range(count) if g.pick([False, False, True])}
    for i in range(count):
        fn = PATTERNS[name] if i in patterns else LAYERS[g.pick(sorted(LAYERS))]
        x = draw(_span(g, fn, x))
        if g.pick([False, False, False, True]):
            g.side.append(x)
    outputs = [x if draw(st.booleans()) else g.op("dequantize", x, None)]
    outputs += [v for v in dict.fromkeys(g.side) if v is not x]
    return verify_graph(g.b.build(outputs))


@st.composite
def pattern_cases(draw, name: str, max_layers: int = 4) -> FuzzCase:
    graph = draw(pattern_graphs(name, max_layers))
    return FuzzCase(graph, tuple(random_inputs(graph, draw(st.integers(0, 2**32 - 1)))))

