"""GraphBuilder type inference for data movement, pooling, reductions, tables and the ops that
cross between reals and codes; ``rebuild``. Expected types are derived by hand."""

import numpy as np
import pytest

from qlower.errors import IRError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, print_graph, rebuild, verify_graph

I8, I16, I32, F32 = DType.INT8, DType.INT16, DType.INT32, DType.FLOAT32
XQ = QuantSpec.per_tensor(0.5, 2)
PCQ = QuantSpec.per_channel([0.1, 0.2, 0.3], axis=3)


def _in(b, shape, dtype=I8, quant=XQ, name="x"):
    return b.input(name, TensorType(shape, dtype, None if dtype is F32 else quant))


# -- data movement ------------------------------------------------------------------------


def test_concat():
    b = GraphBuilder()
    a, c = _in(b, (1, 2, 2, 3), name="a"), _in(b, (1, 2, 2, 5), name="c")
    assert b.op("concat", (a, c), axis=3).type == TensorType((1, 2, 2, 8), I8, XQ)
    # per-channel operands concatenate along another axis
    p, q = _in(b, (1, 2, 2, 3), quant=PCQ, name="p"), _in(b, (1, 4, 2, 3), quant=PCQ, name="q")
    assert b.op("concat", (p, q), axis=1).type == TensorType((1, 6, 2, 3), I8, PCQ)


def test_concat_errors():
    b = GraphBuilder()
    a = _in(b, (1, 2, 2, 3), name="a")
    other = _in(b, (1, 2, 2, 3), quant=QuantSpec.per_tensor(0.5, 3), name="o")
    with pytest.raises(IRError, match="concat: operands must share one type domain, got int8.* and int8.*zp=3"):
        b.op("concat", (a, other), axis=3)
    with pytest.raises(IRError, match=r"concat: shapes \(1, 2, 2, 3\) and \(1, 3, 2, 3\) differ off axis 3"):
        b.op("concat", (a, _in(b, (1, 3, 2, 3), name="d")), axis=3)
    p = _in(b, (1, 2, 2, 3), quant=PCQ, name="p")
    with pytest.raises(IRError, match="concat: can't concatenate along the per-channel axis"):
        b.op("concat", (p, p), axis=3)
    with pytest.raises(IRError, match="concat: needs at least one operand"):
        b.op("concat", (), axis=0)
    with pytest.raises(IRError, match="concat: operand 'inputs\\*' must be a tuple"):
        b.op("concat", a, axis=0)


def test_reshape():
    b = GraphBuilder()
    x = _in(b, (1, 2, 2, 3))
    assert b.op("reshape", x, shape=(1, 12)).type == TensorType((1, 12), I8, XQ)
    with pytest.raises(IRError, match=r"reshape: can't reshape \(1, 2, 2, 3\) to \(1, 13\)"):
        b.op("reshape", x, shape=(1, 13))
    with pytest.raises(IRError, match="reshape: can't move a per-channel quantized tensor"):
        b.op("reshape", _in(b, (1, 2, 2, 3), quant=PCQ, name="p"), shape=(4, 3))


def test_transpose_moves_the_per_channel_axis():
    b = GraphBuilder()
    wq = QuantSpec.per_channel([0.1 * (i + 1) for i in range(8)], axis=0)
    w = b.constant(np.zeros((8, 3, 3, 4), np.int8), wq, name="w")
    t = b.op("transpose", w, perm=(1, 2, 3, 0))    # OHWI -> HWIO: channel axis 0 lands at 3
    assert t.type == TensorType((3, 3, 4, 8), I8, wq.with_axis(3))
    t2 = b.op("transpose", w, perm=(3, 0, 1, 2))   # channel axis 0 lands at 1
    assert t2.type == TensorType((4, 8, 3, 3), I8, wq.with_axis(1))
    with pytest.raises(IRError, match=r"transpose: perm \(0, 1, 1, 2\) is not a permutation of rank 4"):
        b.op("transpose", w, perm=(0, 1, 1, 2))
    assert verify_graph(b.build([t, t2]))


def test_pad():
    b = GraphBuilder()
    x = _in(b, (1, 4, 4, 3))
    assert b.op("pad", x, pads=(0, 0, 1, 2, 3, 4, 0, 0), value=2).type == TensorType((1, 7, 11, 3), I8, XQ)
    with pytest.raises(IRError, match="pad: pads .* must be 2 non-negative numbers per dim"):
        b.op("pad", x, pads=(0, 0, 1, 1))
    with pytest.raises(IRError, match="pad: pads .* must be 2 non-negative numbers per dim"):
        b.op("pad", x, pads=(0, 0, -1, 1, 0, 0, 0, 0))


def test_slice_with_step():
    b = GraphBuilder()
    x = _in(b, (1, 10, 9, 3))
    # rows 1, 4, 7; columns 0, 2, 4, 6, 8
    y = b.op("slice", x, start=(0, 1, 0, 0), stop=(1, 10, 9, 3), step=(1, 3, 2, 1))
    assert y.type == TensorType((1, 3, 5, 3), I8, XQ)
    assert b.op("slice", x, start=(0, 2, 2, 1), stop=(1, 5, 3, 3)).shape == (1, 3, 1, 2)
    with pytest.raises(IRError, match="slice: bad slice 0:9:0 of a dim of size 9"):
        b.op("slice", x, start=(0, 0, 0, 0), stop=(1, 10, 9, 3), step=(1, 1, 0, 1))
    with pytest.raises(IRError, match="slice: bad slice 0:11:1 of a dim of size 10"):
        b.op("slice", x, start=(0, 0, 0, 0), stop=(1, 11, 9, 3))
    with pytest.raises(IRError, match="slice: start/stop/step must have one entry per dim"):
        b.op("slice", x, start=(0, 0), stop=(1, 1))


def test_slice_of_the_per_channel_axis_keeps_its_types_valid():
    b = GraphBuilder()
    p = _in(b, (1, 2, 2, 3), quant=PCQ)
    y = b.op("slice", p, start=(0, 0, 0, 1), stop=(1, 2, 2, 3))
    z = b.op("slice", p, start=(0, 0, 0, 0), stop=(1, 2, 2, 3), step=(1, 1, 1, 2))
    assert y.type == TensorType((1, 2, 2, 2), I8, QuantSpec.per_channel([0.2, 0.3], axis=3))
    assert z.type == TensorType((1, 2, 2, 2), I8, QuantSpec.per_channel([0.1, 0.3], axis=3))
    assert verify_graph(b.build([y, z]))


# -- pooling and reductions --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["avg_pool2d", "max_pool2d"])
def test_pools(kind):
    b = GraphBuilder()
    x = _in(b, (2, 7, 8, 4))
    # H: (7 + 2 - 3) // 2 + 1 = 4;  W: (8 + 0 + 1 - 2) // 3 + 1 = 3
    y = b.op(kind, x, kernel=(3, 2), stride=(2, 3), pad=(1, 1, 0, 1))
    assert y.type == TensorType((2, 4, 3, 4), I8, XQ)
    assert b.op(kind, _in(b, (1, 4, 4, 2), F32, name="f"), kernel=(2, 2), stride=(2, 2)).type == \
        TensorType((1, 2, 2, 2), F32)
    with pytest.raises(IRError, match=f"{kind}: expects NHWC input"):
        b.op(kind, _in(b, (7, 8, 4), name="r3"), kernel=(2, 2), stride=(1, 1))
    with pytest.raises(IRError, match=f"{kind}: input must be quantized per tensor"):
        b.op(kind, _in(b, (1, 4, 4, 3), quant=PCQ, name="p"), kernel=(2, 2), stride=(1, 1))
    with pytest.raises(IRError, match=f"{kind}: empty output"):
        b.op(kind, x, kernel=(9, 2), stride=(1, 1))


def test_avg_pool2d_rejects_int32():
    b = GraphBuilder()
    with pytest.raises(IRError, match="avg_pool2d: expects int8/int16 codes"):
        b.op("avg_pool2d", _in(b, (1, 4, 4, 2), I32, QuantSpec.per_tensor(0.1, 0, I32)), kernel=(2, 2), stride=(2, 2))


def test_reductions():
    b = GraphBuilder()
    acc_q = QuantSpec.per_channel([0.1] * 16, axis=3, dtype=I32)
    acc = _in(b, (1, 7, 7, 16), I32, acc_q, "acc")
    assert b.op("reduce_sum", acc, axis=1).type == TensorType((1, 1, 7, 16), I32, acc_q)
    assert b.op("reduce_sum", _in(b, (2, 5), F32, name="f"), axis=1).type == TensorType((2, 1), F32)
    x = _in(b, (1, 3, 3, 4))
    assert b.op("reduce_max", x, axis=3).type == TensorType((1, 3, 3, 1), I8, XQ)
    with pytest.raises(IRError, match="reduce_sum: can't sum along the per-channel axis"):
        b.op("reduce_sum", acc, axis=3)
    with pytest.raises(IRError, match="reduce_sum: expects a quantized int32 tensor, got int8"):
        b.op("reduce_sum", x, axis=1)
    with pytest.raises(IRError, match="reduce_sum: int32 input must have zero point 0"):
        b.op("reduce_sum", _in(b, (2, 2), I32, QuantSpec.per_tensor(0.1, 4, I32), "z"), axis=0)
    with pytest.raises(IRError, match="reduce_max: can't move a per-channel quantized tensor"):
        b.op("reduce_max", _in(b, (1, 2, 2, 3), quant=PCQ, name="p"), axis=1)


# -- table, quantize, dequantize, cast ----------------------------------------------------


def test_table():
    b = GraphBuilder()
    x = _in(b, (2, 3))
    out = QuantSpec.per_tensor(1 / 256, -128)
    t = b.op("table", x, table=np.arange(-128, 128, dtype=np.int8), offset=128, out=out)
    assert t.type == TensorType((2, 3), I8, out)
    with pytest.raises(IRError, match=r"table: table of 255 entries with offset 128 doesn't cover codes \[-128, 127\]"):
        b.op("table", x, table=np.zeros(255, np.int8), offset=128, out=out)
    with pytest.raises(IRError, match=r"table: table entries leave the output range \[-128, 0\]"):
        b.op("table", x, table=np.arange(-128, 128, dtype=np.int16), offset=128,
             out=QuantSpec.per_tensor(0.1, 0, qmax=0))


def test_quantize_static_and_per_channel():
    b = GraphBuilder()
    f = _in(b, (2, 3), F32)
    assert b.op("quantize", f, out=XQ).type == TensorType((2, 3), I8, XQ)
    pc = QuantSpec.per_channel([0.1, 0.2, 0.3], axis=1)
    assert b.op("quantize", f, out=pc).type == TensorType((2, 3), I8, pc)
    with pytest.raises(IRError, match="quantize: expects float32 without quantization, got int8"):
        b.op("quantize", _in(b, (2, 3), name="i"), out=XQ)
    with pytest.raises(IRError, match="quantize: use dynamic_quantize for run-time scales"):
        b.op("quantize", f, out=QuantSpec(I8, (1.0,), (0,), -127, 127, dynamic="per_tensor"))


@pytest.mark.parametrize("granularity,scale_shape", [("per_tensor", (1, 1, 1)), ("per_row", (2, 5, 1))])
def test_dynamic_quantize_and_dequantize(granularity, scale_shape):
    b = GraphBuilder()
    f = _in(b, (2, 5, 16), F32)
    codes, scale = b.op("dynamic_quantize", f, granularity=granularity)
    assert codes.type == TensorType((2, 5, 16), I8, QuantSpec(I8, (1.0,), (0,), -127, 127, dynamic=granularity))
    assert scale.type == TensorType(scale_shape, F32)
    assert b.op("dequantize", codes, scale).type == TensorType((2, 5, 16), F32)
    with pytest.raises(IRError, match="dequantize: a run-time scale operand is needed exactly when the input is dynamic"):
        b.op("dequantize", codes, None)
    with pytest.raises(IRError, match="dynamic_quantize: granularity must be per_tensor or per_row, got 'per_col'"):
        b.op("dynamic_quantize", f, granularity="per_col")


def test_dequantize_static():
    b = GraphBuilder()
    x = _in(b, (2, 3))
    assert b.op("dequantize", x, None).type == TensorType((2, 3), F32)
    with pytest.raises(IRError, match="dequantize: a run-time scale operand is needed exactly when"):
        b.op("dequantize", x, _in(b, (1, 1), F32, name="s"))
    with pytest.raises(IRError, match="dequantize: expects a quantized integer tensor, got float32"):
        b.op("dequantize", _in(b, (2, 3), F32, name="f"), None)


def test_cast():
    b = GraphBuilder()
    x = _in(b, (2, 3))
    assert b.op("cast", x, dtype=F32).type == TensorType((2, 3), F32)
    q32 = QuantSpec.per_tensor(1.0, 0, I32)
    assert b.op("cast", _in(b, (2, 3), F32, name="f"), dtype=I32, out=q32).type == TensorType((2, 3), I32, q32)
    with pytest.raises(IRError, match=r"cast: an integer result needs its QuantSpec \('out'\)"):
        b.op("cast", x, dtype=I16)


# -- the builder itself ------------------------------------------------------------------


def test_attribute_and_kind_errors():
    b = GraphBuilder()
    x = _in(b, (2, 3), F32)
    with pytest.raises(IRError, match=r"exp: unknown attribute\(s\) \['alpha'\]; known: \[\]"):
        b.op("exp", x, alpha=2)
    with pytest.raises(IRError, match="transpose: missing attribute 'perm'"):
        b.op("transpose", x)
    with pytest.raises(IRError, match="unknown op kind 'gelu'"):
        b.op("gelu", x)
    with pytest.raises(IRError, match=r"exp: expected 1 operands \('input',\), got 2"):
        b.op("exp", x, x)


def test_names_are_unique_and_constants_are_frozen_copies():
    b = GraphBuilder()
    x = _in(b, (3,), F32)
    data = np.array([1.0, 2.0, 3.0], np.float32)
    c = b.constant(data, name="c")
    data[0] = 99.0
    y1, y2 = b.op("add", x, c, name="y"), b.op("add", x, c, name="y")
    g = b.build([y1, y2])
    assert [y1.name, y2.name] == ["y", "y_1"]
    stored = g.constant_data(c)
    assert stored.tolist() == [1.0, 2.0, 3.0] and not stored.flags.writeable


def _conv_chain():
    b = GraphBuilder()
    x = _in(b, (1, 4, 4, 2))
    w = b.constant(np.ones((3, 1, 1, 2), np.int8), QuantSpec.per_tensor(0.25), name="w")
    acc = b.op("conv2d", x, w, None)
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.1, 0))
    r = b.op("reshape", y, shape=(1, 48))
    return b.build([b.op("concat", (r, r), axis=1)])


def test_rebuild_copies_a_graph_with_new_values():
    g = _conv_chain()
    copy = rebuild(g, lambda b, op, operands: None)
    assert print_graph(copy) == print_graph(g)
    old_values, new_values = set(g.values()), set(copy.values())
    assert len(new_values) == len(old_values) and not old_values & new_values
    assert verify_graph(copy)


def test_rebuild_re_infers_downstream_types():
    g = _conv_chain()
    new_out = QuantSpec.per_tensor(0.2, -5, qmin=-127)

    def requantize(b, op, operands):
        return b.emit(op, operands, out=new_out) if op.kind == "rescale" else None

    after = rebuild(g, requantize)
    kinds = {op.kind: op.result.type for op in after.ops}
    assert kinds["rescale"] == TensorType((1, 4, 4, 3), I8, new_out)
    assert kinds["reshape"] == TensorType((1, 48), I8, new_out)
    assert kinds["concat"] == TensorType((1, 96), I8, new_out)
    assert verify_graph(after)


def test_rebuild_rejects_a_rewrite_with_the_wrong_number_of_values():
    g = _conv_chain()
    with pytest.raises(IRError, match="rewrite of reshape returned 0 values for 1 results"):
        rebuild(g, lambda b, op, operands: () if op.kind == "reshape" else None)


def test_rebuild_propagates_type_errors_of_the_rewrite():
    g = _conv_chain()

    def break_shape(b, op, operands):  # a reshape to 1x49 can't hold 48 elements
        return b.emit(op, operands, shape=(1, 49)) if op.kind == "reshape" else None

    with pytest.raises(IRError, match=r"reshape: can't reshape \(1, 4, 4, 3\) to \(1, 49\)"):
        rebuild(g, break_shape)


def test_pooling_rejects_padding_as_large_as_the_kernel():
    import pytest

    from qlower.errors import IRError
    from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType

    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, QuantSpec.per_tensor(0.1, 0)))
    with pytest.raises(IRError, match="padding .* smaller than the kernel"):
        b.op("avg_pool2d", x, kernel=(2, 2), stride=(1, 1), pad=(2, 0, 0, 0))
