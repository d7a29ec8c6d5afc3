"""IR graph -> a .tflite that TensorFlow Lite Micro runs, computing exactly what the reference computes.

The LiteRT exporter (``litert/export.py``) writes each IR op as TFLite builtins;
this one reuses it and keeps only forms TFLM has kernels for (``kernels.py``).
Where LiteRT's exact form needs what TFLM lacks, another exact form replaces it:

- a rescale of int8/int16 codes by an integer power of two (the widening of a
  global average, an ADD operand's shift) is int32 arithmetic, never a table;
- a rescale, table or average of a range of at most 2**22 integers is a lookup
  of the reference's own numbers (``lookup.py``);
- an average pool with one tap count is its exact window sums (a float32
  depthwise convolution of ones) and a lookup of the reference's averages;
- a concatenation of more inputs than TFLM takes is a tree of concatenations;
- an integer sum whose partial sums stay below 2**24 is a float32 SUM (TFLM has no int32 one);
- ARG_MAX / ARG_MIN read int8 codes as they are (TFLM has no int32 kernel);
- the frontend's global average (widen x k, pool, rescale: ``global_means``) is
  one MEAN where TFLM's MEAN computes the graph's result on every sum (``mean.py``'s
  rewrite makes it so), else one lookup by the sum of the centered int8 codes,
  when the widening is linear.

What is left needs 64-bit integer arithmetic (the requantization of a wide
int32 range outside a fused GEMM) or a kernel TFLM lacks; such an op is
refused with the reason, and the partitioner keeps it on the host.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tflite.BuiltinOperator import BuiltinOperator as B
from tflite.Padding import Padding
from tflite.TensorType import TensorType as TflType

from qlower.backends.global_means import (
    GlobalMean,
    SummedMean,
    final_codes,
    global_means,
    plane_sums,
    pooled_codes,
    summed_means,
)
from qlower.backends.litert.emit import NotExact, channel_shape, options, tflite_quant
from qlower.backends.litert.export import GEMMS, _Export, _tfl_dtype
from qlower.backends.litert.flatbuffer import Quant
from qlower.backends.tflm.kernels import MAX_INPUTS, first_refusal
from qlower.backends.tflm.lookup import FLOAT_EXACT, WIDE_TABLE, lookup
from qlower.backends.tflm.mean import tflm_form
from qlower.errors import UnsupportedOpError
from qlower.ir import DType, Graph, Op, requant
from qlower.reference.pooling import pool_counts, reciprocal_scale


class TflmExport(_Export):
    """The LiteRT exporter restricted to TFLM's kernels (module doc)."""

    def __init__(self, graph: Graph, description: str):
        super().__init__(graph, description)
        # id(final) -> (the mean, its lookup by the least sum on, or None: one MEAN)
        self.composed: dict[int, tuple[GlobalMean | SummedMean, np.ndarray | None, int]] = {}
        for mean, form in [*((m, _mean_form) for m in global_means(graph)),
                           *((m, _summed_form) for m in summed_means(graph))]:
            found = form(self, mean)
            if found is not None:
                self.composed[id(mean.final)] = (mean, *found)
        self.skipped |= {id(o) for m, _, _ in self.composed.values() for o in _inner(m)}
        # id(final) -> the reshape dropping H and W after a MEAN: the MEAN writes its result (no keep_dims)
        self.squeezed: dict[int, Op] = {}
        for m, table, _ in self.composed.values():
            readers = self.users.get(m.final.result, [])
            n, _, _, c = m.final.result.shape
            if table is None and len(readers) == 1 and readers[0].kind == "reshape" \
                    and readers[0].result.shape == (n, c) and m.final.result not in self.outputs:
                self.squeezed[id(m.final)] = readers[0]
                self.skipped.add(id(readers[0]))
        self.peak_floor = _peak_floor(self)

    def fused_gemm(self, rescale: Op) -> Op | None:
        # (LiteRT's asks any reader of a GEMM; a dynamic dequantize has no output spec to fuse)
        return super().fused_gemm(rescale) if rescale.kind == "rescale" else None

    def emit(self, op: Op) -> None:
        start = len(self.b.writer.operators)
        own = _mean_of if id(op) in self.composed else _OWN.get(op.kind)
        if own is None or not own(self, op):
            super().emit(op)
        reason = first_refusal(self.b.writer, start)
        if reason is not None:
            raise NotExact(reason)


def _peak_floor(ex: TflmExport) -> int:
    """Bytes the model's arena holds at once whatever the plan: the most any op other than an average reads
    and writes (a fused GEMM: its input and its rescale's output)."""
    producers, best = ex.producers, 0
    for op in ex.graph.ops:
        if op.kind in ("constant", "avg_pool2d", *GEMMS) or id(op) in ex.skipped:
            continue
        gemm = ex.fused_gemm(op) if op.kind == "rescale" else None
        reads = (gemm or op).input_values()
        live = {v for v in reads if getattr(producers.get(v), "kind", None) != "constant"} | set(op.results)
        best = max(best, sum(int(np.prod(v.shape, dtype=np.int64)) * v.type.dtype.numpy.itemsize for v in live))
    return best


# -- rescales and tables ---------------------------------------------------------------------------

def _rescale(ex: TflmExport, op: Op) -> bool:
    if ex.fused_gemm(op) is not None or id(op) in ex.adds:
        return False   # LiteRT's fused CONV_2D / FULLY_CONNECTED / ADD, TFLM's too
    x = op.operands[0]
    src, out = x.type.quant, op.attrs["out"]
    mult = requant.requantize_ratio(np.asarray(src.scale), out.scale[0])
    power = mult.ratio()
    lo, hi = ex.ranges.of(x)
    reach = max(abs(lo - int(np.min(src.zero_point))), abs(hi - int(np.max(src.zero_point)))) * power.max()
    if x.dtype in (DType.INT8, DType.INT16) and np.all(power == np.round(power)) and np.all(power >= 1) \
            and reach + abs(out.zero_point[0]) < 2**31:
        _scaled(ex, op, power.astype(np.int64))
        return True
    if src.is_per_channel or hi - lo + 1 > WIDE_TABLE:
        raise NotExact("requantizing a wide int32 range outside a fused kernel needs 64-bit integer "
                       "arithmetic, which TFLM's kernels lack")
    codes = np.arange(lo, hi + 1, dtype=np.int64)
    table = requant.rescale(codes, np.asarray(src.zero_point), out.zero_point[0], mult, out.qmin, out.qmax,
                            rounding=op.attrs["rounding"])
    lookup(ex, op, table, lo)
    return True


def _scaled(ex: TflmExport, op: Op, power: np.ndarray) -> None:
    """A rescale by an integer ``power`` (x 2**k, a widening or an ADD operand's shift): ``(x - zp) * power
    + zp_out``, clamped, in int32 arithmetic that can't overflow (checked by the caller): no rounding at all."""
    b, name, rank = ex.b, op.result.name, op.result.type.rank
    src, out = op.operands[0].type.quant, op.attrs["out"]
    v = ex.plain(op.operands[0])
    if any(src.zero_point):
        v = b.binary_const(B.SUB, v, channel_shape(np.asarray(src.zero_point, np.int32), rank, src.axis),
                           f"{name}/center")
    if np.any(power != 1):
        v = b.binary_const(B.MUL, v, channel_shape(power.astype(np.int32), rank, src.axis), f"{name}/scale")
    if out.zero_point[0]:
        v = b.binary_const(B.ADD, v, np.int32(out.zero_point[0]), f"{name}/zp")
    v = b.clamp(v, np.int32(out.qmin), np.int32(out.qmax), f"{name}/range")
    ex.bind(op.result, b.cast(v, _tfl_dtype(op.result.type), name, tflite_quant(op.result.type)))


def _table(ex: TflmExport, op: Op) -> bool:
    if op.result.type.dtype is DType.INT8:
        return False   # LiteRT's int8 GATHER
    offset, table = op.attrs["offset"], np.asarray(op.attrs["table"])
    lo, hi = ex.ranges.of(op.operands[0])
    # the reference clips x + offset into the table: the proven range's entries, in order
    lookup(ex, op, table[np.clip(np.arange(lo, hi + 1) + offset, 0, table.size - 1)], lo)
    return True


# -- averages ------------------------------------------------------------------------------------

def _window_sums(ex: TflmExport, x, centre: int, kernel, stride, name: str) -> int:
    """int32 exact sums of each ``kernel`` window of ``x``'s centered codes (VALID): a float32 depthwise
    convolution of ones, exact while every partial sum stays below 2**24 (checked by the caller)."""
    b = ex.b
    n, h, w, c = x.type.shape
    (kh, kw), (sh, sw) = kernel, stride
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    # a whole plane is summed as one channel of h*w rows by c columns: TFLM keeps 8 bytes of
    # requantization data per channel in the arena even for a float convolution (10 KB for 1280
    # channels), and the ones are h*w floats in flash instead of h*w*c
    whole = (kh, kw) == (h, w) and c > 1
    t = ex.value(x)
    if whole:
        t = ex._reshape(t, (n, h * w, c, 1), f"{name}/columns", tflite_quant(x.type))
        (kh, kw), (sh, sw), (oh, ow), c, h, w = (h * w, 1), (1, 1), (1, c), 1, h * w, c
    # int8 codes go to float32 directly and are centred after summing (exact below 2**24): no int32
    # copy of the whole input beside the float one, the arena's peak in small models
    lo, hi = ex.ranges.of(x)
    direct = b.dtype(t) == "int8" and kh * kw * max(abs(lo), abs(hi)) < FLOAT_EXACT
    if not direct:
        t = b.cast(t, "int32", f"{name}/int32")
        if centre:
            t = b.binary_const(B.SUB, t, np.int32(centre), f"{name}/center")
    t = b.cast(t, "float32", f"{name}/f32")
    ones = b.const(f"{name}/ones", np.ones((1, kh, kw, c), np.float32), "float32")
    zeros = b.const(f"{name}/zeros", np.zeros(c, np.float32), "float32")
    sums = b.op(B.DEPTHWISE_CONV_2D, [t, ones, zeros], f"{name}/sums", (n, oh, ow, c), "float32",
                opts=options("DepthwiseConv2DOptions", Padding=Padding.VALID, StrideW=sw, StrideH=sh,
                             DepthMultiplier=1, DilationWFactor=1, DilationHFactor=1))
    if direct and centre:
        sums = b.binary_const(B.SUB, sums, np.float32(kh * kw * centre), f"{name}/center")
    if whole:
        sums = ex._reshape(sums, (n, 1, 1, ow), f"{name}/rows")
    return b.cast(sums, "int32", f"{name}/acc")


OP_TAIL = 160   # arena bytes an operator costs beyond activations: its node, output tensor, kernel data (measured)


def _plane_index(ex: TflmExport, x, offset: int, name: str) -> tuple[int, int] | None:
    """(int32 ``sum - offset + rest``, ``rest``) for each channel's sum of its whole plane of ``x``'s raw int8
    codes (zero point not removed), or None when the sums may leave int16. TFLM's int16 SUM at scale 1
    (its requantization by 1.0 is exact; its output zero point subtracts ``offset`` when the differences
    stay in int16, else ``rest`` is ``offset`` for the lookup to subtract) of an int16 copy,
    half the bytes of a float32 one. When even that copy beside ``x`` would outgrow the model's own peak
    (``ex.peak_floor``), the plane is cut into rows first (``_plane_parts``)."""
    lo, hi = ex.ranges.of(x)
    n, h, w, c = x.type.shape
    if x.dtype is not DType.INT8 or h * w * lo < -2**15 or h * w * hi >= 2**15 or not -2**31 < offset < 2**31:
        return None
    b = ex.b
    rest = 0 if h * w * (hi - lo) < 2**15 else offset
    one, indexed = Quant((1.0,), (0,)), Quant((1.0,), (rest - offset,))   # (SUM requantizes by its scales' ratio)
    axes = b.const(f"{name}/axes", np.asarray([1, 2], np.int32), "int32")
    sum_opts = options("ReducerOptions", KeepDims=True)
    t, (mode, parts) = ex.value(x), _plane_parts(ex, x)
    if mode == "whole":
        wide = b.cast(t, "int16", f"{name}/int16", one)
        sums = b.op(B.SUM, [wide, axes], f"{name}/sums", (n, 1, 1, c), "int16", indexed, sum_opts)
        return b.cast(sums, "int32", f"{name}/index"), rest
    if mode == "split":   # all parts at once (x dies here), then one int16 copy of a part at a time
        sizes = b.const(f"{name}/sizes", np.asarray([r1 - r0 for r0, r1 in parts], np.int32), "int32")
        axis = b.const(f"{name}/axis", np.int32(1), "int32")
        rows = [b.tensor(f"{name}/rows{i}", (n, r1 - r0, w, c), "int8", tflite_quant(x.type))
                for i, (r0, r1) in enumerate(parts)]
        b.writer.operator(B.SPLIT_V, [t, sizes, axis], rows, options("SplitVOptions", NumSplits=len(parts)))
    else:   # slices of rows, one at a time
        strides = b.const(f"{name}/strides", np.ones(4, np.int32), "int32")
        rows = []
        for i, (r0, r1) in enumerate(parts):
            begin = b.const(f"{name}/begin{i}", np.asarray([0, r0, 0, 0], np.int32), "int32")
            end = b.const(f"{name}/end{i}", np.asarray([n, r1, w, c], np.int32), "int32")
            rows.append(b.op(B.STRIDED_SLICE, [t, begin, end, strides], f"{name}/rows{i}", (n, r1 - r0, w, c),
                             "int8", tflite_quant(x.type), options("StridedSliceOptions")))
    sums = []
    for i, r in enumerate(rows):
        wide = b.cast(r, "int16", f"{name}/int16_{i}", one)
        sums.append(b.op(B.SUM, [wide, axes], f"{name}/sums{i}", (n, 1, 1, c), "int16", one, sum_opts))
    partial = b.op(B.CONCATENATION, sums, f"{name}/partial", (n, len(sums), 1, c), "int16", one,
                   options("ConcatenationOptions", Axis=1))
    total = b.op(B.SUM, [partial, axes], f"{name}/sums", (n, 1, 1, c), "int16", indexed, sum_opts)
    return b.cast(total, "int32", f"{name}/index"), rest


def _plane_parts(ex: TflmExport, x) -> tuple[str, list[tuple[int, int]]]:
    """How to cut ``x``'s rows for ``_plane_index``, the way that makes the arena smallest: its peak (``x``
    beside the copies, against the peak the model needs anyway) plus ``OP_TAIL`` per operator beyond the
    whole plane's three. ``whole``: an int16 copy of all of it (3x the bytes of ``x`` live); ``split``: a
    SPLIT_V in two, then each half's int16 copy (2x); ``slices``: k strided slices, one at a time
    (1 + 3/k)."""
    n, h, w, c = x.type.shape
    size = n * h * w * c

    def rows(k: int) -> list[tuple[int, int]]:
        step = -(-h // k)
        return [(r, min(r + step, h)) for r in range(0, h, step)]

    ways = [(max(ex.peak_floor, 3 * size), "whole", [(0, h)])]
    if h >= 2:
        ways.append((max(ex.peak_floor, 2 * size) + 5 * OP_TAIL, "split", rows(2)))
    for k in range(3, min(h, MAX_INPUTS[B.CONCATENATION]) + 1):
        parts = rows(k)
        ways.append((max(ex.peak_floor, size + 3 * n * (parts[0][1] - parts[0][0]) * w * c)
                     + (3 * len(parts) + 2) * OP_TAIL, "slices", parts))
    _, mode, parts = min(ways, key=lambda way: way[0])
    return mode, parts


def _sum_range(ex: TflmExport, x, taps: int) -> tuple[int, int]:
    lo, hi = ex.ranges.of(x)
    zp = x.type.quant.zero_point[0]
    return taps * (lo - zp), taps * (hi - zp)


def _avg_pool(ex: TflmExport, op: Op) -> bool:
    x = op.operands[0]
    if x.type.quant is None:
        return False   # LiteRT's float form (refused below if TFLM lacks it)
    if any(op.attrs["pad"]):
        raise NotExact("a padded average pool divides by several tap counts; TFLM has no exact form of it here")
    counts = pool_counts(op)
    taps = int(counts.flat[0])
    s_lo, s_hi = _sum_range(ex, x, taps)
    if s_hi - s_lo + 1 > WIDE_TABLE or max(abs(s_lo), abs(s_hi)) >= FLOAT_EXACT:
        raise NotExact(f"the window sums span more than {WIDE_TABLE} integers")
    zp = x.type.quant.zero_point[0]
    sums = np.arange(s_lo, s_hi + 1, dtype=np.int64)
    m = reciprocal_scale(np.asarray([taps]))
    table = np.clip(requant.apply_scale_32(sums, m.multiplier[0], m.shift[0]) + zp, x.dtype.min, x.dtype.max)
    index = _plane_index(ex, x, s_lo + taps * zp, op.result.name) \
        if tuple(op.attrs["kernel"]) == x.type.shape[1:3] else None
    if index is not None:
        lookup(ex, op, table, index[1], index=index[0])
        return True
    acc = _window_sums(ex, x, zp, op.attrs["kernel"], op.attrs["stride"], op.result.name)
    lookup(ex, op, table, s_lo, index=acc)
    return True


def _mean_form(ex: TflmExport, mean: GlobalMean) -> tuple[np.ndarray | None, int] | None:
    """How the frontend's global average is written: (None, 0) for one MEAN where TFLM's MEAN gives the graph's
    own result on every sum the proven codes make, else (its result as a function of the sum of its centered
    int8 codes, the least sum) for a lookup; None unless the widening is linear and the sums span at most
    ``WIDE_TABLE`` integers."""
    x = mean.widen.operands[0]
    taps = int(np.prod(mean.pool.attrs["kernel"]))
    sums = plane_sums(x.type, taps, *ex.ranges.of(x))
    pooled = pooled_codes(mean, sums)
    if pooled is None:
        return None
    results = final_codes(mean, pooled)
    if np.array_equal(tflm_form(x.type, mean.final.result.type, taps, sums), results):
        return None, 0
    reach = max(abs(int(sums[0])), abs(int(sums[-1])))
    if sums.size > WIDE_TABLE or reach >= FLOAT_EXACT:
        return None
    return results, int(sums[0])


def _summed_form(ex: TflmExport, mean: SummedMean) -> tuple[None, int] | None:
    """(None, 0): one MEAN, where ``TflmMean``'s table is TFLM's MEAN on every sum the proven codes make; else
    None (its ops are written one by one: a float32 SUM and a GATHER)."""
    x, table = mean.widen.operands[0], mean.final.attrs["table"]
    sums = plane_sums(x.type, mean.taps, *ex.ranges.of(x))
    index = sums + mean.final.attrs["offset"]
    if index[0] < 0 or index[-1] >= table.size:
        return None
    native = tflm_form(x.type, mean.final.result.type, mean.taps, sums)
    return (None, 0) if np.array_equal(native, table[index]) else None


def _inner(mean: GlobalMean | SummedMean) -> tuple[Op, ...]:
    """The ops of a mean its last op writes with it."""
    return (mean.widen, mean.pool) if isinstance(mean, GlobalMean) else (mean.widen, mean.rows, mean.cols)


def _mean_of(ex: TflmExport, op: Op) -> bool:
    _mean(ex, *ex.composed[id(op)])
    return True


def _mean(ex: TflmExport, mean: GlobalMean | SummedMean, table: np.ndarray | None, s_lo: int) -> None:
    x = mean.widen.operands[0]
    zp, name = x.type.quant.zero_point[0], mean.final.result.name
    if table is None:   # TFLM's MEAN over axes 1 and 2, keeping them: the kernel tflm/mean.py models
        axes = ex.b.const(f"{name}/axes", np.asarray([1, 2], np.int32), "int32")
        squeeze = ex.squeezed.get(id(mean.final))
        if squeeze is None:
            ex.result(mean.final, B.MEAN, [ex.value(x), axes], options("ReducerOptions", KeepDims=True))
        else:   # (TFLM's int8 MEAN computes alike either way; a tensor and an operator fewer in the arena)
            ex.result(squeeze, B.MEAN, [ex.value(x), axes], options("ReducerOptions", KeepDims=False))
        return
    index = _plane_index(ex, x, s_lo + int(np.prod(mean.pool.attrs["kernel"])) * zp, name)
    if index is not None:
        lookup(ex, mean.final, table, index[1], index=index[0])
        return
    acc = _window_sums(ex, x, zp, mean.pool.attrs["kernel"], (1, 1), name)
    lookup(ex, mean.final, table, s_lo, index=acc)


# -- data movement -------------------------------------------------------------------------------

def _concat(ex: TflmExport, op: Op) -> bool:
    """More inputs than TFLM's CONCATENATION takes: a tree of concatenations of at most that many along
    the same axis (the same codes in the same order; all share one quantization, or LiteRT's refuses)."""
    (xs,) = op.operands
    limit = MAX_INPUTS[B.CONCATENATION]
    if len(xs) <= limit:
        return False
    b, axis, t = ex.b, op.attrs["axis"], op.result.type
    quant = tflite_quant(t)
    if {tflite_quant(v.type) for v in xs} != {quant}:
        return False
    parts = [(ex.value(v), v.shape[axis]) for v in xs]
    level = 0
    while len(parts) > limit:
        grouped = []
        for i in range(0, len(parts), limit):
            group = parts[i:i + limit]
            if len(group) == 1:
                grouped.append(group[0])
                continue
            width = sum(n for _, n in group)
            shape = tuple(width if d == axis % t.rank else s for d, s in enumerate(t.shape))
            grouped.append((b.op(B.CONCATENATION, [p for p, _ in group], f"{op.result.name}/cat{level}_{i}", shape,
                                 _tfl_dtype(t), quant, options("ConcatenationOptions", Axis=axis)), width))
        parts, level = grouped, level + 1
    ex.result(op, B.CONCATENATION, [p for p, _ in parts], options("ConcatenationOptions", Axis=axis))
    return True


def _reduce_sum(ex: TflmExport, op: Op) -> bool:
    """An integer sum as TFLM's float32 SUM (it has no int32 one): exact, whatever the order it adds in,
    while every partial sum is an integer float32 holds (below 2**24, proven from the input's range)."""
    if op.result.type.quant is None:
        raise NotExact("a float sum: the reference adds in float64, TFLM's SUM in float32")
    b, name, x, axis = ex.b, op.result.name, op.operands[0], op.attrs["axis"]
    lo, hi = ex.ranges.of(x)
    reach = max(abs(lo), abs(hi)) * x.shape[axis]
    if reach >= FLOAT_EXACT:
        raise NotExact(f"an integer sum is exact on TFLM only in float32, below 2**24; this one may reach {reach}")
    t = b.cast(ex.plain(x), "float32", f"{name}/f32")
    a = b.const(f"{name}/axis", np.asarray([axis], np.int32), "int32")
    sums = b.op(B.SUM, [t, a], f"{name}/sum", op.result.shape, "float32",
                opts=options("ReducerOptions", KeepDims=True))
    ex.bind(op.result, b.cast(sums, _tfl_dtype(op.result.type), name, tflite_quant(op.result.type)))
    return True


def _arg(code: int, opts_name: str) -> Callable[[TflmExport, Op], bool]:
    def run(ex: TflmExport, op: Op) -> bool:
        """ARG_MAX / ARG_MIN on the int8 codes themselves (TFLM has no int32 kernel; LiteRT's form widens
        them first): one order, one first index of the extreme, whatever the quantization."""
        x = op.operands[0]
        if x.dtype is not DType.INT8:
            return False
        b, name, axis = ex.b, op.result.name, op.attrs["axis"]
        shape = tuple(d for i, d in enumerate(x.type.shape) if i != axis)
        a = b.const(f"{name}/axis", np.asarray([axis], np.int32), "int32")
        idx = b.op(code, [ex.value(x), a], f"{name}/flat", shape, "int32",
                   opts=options(opts_name, OutputType=TflType.INT32))
        ex.bind(op.result, ex._reshape(idx, op.result.shape, name))
        return True
    return run


_OWN: dict[str, Callable[[TflmExport, Op], bool]] = {
    "rescale": _rescale, "table": _table, "avg_pool2d": _avg_pool, "concat": _concat, "reduce_sum": _reduce_sum,
    "argmax": _arg(B.ARG_MAX, "ArgMaxOptions"), "argmin": _arg(B.ARG_MIN, "ArgMinOptions"),
}


# -- what the partitioner and the program use -------------------------------------------------------

def op_reasons(graph: Graph) -> dict[int, str]:
    """id(op) -> why ``op`` has no TFLM form, for every op of ``graph`` that has none.

    One export of the whole graph, op by op: an op that fails leaves a placeholder for its results,
    so the ops after it are judged on their own. An op written by another (a fused GEMM by its
    rescale, an ADD group's and a global average's members by the last op) shares that op's verdict."""
    ex = TflmExport(graph, "")
    for v in graph.inputs:
        ex.bind(v, ex.b.tensor(v.name, v.shape, _tfl_dtype(v.type), tflite_quant(v.type)))
    writers: dict[int, list[Op]] = {}
    for g in ex.adds.values():
        writers[id(g.out)] = list(g.members)
    for m, _, _ in ex.composed.values():
        writers[id(m.final)] = list(_inner(m))
    for final, reshape in ex.squeezed.items():
        writers[final].append(reshape)
    reasons: dict[int, str] = {}
    for op in graph.ops:
        if op.kind == "constant" or id(op) in ex.skipped:
            continue
        if op.kind in ("conv2d", "fully_connected", "matmul"):
            fused = [u for u in ex.users.get(op.result, []) if ex.fused_gemm(u) is op]
            if fused:
                writers.setdefault(id(fused[0]), []).append(op)
                continue
        try:
            ex.emit(op)
        except NotExact as e:
            reasons[id(op)] = str(e)
            for v in op.results:
                try:
                    ex.bind(v, ex.b.tensor(v.name, v.shape, _tfl_dtype(v.type), tflite_quant(v.type)))
                except NotExact:
                    pass
    for writer, members in writers.items():
        for m in members:
            if writer in reasons:
                reasons[id(m)] = reasons[writer]
    return reasons


def export_tflm(graph: Graph, description: str = "qlower for TFLM") -> bytes:
    """The .tflite TFLM runs computing exactly what ``graph`` means; UnsupportedOpError names the first op
    with no TFLM form (its source line and why)."""
    try:
        return TflmExport(graph, description).run()
    except NotExact as e:
        raise UnsupportedOpError(f"graph '{graph.name}' can't be exported for TFLM: {e}") from None
