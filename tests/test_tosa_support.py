"""TOSA backend supports(): one verdict per op form and profile, with the reason users read.

Every IR op kind (but delegate) has at least one case, and the verdict is checked against what
lower() does: a "yes" lowers and passes tosa-opt, a "no" makes lower() raise
UnsupportedOpError with the same reason.
"""

import numpy as np
import pytest

from qlower.backends.tosa import TosaBackend
from qlower.backends.tosa.support import DYNAMIC_REASON, FLOAT_REASON
from qlower.errors import CompileError, UnsupportedOpError
from qlower.ir import OPS, DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference.aten_fallback import Operand, encode_call

BACKEND = TosaBackend()
INT, FP = "tosa-1.0+int", "tosa-1.0+int+fp"
YES = None


def i8(shape, zp=0):
    return TensorType(shape, DType.INT8, QuantSpec.per_tensor(0.1, zp))


def i32(shape):
    return TensorType(shape, DType.INT32, QuantSpec.per_tensor(0.001, 0, DType.INT32))


def f32(shape):
    return TensorType(shape, DType.FLOAT32)


W8 = np.ones((4, 3, 3, 2), np.int8)


def conv(b, x_type=None, w_zp=(0, 0, 0, 0), groups=1, w=W8):
    x = b.input("x", x_type or i8((1, 6, 6, 2)))
    q = QuantSpec.per_channel([0.1] * w.shape[0], w_zp[:w.shape[0]]) if x.type.quant else None
    wv = b.constant(w if q else w.astype(np.float32), q)
    return b.op("conv2d", x, wv, None, groups=groups)


def unary(kind, in_type, *extra, **attrs):
    def build(b):
        return b.op(kind, b.input("x", in_type), *extra, **attrs)
    return build


def binary(kind, t, **attrs):
    def build(b):
        return b.op(kind, b.input("a", t), b.input("b", t), **attrs)
    return build


PER_AXIS1 = TensorType((2, 3, 4), DType.INT32, QuantSpec.per_channel([0.1, 0.2, 0.3], axis=1, dtype=DType.INT32))
DYN = TensorType((2, 3), DType.INT8, QuantSpec(DType.INT8, (1.0,), (0,), -127, 127, dynamic="per_tensor"))

# (id, builder, +INT reason, +INT+FP reason); a reason is a substring of the expected message.
CASES = [
    ("constant float", lambda b: b.constant(np.ones((2,), np.float32)), FLOAT_REASON, YES),
    ("constant int8", lambda b: b.constant(np.ones((2,), np.int8), quant=QuantSpec.per_tensor(0.5, 0)), YES, YES),
    ("conv2d int8", conv, YES, YES),
    ("conv2d depthwise", lambda b: conv(b, i8((1, 6, 6, 4)), groups=4, w=np.ones((4, 3, 3, 1), np.int8)), YES, YES),
    ("conv2d float", lambda b: conv(b, f32((1, 6, 6, 2))), FLOAT_REASON, YES),
    ("conv2d int16", lambda b: conv(b, TensorType((1, 6, 6, 2), DType.INT16, QuantSpec.per_tensor(0.1, 0, DType.INT16))),
     YES, YES),  # A16W8: an int48 accumulator in TOSA (EXT-INT16), rescaled by 1 to the IR's int32
    ("conv2d int16 zero point", lambda b: conv(b, TensorType((1, 6, 6, 2), DType.INT16,
                                                              QuantSpec.per_tensor(0.1, 3, DType.INT16))),
     "int16 x int8 with zero points 0", "int16 x int8 with zero points 0"),
    ("conv2d weight zps", lambda b: conv(b, w_zp=(0, 1, 0, 0)), "per-channel weight zero points: TOSA CONV2D takes one",
     "per-channel weight zero points"),
    ("fully_connected", lambda b: b.op("fully_connected", b.input("x", i8((2, 8))),
                                       b.constant(np.ones((3, 8), np.int8), QuantSpec.per_tensor(0.1)), None), YES, YES),
    ("matmul int8", binary("matmul", i8((2, 4, 4))), YES, YES),
    ("matmul float", binary("matmul", f32((2, 4, 4))), FLOAT_REASON, YES),
    ("rescale", unary("rescale", i32((2, 8)), out=QuantSpec.per_tensor(0.1, 5)), YES, YES),
    ("rescale per-channel axis 1", unary("rescale", PER_AXIS1, out=QuantSpec.per_tensor(0.1)),
     "only along the last axis", "only along the last axis"),
    ("rescale to int32 zp", unary("rescale", i8((4,)), out=QuantSpec.per_tensor(0.01, 3, DType.INT32)),
     "int32 output with zero point 3", "int32 output"),
    ("rescale ratio too large", unary("rescale", i8((4,)), out=QuantSpec.per_tensor(1e-12, 0, DType.INT32)),
     "too large", "too large"),
    ("clamp int8", unary("clamp", i8((4,)), min=-3, max=9), YES, YES),
    ("clamp int32", unary("clamp", i32((4,)), min=-3, max=9), YES, YES),
    ("clamp beyond int8", unary("clamp", i8((4,)), min=200, max=300), "outside int8's range", "outside int8"),
    ("clamp float", unary("clamp", f32((4,)), min=-3.0, max=9.0), FLOAT_REASON, YES),
    ("add int32", binary("add", i32((2, 3))), YES, YES),
    ("sub float", binary("sub", f32((2, 3))), FLOAT_REASON, YES),
    ("mul int32", binary("mul", i32((2, 3)), shift=5), YES, YES),
    ("mul shift 64", binary("mul", i32((2, 3)), shift=64), "shifts by 0..63", "shifts by 0..63"),
    ("mul float", binary("mul", f32((2, 3))), FLOAT_REASON, YES),
    ("intdiv", binary("intdiv", i32((2, 3))), YES, YES),
    ("concat", lambda b: b.op("concat", (b.input("a", i8((2, 3))), b.input("b", i8((2, 3)))), axis=0), YES, YES),
    ("reshape", unary("reshape", i8((2, 3)), shape=(3, 2)), YES, YES),
    ("reshape uint8", unary("reshape", TensorType((2, 3), DType.UINT8, QuantSpec.per_tensor(0.1, 128, DType.UINT8)),
                            shape=(6,)), "no uint8 tensors", "no uint8 tensors"),
    ("reshape rank 7", unary("reshape", i8((2, 3)), shape=(1, 1, 1, 1, 1, 2, 3)), "at most rank 6", "at most rank 6"),
    ("transpose", unary("transpose", i8((2, 3)), perm=(1, 0)), YES, YES),
    ("pad", unary("pad", i8((2, 3)), pads=(1, 0, 0, 2), value=-4), YES, YES),
    ("pad value out of int8", unary("pad", i8((2, 3)), pads=(1, 0, 0, 2), value=300), "not a int8 code",
     "not a int8 code"),
    ("slice", unary("slice", i8((6, 3)), start=(1, 0), stop=(6, 3), step=(2, 1)), YES, YES),
    ("slice empty", unary("slice", i8((6, 3)), start=(1, 0), stop=(1, 3)), "empty tensor", "empty tensor"),
    ("gather constant indices", lambda b: b.op("gather", b.input("x", i8((2, 5, 3))), b.constant(
        np.array([4, 0, 2], np.int32), QuantSpec(DType.INT32, (1.0,), (0,), 0, 4)), axis=1), YES, YES),
    ("gather run-time indices", lambda b: b.op("gather", b.input("x", i8((5, 3))), b.input(
        "i", TensorType((2, 4), DType.INT32, QuantSpec.plain_integer())), axis=0), "run-time indices",
     "run-time indices"),
    ("avg_pool2d int8", unary("avg_pool2d", i8((1, 6, 6, 2), 5), kernel=(2, 2), stride=(2, 2)), YES, YES),
    ("max_pool2d kernel above level 8K", unary("max_pool2d", i8((1, 9000, 1, 1)), kernel=(8200, 1), stride=(1, 1)),
     "beyond TOSA 1.0 level 8K", "beyond TOSA 1.0 level 8K"),
    ("max_pool2d float", unary("max_pool2d", f32((1, 6, 6, 2)), kernel=(3, 3), stride=(1, 1)), FLOAT_REASON, YES),
    ("reduce_sum int32", unary("reduce_sum", i32((2, 3)), axis=1), YES, YES),
    ("reduce_max int8", unary("reduce_max", i8((2, 3)), axis=0), YES, YES),
    ("reduce_min int8", unary("reduce_min", i8((2, 3)), axis=1), YES, YES),
    ("argmax int8", unary("argmax", i8((2, 3)), axis=1), YES, YES),
    ("argmin int16", unary("argmin", TensorType((2, 3), DType.INT16, QuantSpec.per_tensor(0.1, 0, DType.INT16)),
                             axis=0), YES, YES),
    ("argmax int32", unary("argmax", i32((2, 3)), axis=0), "TOSA 1.0 INT takes ARGMAX of int8 and int16 only",
     "TOSA 1.0 INT takes ARGMAX of int8 and int16 only"),
    ("table", unary("table", i8((2, 3)), table=np.zeros(256, np.int8), offset=128, out=QuantSpec.per_tensor(0.1)),
     YES, YES),
    ("table_interp int16", unary("table_interp", TensorType((2, 3), DType.INT16, QuantSpec.per_tensor(0.1, 0, DType.INT16)),
                                 table=np.arange(-256, 257, dtype=np.int16),
                                 out=QuantSpec.per_tensor(0.1 / 128, 0, DType.INT32)), YES, YES),
    ("quantize", unary("quantize", f32((2, 3)), out=QuantSpec.per_tensor(0.1, 3)), FLOAT_REASON, YES),
    ("quantize to int32", unary("quantize", f32((2, 3)), out=QuantSpec.per_tensor(0.1, 0, DType.INT32)),
     FLOAT_REASON, YES),
    ("quantize to int32 zp", unary("quantize", f32((2, 3)), out=QuantSpec.per_tensor(0.1, 5, DType.INT32)),
     FLOAT_REASON, "int32 with a nonzero zero point"),
    ("dynamic_quantize", lambda b: b.op("dynamic_quantize", b.input("x", f32((2, 3))))[0], DYNAMIC_REASON,
     DYNAMIC_REASON),
    ("dequantize", unary("dequantize", i8((2, 3)), None), FLOAT_REASON, YES),
    ("dequantize dynamic", lambda b: b.op("dequantize", b.input("x", DYN), b.input("s", f32((1, 1)))),
     FLOAT_REASON, YES),
    ("cast int8->int32", unary("cast", i8((2, 3)), dtype=DType.INT32, out=QuantSpec.per_tensor(0.1, 0, DType.INT32)),
     YES, YES),
    ("cast int8->float", unary("cast", i8((2, 3)), dtype=DType.FLOAT32), FLOAT_REASON, YES),
    *[(k, unary(k, f32((2, 3))), FLOAT_REASON, YES) for k in ("sigmoid", "tanh", "exp", "erf", "reciprocal")],
    ("softmax", unary("softmax", f32((2, 3)), axis=1), FLOAT_REASON, YES),
    *[(f"{k} int8", binary(k, i8((2, 3), zp=3)), YES, YES)
      for k in ("minimum", "maximum", "equal", "greater", "greater_equal")],
    *[(f"{k} float", binary(k, f32((2, 3))), FLOAT_REASON, YES) for k in ("maximum", "greater")],
    *[(k, binary(k, TensorType((2, 3), DType.BOOL)), YES, YES) for k in ("logical_and", "logical_or", "logical_xor")],
    ("logical_not", unary("logical_not", TensorType((2, 3), DType.BOOL)), YES, YES),
    ("select int8", lambda b: b.op("select", b.input("c", TensorType((2, 1), DType.BOOL)), b.input("a", i8((2, 3))),
                                   b.input("b", i8((1, 3)))), YES, YES),
    ("cast int8->bool", unary("cast", i8((2, 3)), dtype=DType.BOOL), "bool tensor", "bool tensor"),
    ("aten fallback", lambda b: b.op("aten", (b.input("x", f32((2, 3))),), target="aten.cumsum.default",
                                     args=encode_call([Operand(0), 1], {}), in_dtypes=("float32",),
                                     out_types=(f32((2, 3)),), out_dtypes=("float32",))[0],
     "no quantized rule for aten.cumsum.default; runs in float on the host",
     "no quantized rule for aten.cumsum.default; runs in float on the host"),
]


def _graph(build):
    b = GraphBuilder()
    v = build(b)
    g = b.build([v])
    return g, next(op for op in g.ops if v in op.results)


def test_every_op_kind_has_a_case():
    covered = {_graph(build)[1].kind for _, build, _, _ in CASES}
    assert covered == set(OPS) - {"delegate"}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("target", [INT, FP])
def test_verdict_and_lowering_agree(case, target):
    _, build, int_reason, fp_reason = case
    expected = int_reason if target == INT else fp_reason
    graph, op = _graph(build)
    verdict = BACKEND.supports(op, target)
    if expected is YES:
        assert verdict.ok, verdict.reason
        payload = BACKEND.lower(graph, target)  # validates with tosa-opt
        assert payload.output_types == tuple(v.type for v in graph.outputs)
    else:
        assert not verdict.ok and expected in verdict.reason
        with pytest.raises(UnsupportedOpError, match=f"%{op.results[0].name}.*") as e:
            BACKEND.lower(graph, target)
        assert verdict.reason in str(e.value)


def test_delegate_stays_on_the_host_and_unknown_targets_are_errors():
    b = GraphBuilder()
    x = b.input("x", i8((2,)))
    (y,) = b.op("delegate", (x,), partition="p0", in_types=(x.type,), out_types=(x.type,))
    op = b.build([y]).ops[-1]
    assert not BACKEND.supports(op, INT).ok
    with pytest.raises(CompileError, match="unknown TOSA target 'tosa-2.0'"):
        BACKEND.supports(op, "tosa-2.0")
    assert BACKEND.targets == (INT, FP)
