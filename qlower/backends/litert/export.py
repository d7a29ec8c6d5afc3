"""IR graph -> TFLite flatbuffer that computes exactly what the reference interpreter computes.

Each IR op becomes TFLite builtin operators (no custom ops):

- ``conv2d`` / ``fully_connected`` / ``matmul`` whose int32 result feeds one
  single-rounding ``rescale`` to int8 become one fused CONV_2D,
  DEPTHWISE_CONV_2D, FULLY_CONNECTED or BATCH_MATMUL: TFLite derives the same
  multiplier from the float32 scales and requantizes with the same single
  rounding (checked per op at export: ``emit.same_multiplier``);
- other ``rescale``s, integer ``mul`` with a shift, ``table`` (a GATHER from the
  table) and ``quantize`` are written as exact plain-integer arithmetic
  (``emit.py``);
- ops that only move or compare codes map one to one, on raw codes.

``native=True`` (the ``xnnpack`` kernels) writes XNNPACK's own forms where
they compute the same codes, so the delegate takes the whole model instead of
stopping at every plain-integer op: a per-tensor int8 ``quantize`` /
``dequantize`` becomes QUANTIZE / DEQUANTIZE (XNNPACK multiplies by the
float32 reciprocal of the scale and rounds half to even, as the reference
does), padding with the zero point PAD instead of PADV2, and a residual add in
XNNPACK's form (xnnpack_add.py) one ADD, and a global mean in XNNPACK's form
(xnnpack_mean.py) one MEAN.

An op with no exact form raises UnsupportedOpError naming the op, its source
line and why. Tensors are named after the IR values they hold, so a traced run
can read any of them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tflite.ActivationFunctionType import ActivationFunctionType as Act
from tflite.BuiltinOperator import BuiltinOperator as B
from tflite.Padding import Padding
from tflite.TensorType import TensorType as TflType

from qlower.backends.litert import emit
from qlower.backends.litert.emit import Builder, NotExact, channel_shape, options, tflite_quant
from qlower.backends.litert.fused_add import AddGroup, add_groups
from qlower.backends.litert.ranges import CodeRanges, table_span
from qlower.backends.litert.xnnpack_add import xnnpack_add_groups
from qlower.backends.litert.xnnpack_mean import xnnpack_means
from qlower.errors import UnsupportedOpError
from qlower.ir import DType, Graph, Op, TensorType, Value, requant
from qlower.reference.elementwise import wraps
from qlower.reference.pooling import pool_counts, reciprocal_scale

GEMMS = ("conv2d", "fully_connected", "matmul")
_TYPES = {DType.FLOAT32: "float32", DType.INT8: "int8", DType.INT16: "int16", DType.INT32: "int32",
          DType.BOOL: "bool", DType.UINT8: "uint8"}


def _tfl_dtype(t: TensorType) -> str:
    try:
        return _TYPES[t.dtype]
    except KeyError:
        raise NotExact(f"TFLite has no tensor type for {t.dtype.value}") from None


class _Export:
    def __init__(self, graph: Graph, description: str, native: bool = False):
        self.graph = graph
        self.native = native
        self.b = Builder()
        self.b.writer.description = description
        self.tensors: dict[Value, int] = {}
        self.users = graph.users()
        self.producers = graph.producers()
        self.outputs = set(graph.outputs)
        self.adds = add_groups(graph) | (xnnpack_add_groups(graph) if native else {})
        self.ranges = CodeRanges(graph)
        self.means = xnnpack_means(graph) if native else {}
        # ops written by another op's emitter: an add group's members by its output rescale, an XNNPACK
        # mean's centering and sums by its table
        self.skipped = {id(m) for g in self.adds.values() for m in g.members}
        self.skipped |= {id(o) for m in self.means.values() for o in (m.widen, m.rows, m.cols)}

    # -- tensors of IR values -----------------------------------------------------------------
    def value(self, v: Value) -> int:
        if v not in self.tensors:
            op = self.producers.get(v)
            if op is None or op.kind != "constant":
                raise NotExact(f"%{v.name} is used before it is computed")
            self.tensors[v] = self.b.const(v.name, op.attrs["data"], _tfl_dtype(v.type), tflite_quant(v.type))
        return self.tensors[v]

    def bind(self, v: Value, tensor: int) -> None:
        self.tensors[v] = tensor

    def result(self, op: Op, code: int, inputs, opts=None) -> int:
        """Emit ``code`` writing ``op``'s result tensor directly."""
        v = op.result
        t = self.b.op(code, inputs, v.name, v.shape, _tfl_dtype(v.type), tflite_quant(v.type), opts)
        self.bind(v, t)
        return t

    def plain(self, v: Value, dtype: str = "int32") -> int:
        """``v``'s raw codes as a plain tensor of ``dtype`` (no quantization parameters)."""
        return self.b.cast(self.value(v), dtype, f"{v.name}/{dtype}")

    # -- fusion of a GEMM into the rescale that reads its accumulator ----------------------------
    def fused_gemm(self, rescale: Op) -> Op | None:
        src = self.producers.get(rescale.operands[0])
        if src is None or src.kind not in GEMMS or src.result in self.outputs:
            return None
        if [u for u in self.users.get(src.result, [])] != [rescale]:
            return None
        return src if _fusion_problem(src, rescale) is None else None

    def run(self) -> bytes:
        inputs = []
        for v in self.graph.inputs:
            t = self.b.tensor(v.name, v.shape, _tfl_dtype(v.type), tflite_quant(v.type))
            self.bind(v, t)
            inputs.append(t)
        for op in self.graph.ops:
            if op.kind == "constant" or id(op) in self.skipped:
                continue   # constants are written where they are read, see self.skipped for the others
            if op.kind in GEMMS and all(self.fused_gemm(u) is op for u in self.users.get(op.result, [])) \
                    and self.users.get(op.result) and op.result not in self.outputs:
                continue   # emitted by the rescale that reads it
            try:
                self.emit(op)
            except NotExact as e:
                raise _unsupported(op, str(e)) from None
        outputs = []
        for v in self.graph.outputs:
            t = self.value(v)
            if self.b.writer.tensors[t].buffer or t in inputs:
                # TFLite outputs must be computed by an operator: copy constants and inputs through a RESHAPE
                t = self._reshape(t, v.shape, f"{v.name}/out", tflite_quant(v.type))
            outputs.append(t)
        return self.b.writer.finish(inputs, outputs)

    def emit(self, op: Op) -> None:
        """Write ``op`` (NotExact says why it has no exact TFLite form)."""
        emitter = _EMITTERS.get(op.kind)
        if emitter is None:
            raise NotExact(f"{op.kind} has no TFLite builtin form in qlower's exporter")
        emitter(self, op)

    def _reshape(self, t: int, shape, name: str, quant=None) -> int:
        new_shape = self.b.const(f"{name}/shape", np.asarray(shape, dtype=np.int32), "int32")
        return self.b.op(B.RESHAPE, [t, new_shape], name, shape, self.b.dtype(t), quant)


def _int8_per_tensor(t: TensorType) -> bool:
    return t.dtype is DType.INT8 and t.quant is not None and not t.quant.is_per_channel and not t.quant.dynamic


def _unsupported(op: Op, reason: str) -> UnsupportedOpError:
    where = f" at {op.origin.describe()}" if op.origin else ""
    return UnsupportedOpError(f"{op.kind} producing %{op.results[0].name}{where} can't be exported to TFLite: {reason}")


# -- fused GEMMs ----------------------------------------------------------------------------------

def _fusion_problem(gemm: Op, rescale: Op) -> str | None:
    """Why ``gemm`` + ``rescale`` is not one exact fused TFLite kernel, or None."""
    out = rescale.attrs["out"]
    if out.dtype is not DType.INT8:
        return "only a rescale to int8 fuses"
    x, w = gemm.operands[0].type, gemm.operands[1].type
    if x.dtype is not DType.INT8 or w.dtype is not DType.INT8 or x.quant is None or x.quant.is_per_channel:
        return "fused TFLite kernels take int8 per-tensor inputs"
    if gemm.kind == "matmul":
        if w.quant is None or w.quant.is_per_channel:
            return "BATCH_MATMUL takes per-tensor operands"
    elif any(z != 0 for z in w.quant.zero_point) or (w.quant.axis not in (None, 0)):
        return "TFLite weights are symmetric and quantized along the output channel"
    if gemm.kind == "conv2d" and gemm.attrs["groups"] != 1 and not _depthwise(gemm):
        return "grouped convolution (not depthwise) has no TFLite builtin"
    if gemm.kind == "matmul" and x.rank > 4:
        return "BATCH_MATMUL takes rank <= 4"
    acc = gemm.result.type.quant
    ir = requant.requantize_ratio(np.asarray(acc.scale), out.scale[0])
    def stored(scales):   # the float32 scales a .tflite holds, widened as TFLite's kernels widen them
        return np.asarray(scales, np.float32).astype(np.float64)
    real = stored(x.quant.scale[0]) * stored(w.quant.scale) / stored(out.scale[0])
    if not emit.same_multiplier(real, ir.multiplier, ir.shift):
        return ("TFLite's requantization multiplier, which it computes from the float32 scales it stores, "
                "differs from the IR's (scales that are not float32s, as PyTorch's are)")
    return None


def _depthwise(conv: Op) -> bool:
    c = conv.operands[0].type.shape[3]
    return conv.attrs["groups"] == c and conv.operands[1].type.shape[3] == 1 and c > 1


def _activation(out_spec, out: TensorType) -> tuple[int, bool]:
    """A fused activation whose clamp TFLite computes as exactly [qmin, qmax] of ``out_spec``
    (NONE when it is the dtype range), and whether it covers the range (else clamp after)."""
    lo, hi = out.dtype.min, out.dtype.max
    if (out_spec.qmin, out_spec.qmax) == (lo, hi):
        return Act.NONE, True
    zp, scale = out_spec.zero_point[0], np.float32(out_spec.scale[0])
    relu = (max(lo, zp), hi)
    relu6 = (max(lo, zp), min(hi, zp + int(np.round(np.float32(6.0) / scale))))
    if (out_spec.qmin, out_spec.qmax) == relu:
        return Act.RELU, True
    if (out_spec.qmin, out_spec.qmax) == relu6:
        return Act.RELU6, True
    return Act.NONE, False


def _emit_fused(ex: _Export, gemm: Op, rescale: Op) -> None:
    b = ex.b
    out_spec = rescale.attrs["out"]
    act, covered = _activation(out_spec, rescale.result.type)
    x = ex.value(gemm.operands[0])
    xq = gemm.operands[0].type.quant
    wv = gemm.operands[1]
    wq = wv.type.quant
    wdata = ex.producers[wv].attrs["data"] if ex.producers.get(wv) and ex.producers[wv].kind == "constant" else None
    bias_v = gemm.operands[2] if len(gemm.operands) > 2 else None
    inputs = [x]
    if gemm.kind == "matmul":
        inputs.append(ex.value(wv))
        code, opts = B.BATCH_MATMUL, options("BatchMatMulOptions", AdjX=False, AdjY=False)
    else:
        if wdata is None:
            raise NotExact("TFLite's fused kernels need constant weights")
        if gemm.kind == "conv2d":
            (sh, sw), (dh, dw), pad = gemm.attrs["stride"], gemm.attrs["dilation"], gemm.attrs["pad"]
            kh, kw = wv.type.shape[1:3]
            x, padding = _padded(ex, x, gemm.operands[0], pad, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), (sh, sw),
                                 xq.zero_point[0], f"{gemm.result.name}/pad")
            inputs[0] = x
            if _depthwise(gemm):
                c = gemm.operands[0].type.shape[3]
                data = np.transpose(wdata, (3, 1, 2, 0))          # OHW1 -> 1HWO
                w = b.const(wv.name, data, "int8", emit.Quant(tuple(map(float, np.float32(wq.scale))),
                                                              tuple(wq.zero_point), 3))
                code = B.DEPTHWISE_CONV_2D
                opts = options("DepthwiseConv2DOptions", Padding=padding, StrideW=sw, StrideH=sh,
                               DepthMultiplier=wdata.shape[0] // c, FusedActivationFunction=act,
                               DilationWFactor=dw, DilationHFactor=dh)
            else:
                w = b.const(wv.name, wdata, "int8", tflite_quant(wv.type))
                code = B.CONV_2D
                opts = options("Conv2DOptions", Padding=padding, StrideW=sw, StrideH=sh,
                               FusedActivationFunction=act, DilationWFactor=dw, DilationHFactor=dh)
        else:
            w = b.const(wv.name, wdata, "int8", tflite_quant(wv.type))
            code = B.FULLY_CONNECTED
            opts = options("FullyConnectedOptions", FusedActivationFunction=act,
                           KeepNumDims=gemm.operands[0].type.rank > 2)
        inputs.append(w)
        # LiteRT's int8 convolutions require a bias: a missing one is zeros, which add nothing
        n_out = gemm.result.shape[-1]
        bias_data = ex.producers[bias_v].attrs["data"] if bias_v is not None else np.zeros(n_out, np.int32)
        bias_scale = tuple(float(np.float32(np.float64(xq.scale[0]) * s)) for s in wq.scale)   # as the weights'
        inputs.append(b.const(bias_v.name if bias_v is not None else f"{gemm.result.name}/bias", bias_data, "int32",
                              emit.Quant(bias_scale, (0,) * len(bias_scale), 0)))
    shape, quant = rescale.result.shape, tflite_quant(rescale.result.type)
    # FULLY_CONNECTED writes [1, n] for a rank-1 input: computed as such, then reshaped to [n]
    flat = len(shape) == 1
    final = f"{rescale.result.name}/2d" if flat else rescale.result.name
    name = final if covered else f"{rescale.result.name}/acc"
    out = b.op(code, inputs, name, (1, *shape) if flat else shape, "int8", quant, opts)
    if not covered:
        out = b.clamp(out, np.int8(out_spec.qmin), np.int8(out_spec.qmax), final, quant)
    if flat:
        out = ex._reshape(out, shape, rescale.result.name, quant)
    ex.bind(rescale.result, out)


def _emit_add(ex: _Export, group: AddGroup) -> None:
    """One int8 ADD for a group in TFLite ADD's form (fused_add.py), with its activation clamp."""
    out = group.out
    out_spec, t = out.attrs["out"], out.result.type
    act, covered = _activation(out_spec, t)
    name = out.result.name if covered else f"{out.result.name}/sum"
    y = ex.b.op(B.ADD, [ex.value(x) for x in group.operands], name, t.shape, "int8", tflite_quant(t),
                options("AddOptions", FusedActivationFunction=act))
    if not covered:
        y = ex.b.clamp(y, np.int8(out_spec.qmin), np.int8(out_spec.qmax), out.result.name, tflite_quant(t))
    ex.bind(out.result, y)


def _same_pads(size: int, k: int, stride: int) -> tuple[int, int]:
    """TFLite's SAME padding (before, after) of one spatial axis (``k`` the dilated window)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


def _padded(ex: _Export, t: int, v: Value, pad, kernel, stride, value, name: str, same_ok: bool = True):
    """``t`` and the TFLite padding for a window op with explicit IR ``pad`` (top, bottom, left, right):
    VALID when there is none, SAME when it is exactly TFLite's, else an explicit PADV2 and VALID."""
    if not any(pad):
        return t, Padding.VALID
    _, h, w, _ = v.type.shape
    if same_ok and tuple(pad) == _same_pads(h, kernel[0], stride[0]) + _same_pads(w, kernel[1], stride[1]):
        return t, Padding.SAME
    return _pad(ex, t, v, pad, value, name), Padding.VALID


def _pad(ex: _Export, t: int, v: Value, pad, value: int, name: str) -> int:
    """PADV2 of an NHWC tensor by (top, bottom, left, right) with ``value`` codes."""
    pt, pb, pl, pr = pad
    pads = np.array([[0, 0], [pt, pb], [pl, pr], [0, 0]], dtype=np.int32)
    return _padv2(ex, t, v.type, pads, value, name)


def _padv2(ex: _Export, t: int, vt: TensorType, pads: np.ndarray, value, name: str) -> int:
    b = ex.b
    shape = tuple(int(d + p0 + p1) for d, (p0, p1) in zip(b.shape(t), pads))
    quant = b.writer.tensors[t].quant
    if ex.native and quant is not None and len(quant.zero_point) == 1 and np.all(value == quant.zero_point[0]):
        # a quantized PAD pads with the zero point: the same codes, in the form XNNPACK fuses into the conv
        return b.op(B.PAD, [t, b.const(f"{name}/pads", pads, "int32")], name, shape, b.dtype(t), quant)
    fill = b.const(f"{name}/value", np.asarray(value, dtype=b.dtype(t)), b.dtype(t), quant)
    return b.op(B.PADV2, [t, b.const(f"{name}/pads", pads, "int32"), fill], name, shape, b.dtype(t), quant)


# -- per-op emitters -------------------------------------------------------------------------------

def _rescale(ex: _Export, op: Op) -> None:
    gemm = ex.fused_gemm(op)
    if gemm is not None:
        return _emit_fused(ex, gemm, op)
    if id(op) in ex.adds:
        return _emit_add(ex, ex.adds[id(op)])
    src, out = op.operands[0].type.quant, op.attrs["out"]
    mult = requant.requantize_ratio(np.asarray(src.scale), out.scale[0])
    lo, hi = ex.ranges.of(op.operands[0])
    if not src.is_per_channel and table_span(lo, hi):
        # a function of at most 2**16 integers (int8/int16 codes, a pool's sum): one GATHER from the
        # reference's own numbers, no 64-bit arithmetic
        codes = np.arange(lo, hi + 1, dtype=np.int64)
        table = requant.rescale(codes, np.asarray(src.zero_point), out.zero_point[0], mult, out.qmin, out.qmax,
                                rounding=op.attrs["rounding"])
        return _gather_table(ex, op, table, -lo, (lo, hi))
    if op.attrs["rounding"] not in ("single", "double"):
        raise NotExact(f"a {op.attrs['rounding']} rescale of int32 codes exists only inside a fused TFLite GEMM")
    rank = op.result.type.rank
    t = emit.rescale(ex.b, ex.value(op.operands[0]), channel_shape(src.zero_point, rank, src.axis),
                     channel_shape(mult.multiplier, rank, src.axis), channel_shape(mult.shift, rank, src.axis),
                     out.zero_point[0], out.qmin, out.qmax, _tfl_dtype(op.result.type), op.result.name,
                     tflite_quant(op.result.type), double_round=op.attrs["rounding"] == "double")
    ex.bind(op.result, t)


def _gemm_alone(ex: _Export, op: Op) -> None:
    raise NotExact(f"its int32 accumulator is used other than by one rescale to int8 "
                   f"({_fusion_reason(ex, op)}); TFLite has no int32-output {op.kind}")


def _fusion_reason(ex: _Export, op: Op) -> str:
    users = ex.users.get(op.result, [])
    if len(users) != 1 or users[0].kind != "rescale" or op.result in ex.outputs:
        return "users: " + ", ".join(u.kind for u in users) if users else "it is a graph output"
    return _fusion_problem(op, users[0]) or "?"


def _quantize(ex: _Export, op: Op) -> None:
    """float -> codes as the reference: round_half_even(x * float32(1/scale)) + zp, clamped, in float32."""
    q = op.attrs["out"]
    if ex.native and _int8_per_tensor(op.result.type):
        t, name = op.result.type, op.result.name
        if (q.qmin, q.qmax) == (t.dtype.min, t.dtype.max):
            ex.result(op, B.QUANTIZE, [ex.value(op.operands[0])])
            return
        # QUANTIZE saturates to the dtype's range: a narrower [qmin, qmax] is a clamp after it
        y = ex.b.op(B.QUANTIZE, [ex.value(op.operands[0])], f"{name}/q", t.shape, "int8", tflite_quant(t))
        ex.bind(op.result, ex.b.clamp(y, np.int8(q.qmin), np.int8(q.qmax), name, tflite_quant(t)))
        return
    if op.result.type.dtype not in (DType.INT8, DType.INT16):
        raise NotExact("quantize to int32 has no exact float32 form")
    b, rank = ex.b, op.result.type.rank
    inv = (1.0 / np.asarray(q.scale, dtype=np.float64)).astype(np.float32)
    x = ex.value(op.operands[0])
    name = op.result.name
    y = b.binary_const(B.MUL, x, channel_shape(inv, rank, q.axis), f"{name}/mul")
    zp = channel_shape(np.asarray(q.zero_point, np.float64), rank, q.axis)
    y = emit.round_half_even(b, y, q.qmin - zp, q.qmax - zp, zp, name)
    y = b.clamp(y, np.float32(q.qmin), np.float32(q.qmax), f"{name}/range")
    ex.bind(op.result, b.cast(y, _tfl_dtype(op.result.type), name, tflite_quant(op.result.type)))


def _dequantize(ex: _Export, op: Op) -> None:
    if op.operands[1] is not None:
        raise NotExact("dynamic dequantization (a run-time scale) has no TFLite form")
    # (x - zp) as float32, times the float32 scale, as the reference computes it: LiteRT's optimized
    # DEQUANTIZE rounds differently (1 ulp), and XNNPACK can't take one whose input is a constant
    t = op.operands[0].type
    b, q, name = ex.b, t.quant, op.result.name
    source = ex.producers.get(op.operands[0])
    if ex.native and _int8_per_tensor(t) and (source is None or source.kind != "constant"):
        ex.result(op, B.DEQUANTIZE, [ex.value(op.operands[0])])
        return
    x = ex.plain(op.operands[0])
    if any(q.zero_point):
        x = b.binary_const(B.SUB, x, channel_shape(np.asarray(q.zero_point, np.int32), t.rank, q.axis), f"{name}/c")
    x = b.cast(x, "float32", f"{name}/f")
    ex.bind(op.result, b.binary_const(B.MUL, x, channel_shape(np.asarray(q.scale, np.float32), t.rank, q.axis),
                                      name))


def _same_domain_binary(code: int) -> Callable[[_Export, Op], None]:
    def run(ex: _Export, op: Op) -> None:
        a, bv = op.operands
        if wraps(op):  # signed overflow in TFLite's int32 kernels is C++ undefined behaviour, not a wrap
            raise NotExact("plain int32 arithmetic wraps around on overflow in PyTorch; TFLite's int32 "
                           f"{op.kind.upper()} does not define overflow: stays on the host")
        if op.result.type.dtype is DType.FLOAT32 or op.result.type.dtype is DType.INT32:
            ex.result(op, code, [ex.value(a), ex.value(bv)], _binary_options(code))
        else:   # narrow codes: compute on int32 (no TFLite requantization), then narrow exactly
            y = ex.b.binary(code, ex.plain(a), ex.plain(bv), f"{op.result.name}/i32")
            ex.bind(op.result, ex.b.cast(y, _tfl_dtype(op.result.type), op.result.name, tflite_quant(op.result.type)))
    return run


def _binary_options(code: int):
    return {B.ADD: options("AddOptions"), B.SUB: options("SubOptions"), B.MUL: options("MulOptions")}.get(code)


def _mul(ex: _Export, op: Op) -> None:
    shift = op.attrs["shift"]
    if op.result.type.quant is None or shift == 0 or wraps(op):
        return _same_domain_binary(B.MUL)(ex, op)
    b, name = ex.b, op.result.name
    p = b.binary(B.MUL, ex.plain(op.operands[0], "int64"), ex.plain(op.operands[1], "int64"), f"{name}/p")
    p = b.binary_const(B.ADD, p, np.int64(1 << (shift - 1)), f"{name}/round")
    info = np.iinfo(np.int32)
    ex.bind(op.result, emit.floor_shift(b, p, np.int64(shift), np.int64(info.min), np.int64(info.max), name))


def _intdiv(ex: _Export, op: Op) -> None:
    # TFLite's int32 DIV truncates toward zero like TOSA INTDIV; a zero divisor (an error in the
    # reference) is replaced by 1 so that the kernel never divides by zero.
    b, name = ex.b, op.result.name
    d = ex.value(op.operands[1])
    zero = b.binary(B.EQUAL, d, b.const(f"{name}/0", np.int32(0), "int32"), f"{name}/zero", dtype="bool")
    d = b.binary(B.ADD, d, b.cast(zero, "int32", f"{name}/one"), f"{name}/divisor")
    ex.result(op, B.DIV, [ex.value(op.operands[0]), d], options("DivOptions"))


def _compare(code: int) -> Callable[[_Export, Op], None]:
    def run(ex: _Export, op: Op) -> None:
        a, bv = op.operands
        if a.type.dtype is DType.FLOAT32:
            ex.result(op, code, [ex.value(a), ex.value(bv)])
        else:   # raw codes (same domain): compare as plain int32, never through TFLite's requantization
            ex.result(op, code, [ex.plain(a), ex.plain(bv)])
    return run


def _logical(code: int) -> Callable[[_Export, Op], None]:
    def run(ex: _Export, op: Op) -> None:
        ex.result(op, code, [ex.value(v) for v in op.operands])
    return run


def _select(ex: _Export, op: Op) -> None:
    ex.result(op, B.SELECT_V2, [ex.value(v) for v in op.operands])


def _clamp(ex: _Export, op: Op) -> None:
    t = op.result.type
    dt = np.dtype(_tfl_dtype(t))
    ex.bind(op.result, ex.b.clamp(ex.value(op.operands[0]), np.asarray(op.attrs["min"]).astype(dt),
                                  np.asarray(op.attrs["max"]).astype(dt), op.result.name, tflite_quant(t)))
    if ex.tensors[op.result] == ex.tensors[op.operands[0]]:   # nothing to clamp: still a tensor of its own
        ex.bind(op.result, ex._reshape(ex.tensors[op.result], t.shape, op.result.name, tflite_quant(t)))


def _concat(ex: _Export, op: Op) -> None:
    (xs,) = op.operands
    quants = {tflite_quant(v.type) for v in xs} | {tflite_quant(op.result.type)}
    if len(quants) != 1:
        raise NotExact("TFLite requantizes a concatenation whose inputs differ in quantization")
    ex.result(op, B.CONCATENATION, [ex.value(v) for v in xs],
              options("ConcatenationOptions", Axis=op.attrs["axis"]))


def _reshape(ex: _Export, op: Op) -> None:
    t = op.result.type
    ex.bind(op.result, ex._reshape(ex.value(op.operands[0]), t.shape, op.result.name, tflite_quant(t)))


def _transpose(ex: _Export, op: Op) -> None:
    perm = ex.b.const(f"{op.result.name}/perm", np.asarray(op.attrs["perm"], np.int32), "int32")
    ex.result(op, B.TRANSPOSE, [ex.value(op.operands[0]), perm])


def _pad_op(ex: _Export, op: Op) -> None:
    p = op.attrs["pads"]
    pads = np.asarray(p, dtype=np.int32).reshape(-1, 2)
    value = op.attrs["value"]
    ex.bind(op.result, _padv2(ex, ex.value(op.operands[0]), op.operands[0].type, pads, value, op.result.name))


def _slice(ex: _Export, op: Op) -> None:
    a, name = op.attrs, op.result.name
    rank = op.operands[0].type.rank
    step = a["step"] or (1,) * rank
    b = ex.b
    ex.result(op, B.STRIDED_SLICE, [ex.value(op.operands[0]),
                                    b.const(f"{name}/begin", np.asarray(a["start"], np.int32), "int32"),
                                    b.const(f"{name}/end", np.asarray(a["stop"], np.int32), "int32"),
                                    b.const(f"{name}/strides", np.asarray(step, np.int32), "int32")],
              options("StridedSliceOptions"))


def _gather(ex: _Export, op: Op) -> None:
    ex.result(op, B.GATHER, [ex.value(op.operands[0]), ex.value(op.operands[1])],
              options("GatherOptions", Axis=op.attrs["axis"]))


def _table(ex: _Export, op: Op) -> None:
    if id(op) in ex.means:   # XNNPACK's MEAN of the plane (xnnpack_mean.py)
        axes = ex.b.const(f"{op.result.name}/axes", np.asarray([1, 2], np.int32), "int32")
        ex.result(op, B.MEAN, [ex.value(ex.means[id(op)].widen.operands[0]), axes],
                  options("ReducerOptions", KeepDims=True))
        return
    _gather_table(ex, op, op.attrs["table"], op.attrs["offset"])


def _gather_table(ex: _Export, op: Op, table: np.ndarray, offset: int, proven: tuple[int, int] | None = None) -> None:
    """``op``'s result as ``table[clip(x + offset)]``: a GATHER from the constant table (no clip where the
    input is ``proven`` to stay within the table)."""
    b, name = ex.b, op.result.name
    idx = ex.plain(op.operands[0])
    if offset:
        idx = b.binary_const(B.ADD, idx, np.int32(offset), f"{name}/index")
    dt = op.operands[0].type.dtype
    lo, hi = proven or (dt.min, dt.max)
    if lo + offset < 0 or hi + offset >= table.size:   # codes beyond the declared range read the ends
        idx = b.clamp(idx, np.int32(0), np.int32(table.size - 1), f"{name}/inside")
    dtype = _tfl_dtype(op.result.type)
    tab = b.const(f"{name}/table", np.asarray(table).astype(dtype), dtype, tflite_quant(op.result.type))
    ex.result(op, B.GATHER, [tab, idx], options("GatherOptions", Axis=0))


def _max_pool(ex: _Export, op: Op) -> None:
    (kh, kw), (sh, sw), pad = op.attrs["kernel"], op.attrs["stride"], op.attrs["pad"]
    t = op.operands[0].type
    low = t.dtype.min if t.dtype.is_integer else np.finfo(np.float32).min
    # TFLite's SAME max pool skips padding taps, as padding with the lowest code does (integers only:
    # a float window of -inf taps would give the lowest float32 in the reference)
    x, padding = _padded(ex, ex.value(op.operands[0]), op.operands[0], pad, (kh, kw), (sh, sw), low,
                         f"{op.result.name}/pad", same_ok=t.dtype.is_integer)
    ex.result(op, B.MAX_POOL_2D, [x], options("Pool2DOptions", Padding=padding, StrideW=sw, StrideH=sh,
                                              FilterWidth=kw, FilterHeight=kh))


def _avg_pool(ex: _Export, op: Op) -> None:
    """TOSA's integer average: the exact sum of the real taps' centered codes, times ``reciprocal_scale`` of
    their count. The sums come from a float32 depthwise convolution with a filter of ones on the centered
    codes: every partial sum is an integer below 2**24, so float32 holds it exactly in any order. A global
    pool whose sums float32 can't hold exactly sums in int32 (SUM over H and W) instead."""
    t = op.operands[0].type
    if t.quant is None:
        raise NotExact("float average pooling sums in an order LiteRT's kernels don't follow")
    (kh, kw), (sh, sw), pad = op.attrs["kernel"], op.attrs["stride"], op.attrs["pad"]
    float_exact = kh * kw * (t.dtype.max - t.dtype.min) < emit.FLOAT_EXACT
    global_pool = (kh, kw) == t.shape[1:3] and not any(pad)
    if not float_exact and not global_pool:
        raise NotExact(f"a {kh}x{kw} window's sum of {t.dtype.value} codes is not exact in float32")
    b, name, zp = ex.b, op.result.name, t.quant.zero_point[0]
    n, oh, ow, c = op.result.shape
    x = ex.plain(op.operands[0])
    if zp:
        x = b.binary_const(B.SUB, x, np.int32(zp), f"{name}/center")
    if not float_exact:
        axes = b.const(f"{name}/axes", np.asarray([1, 2], np.int32), "int32")
        acc = b.op(B.SUM, [x, axes], f"{name}/acc", (n, 1, 1, c), "int32", opts=options("ReducerOptions", KeepDims=True))
        _average_of_sums(ex, op, acc)
        return
    x = b.cast(x, "float32", f"{name}/f32")
    if any(pad):
        x = _padv2(ex, x, t, np.array([[0, 0], [pad[0], pad[1]], [pad[2], pad[3]], [0, 0]], np.int32), 0.0,
                   f"{name}/pad")
    ones = b.const(f"{name}/ones", np.ones((1, kh, kw, c), np.float32), "float32")
    zeros = b.const(f"{name}/zeros", np.zeros(c, np.float32), "float32")
    sums = b.op(B.DEPTHWISE_CONV_2D, [x, ones, zeros], f"{name}/sums", (n, oh, ow, c), "float32",
                opts=options("DepthwiseConv2DOptions", Padding=Padding.VALID, StrideW=sw, StrideH=sh,
                             DepthMultiplier=1, DilationWFactor=1, DilationHFactor=1))
    _average_of_sums(ex, op, b.cast(sums, "int32", f"{name}/acc"))


def _average_of_sums(ex: _Export, op: Op, acc: int) -> None:
    """The average pool's result from its int32 window sums (centered codes): TOSA's reciprocal scale."""
    t, name = op.operands[0].type, op.result.name
    zp = t.quant.zero_point[0]
    m = reciprocal_scale(pool_counts(op))
    y = emit.rescale(ex.b, acc, np.int64(0), m.multiplier[None, :, :, None], m.shift[None, :, :, None], zp,
                     t.dtype.min, t.dtype.max, _tfl_dtype(op.result.type), name, tflite_quant(op.result.type))
    ex.bind(op.result, y)


def _reduce(code: int, plain: bool) -> Callable[[_Export, Op], None]:
    def run(ex: _Export, op: Op) -> None:
        name = op.result.name
        x = ex.plain(op.operands[0]) if plain and op.result.type.dtype is DType.INT32 else ex.value(op.operands[0])
        axis = ex.b.const(f"{name}/axis", np.asarray([op.attrs["axis"]], np.int32), "int32")
        ex.result(op, code, [x, axis], options("ReducerOptions", KeepDims=True))
    return run


def _arg(code: int, opts_name: str) -> Callable[[_Export, Op], None]:
    def run(ex: _Export, op: Op) -> None:
        b, name, axis = ex.b, op.result.name, op.attrs["axis"]
        shape = tuple(d for i, d in enumerate(op.operands[0].type.shape) if i != axis)
        a = b.const(f"{name}/axis", np.asarray([axis], np.int32), "int32")
        idx = b.op(code, [ex.plain(op.operands[0]), a], f"{name}/flat", shape, "int32",
                   opts=options(opts_name, OutputType=TflType.INT32))
        ex.bind(op.result, ex._reshape(idx, op.result.shape, name))
    return run


def _cast(ex: _Export, op: Op) -> None:
    out, src = op.result.type, op.operands[0].type
    b, name = ex.b, op.result.name
    x = ex.value(op.operands[0])
    if out.dtype.is_float or out.dtype is DType.BOOL or src.dtype is DType.BOOL:
        ex.bind(op.result, b.cast(x, _tfl_dtype(out), name))
        return
    if src.dtype.is_float:
        if out.dtype is DType.INT32:
            raise NotExact("a float -> int32 cast saturates at bounds float32 can't hold")
        x = emit.round_half_even(b, x, np.float64(out.dtype.min), np.float64(out.dtype.max), np.float64(0), name)
        x = b.clamp(x, np.float32(out.dtype.min), np.float32(out.dtype.max), f"{name}/range")
        ex.bind(op.result, b.cast(x, _tfl_dtype(out), name, tflite_quant(out)))
        return
    x = b.clamp(ex.plain(op.operands[0]), np.int32(out.dtype.min), np.int32(out.dtype.max), f"{name}/range")
    ex.bind(op.result, b.cast(x, _tfl_dtype(out), name, tflite_quant(out)))


_EMITTERS: dict[str, Callable[[_Export, Op], None]] = {
    "rescale": _rescale, "conv2d": _gemm_alone, "fully_connected": _gemm_alone, "matmul": _gemm_alone,
    "quantize": _quantize, "dequantize": _dequantize,
    "add": _same_domain_binary(B.ADD), "sub": _same_domain_binary(B.SUB), "mul": _mul, "intdiv": _intdiv,
    "minimum": _same_domain_binary(B.MINIMUM), "maximum": _same_domain_binary(B.MAXIMUM),
    "equal": _compare(B.EQUAL), "greater": _compare(B.GREATER), "greater_equal": _compare(B.GREATER_EQUAL),
    "logical_and": _logical(B.LOGICAL_AND), "logical_or": _logical(B.LOGICAL_OR),
    "logical_xor": _logical(B.NOT_EQUAL), "logical_not": _logical(B.LOGICAL_NOT), "select": _select,
    "clamp": _clamp, "concat": _concat, "reshape": _reshape, "transpose": _transpose, "pad": _pad_op,
    "slice": _slice, "gather": _gather, "table": _table, "max_pool2d": _max_pool, "avg_pool2d": _avg_pool,
    "reduce_sum": _reduce(B.SUM, plain=True), "reduce_max": _reduce(B.REDUCE_MAX, plain=False),
    "reduce_min": _reduce(B.REDUCE_MIN, plain=False),
    "argmax": _arg(B.ARG_MAX, "ArgMaxOptions"), "argmin": _arg(B.ARG_MIN, "ArgMinOptions"), "cast": _cast,
}


def unsupported_reason(op: Op, graph: Graph | None = None) -> str | None:
    """Why ``op`` has no exact TFLite form in this exporter, or None when it exports.

    Decided from the op alone, except for GEMMs, whose form depends on their users: with
    ``graph`` given, a GEMM counts as supported when it fuses with the rescale reading it."""
    if op.kind == "constant":
        return None
    if op.kind not in _EMITTERS:
        return f"{op.kind} has no TFLite builtin form in qlower's exporter"
    if op.kind in GEMMS:
        if graph is None:
            return None if op.result.type.quant is not None else f"float {op.kind} is not exported"
        ex = _Export(graph, "")
        return None if any(ex.fused_gemm(u) is op for u in ex.users.get(op.result, [])) \
            else f"its int32 accumulator doesn't fuse ({_fusion_reason(ex, op)})"
    probe = _Export(Graph(inputs=tuple(dict.fromkeys(op.input_values())), ops=(op,), outputs=op.results,
                          name="probe"), "")
    try:
        for v in probe.graph.inputs:
            probe.bind(v, probe.b.tensor(v.name, v.shape, _tfl_dtype(v.type), tflite_quant(v.type)))
        probe.emit(op)
    except NotExact as e:
        return str(e)
    return None


def fused_pairs(graph: Graph) -> dict[int, tuple[Op, Op]]:
    """id(rescale) -> (rescale, GEMM) for every GEMM the export fuses into the rescale reading it."""
    ex = _Export(graph, "")
    pairs = {}
    for op in graph.ops:
        if op.kind == "rescale":
            gemm = ex.fused_gemm(op)
            if gemm is not None:
                pairs[id(op)] = (op, gemm)
    return pairs


def export_tflite(graph: Graph, description: str = "qlower", native: bool = False) -> bytes:
    """The TFLite model (schema 3) computing exactly what ``graph`` means; UnsupportedOpError otherwise.
    ``native``: XNNPACK's own forms where they compute the same codes (see the module docstring)."""
    try:
        return _Export(graph, description, native).run()
    except NotExact as e:
        raise UnsupportedOpError(f"graph '{graph.name}' can't be exported to TFLite: {e}") from None
