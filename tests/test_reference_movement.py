"""Reference data movement (concat, reshape, transpose, pad, slice) against PyTorch, and the
interpreter's own contract: input checking, overflow, keep_all."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from qlower.errors import ExecutionError, InputError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.reference import run_graph

I8, I32, F32 = DType.INT8, DType.INT32, DType.FLOAT32
Q = QuantSpec.per_tensor(0.1, -3)


def _codes(shape, seed=0):
    return np.random.default_rng(seed).integers(-128, 128, size=shape).astype(np.int8)


def _run1(kind, x, **attrs):
    b = GraphBuilder()
    (out,) = run_graph(b.build([b.op(kind, b.input("x", TensorType(x.shape, I8, Q)), **attrs)]), [x])
    assert out.dtype == np.int8
    return out


def test_concat_of_three_operands():
    xs = [_codes((1, 2, s, 3), seed=s) for s in (1, 4, 2)]
    b = GraphBuilder()
    vals = tuple(b.input(f"x{i}", TensorType(x.shape, I8, Q)) for i, x in enumerate(xs))
    (out,) = run_graph(b.build([b.op("concat", vals, axis=2)]), xs)
    assert np.array_equal(out, torch.cat([torch.from_numpy(x) for x in xs], dim=2).numpy())


def test_reshape_is_row_major():
    x = _codes((2, 3, 4, 5))
    out = _run1("reshape", x, shape=(6, 20))
    assert np.array_equal(out, torch.from_numpy(x).reshape(6, 20).numpy())


@pytest.mark.parametrize("perm", [(0, 3, 1, 2), (0, 2, 3, 1), (3, 2, 1, 0), (1, 0, 2, 3)])
def test_transpose(perm):
    x = _codes((2, 3, 4, 5))
    out = _run1("transpose", x, perm=perm)
    assert np.array_equal(out, torch.from_numpy(x).permute(*perm).numpy())
    assert out.flags.c_contiguous


def test_pad_with_a_value():
    x = _codes((1, 3, 4, 2))
    pads = (0, 0, 1, 2, 0, 3, 1, 0)  # (before, after) per dim
    out = _run1("pad", x, pads=pads, value=-3)
    torch_pads = (1, 0, 0, 3, 1, 2, 0, 0)  # PyTorch lists the last dim first
    expected = F.pad(torch.from_numpy(x).long(), torch_pads, value=-3).numpy()
    assert out.shape == (1, 6, 7, 3) and np.array_equal(out, expected)


@pytest.mark.parametrize("start,stop,step", [
    ((0, 1, 0, 0), (2, 10, 9, 3), (1, 3, 2, 1)),
    ((1, 0, 3, 1), (2, 7, 9, 3), (1, 2, 5, 1)),
    ((0, 2, 2, 0), (2, 5, 3, 3), None),
    ((0, 9, 0, 0), (2, 10, 9, 3), (1, 4, 9, 2)),
])
def test_slice_with_step(start, stop, step):
    x = _codes((2, 10, 9, 3))
    attrs = dict(start=start, stop=stop) | ({"step": step} if step else {})
    out = _run1("slice", x, **attrs)
    step = step or (1, 1, 1, 1)
    expected = torch.from_numpy(x)[tuple(slice(a, c, s) for a, c, s in zip(start, stop, step))].numpy()
    assert np.array_equal(out, expected)


# -- the interpreter ---------------------------------------------------------------------------


def _two_input_graph():
    b = GraphBuilder("two")
    x = b.input("image", TensorType((1, 4, 4, 3), I8, Q))
    f = b.input("mask", TensorType((2, 2), F32))
    return b.build([b.op("reshape", x, shape=(48,)), b.op("exp", f)])


def test_input_shape_mismatch_names_the_input_and_the_expected_shape():
    g = _two_input_graph()
    with pytest.raises(InputError, match=r"input 0 \(%image\) has shape \(1, 3, 4, 4\), expected \(1, 4, 4, 3\)"):
        run_graph(g, [np.zeros((1, 3, 4, 4), np.int8), np.zeros((2, 2), np.float32)])


def test_input_count_and_dtype_errors():
    g = _two_input_graph()
    with pytest.raises(InputError, match=r"graph 'two' takes 2 input\(s\) \(%image, %mask\), got 1"):
        run_graph(g, [np.zeros((1, 4, 4, 3), np.int8)])
    with pytest.raises(InputError, match=r"input 0 \(%image\) has dtype int32, expected int8"):
        run_graph(g, [np.zeros((1, 4, 4, 3), np.int32), np.zeros((2, 2), np.float32)])


def test_float64_inputs_are_accepted_for_float32_inputs():
    g = _two_input_graph()
    flat, e = run_graph(g, [np.ones((1, 4, 4, 3), np.int8), np.zeros((2, 2), np.float64)])
    assert e.dtype == np.float32 and e.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert flat.shape == (48,)


def test_overflow_names_the_value_and_the_model_location():
    from qlower.ir import Origin

    b = GraphBuilder()
    q = QuantSpec.per_tensor(0.1, 0, I32)
    a = b.input("a", TensorType((2,), I32, q))
    s = b.op("add", a, a, name="sum", origin=Origin("add_1", "head", "model.py:12"))
    with pytest.raises(ExecutionError, match=r"add producing %sum overflows int32 .* at head.add_1 \(model.py:12\)"):
        run_graph(b.build([s]), [np.array([2**30, 2**30], np.int32)])


def test_keep_all_returns_every_intermediate():
    b = GraphBuilder()
    x = b.input("x", TensorType((3,), F32))
    e = b.op("exp", x)
    r = b.op("reciprocal", e)
    g = b.build([r])
    outs, env = run_graph(g, [np.zeros(3, np.float32)], keep_all=True)
    assert set(env) == {x, e, r}
    assert env[e].tolist() == [1.0, 1.0, 1.0] and outs[0].tolist() == [1.0, 1.0, 1.0]
