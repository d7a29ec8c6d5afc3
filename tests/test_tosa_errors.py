"""TOSA backend errors: invalid lowerings are caught by tosa-opt and named in IR terms, run-time
failures of the reference model become ExecutionError (never a crash), bad inputs InputError."""

import numpy as np
import pytest
import tosa_serializer as ts

from qlower.backends.tosa import TosaBackend, executor
from qlower.backends.tosa.lowering import LOWERINGS
from qlower.backends.tosa.serializer import DT, GraphWriter, attr
from qlower.errors import CompileError, ExecutionError, InputError
from qlower.ir import DType, GraphBuilder, Origin, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph

BACKEND = TosaBackend()
INT = "tosa-1.0+int"
Q32 = QuantSpec.per_tensor(0.001, 0, DType.INT32)


def _residual_graph():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, QuantSpec.per_tensor(0.1, 3)))
    w = b.constant(np.ones((2, 1, 1, 2), np.int8), QuantSpec.per_tensor(0.01))
    acc = b.op("conv2d", x, w, None)
    skip = b.op("rescale", x, out=acc.quant, name="skip")
    total = b.op("add", acc, skip, name="total", origin=Origin("add", "block1", "model.py:42"))
    return verify_graph(b.build([b.op("rescale", total, out=QuantSpec.per_tensor(0.1, 0))]))


def test_invalid_lowering_is_rejected_by_validation_naming_the_ir_op(monkeypatch):
    """A forced bad lowering (int8 ADD, which TOSA-1.0+INT lacks) must fail tosa-opt, not reach the ref model."""
    def bad_add(lw, op):
        a8, b8 = (lw.saturate(lw.t(v), DT.INT8) for v in op.operands)
        s8 = lw.emit(ts.Op.ADD, [a8, b8], a8.shape, DT.INT8, attr("Add"))
        return lw.cast(s8, DT.INT32)

    monkeypatch.setitem(LOWERINGS, "add", bad_add)
    with pytest.raises(CompileError) as e:
        BACKEND.lower(_residual_graph(), INT)
    msg = str(e.value)
    assert "TOSA ADD emitted for add %total at block1.add (model.py:42)" in msg
    assert "did not align with any profile" in msg and "pro_int" in msg


def test_lowering_that_produces_the_wrong_type_is_a_compile_error(monkeypatch):
    monkeypatch.setitem(LOWERINGS, "rescale", lambda lw, op: lw.t(op.operands[0]))
    with pytest.raises(CompileError, match="rescale %skip produced INT8.*expected int32"):
        BACKEND.lower(_residual_graph(), INT)


def test_zero_divisor_is_an_execution_error_not_a_crash():
    b = GraphBuilder()
    a = b.input("a", TensorType((4,), DType.INT32, Q32))
    c = b.input("c", TensorType((4,), DType.INT32, Q32))
    g = verify_graph(b.build([b.op("intdiv", a, c)]))
    p = BACKEND.lower(g, INT)
    xa, ok, bad = np.array([7, -7, 9, -2**31], np.int32), np.array([2, 3, -2, 1], np.int32), np.array([2, 0, 1, 1],
                                                                                                       np.int32)
    np.testing.assert_array_equal(BACKEND.execute(p, [xa, ok])[0], run_graph(g, [xa, ok])[0])
    with pytest.raises(ExecutionError):
        run_graph(g, [xa, bad])
    with pytest.raises(ExecutionError, match="TOSA_UNPREDICTABLE"):
        BACKEND.execute(p, [xa, bad])


def test_rescale_input_out_of_range_for_its_shift_is_an_execution_error():
    b = GraphBuilder()
    x = b.input("x", TensorType((3,), DType.INT32, QuantSpec.per_tensor(2.0**26, 0, DType.INT32)))
    g = verify_graph(b.build([b.op("rescale", x, out=QuantSpec.per_tensor(0.25, 0, DType.INT32))]))
    p = BACKEND.lower(g, INT)  # ratio 2**28: multiplier 2**30, shift 2 admits inputs in [-2, 2)
    np.testing.assert_array_equal(BACKEND.execute(p, [np.array([1, -2, 0], np.int32)])[0], [2**28, -2**29, 0])
    with pytest.raises(ExecutionError, match="TOSA_UNPREDICTABLE") as e:
        BACKEND.execute(p, [np.array([1, 2, 0], np.int32)])
    assert "RESCALE" in str(e.value) or "Rescale" in str(e.value)


def test_graph_rejected_by_the_reference_model_is_an_execution_error():
    """A CONV2D breaking TOSA's output-size rule (never emitted by the lowering) run directly."""
    w = GraphWriter()
    x = w.input((1, 8, 8, 1), DT.INT8)
    y = w.op(ts.Op.CONV2D, [x, w.const(np.ones((1, 3, 3, 1), np.int8)), w.const(np.zeros(1, np.int32)),
                            w.scalar(0, DT.INT8), w.scalar(0, DT.INT8)], (1, 4, 4, 1), DT.INT32,
             attr("Conv2d", [0, 0, 0, 0], [2, 2], [1, 1], False, DT.INT32))
    w.mark_output(y)
    with pytest.raises(ExecutionError, match="rejected"):
        executor.run(w.serialize(), [np.zeros((1, 8, 8, 1), np.int8)])


def test_wrong_inputs_are_input_errors():
    p = BACKEND.lower(_residual_graph(), INT)
    good = np.zeros((1, 4, 4, 2), np.int8)
    with pytest.raises(InputError, match="shape \\(1, 4, 4, 3\\), expected \\(1, 4, 4, 2\\)"):
        BACKEND.execute(p, [np.zeros((1, 4, 4, 3), np.int8)])
    with pytest.raises(InputError, match="dtype int32, expected int8"):
        BACKEND.execute(p, [good.astype(np.int32)])
    with pytest.raises(InputError, match="takes 1 input"):
        BACKEND.execute(p, [good, good])
    with pytest.raises(InputError):
        BACKEND.execute_traced(p, [], ["layer-1"])


def test_spec_version_warning_is_kept_off_stdout(capfd):
    p = BACKEND.lower(_residual_graph(), INT)
    BACKEND.execute(p, [np.zeros((1, 4, 4, 2), np.int8)])
    out, err = capfd.readouterr()
    assert "Different TOSA spec" not in out + err
