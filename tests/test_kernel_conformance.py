"""Conformance: every reference kernel against its CPU twins, on the same inputs.

``ROWS`` maps every kernel of ``qlower.reference.KERNELS`` to graphs that reach each
of its CPU twins: the torch kernel, the native C kernel (rescale, the fused
quantized add, depthwise and im2col convolutions), the GEMM engines and the
fused chains (``cpu_checks.CONFIGS`` prepares each graph with native kernels on
and off, every exact GEMM engine and fusion off). Each graph runs on three
input sets: random codes, extremes (dtype limits, qmin/qmax, zero points,
±0, ±inf, NaN, denormals) and rounding ties (powers of two and halves). Where
the reference computes, every configuration must give the same bits, traced
values included; where it refuses (int32 overflow, the rescale REQUIRE, a
division by zero, NaN into integers), every configuration must refuse too.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import pytest

from qlower.backends.cpu import prepare
from qlower.errors import ExecutionError
from qlower.ir import DType, Graph, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import KERNELS, run_graph
from qlower.reference.aten_fallback import Operand, encode_call
from qlower.testing.cpu_checks import CONFIGS, assert_cpu_matches_reference
from qlower.testing.graph_checks import random_inputs

I8, I16, I32, F32, BOOL = DType.INT8, DType.INT16, DType.INT32, DType.FLOAT32, DType.BOOL
Build = Callable[[GraphBuilder], list]


def q8(scale=0.05, zp=0, **kw):
    return QuantSpec.per_tensor(scale, zp, I8, **kw)


def q16(scale=0.001, zp=0):
    return QuantSpec.per_tensor(scale, zp, I16)


def q32(scale=1.0):
    return QuantSpec.per_tensor(scale, 0, I32)


def q32_channels(scales, axis):
    return QuantSpec(I32, tuple(scales), (0,) * len(scales), I32.min, I32.max, axis=axis)


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


# -- the table ----------------------------------------------------------------------------------

def _rescales(rounding):
    def build(b):
        x = b.input("x", TensorType((2, 3, 4, 5), I8, q8(0.1, 7)))
        acc = b.input("acc", TensorType((1, 3, 4, 6), I32, q32_channels(np.linspace(1e-4, 3e-4, 6), 3)))
        acc1 = b.input("acc1", TensorType((1, 6, 4, 2), I32, q32_channels(np.linspace(1e-4, 3e-4, 6), 1)))
        h = b.input("h", TensorType((3, 5), I16, q16(0.001, -30)))
        return [b.op("rescale", x, out=q8(0.07, -3, qmin=-127, qmax=120), rounding=rounding),
                b.op("rescale", x, out=q32(0.1 / 2**10), rounding=rounding),
                b.op("rescale", acc, out=q8(0.3, 11), rounding=rounding),
                b.op("rescale", acc, out=q16(0.01, 4), rounding=rounding),
                b.op("rescale", acc1, out=q8(0.3, -2), rounding=rounding),
                b.op("rescale", h, out=q8(0.01, 1), rounding=rounding),
                b.op("rescale", h, out=q32(0.001 / 2**12), rounding=rounding)]
    return build


def _int_arith(b):
    rng = rng_for("int_arith")
    x = b.input("x", TensorType((1, 4, 5, 6), I32, q32(0.1 / 2**8)))
    y = b.input("y", TensorType((1, 4, 1, 6), I32, q32(0.1 / 2**8)))
    c = b.constant(rng.integers(-2**12, 2**12, (1, 1, 1, 6)).astype(np.int32), q32(0.1 / 2**8), name="c")
    cm = b.constant(rng.integers(-300, 300, (1, 1, 1, 6)).astype(np.int32),
                    q32_channels(rng.uniform(0.01, 0.02, 6), 3), name="cm")
    # products of int8 codes widened to int32 (as the frontend's muls are): any int8 inputs fit
    a = b.op("rescale", b.input("a8", TensorType((1, 4, 5, 6), I8, q8(0.1, 3))), out=q32(0.1 / 2**4))
    a2 = b.op("rescale", b.input("b8", TensorType((1, 4, 1, 6), I8, q8(0.1, -2))), out=q32(0.1 / 2**8))
    return [b.op("add", x, c), b.op("add", x, y), b.op("sub", c, x), b.op("sub", x, y),
            b.op("mul", a, cm, shift=7), b.op("mul", a, a2, shift=0), b.op("mul", a, a2, shift=13)]


def _float_arith(b):
    f = b.input("f", TensorType((2, 1, 3), F32))
    g = b.input("g", TensorType((2, 4, 1), F32))
    return [b.op(k, f, g) for k in ("add", "sub", "mul")]


def _clamps(b):
    x = b.input("x", TensorType((1, 4, 5, 6), I8, q8(0.1, 3)))
    i = b.input("i", TensorType((3, 7), I32, q32()))
    f = b.input("f", TensorType((3, 7), F32))
    return [b.op("clamp", x, min=-20, max=30), b.op("clamp", i, min=-1000, max=5000),
            b.op("clamp", f, min=-0.5, max=0.25)]


def _intdiv(b):
    return [b.op("intdiv", b.input("a", TensorType((4, 8), I32, q32())), b.input("c", TensorType((1, 8), I32, q32())))]


def _binary(kind, dtype, shape_b=(2, 1, 5)):
    def build(b):
        t = q8(0.1, 3) if dtype is I8 else None
        return [b.op(kind, b.input("a", TensorType((2, 4, 5), dtype, t)), b.input("b", TensorType(shape_b, dtype, t)))]
    return build


def _logical(kind):
    def build(b):
        a = b.input("a", TensorType((3, 5), BOOL))
        return [b.op(kind, a) if kind == "logical_not" else b.op(kind, a, b.input("b", TensorType((1, 5), BOOL)))]
    return build


def _select(b):
    c = b.input("c", TensorType((3, 1), BOOL))
    return [b.op("select", c, b.input("a", TensorType((3, 4), I8, q8())), b.input("b", TensorType((1, 4), I8, q8()))),
            b.op("select", c, b.input("f", TensorType((3, 4), F32)), b.input("g", TensorType((3, 4), F32)))]


def _float_unary(kind):
    def build(b):
        f = b.input("f", TensorType((3, 4, 5), F32))
        return [b.op(kind, f, axis=2), b.op(kind, f, axis=0)] if kind == "softmax" else [b.op(kind, f)]
    return build


def _avg_pools(dtype):
    def build(b):
        quant = None if dtype is F32 else QuantSpec.per_tensor(0.1, -9, dtype)
        x = b.input("x", TensorType((2, 7, 9, 5), dtype, quant))
        return [b.op("avg_pool2d", x, kernel=(3, 3), stride=(2, 2), pad=(1, 1, 1, 1)),
                b.op("avg_pool2d", x, kernel=(2, 4), stride=(1, 3), pad=(0, 1, 2, 0)),
                b.op("avg_pool2d", x, kernel=(7, 9), stride=(1, 1))]
    return build


def _max_pools(b):
    x = b.input("x", TensorType((1, 6, 7, 4), I8, q8(0.1, 2)))
    f = b.input("f", TensorType((1, 6, 7, 4), F32))
    i = b.input("i", TensorType((1, 5, 3, 4), I32, q32(0.01)))
    return [b.op("max_pool2d", x, kernel=(3, 3), stride=(2, 2), pad=(1, 1, 1, 1)),
            b.op("max_pool2d", x, kernel=(2, 3), stride=(2, 1), pad=(1, 0, 2, 1)),
            b.op("max_pool2d", f, kernel=(3, 2), stride=(1, 2), pad=(2, 0, 0, 1)),
            b.op("max_pool2d", i, kernel=(2, 2), stride=(1, 1), pad=(1, 1, 1, 1))]


def _reductions(kind):
    def build(b):
        x = b.input("x", TensorType((2, 5, 3, 4), I8, q8(0.1, 2)))
        i = b.input("i", TensorType((2, 5, 3, 4), I32, q32(0.01)))
        f = b.input("f", TensorType((2, 5, 3, 4), F32))
        sources = {"reduce_sum": (i, f), "argmax": (x, i), "argmin": (x, i)}.get(kind, (x, i, f))
        return [b.op(kind, v, axis=a) for v in sources for a in (0, 3)]
    return build


def _movement(b):
    rng = rng_for("movement")
    x = b.input("x", TensorType((1, 4, 5, 6), I8, q8(0.1, 2)))
    y = b.input("y", TensorType((1, 4, 3, 6), I8, q8(0.1, 2)))
    c = b.constant(rng.integers(-128, 128, (1, 4, 2, 6)).astype(np.int8), q8(0.1, 2), name="c")
    f = b.input("f", TensorType((2, 3), F32))
    cat = b.op("concat", (x, y, c), axis=2)
    return [b.op("reshape", b.op("transpose", cat, perm=(0, 3, 1, 2)), shape=(6, 40)),
            b.op("pad", x, pads=(0, 0, 1, 2, 0, 3, 2, 0), value=2),
            b.op("slice", cat, start=(0, 1, 0, 1), stop=(1, 4, 10, 6), step=(1, 2, 3, 2)),
            b.op("pad", f, pads=(1, 0, 0, 2), value=-1.5), b.op("transpose", f, perm=(1, 0)),
            b.op("concat", (f, f), axis=0), c]


def _gather(b):
    x = b.input("x", TensorType((2, 5, 3), I8, q8()))
    idx = b.constant(np.array([[4, 0, 2, 2]], np.int32), q32(), name="idx")
    f = b.input("f", TensorType((6, 4), F32))
    return [b.op("gather", x, idx, axis=1), b.op("gather", f, idx, axis=0)]


def _table(b):
    rng = rng_for("table")
    x = b.input("x", TensorType((3, 7), I8, q8(0.1, 2)))
    h = b.input("h", TensorType((3, 7), I16, QuantSpec.per_tensor(0.001, 0, I16, qmin=-256, qmax=256)))
    return [b.op("table", x, table=rng.integers(-128, 128, 256).astype(np.int16), offset=128, out=q8(0.02, -1)),
            b.op("table", h, table=rng.integers(-2**15, 2**15, 513).astype(np.int16), offset=256,
                 out=q16(0.002, 0))]


def _table_interp(b):
    """TOSA's interpolated int16 TABLE: random knots (slopes up to int16) and a smooth curve."""
    rng = rng_for("table_interp")
    x = b.input("x", TensorType((4, 9), I16, q16(0.001, 0)))
    steep = np.cumsum(rng.integers(-2**14, 2**14, 513)).clip(-2**15, 2**15 - 1).astype(np.int16)
    smooth = (30000 * np.tanh(np.linspace(-3, 3, 513))).astype(np.int16)
    out = QuantSpec.per_tensor(0.001 / 128, 0, I32)
    return [b.op("table_interp", x, table=t, out=out) for t in (steep, smooth)]


def _quantize(b):
    f = b.input("f", TensorType((2, 3, 4), F32))
    return [b.op("quantize", f, out=q8(0.02, 3, qmin=-127, qmax=127)),
            b.op("quantize", f, out=QuantSpec.per_channel([0.01, 0.02, 0.05, 0.1], [0, 1, -2, 3], axis=2)),
            b.op("quantize", f, out=QuantSpec.per_tensor(1e-9, 0, I32)),
            b.op("quantize", f, out=q16(0.0005, -7))]


def _dequantize(b):
    x = b.input("x", TensorType((3, 7), I8, q8(0.1, 2)))
    h = b.input("h", TensorType((3, 4), I16, q16(0.003, 5)))
    acc = b.input("acc", TensorType((2, 4), I32, q32_channels((1e-3, 2e-3, 3e-3, 4e-3), 1)))
    return [b.op("dequantize", x, None), b.op("dequantize", h, None), b.op("dequantize", acc, None)]


def _dynamic_quantize(b):
    f = b.input("f", TensorType((3, 6), F32))
    codes, scale = b.op("dynamic_quantize", f)
    row_codes, row_scale = b.op("dynamic_quantize", f, granularity="per_row")
    return [codes, scale, row_codes, row_scale, b.op("dequantize", row_codes, row_scale)]


def _casts(b):
    x = b.input("x", TensorType((3, 7), I8, q8(0.1, 2)))
    f = b.input("f", TensorType((2, 3, 4), F32))
    acc = b.input("acc", TensorType((2, 4), I32, q32()))
    flags = b.input("flags", TensorType((3,), BOOL))
    return [b.op("cast", flags, dtype=F32), b.op("cast", flags, dtype=I8, out=q8(1.0)),
            b.op("cast", f, dtype=I8, out=q8(1.0)), b.op("cast", f, dtype=I32, out=q32()),
            b.op("cast", x, dtype=F32), b.op("cast", acc, dtype=I16, out=q16(1.0))]


def _conv(groups, x_dtype=I8, x_zp=5, w_zp=0, requant=True):
    def build(b):
        rng = rng_for(f"conv{groups}{x_dtype}{x_zp}{w_zp}{requant}")
        o, ci = 8, 8 // groups
        x = b.input("x", TensorType((1, 7, 6, 8), x_dtype, QuantSpec.per_tensor(0.02, x_zp, x_dtype)))
        scales = rng.uniform(0.002, 0.01, o)
        w = b.constant(rng.integers(-128, 128, (o, 3, 3, ci)).astype(np.int8),
                       QuantSpec.per_channel(scales, np.full(o, w_zp), axis=0), name="w")
        bias = b.constant(rng.integers(-5000, 5000, o).astype(np.int32),
                          QuantSpec.accumulator(x.quant, w.quant, axis=0), name="bias")
        acc = b.op("conv2d", x, w, bias, stride=(2, 1), pad=(1, 1, 0, 2), groups=groups)
        if not requant:
            return [acc]
        y = b.op("rescale", acc, out=q8(0.02 * 0.006 * 3 * np.sqrt(9 * ci) * 128, -10))
        return [b.op("clamp", y, min=-10, max=100)]
    return build


def _float_conv(b):
    rng = rng_for("float_conv")
    x = b.input("x", TensorType((1, 5, 5, 3), F32))
    w = b.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), None, name="w")
    return [b.op("conv2d", x, w, None, pad=(1, 1, 1, 1))]


def _fully_connected(b):
    rng = rng_for("fully_connected")
    x = b.input("x", TensorType((3, 33), I8, q8(0.02, -4)))
    w = b.constant(rng.integers(-128, 128, (10, 33)).astype(np.int8),
                   QuantSpec.per_channel(rng.uniform(0.002, 0.01, 10), axis=0), name="w")
    acc = b.op("fully_connected", x, w, None)
    return [acc, b.op("rescale", acc, out=q8(0.3, 2))]


def _matmul(b):
    a = b.input("a", TensorType((2, 3, 17), I8, q8(0.02, 3)))
    c = b.input("c", TensorType((2, 17, 5), I8, q8(0.03, -1)))
    f = b.input("f", TensorType((4, 6), F32))
    g = b.input("g", TensorType((6, 2), F32))
    return [b.op("matmul", a, c), b.op("matmul", f, g)]


def _aten(b):
    x = b.input("x", TensorType((2, 3), F32))
    (y,) = b.op("aten", (x,), target="aten.cumsum.default", args=encode_call([Operand(0), 1], {}),
                in_dtypes=("float32",), out_types=(TensorType((2, 3), F32),), out_dtypes=("float32",))
    return [y]


ROWS: list[tuple[str, str, Build]] = [
    *[("rescale", r, _rescales(r)) for r in ("single", "double", "double_half_up")],
    ("add", "int32 broadcast constant", _int_arith), ("add", "float broadcast", _float_arith),
    ("sub", "int32 broadcast constant", _int_arith), ("sub", "float broadcast", _float_arith),
    ("mul", "int32 shifts per-channel", _int_arith), ("mul", "float broadcast", _float_arith),
    ("clamp", "int8 int32 float", _clamps),
    ("intdiv", "int32 broadcast", _intdiv),
    *[(k, f"{d.value} broadcast", _binary(k, d)) for k in ("minimum", "maximum", "equal", "greater", "greater_equal")
      for d in (I8, F32)],
    *[(k, "bool broadcast", _logical(k)) for k in ("logical_and", "logical_or", "logical_xor", "logical_not")],
    ("select", "int8 float", _select),
    *[(k, "float", _float_unary(k)) for k in ("sigmoid", "tanh", "exp", "erf", "reciprocal", "softmax")],
    *[("avg_pool2d", d.value, _avg_pools(d)) for d in (I8, I16, F32)],
    ("max_pool2d", "int8 int32 float", _max_pools),
    *[(k, "axes 0 and 3", _reductions(k)) for k in ("reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin")],
    *[(k, "int8 float", _movement) for k in ("concat", "reshape", "transpose", "pad", "slice", "constant")],
    ("gather", "int8 float", _gather),
    ("table", "int8 int16", _table),
    ("table_interp", "int16", _table_interp),
    ("quantize", "per tensor, per channel, int16, int32", _quantize),
    ("dequantize", "int8 int16 int32", _dequantize), ("dequantize", "runtime scale", _dynamic_quantize),
    ("dynamic_quantize", "per tensor and per row", _dynamic_quantize),
    ("cast", "bool float int", _casts),
    ("conv2d", "im2col, requantized", _conv(1)), ("conv2d", "accumulator", _conv(1, requant=False)),
    ("conv2d", "depthwise, requantized", _conv(8)), ("conv2d", "grouped, weight zp", _conv(2, w_zp=3)),
    ("conv2d", "depthwise x_zp max", _conv(8, x_zp=127)), ("conv2d", "int16 input", _conv(1, I16, 0)),
    ("conv2d", "float", _float_conv),
    ("fully_connected", "per channel", _fully_connected),
    ("matmul", "int8 batched, float", _matmul),
    ("aten", "float fallback", _aten),
]


def _graph(build: Build) -> Graph:
    b = GraphBuilder("conformance")
    return verify_graph(b.build(build(b)))


def test_every_reference_kernel_has_a_row_that_reaches_it():
    rows = {kind for kind, _, _ in ROWS}
    assert rows == set(KERNELS), f"kernels without a row: {sorted(set(KERNELS) - rows)}"
    for kind, case, build in ROWS:
        assert kind in {op.kind for op in _graph(build).ops}, f"row {kind}/{case} has no {kind} op"


# -- the input sets ------------------------------------------------------------------------------

def _fill(values: np.ndarray, shape, rng) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    return rng.permutation(np.resize(values, n)).reshape(shape)


def _extremes(v, rng) -> np.ndarray:
    if v.dtype is BOOL:
        return _fill(np.array([True, False]), v.shape, rng)
    if v.dtype.is_float:
        tiny = np.float32(1e-45)   # the smallest denormal
        values = np.array([0.0, -0.0, 1.0, -1.0, tiny, -tiny, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 1e-30,
                           -7.5], np.float32)
        return _fill(values, v.shape, rng)
    values = [v.dtype.min, v.dtype.min + 1, -1, 0, 1, v.dtype.max - 1, v.dtype.max]
    if v.type.quant is not None:
        q = v.type.quant
        values += [q.qmin, q.qmax, *q.zero_point, *(z + 1 for z in q.zero_point), *(z - 1 for z in q.zero_point)]
    return _fill(np.clip(values, v.dtype.min, v.dtype.max).astype(v.dtype.numpy), v.shape, rng)


def _ties(v, rng) -> np.ndarray:
    """Values where a rounding or truncation rule shows: ±2**k, ±(2**k ± 1), halves; int32 within ±2**20."""
    if v.dtype is BOOL:
        return _fill(np.array([False, True, True]), v.shape, rng)
    if v.dtype.is_float:
        halves = np.arange(-8, 8) + 0.5
        return _fill(np.concatenate([halves, halves / 64, [0.0, -0.0]]).astype(np.float32), v.shape, rng)
    top = min(v.dtype.max.bit_length() - 1, 20)
    powers = np.left_shift(1, np.arange(top + 1))
    values = np.concatenate([powers, powers - 1, powers + 1, -powers, -powers + 1, -powers - 1, [0]])
    lo, hi = max(v.dtype.min, -(2**20)), min(v.dtype.max, 2**20)
    return _fill(np.clip(values, lo, hi).astype(v.dtype.numpy), v.shape, rng)


def _inputs(graph: Graph, which: str, seed: int) -> list[np.ndarray]:
    if which == "random":
        out = random_inputs(graph, seed)
        return [np.asarray(x) if v.dtype is not BOOL else rng_for(f"bool{seed}").random(v.shape) < 0.5
                for v, x in zip(graph.inputs, out)]
    rng = np.random.default_rng(seed)
    make = _extremes if which == "extremes" else _ties
    return [make(v, rng) for v in graph.inputs]


def _row_id(row) -> str:
    return f"{row[0]}-{row[1]}".replace(" ", "_").replace(",", "")


@pytest.mark.parametrize("which", ["random", "extremes", "ties"])
@pytest.mark.parametrize("row", ROWS, ids=_row_id)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # NumPy reporting inf and NaN in the extremes
def test_cpu_twins_conform_to_the_reference(row, which):
    kind, case, build = row
    graph = _graph(build)
    inputs = _inputs(graph, which, zlib.crc32(_row_id(row).encode()))
    try:
        run_graph(graph, inputs)
    except ExecutionError as refused:
        for cfg in CONFIGS:
            with pytest.raises(ExecutionError):
                prepare(graph, **cfg).run(inputs)
        assert which != "random", f"the reference refused random inputs: {refused}"
        return
    assert_cpu_matches_reference(graph, inputs)
