"""TOSA backend, ops that move, pool, reduce or look up codes: lowered, validated, run on the TOSA
reference model and compared bit-exactly with the reference interpreter."""

import numpy as np
import pytest

from qlower.backends.tosa import TosaBackend
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph

BACKEND = TosaBackend()
INT = "tosa-1.0+int"


def act(shape, scale=0.05, zp=0, dtype=DType.INT8, qmin=None, qmax=None):
    return TensorType(shape, dtype, QuantSpec.per_tensor(scale, zp, dtype, qmin, qmax))


def codes(rng, shape, dtype=np.int8):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def assert_exact(graph, inputs, target=INT):
    graph = verify_graph(graph)
    payload = BACKEND.lower(graph, target)
    got = BACKEND.execute(payload, inputs)
    want = run_graph(graph, inputs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    return payload


def unary_graph(in_type, kind, **attrs):
    b = GraphBuilder()
    x = b.input("x", in_type)
    return b.build([b.op(kind, x, **attrs)])


def test_table_int8_256_entries_is_one_table():
    rng = np.random.default_rng(20)
    table = codes(rng, 256)
    g = unary_graph(act((4, 64), 0.1, 3), "table", table=table, offset=128, out=QuantSpec.per_tensor(0.01, -2))
    x = np.arange(-128, 128, dtype=np.int8).reshape(4, 64)  # every code once
    p = assert_exact(g, [x])
    assert p.meta["tosa_ops"] == {"TABLE": 1}
    (y,) = BACKEND.execute(p, [x])
    np.testing.assert_array_equal(y.reshape(-1), table)  # independent: table[code + 128], codes in order


def test_table_int8_narrow_range_is_reindexed():
    """A 255-entry table for codes [-127, 127] (offset 127) becomes TOSA's 256-entry form."""
    rng = np.random.default_rng(21)
    table = codes(rng, 255)
    g = unary_graph(act((255,), 0.1, 0, qmin=-127), "table", table=table, offset=127,
                    out=QuantSpec.per_tensor(0.01, 0))
    x = np.arange(-127, 128, dtype=np.int8)
    p = assert_exact(g, [x])
    (y,) = BACKEND.execute(p, [x])
    np.testing.assert_array_equal(y, table)


@pytest.mark.parametrize("in_dtype,out_dtype", [(DType.INT16, DType.INT16), (DType.INT8, DType.INT16),
                                                (DType.INT16, DType.INT8)])
def test_table_other_forms_gather(in_dtype, out_dtype):
    rng = np.random.default_rng(22)
    lo, hi = -3000 if in_dtype is DType.INT16 else -128, 2999 if in_dtype is DType.INT16 else 127
    size = hi - lo + 1
    table = rng.integers(out_dtype.min, out_dtype.max + 1, size).astype(out_dtype.numpy)
    g = unary_graph(act((3, 100), 0.01, 0, in_dtype, lo, hi), "table", table=table, offset=-lo,
                    out=QuantSpec.per_tensor(0.01, 0, out_dtype))
    x = rng.integers(lo, hi + 1, (3, 100)).astype(in_dtype.numpy)
    x[0, :2] = lo, hi
    p = assert_exact(g, [x])
    assert p.meta["tosa_ops"]["GATHER"] == 1
    (y,) = BACKEND.execute(p, [x])
    np.testing.assert_array_equal(y, table[x.astype(np.int64) - lo])


@pytest.mark.parametrize("axis", [1, -1])
def test_reduce_sum_int32(axis):
    rng = np.random.default_rng(23)
    g = unary_graph(TensorType((2, 5, 3), DType.INT32, QuantSpec.per_tensor(0.01, 0, DType.INT32)), "reduce_sum",
                    axis=axis)
    x = rng.integers(-10**6, 10**6, (2, 5, 3)).astype(np.int32)
    assert_exact(g, [x])


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16, DType.INT32])
def test_reduce_max(dtype):
    rng = np.random.default_rng(24)
    g = unary_graph(act((2, 5, 3), 0.1, 0, dtype), "reduce_max", axis=0)
    assert_exact(g, [codes(rng, (2, 5, 3), dtype.numpy)])


POOL_CASES = [
    # (input, kernel, stride, pad)
    ((1, 7, 7, 3), (3, 3), (2, 2), (1, 1, 1, 1)),
    ((2, 8, 9, 4), (3, 2), (2, 3), (1, 1, 0, 1)),  # TOSA's output-size rule: pads and rows cut
    ((1, 7, 7, 16), (7, 7), (1, 1), (0, 0, 0, 0)),  # global
    ((1, 10, 10, 2), (3, 3), (3, 3), (0, 0, 0, 0)),  # input rows never read are sliced off
]


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("kind", ["avg_pool2d", "max_pool2d"])
def test_pool_int8(kind, case):
    shape, kernel, stride, pad = case
    rng = np.random.default_rng(25)
    g = unary_graph(act(shape, 0.1, -13), kind, kernel=kernel, stride=stride, pad=pad)
    p = assert_exact(g, [codes(rng, shape)])
    assert p.meta["tosa_ops"][kind.upper()] == 1


def test_avg_pool_tie_rounding():
    """2x2 windows summing to 2, -2, 6, -6, 1, -1 (zp 0): averages 0.5 ... round half away from zero."""
    x = np.zeros((1, 2, 12, 1), np.int8)
    x[0, 0, ::2, 0] = [2, -2, 6, -6, 1, -1]
    p = assert_exact(unary_graph(act((1, 2, 12, 1)), "avg_pool2d", kernel=(2, 2), stride=(2, 2)), [x])
    (y,) = BACKEND.execute(p, [x])
    assert y.reshape(-1).tolist() == [1, -1, 2, -2, 0, 0]


@pytest.mark.parametrize("kind", ["avg_pool2d", "max_pool2d"])
def test_pool_int16_uses_the_int16_extension(kind):
    rng = np.random.default_rng(26)
    g = unary_graph(act((1, 6, 6, 2), 0.001, 0, DType.INT16), kind, kernel=(2, 2), stride=(2, 2), pad=(1, 0, 1, 0))
    p = assert_exact(g, [codes(rng, (1, 6, 6, 2), np.int16)])
    assert p.meta["extensions"] == ["int16"]


@pytest.mark.parametrize("dtype,value", [(DType.INT8, -13), (DType.INT16, 300), (DType.INT32, -70000)])
def test_pad(dtype, value):
    rng = np.random.default_rng(27)
    g = unary_graph(act((1, 3, 4, 2), 0.1, 0, dtype), "pad", pads=(0, 0, 1, 2, 0, 1, 0, 0), value=value)
    p = assert_exact(g, [codes(rng, (1, 3, 4, 2), dtype.numpy)])
    (y,) = BACKEND.execute(p, [codes(rng, (1, 3, 4, 2), dtype.numpy)])
    assert y.shape == (1, 6, 5, 2) and np.all(y[0, 0] == value) and np.all(y[0, :, 4] == value)


SLICE_CASES = [
    ((4, 6, 5), (1, 2, 0), (3, 5, 5), None),
    ((2, 7, 9, 3), (0, 1, 0, 0), (2, 7, 9, 3), (1, 3, 2, 1)),  # steps that fit whole
    ((2, 7, 9, 3), (0, 0, 1, 1), (2, 7, 9, 3), (1, 3, 3, 2)),  # last step padded
    ((10,), (1,), (10,), (4,)),
]


@pytest.mark.parametrize("shape,start,stop,step", SLICE_CASES)
def test_slice(shape, start, stop, step):
    rng = np.random.default_rng(28)
    g = unary_graph(act(shape), "slice", start=start, stop=stop, step=step)
    assert_exact(g, [codes(rng, shape)])


def test_transpose_reshape_chain():
    rng = np.random.default_rng(29)
    b = GraphBuilder()
    x = b.input("x", act((1, 4, 6, 8)))
    t = b.op("transpose", x, perm=(0, 3, 1, 2))
    r = b.op("reshape", t, shape=(8, 24))
    r = b.op("transpose", b.op("reshape", r, shape=(2, 4, 4, 6)), perm=(3, 1, 0, 2))
    p = assert_exact(b.build([t, r]), [codes(rng, (1, 4, 6, 8))])
    assert p.meta["tosa_ops"] == {"TRANSPOSE": 2, "RESHAPE": 2}


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16, DType.INT32])
def test_concat_with_a_constant(dtype):
    rng = np.random.default_rng(30)
    b = GraphBuilder()
    q = act((2, 3, 4), 0.1, 0, dtype).quant
    a = b.input("a", TensorType((2, 3, 4), dtype, q))
    c = b.input("c", TensorType((2, 5, 4), dtype, q))
    k = b.constant(codes(rng, (2, 1, 4), dtype.numpy), q)
    p = assert_exact(b.build([b.op("concat", (a, k, c, a), axis=1)]),
                     [codes(rng, (2, 3, 4), dtype.numpy), codes(rng, (2, 5, 4), dtype.numpy)])
    assert p.meta["extensions"] == (["int16"] if dtype is DType.INT16 else [])


def test_concat_of_more_inputs_than_a_tosa_list_holds():
    rng = np.random.default_rng(31)
    b = GraphBuilder()
    x = b.input("x", act((1, 2)))
    p = assert_exact(b.build([b.op("concat", (x,) * 70, axis=1)]), [codes(rng, (1, 2))])
    assert p.meta["tosa_ops"]["CONCAT"] == 3


def test_graph_outputs_in_order_including_an_input_and_a_constant():
    rng = np.random.default_rng(32)
    b = GraphBuilder()
    x = b.input("x", act((2, 3)))
    y = b.input("y", act((3, 2)))
    k = b.constant(codes(rng, (2, 2)), act((2, 2)).quant)
    t = b.op("transpose", y, perm=(1, 0))
    g = b.build([t, x, k, t])
    p = assert_exact(g, [codes(rng, (2, 3)), codes(rng, (3, 2))])
    assert [str(t) for t in p.output_types] == [str(v.type) for v in g.outputs]
