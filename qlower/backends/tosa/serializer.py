"""A thin layer over ``tosa_serializer`` for one TOSA 1.0.0 graph.

It keeps the flatbuffer API's conventions in one place: the graph targets
TOSA 1.0.0 (not the 1.1 draft), scalar operands (zero points, MUL shift,
pad_const) are ``[1]``-shaped constants, shape operands are CONST_SHAPE
tensors, CLAMP bounds are raw little-endian bytes. It also records, for every
operator, the IR op it was emitted for, so that a validation error can name the
IR value it came from, and which TOSA extensions the emitted operators need.

Constants are lazy: ``const()`` returns a Tensor holding its data, emitted into
the flatbuffer on first use, so that a weight which is only ever consumed in a
transformed layout (reshaped, transposed) is serialized once, in that layout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tosa_serializer as ts

from qlower.ir import DType, Op

TOSA_VERSION = (1, 0, 0)
DT = ts.DType

IR_TO_TOSA: dict[DType, Any] = {
    DType.INT8: DT.INT8, DType.INT16: DT.INT16, DType.INT32: DT.INT32, DType.FLOAT32: DT.FP32, DType.BOOL: DT.BOOL,
}
NUMPY_OF: dict[Any, type] = {DT.INT8: np.int8, DT.INT16: np.int16, DT.INT32: np.int32, DT.INT48: np.int64, DT.FP32: np.float32,
                             DT.BOOL: np.bool_}
_NUMPY_TO_TOSA = {np.dtype(v): k for k, v in NUMPY_OF.items()}

# Operators whose int16 forms belong to the EXT-INT16 extension (checked with tosa-opt).
_INT16_EXTENSION_OPS = {"CLAMP", "MAX_POOL2D", "AVG_POOL2D", "CONCAT", "TABLE", "CONV2D", "DEPTHWISE_CONV2D", "MATMUL",
                        "ARGMAX"}


def tosa_dtype(dtype: DType) -> Any:
    return IR_TO_TOSA[dtype]


def dtype_range(dtype: Any) -> tuple[int, int]:
    info = np.iinfo(NUMPY_OF[dtype])
    return int(info.min), int(info.max)


@dataclass(eq=False)
class Tensor:
    """A TOSA tensor: emitted (``name`` set), or a constant not emitted yet (``data`` set)."""

    shape: tuple[int, ...]
    dtype: Any  # ts.DType
    name: str | None = None
    data: np.ndarray | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_const(self) -> bool:
        return self.data is not None


def attr(kind: str, *args: Any) -> Any:
    """``ts.TosaSerializerAttribute`` filled by its ``<kind>Attribute(*args)`` method."""
    a = ts.TosaSerializerAttribute()
    getattr(a, f"{kind}Attribute")(*args)
    return a


def clamp_attr(lo: float, hi: float, dtype: Any) -> Any:
    """CLAMP bounds as raw little-endian bytes of ``dtype``."""
    conv = ts.TosaSerializer.convertDataToUint8Vec
    lo_b, hi_b = conv(dtype, [lo]), conv(dtype, [hi])
    return attr("Clamp", lo_b, hi_b, ts.NanPropagationMode.PROPAGATE)


def rescale_attr(double_round: bool, per_channel: bool) -> Any:
    """RESCALE with a 32-bit multiplier, signed input and output."""
    mode = ts.RoundingMode.DOUBLE_ROUND if double_round else ts.RoundingMode.SINGLE_ROUND
    return attr("Rescale", True, mode, per_channel, False, False)


@dataclass
class EmittedOp:
    """One TOSA operator and the IR op whose lowering emitted it."""

    tosa_op: str
    ir_op: Op | None
    output: str


class GraphWriter:
    """Builds one TOSA 1.0.0 flatbuffer with a single main block."""

    def __init__(self) -> None:
        self.ser = ts.TosaSerializer("", ts.ConstMode.EMBED, *TOSA_VERSION, False)
        self.operators: list[EmittedOp] = []
        self.extensions: set[str] = set()
        self.current: Op | None = None  # the IR op being lowered, recorded with each operator
        self._scalars: dict[tuple[Any, float], Tensor] = {}
        self._shapes: dict[tuple[int, ...], Tensor] = {}
        self._handles: dict[str, Any] = {}  # name -> serializer tensor object

    # -- tensors ----------------------------------------------------------------------
    def input(self, shape: Sequence[int], dtype: Any) -> Tensor:
        """A graph input; inputs are numbered in call order (``input-0``, ...)."""
        t = self.ser.addPlaceholder(list(shape), dtype, None)
        self._handles[t.name] = t
        return Tensor(tuple(shape), dtype, t.name)

    def const(self, data: np.ndarray, dtype: Any | None = None) -> Tensor:
        """A lazy constant (emitted on first use)."""
        data = np.asarray(data)
        if dtype is None:
            dtype = _NUMPY_TO_TOSA[data.dtype]
        return Tensor(tuple(data.shape), dtype, None, np.ascontiguousarray(data, dtype=NUMPY_OF[dtype]))

    def scalar(self, value: float, dtype: Any) -> Tensor:
        """A ``[1]``-shaped constant (zero points, shifts, pad values), shared by value."""
        key = (dtype, value)
        if key not in self._scalars:
            t = self.const(np.array([value], dtype=NUMPY_OF[dtype]), dtype)
            self.name(t)
            self._scalars[key] = t
        return self._scalars[key]

    def shape(self, values: Sequence[int]) -> Tensor:
        """A ``shape_t`` operand (serialized as CONST_SHAPE), shared by value."""
        key = tuple(int(v) for v in values)
        if key not in self._shapes:
            t = self.ser.addConst([len(key)], DT.SHAPE, np.array(key, dtype=np.int64), "")
            self._shapes[key] = Tensor((len(key),), DT.SHAPE, t.name)
        return self._shapes[key]

    def name(self, t: Tensor) -> str:
        """The tensor's name in the flatbuffer, emitting a pending constant."""
        if t.name is None:
            ser_t = self.ser.addConst(list(t.shape), t.dtype, t.data, "")
            self._handles[ser_t.name] = ser_t
            t.name = ser_t.name
        return t.name

    # -- operators --------------------------------------------------------------------
    def op(self, op: Any, inputs: Sequence[Tensor], shape: Sequence[int], dtype: Any, attribute: Any) -> Tensor:
        """Append ``op`` reading ``inputs``; returns its (single) result."""
        names = [self.name(t) for t in inputs]
        out = self.ser.addIntermediate(list(shape), dtype)
        self._handles[out.name] = out
        self.ser.addOperator(op, names, [out.name], attribute)
        self.operators.append(EmittedOp(op.name, self.current, out.name))
        if op.name in _INT16_EXTENSION_OPS and DT.INT16 in {dtype, *(t.dtype for t in inputs)}:
            self.extensions.add("int16")
        return Tensor(tuple(shape), dtype, out.name)

    def mark_output(self, t: Tensor) -> str:
        """Append ``t`` to the graph's outputs (outputs come back in this order)."""
        return self.mark_output_name(self.name(t))

    def mark_output_name(self, name: str) -> str:
        self.ser.addOutputTensor(self._handles[name])
        return name

    def op_counts(self) -> dict[str, int]:
        return dict(Counter(e.tosa_op for e in self.operators))

    def serialize(self) -> bytes:
        return bytes(self.ser.serialize())
