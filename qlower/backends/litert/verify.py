"""Checking a .tflite before LiteRT's native code reads it.

A loaded program's LiteRT payload must be exactly what qlower writes for the
partition's (validated) IR subgraph: the export is deterministic, so
``loaded_payload_problem`` re-exports and compares, and any altered byte is an
InvalidProgramError at load. ``verify_tflite`` is the structural check that runs
before any model reaches the interpreter (a payload built in memory included):
it walks the whole flatbuffer with the generated Python readers, whose reads are
bounds-checked, and checks what the interpreter would otherwise trust: indices
in range, constant buffers of exactly their tensor's size, known types and
builtin operators only, quantization vectors of consistent lengths.
"""

from __future__ import annotations

import struct

import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator

from qlower.backends.litert.flatbuffer import NUMPY_OF_TFLITE, SCHEMA_VERSION
from qlower.contract import Payload
from qlower.errors import InvalidProgramError
from qlower.ir import Graph

_BUILTIN_NAMES = {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_")}
MAX_RANK = 8
MAX_TENSOR_BYTES = 2**31   # LiteRT's own limit on one tensor; larger shapes come only from corrupted files


def builtin_counts(model: bytes) -> dict[str, int]:
    """Operators of a (verified) model by builtin name."""
    m = tflite.Model.GetRootAsModel(model, 0)
    sg = m.Subgraphs(0)
    counts: dict[str, int] = {}
    for i in range(sg.OperatorsLength()):
        name = _BUILTIN_NAMES[m.OperatorCodes(sg.Operators(i).OpcodeIndex()).BuiltinCode()]
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def verify_tflite(data: bytes) -> None:
    """Raise InvalidProgramError (with the reason) unless ``data`` is a well-formed single-subgraph model."""
    if not isinstance(data, bytes | bytearray) or len(data) < 8:
        raise InvalidProgramError("the .tflite payload is too short to be a model")
    if bytes(data[4:8]) != b"TFL3":
        raise InvalidProgramError("the .tflite payload lacks the TFLite file identifier 'TFL3'")
    try:
        _walk(bytes(data))
    except InvalidProgramError:
        raise
    except (struct.error, IndexError, ValueError, TypeError, OverflowError, KeyError, UnicodeDecodeError) as e:
        raise InvalidProgramError(f"the .tflite payload is malformed: {type(e).__name__}: {e}") from None


def _walk(data: bytes) -> None:
    root = struct.unpack_from("<I", data, 0)[0]
    if root >= len(data):
        raise InvalidProgramError("the .tflite root table lies outside the payload")
    m = tflite.Model.GetRootAsModel(data, 0)
    if m.Version() != SCHEMA_VERSION:
        raise InvalidProgramError(f"the .tflite payload has schema version {m.Version()}, expected {SCHEMA_VERSION}")
    if m.SubgraphsLength() != 1:
        raise InvalidProgramError(f"the .tflite payload has {m.SubgraphsLength()} subgraphs, expected 1")
    codes = []
    for i in range(m.OperatorCodesLength()):
        oc = m.OperatorCodes(i)
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        if code not in _BUILTIN_NAMES or code == BuiltinOperator.CUSTOM:
            raise InvalidProgramError(f"operator code {i} is not a TFLite builtin ({code})")
        codes.append(code)
    buffers = [_buffer_size(m, i) for i in range(m.BuffersLength())]
    sg = m.Subgraphs(0)
    n_tensors = sg.TensorsLength()
    for i in range(n_tensors):
        _check_tensor(sg.Tensors(i), i, buffers)
    for what, length, get in (("input", sg.InputsLength(), sg.Inputs), ("output", sg.OutputsLength(), sg.Outputs)):
        for j in range(length):
            if not 0 <= get(j) < n_tensors:
                raise InvalidProgramError(f"subgraph {what} {j} names tensor {get(j)} of {n_tensors}")
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        if not 0 <= op.OpcodeIndex() < len(codes):
            raise InvalidProgramError(f"operator {i} names operator code {op.OpcodeIndex()} of {len(codes)}")
        if op.CustomOptionsLength():
            raise InvalidProgramError(f"operator {i} carries custom options")
        for j in range(op.InputsLength()):
            if not -1 <= op.Inputs(j) < n_tensors:
                raise InvalidProgramError(f"operator {i} input {j} names tensor {op.Inputs(j)} of {n_tensors}")
        for j in range(op.OutputsLength()):
            if not 0 <= op.Outputs(j) < n_tensors:
                raise InvalidProgramError(f"operator {i} output {j} names tensor {op.Outputs(j)} of {n_tensors}")
        op.BuiltinOptionsType()   # read: inside the payload


def _buffer_size(m, i: int) -> int:
    buf = m.Buffers(i)
    if buf.Offset() or buf.Size():
        raise InvalidProgramError(f"buffer {i} points outside the flatbuffer (offset {buf.Offset()})")
    return buf.DataLength()


def _check_tensor(t, i: int, buffers: list[int]) -> None:
    dtype = NUMPY_OF_TFLITE.get(t.Type())
    if dtype is None:
        raise InvalidProgramError(f"tensor {i} has a type qlower never writes ({t.Type()})")
    shape = [t.Shape(j) for j in range(t.ShapeLength())]
    if len(shape) > MAX_RANK or any(d < 0 for d in shape):
        raise InvalidProgramError(f"tensor {i} has shape {shape}")
    if t.IsVariable() or t.Sparsity() is not None:
        raise InvalidProgramError(f"tensor {i} is variable or sparse, which qlower never writes")
    if not 0 <= t.Buffer() < len(buffers):
        raise InvalidProgramError(f"tensor {i} names buffer {t.Buffer()} of {len(buffers)}")
    size = buffers[t.Buffer()]
    expected = int(np.prod(np.asarray(shape, dtype=object))) * dtype.itemsize if shape else dtype.itemsize
    if expected > MAX_TENSOR_BYTES:
        raise InvalidProgramError(f"tensor {i} of shape {shape} would take {expected} bytes")
    if size and size != expected:
        raise InvalidProgramError(f"tensor {i} has a {size}-byte buffer, its shape {shape} needs {expected}")
    q = t.Quantization()
    if q is not None:
        scales, zps = q.ScaleLength(), q.ZeroPointLength()
        if scales != zps or (scales > 1 and not (0 <= q.QuantizedDimension() < len(shape)
                                                  and shape[q.QuantizedDimension()] == scales)):
            raise InvalidProgramError(f"tensor {i} has {scales} scales and {zps} zero points for shape {shape}")
        if scales and not np.all(np.isfinite(q.ScaleAsNumpy())):
            raise InvalidProgramError(f"tensor {i} has a scale that is not finite")


def model_description(subgraph: Graph, kernels: str) -> str:
    return f"qlower {subgraph.name} for LiteRT {kernels} kernels"


def loaded_payload_problem(subgraph: Graph, payload: Payload) -> str | None:
    """Why ``payload`` is not exactly qlower's export of the partition ``subgraph``; None when it is."""
    from qlower.backends.litert.export import export_tflite

    model, kernels = payload.blobs.get("model.tflite"), payload.meta.get("kernels")
    if model is None:
        return "the litert payload has no model.tflite"
    if kernels not in ("reference", "builtin", "xnnpack"):
        return f"the litert payload names unknown kernels {str(kernels)[:40]!r}"
    try:
        verify_tflite(model)
    except InvalidProgramError as e:
        return str(e)
    forms = payload.meta.get("forms", "exact")   # xnnpack payloads written before native forms are exact
    if forms not in ("exact", "native") or (forms == "native" and kernels != "xnnpack"):
        return f"the litert payload's forms {str(forms)[:40]!r} don't belong to its {kernels} kernels"
    if model != export_tflite(subgraph, description=model_description(subgraph, str(kernels)),
                              native=forms == "native"):
        return "the .tflite payload is not what qlower writes for its subgraph (altered after compilation)"
    return None
