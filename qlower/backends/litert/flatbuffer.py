"""Writing a TFLite flatbuffer (schema version 3) with the generated builders of the `tflite` package.

``ModelWriter`` collects tensors, buffers and operators, then serialises them in
one pass. It knows nothing about qlower's IR: ``export.py`` decides what goes in.
Buffer 0 is the empty sentinel the schema reserves; constant data is aligned to
16 bytes so that runtimes may map it in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions
from tflite.TensorType import TensorType

SCHEMA_VERSION = 3

TFLITE_TYPES: dict[str, int] = {
    "float32": TensorType.FLOAT32, "int8": TensorType.INT8, "uint8": TensorType.UINT8,
    "int16": TensorType.INT16, "int32": TensorType.INT32, "int64": TensorType.INT64,
    "bool": TensorType.BOOL,
}
NUMPY_OF_TFLITE = {v: np.dtype(k) for k, v in TFLITE_TYPES.items()}

# builds an operator's options table; returns (BuiltinOptions type, offset)
OptionsFn = Callable[[flatbuffers.Builder], tuple[int, int]]


@dataclass(frozen=True)
class Quant:
    """Affine quantization of a tensor: per tensor (one scale) or along ``axis``."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 0


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    buffer: int
    quant: Quant | None


@dataclass
class _Operator:
    opcode: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: OptionsFn | None


@dataclass
class ModelWriter:
    """Accumulates one subgraph and writes the model."""

    description: str = "qlower"
    tensors: list[_Tensor] = field(default_factory=list)
    buffers: list[bytes] = field(default_factory=lambda: [b""])
    operators: list[_Operator] = field(default_factory=list)
    opcodes: list[int] = field(default_factory=list)
    metadata: dict[str, bytes] = field(default_factory=dict)

    def tensor(self, name: str, shape: Sequence[int], dtype: str, quant: Quant | None = None,
               data: np.ndarray | None = None) -> int:
        """Add a tensor (a constant when ``data`` is given); returns its index."""
        if dtype not in TFLITE_TYPES:
            raise ValueError(f"TFLite has no tensor type for {dtype}")
        buffer = 0
        if data is not None:
            arr = np.ascontiguousarray(np.asarray(data, dtype=np.dtype(dtype)).reshape(tuple(shape)))
            self.buffers.append(arr.tobytes())
            buffer = len(self.buffers) - 1
        self.tensors.append(_Tensor(name, tuple(int(d) for d in shape), dtype, buffer, quant))
        return len(self.tensors) - 1

    def operator(self, builtin: int, inputs: Sequence[int], outputs: Sequence[int],
                 options: OptionsFn | None = None) -> None:
        """Add an operator; ``-1`` in ``inputs`` marks an omitted optional operand."""
        if builtin not in self.opcodes:
            self.opcodes.append(builtin)
        self.operators.append(_Operator(self.opcodes.index(builtin), tuple(inputs), tuple(outputs), options))

    def finish(self, inputs: Sequence[int], outputs: Sequence[int]) -> bytes:
        b = flatbuffers.Builder(1024)
        buffers = [self._buffer(b, data) for data in self.buffers]
        meta_buffers = []
        for key, data in self.metadata.items():
            buffers.append(self._buffer(b, data))
            meta_buffers.append((key, len(buffers) - 1))
        tensors = [self._tensor(b, t) for t in self.tensors]
        operators = [self._operator(b, op) for op in self.operators]
        subgraph = self._subgraph(b, tensors, operators, inputs, outputs)
        codes = [self._opcode(b, code) for code in self.opcodes]
        metadata = [self._metadata(b, key, index) for key, index in meta_buffers]
        desc = b.CreateString(self.description)
        codes_vec = _table_vector(b, tflite.ModelStartOperatorCodesVector, codes)
        subgraphs_vec = _table_vector(b, tflite.ModelStartSubgraphsVector, [subgraph])
        buffers_vec = _table_vector(b, tflite.ModelStartBuffersVector, buffers)
        metadata_vec = _table_vector(b, tflite.ModelStartMetadataVector, metadata)
        model = table(b, "Model", Version=SCHEMA_VERSION, OperatorCodes=codes_vec, Subgraphs=subgraphs_vec,
                       Description=desc, Buffers=buffers_vec, Metadata=metadata_vec)
        b.Finish(model, file_identifier=b"TFL3")
        return bytes(b.Output())

    @staticmethod
    def _buffer(b: flatbuffers.Builder, data: bytes) -> int:
        vec = None
        if data:
            b.StartVector(1, len(data), 16)
            b.head = b.head - len(data)
            b.Bytes[b.head:b.head + len(data)] = data
            vec = b.EndVector()
        tflite.BufferStart(b)
        if vec is not None:
            tflite.BufferAddData(b, vec)
        return tflite.BufferEnd(b)

    @staticmethod
    def _tensor(b: flatbuffers.Builder, t: _Tensor) -> int:
        name = b.CreateString(t.name)
        shape = _int_vector(b, tflite.TensorStartShapeVector, t.shape)
        quant = ModelWriter._quant(b, t.quant) if t.quant is not None else None
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        tflite.TensorAddType(b, TFLITE_TYPES[t.dtype])
        tflite.TensorAddBuffer(b, t.buffer)
        tflite.TensorAddName(b, name)
        if quant is not None:
            tflite.TensorAddQuantization(b, quant)
        return tflite.TensorEnd(b)

    @staticmethod
    def _quant(b: flatbuffers.Builder, q: Quant) -> int:
        tflite.QuantizationParametersStartScaleVector(b, len(q.scale))
        for s in reversed(q.scale):
            b.PrependFloat32(float(s))
        scale = b.EndVector()
        tflite.QuantizationParametersStartZeroPointVector(b, len(q.zero_point))
        for z in reversed(q.zero_point):
            b.PrependInt64(int(z))
        zp = b.EndVector()
        tflite.QuantizationParametersStart(b)
        tflite.QuantizationParametersAddScale(b, scale)
        tflite.QuantizationParametersAddZeroPoint(b, zp)
        tflite.QuantizationParametersAddQuantizedDimension(b, q.axis)
        return tflite.QuantizationParametersEnd(b)

    @staticmethod
    def _operator(b: flatbuffers.Builder, op: _Operator) -> int:
        inputs = _int_vector(b, tflite.OperatorStartInputsVector, op.inputs)
        outputs = _int_vector(b, tflite.OperatorStartOutputsVector, op.outputs)
        opt_type, opt = op.options(b) if op.options is not None else (BuiltinOptions.NONE, None)
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, op.opcode)
        tflite.OperatorAddInputs(b, inputs)
        tflite.OperatorAddOutputs(b, outputs)
        if opt is not None:
            tflite.OperatorAddBuiltinOptionsType(b, opt_type)
            tflite.OperatorAddBuiltinOptions(b, opt)
        return tflite.OperatorEnd(b)

    @staticmethod
    def _subgraph(b, tensors, operators, inputs, outputs) -> int:
        tensors_vec = _table_vector(b, tflite.SubGraphStartTensorsVector, tensors)
        inputs_vec = _int_vector(b, tflite.SubGraphStartInputsVector, inputs)
        outputs_vec = _int_vector(b, tflite.SubGraphStartOutputsVector, outputs)
        ops_vec = _table_vector(b, tflite.SubGraphStartOperatorsVector, operators)
        name = b.CreateString("main")
        return table(b, "SubGraph", Tensors=tensors_vec, Inputs=inputs_vec, Outputs=outputs_vec,
                      Operators=ops_vec, Name=name)

    @staticmethod
    def _opcode(b: flatbuffers.Builder, code: int) -> int:
        tflite.OperatorCodeStart(b)
        # builtin codes above 127 live only in builtin_code; the deprecated byte holds the placeholder
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES))
        tflite.OperatorCodeAddBuiltinCode(b, code)
        tflite.OperatorCodeAddVersion(b, 1)
        return tflite.OperatorCodeEnd(b)

    @staticmethod
    def _metadata(b: flatbuffers.Builder, key: str, buffer: int) -> int:
        name = b.CreateString(key)
        tflite.MetadataStart(b)
        tflite.MetadataAddName(b, name)
        tflite.MetadataAddBuffer(b, buffer)
        return tflite.MetadataEnd(b)


def table(b: flatbuffers.Builder, name: str, **fields: int) -> int:
    """A ``name`` table (e.g. ``SubGraph``) with the given fields, through the generated ``{name}Add{Field}``."""
    getattr(tflite, f"{name}Start")(b)
    for key, value in fields.items():
        getattr(tflite, f"{name}Add{key}")(b, value)
    return getattr(tflite, f"{name}End")(b)


def _int_vector(b: flatbuffers.Builder, start: Callable, values: Sequence[int]) -> int:
    start(b, len(values))
    for v in reversed(values):
        b.PrependInt32(int(v))
    return b.EndVector()


def _table_vector(b: flatbuffers.Builder, start: Callable, offsets: Sequence[int]) -> int:
    start(b, len(offsets))
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()
