"""The table of TFLM's kernels (qlower/backends/tflm/kernels.py) against tflite-micro's interpreter:
every elementwise operator, CAST and GATHER it lists loads and computes what NumPy computes, and
the forms it leaves out (the plain-integer arithmetic LiteRT's exact forms use) are refused."""

import numpy as np
import pytest
from tflite.BuiltinOperator import BuiltinOperator as B

from qlower.backends.litert.emit import Builder, options
from qlower.backends.tflm import runner
from qlower.backends.tflm.kernels import ACCEPTED, CASTS, refusal
from qlower.errors import ExecutionError

_BINARY = {B.ADD: np.add, B.SUB: np.subtract, B.MUL: np.multiply, B.MAXIMUM: np.maximum,
           B.MINIMUM: np.minimum, B.DIV: None, B.FLOOR_MOD: np.mod, B.EQUAL: np.equal,
           B.NOT_EQUAL: np.not_equal, B.GREATER: np.greater, B.GREATER_EQUAL: np.greater_equal}
_COMPARE = (B.EQUAL, B.NOT_EQUAL, B.GREATER, B.GREATER_EQUAL)
_OPTIONS = {B.ADD: "AddOptions", B.SUB: "SubOptions", B.MUL: "MulOptions", B.DIV: "DivOptions"}


def _values(dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.normal(size=(2, 5)).astype(np.float32) * 8
    if dtype == "bool":
        return rng.integers(0, 2, size=(2, 5)).astype(bool)
    return rng.integers(-100, 100, size=(2, 5)).astype(dtype)


def _binary_model(code: int, dtype: str) -> bytes:
    b = Builder()
    ins = [b.tensor(f"in{i}", (2, 5), dtype) for i in range(2)]
    opts = options(_OPTIONS[code]) if code in _OPTIONS else None
    out = b.op(code, ins, "out", (2, 5), "bool" if code in _COMPARE else dtype, None, opts)
    return b.writer.finish(ins, [out])


def _run(model: bytes, inputs) -> list[np.ndarray]:
    return runner.run(model, 1 << 16, inputs)


_LISTED = [(code, dt) for code in _BINARY for dt in sorted(ACCEPTED[code]) if not (code == B.ADD and dt == "int8")]


@pytest.mark.parametrize(("code", "dtype"), _LISTED)
def test_listed_elementwise_kernels_run_as_numpy(code, dtype):
    x, y = _values(dtype, 1), _values(dtype, 2)
    if code in (B.DIV, B.FLOOR_MOD):
        y = np.where(y == 0, np.asarray(3, dtype), y).astype(dtype)
    (got,) = _run(_binary_model(code, dtype), [x, y])
    if code == B.DIV:
        want = np.trunc(x / y).astype(dtype) if dtype != "float32" else x / y
    else:
        want = _BINARY[code](x, y)
    np.testing.assert_array_equal(got, want)


def test_listed_casts_and_gathers_run_as_numpy():
    for src, dst in sorted(CASTS):
        b = Builder()
        x = b.tensor("in", (2, 5), src)
        model = b.writer.finish([x], [b.cast(x, dst, "out")])
        values = _values(src, 3)
        (got,) = _run(model, [values])
        np.testing.assert_array_equal(got, values.astype(dst), err_msg=f"CAST {src} -> {dst}")
    for dtype in sorted(ACCEPTED[B.GATHER]):
        table = _values(dtype, 4).reshape(-1)
        b = Builder()
        idx = b.tensor("idx", (2, 5), "int32")
        tab = b.const("table", table, dtype)
        out = b.op(B.GATHER, [tab, idx], "out", (2, 5), dtype, None, options("GatherOptions", Axis=0))
        index = np.random.default_rng(5).integers(0, table.size, size=(2, 5)).astype(np.int32)
        (got,) = _run(b.writer.finish([idx], [out]), [index])
        np.testing.assert_array_equal(got, table[index])


@pytest.mark.parametrize(("code", "dtype"), [(B.ADD, "int64"), (B.MUL, "int64"), (B.SUB, "int64"),
                                             (B.FLOOR_MOD, "int32"), (B.FLOOR_MOD, "int64")])
def test_left_out_forms_are_refused_by_tflm(code, dtype):
    assert refusal(code, dtype, dtype) is not None
    with pytest.raises(ExecutionError, match="TFLM"):
        _run(_binary_model(code, dtype), [_values("int32", 1).astype(dtype), _values("int32", 2).astype(dtype)])


def test_left_out_casts_and_gathers_are_refused_by_tflm():
    for src, dst in (("int32", "int64"), ("int64", "float32")):
        assert refusal(B.CAST, src, dst) is not None
        b = Builder()
        x = b.tensor("in", (2, 5), src)
        with pytest.raises(ExecutionError, match="TFLM"):
            _run(b.writer.finish([x], [b.cast(x, dst, "out")]), [_values("int32", 1).astype(src)])
    for dtype in ("int16", "int32"):
        assert refusal(B.GATHER, dtype, dtype) is not None
        b = Builder()
        idx = b.tensor("idx", (3,), "int32")
        out = b.op(B.GATHER, [b.const("t", np.arange(8).astype(dtype), dtype), idx], "out", (3,), dtype, None,
                   options("GatherOptions", Axis=0))
        with pytest.raises(ExecutionError, match="TFLM"):
            _run(b.writer.finish([idx], [out]), [np.array([0, 1, 2], np.int32)])


class _Stub:
    """What ``lookup`` needs of the exporter: a builder and a place to bind the result."""

    def __init__(self):
        self.b = Builder()
        self.bound = None

    def bind(self, value, tensor):
        self.bound = tensor


@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_a_bucketed_lookup_is_exact_on_every_index(dtype):
    """A requantized sum over 300,000 integers (beyond one 2**16 table): every index through TFLM,
    the change points included, gives the table's value."""
    from types import SimpleNamespace

    from qlower.backends.tflm.lookup import lookup
    from qlower.ir import DType, QuantSpec, TensorType

    n, lo = 300_000, -150_000
    sums = np.arange(lo, lo + n, dtype=np.int64)
    info = np.iinfo(dtype)
    table = np.clip(np.floor(sums * 0.0131 + 0.5), info.min, info.max).astype(np.int64)
    out = TensorType((n,), DType(dtype), QuantSpec.per_tensor(0.1, 0, DType(dtype)))
    op = SimpleNamespace(result=SimpleNamespace(name="y", type=out, shape=(n,)))
    ex = _Stub()
    x = ex.b.tensor("x", (n,), "int32")
    lookup(ex, op, table, lo, index=x)
    model = ex.b.writer.finish([x], [ex.bound])
    (got,) = runner.run(model, 1 << 24, [sums.astype(np.int32)])
    np.testing.assert_array_equal(got, table.astype(dtype))
