"""Random small valid quantized IR graphs, and inputs for them (hypothesis strategies).

``cases()`` draws a ``FuzzCase``: a verified graph and inputs. A graph is a small
post-training-quantized network: an int8 NHWC trunk (graph input int8, or float32
quantized at the boundary) through 1-5 random layers, each a pattern the frontend
emits: convolutions of every geometry (dense, depthwise with multiplier, grouped,
strided, dilated, padded; per-tensor or per-channel weights; with or without bias;
int8 or int16 activations) requantized with folded or explicit relu-style clamps;
plain rescales (any zero point, ratios in 2**±6, via int8/int16/uint8, single or
double rounding); concats of differently quantized branches rescaled to one domain;
int32 add/sub/mul/intdiv with broadcast or per-channel constants or with another
branch; reshape/transpose chains; pad; strided slices; pools; reductions; table
lookups (int8/int16); fully_connected and matmul; exact float islands (dequantize or
cast, float mul/add/pool/transpose, quantize or cast back). Outputs: the trunk
(int8 or dequantized), random side outputs, and optional float tails: a dynamic
quantization chain (dynamic_quantize -> fully_connected|conv2d -> dequantize
[-> float bias add]) and approximate float ops (sigmoid, tanh, exp, erf, reciprocal,
softmax).

Guarantees, which the differential tests rely on:
- every graph verifies, and the reference interpreter runs it on any input ``cases``
  draws for it: int32 values carry a bound (interval arithmetic over the actual
  constants) that keeps accumulators, products and every rescale input in range;
- integer codes stay within their type's [qmin, qmax] (inputs are drawn there and every
  op keeps them there), so a table always covers its input;
- results of dynamic quantization and of approximate float ops reach float graph
  outputs only, never static integer codes: every integer output is exactly defined.

Structure (layer kinds, kernel sizes, zero points) is drawn with hypothesis, each layer
and each tail as one span of draws, so that shrinking deletes whole layers; bulk data
(weights, constants, tables, inputs) comes from NumPy generators seeded by drawn
integers. The layers themselves live in ``qlower.testing.random_layers``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from graph_state import GraphState, conv_geometry
from hypothesis import strategies as st
from random_layers import LAYERS

from qlower.ir import DType, Graph, TensorType, Value, print_graph, verify_graph


@dataclass(frozen=True, eq=False)
class FuzzCase:
    """A graph and inputs for it; prints as IR text (also in hypothesis's reports)."""

    graph: Graph
    inputs: tuple[np.ndarray, ...]

    def __repr__(self) -> str:
        ins = ", ".join(f"{x.dtype}{list(x.shape)}" for x in self.inputs)
        return f"FuzzCase(inputs: {ins})\n{print_graph(self.graph)}"

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(repr(self))


def random_inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    """Inputs of the graph's types: codes within [qmin, qmax] (uniform, or piled on the
    bounds and the zero point), floats ~ N(0, sigma) with sigma in [0.25, 2] and some zeros."""
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        if v.quant is not None:
            q = v.quant
            x = rng.integers(q.qmin, q.qmax, v.shape, endpoint=True)
            if rng.random() < 0.3:
                special = rng.choice([q.qmin, q.qmax, min(max(q.zero_point[0], q.qmin), q.qmax)], v.shape)
                x = np.where(rng.random(v.shape) < 0.5, special, x)
            out.append(x.astype(v.dtype.numpy))
        else:
            x = rng.standard_normal(v.shape) * rng.uniform(0.25, 2.0)
            out.append(np.where(rng.random(v.shape) < 0.05, 0.0, x).astype(np.float32))
    return out


# -- float tails: their results reach float outputs only ------------------------------------

def dynamic_tail(g: GraphState, f: Value) -> Value:
    """dynamic_quantize -> fully_connected | conv2d -> dequantize(acc, scale) [-> add float bias]."""
    gran = g.pick(["per_tensor", "per_row"])
    use_conv = f.type.rank == 4 and g.draw(st.booleans())
    codes, scale = g.op("dynamic_quantize", f, granularity=gran)
    c = f.shape[-1]
    nout = g.i(1, 8)
    if use_conv:
        point = gran == "per_row"
        geo = [(1, 1, 1, 0, 0)] * 2 if point else [conv_geometry(g, f.shape[1]), conv_geometry(g, f.shape[2])]
        (kh, sh, dh, pt, pb), (kw, sw, dw, pl, pr) = geo
        w = g.weights((nout, kh, kw, c), g.draw(st.booleans()), kh * kw * c)
        acc = g.op("conv2d", codes, w, None, stride=(sh, sw), dilation=(dh, dw), pad=(pt, pb, pl, pr))
    else:
        w = g.weights((nout, c), g.draw(st.booleans()), c)
        acc = g.op("fully_connected", codes, w, None)
    y = g.op("dequantize", acc, scale)
    if g.draw(st.booleans()):
        bias = g.rng.uniform(-1, 1, (1,) * (y.type.rank - 1) + (nout,)).astype(np.float32)
        y = g.op("add", y, g.const(bias))
    return y


def approx_tail(g: GraphState, f: Value) -> Value:
    """An approximate float op (or two) on ``f``."""
    kind = g.pick(["sigmoid", "tanh", "exp", "erf", "reciprocal", "softmax"])
    if kind == "softmax":
        return g.op("softmax", f, axis=g.i(0, f.type.rank - 1))
    if kind == "reciprocal":  # of a positive value: no division by zero
        return g.op("reciprocal", g.op("sigmoid", f))
    return g.op(kind, f)


@st.composite
def _span(draw, g: GraphState, fn, *args):
    """Run ``fn(g, *args)`` with its draws grouped in one span (shrinking deletes it whole)."""
    outer, g.draw = g.draw, draw
    try:
        return fn(g, *args)
    finally:
        g.draw = outer


def _layer(g: GraphState, x: Value) -> Value:
    x = LAYERS[g.pick(sorted(LAYERS))](g, x)
    if g.pick([False, False, False, True]):
        g.side.append(x)
    return x


def _float_source(g: GraphState, x: Value, shape: tuple[int, ...], fresh_input: bool) -> Value:
    if fresh_input:
        dims = g.pick([(g.i(1, 4), g.i(1, 8)), shape])
        return g.b.input("xf", TensorType(dims, DType.FLOAT32))
    return g.op("dequantize", x, None) if not g.floats or g.draw(st.booleans()) else g.pick(g.floats)


def _tail(g: GraphState, x: Value, shape: tuple[int, ...], dynamic: bool) -> Value:
    if dynamic:
        return dynamic_tail(g, _float_source(g, x, shape, g.draw(st.booleans())))
    return approx_tail(g, _float_source(g, x, shape, False))


@st.composite
def graphs(draw, max_layers: int = 5) -> Graph:
    """A random valid quantized graph (see the module docstring)."""
    g = GraphState(draw, draw(st.integers(0, 2**32 - 1)))
    shape = (g.i(1, 2), g.i(1, 8), g.i(1, 8), g.i(1, 8))
    if draw(st.booleans()):
        x = g.b.input("x", TensorType(shape, DType.INT8, g.act_spec()))
    else:  # a float model input, quantized at the boundary: N(0, <=2), mostly within +-4
        f = g.b.input("x", TensorType(shape, DType.FLOAT32))
        g.floats.append(f)
        x = g.op("quantize", f, out=g.domain(-4 * g.rng.uniform(0.3, 1.5), 4 * g.rng.uniform(0.3, 1.5)))
    x = draw(_span(g, _layer, x))
    for _ in range(max_layers - 1):
        if draw(st.integers(0, 3)) == 0:  # go on with probability 3/4; shrinks to stopping
            break
        x = draw(_span(g, _layer, x))
    outputs = [x if draw(st.booleans()) else g.op("dequantize", x, None)]
    outputs += [v for v in dict.fromkeys(g.side) if v is not x]
    for dynamic in (True, False):
        if draw(st.integers(0, 2)) == 2:
            outputs.append(draw(_span(g, _tail, x, shape, dynamic)))
    return verify_graph(g.b.build(outputs))


@st.composite
def cases(draw, max_layers: int = 5) -> FuzzCase:
    """A random graph and random inputs for it."""
    graph = draw(graphs(max_layers))
    return FuzzCase(graph, tuple(random_inputs(graph, draw(st.integers(0, 2**32 - 1)))))
