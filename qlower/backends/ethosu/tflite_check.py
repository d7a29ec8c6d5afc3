"""Reading back an Ethos-U .tflite (``tflite_export.py``) and running it here.

No Ethos-U or FVP is installable here, and TFLM's Python interpreter has no Ethos-U kernel: so
``run_split`` cuts the model at its ``ethos-u`` custom operators, runs each run of builtin
operators on TFLM's own interpreter (a model of its own, in a worker process) and each custom
operator on the simulated executor of the payload whose command stream and flash it holds byte
for byte (the TOSA reference model on the partition's TOSA, as ``prog.run`` does).

``read_npu_tflite`` checks a file before anything native reads it: a flatbuffer that fails to
parse, names tensors or buffers out of range, or carries a custom operator other than Vela's
NPU op in its layout is an InvalidProgramError with the reason; every builtin piece then passes
the structural check of LiteRT's files (``litert/verify.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import flatbuffers
import numpy as np
from tflite_micro.python.tflite_micro.runtime import schema_fb as fb

from qlower.backends.ethosu.tflite_export import COMMAND_STREAM, CUSTOM_CODE, NPU_OP_OPTIONS, READ_ONLY
from qlower.backends.litert.flatbuffer import NUMPY_OF_TFLITE
from qlower.backends.litert.verify import verify_tflite
from qlower.contract import Payload
from qlower.errors import ExecutionError, InvalidProgramError

CUSTOM = 32   # BuiltinOperator.CUSTOM


@dataclass(frozen=True)
class NpuCall:
    """One ``ethos-u`` operator: its position, the bytes it carries, its IFM and OFM tensors."""

    index: int
    command_stream: bytes
    flash: bytes
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def read_npu_tflite(data: bytes) -> tuple[fb.ModelT, list[NpuCall]]:
    """The parsed model and its NPU calls; InvalidProgramError (with the reason) for a corrupt file."""
    if not isinstance(data, bytes | bytearray) or len(data) < 8 or bytes(data[4:8]) != b"TFL3":
        raise InvalidProgramError("not a .tflite file (too short, or no 'TFL3' identifier)")
    try:
        model = fb.ModelT.InitFromPackedBuf(bytes(data), 0)
        calls = _npu_calls(model)
    except InvalidProgramError:
        raise
    except Exception as e:  # noqa: BLE001 - the generated reader's bounds checks: a corrupt file
        raise InvalidProgramError(f"the .tflite file is malformed: {type(e).__name__}: {e}") from None
    if model.version != 3 or len(model.subgraphs or []) != 1:
        raise InvalidProgramError("the .tflite file is not a schema-3 model of one subgraph")
    for piece, _ in _pieces(model):   # the builtin parts get LiteRT's structural check
        verify_tflite(piece)
    return model, calls


def _npu_calls(model: fb.ModelT) -> list[NpuCall]:
    sg, codes, buffers = model.subgraphs[0], model.operatorCodes or [], model.buffers or []
    n = len(sg.tensors or [])
    calls = []
    for i, op in enumerate(sg.operators or []):
        if not 0 <= op.opcodeIndex < len(codes):
            raise InvalidProgramError(f"operator {i} names operator code {op.opcodeIndex} of {len(codes)}")
        for t in [*(op.inputs if op.inputs is not None else []), *(op.outputs if op.outputs is not None else [])]:
            if not -1 <= t < n:
                raise InvalidProgramError(f"operator {i} names tensor {t} of {n}")
        code = codes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) != CUSTOM:
            continue
        if (code.customCode or b"").decode(errors="replace") != CUSTOM_CODE:
            raise InvalidProgramError(f"operator {i} is a custom operator other than '{CUSTOM_CODE}'")
        ins = [int(t) for t in op.inputs]
        if len(ins) < 4 or bytes(np.asarray(op.customOptions, np.uint8)) != NPU_OP_OPTIONS \
                or min(ins) < 0:
            raise InvalidProgramError(f"operator {i} ({CUSTOM_CODE}) lacks Vela's NPU-op layout")
        held = []
        for what, t in (("command stream", ins[0]), ("flash", ins[1])):
            tensor = sg.tensors[t]
            if not 0 <= tensor.buffer < len(buffers) or tensor.type != 3:   # 3: UINT8
                raise InvalidProgramError(f"operator {i}'s {what} is not a constant uint8 tensor")
            held.append(bytes(np.asarray(buffers[tensor.buffer].data if buffers[tensor.buffer].data is not None
                                         else [], np.uint8)))
        calls.append(NpuCall(i, held[0], held[1], tuple(ins[4:]), tuple(int(t) for t in op.outputs)))
    return calls


def _pieces(model: fb.ModelT) -> list[tuple[bytes, list[int]]]:
    """Each maximal run of builtin operators as a model of its own (its inputs: what it reads that is
    computed outside it; its outputs: what it computes that is read after it or is a model output),
    with the indices of its operators."""
    sg = model.subgraphs[0]
    ops, codes = sg.operators or [], model.operatorCodes
    custom = [max(codes[op.opcodeIndex].builtinCode, codes[op.opcodeIndex].deprecatedBuiltinCode) == CUSTOM
              for op in ops]
    runs, run = [], []
    for i, is_custom in enumerate(custom):
        if is_custom:
            runs, run = runs + ([run] if run else []), []
        else:
            run.append(i)
    runs += [run] if run else []
    outputs = set(int(t) for t in sg.outputs)
    pieces = []
    for run in runs:
        made = {int(t) for i in run for t in ops[i].outputs}
        read = [int(t) for i in run for t in ops[i].inputs if t >= 0]
        constant = {t for t in read if sg.tensors[t].buffer and model.buffers[sg.tensors[t].buffer].data is not None}
        ins = list(dict.fromkeys(t for t in read if t not in made and t not in constant))
        later = {int(t) for i in range(run[-1] + 1, len(ops)) for t in ops[i].inputs}
        outs = [t for t in sorted(made) if t in later or t in outputs]
        pieces.append((_submodel(model, run, ins, outs), run, ins, outs))
    return [(p[0], p[1:]) for p in pieces]


def _submodel(model: fb.ModelT, run: list[int], ins: list[int], outs: list[int]) -> bytes:
    """The operators ``run`` as a model reading ``ins`` and writing ``outs`` (tensors renumbered, no
    offline placement: TFLM plans this piece itself)."""
    sg = model.subgraphs[0]
    keep = list(dict.fromkeys([*ins, *(int(t) for i in run for t in (*sg.operators[i].inputs,
                                                                         *sg.operators[i].outputs) if t >= 0)]))
    index = {t: k for k, t in enumerate(keep)}
    sub = fb.SubGraphT()
    sub.tensors = [copy.copy(sg.tensors[t]) for t in keep]
    sub.operators = []
    used = list(dict.fromkeys(sg.operators[i].opcodeIndex for i in run))   # the custom code left out
    for i in run:
        op = copy.copy(sg.operators[i])
        op.opcodeIndex = used.index(op.opcodeIndex)
        op.inputs = [index[int(t)] if t >= 0 else -1 for t in op.inputs]
        op.outputs = [index[int(t)] for t in op.outputs]
        sub.operators.append(op)
    sub.inputs, sub.outputs, sub.name = [index[t] for t in ins], [index[t] for t in outs], sg.name
    m = fb.ModelT()
    m.version, m.buffers, m.description = 3, model.buffers, model.description
    m.operatorCodes = [model.operatorCodes[c] for c in used]
    m.subgraphs = [sub]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def payload_of(call: NpuCall, payloads: Sequence[Payload]) -> Payload:
    """The payload whose Vela output the call holds byte for byte; InvalidProgramError when none does."""
    for p in payloads:
        if p.blobs.get(COMMAND_STREAM) == call.command_stream and p.blobs.get(READ_ONLY) == call.flash:
            return p
    raise InvalidProgramError(f"operator {call.index}'s command stream and flash are no payload's Vela output")


def run_split(data: bytes, payloads: Sequence[Payload], inputs: Sequence[np.ndarray],
              execute) -> list[np.ndarray]:
    """Run the model here (module doc): builtin pieces on TFLM, each NPU call by ``execute(payload,
    arrays)`` (the Ethos-U backend's simulated executor)."""
    from qlower.backends.tflm import runner

    model, calls = read_npu_tflite(data)
    sg = model.subgraphs[0]
    if len(inputs) != len(sg.inputs):
        raise ExecutionError(f"the model takes {len(sg.inputs)} inputs, got {len(inputs)}")
    values: dict[int, np.ndarray] = {int(t): np.asarray(x) for t, x in zip(sg.inputs, inputs)}
    pieces = {run[0]: (piece, ins, outs) for piece, (run, ins, outs) in _pieces(model)}
    by_index = {c.index: c for c in calls}
    for i in range(len(sg.operators)):
        if i in by_index:
            call = by_index[i]
            outs = execute(payload_of(call, payloads), [values[t] for t in call.inputs])
            values.update(zip(call.outputs, outs))
        elif i in pieces:
            piece, ins, outs = pieces[i]
            arena = runner.smallest_arena(piece, f"the host ops from operator {i}")
            values.update(zip(outs, runner.run(piece, arena, [values[t] for t in ins], f"operator {i}")))
    for t in sg.outputs:
        want = NUMPY_OF_TFLITE[sg.tensors[t].type]
        if values[int(t)].dtype != want:
            raise ExecutionError(f"output tensor {t} came back as {values[int(t)].dtype}, the model says {want}")
    return [values[int(t)] for t in sg.outputs]


def npu_offsets(data: bytes) -> Mapping[int, int]:
    """Tensor index -> arena offset of the tensors the file places offline (TFLM's metadata)."""
    model, _ = read_npu_tflite(data)
    for meta in model.metadata or []:
        if meta.name == b"OfflineMemoryAllocation":
            raw = np.frombuffer(bytes(np.asarray(model.buffers[meta.buffer].data, np.uint8)), "<i4")
            return {i: int(o) for i, o in enumerate(raw[3:]) if o >= 0}
    return {}
