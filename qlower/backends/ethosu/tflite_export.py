"""An Ethos-U program as one .tflite for TensorFlow Lite Micro: host ops as TFLM builtins, each
NPU partition as Vela's ``ethos-u`` custom operator.

The custom operator has the layout Vela's own TFLite writer gives it and TFLM's Ethos-U kernel
reads: inputs ``[command stream, flash, scratch, scratch_fast, IFM...]``, outputs the OFMs,
custom options ``[1, 4, 1]`` (flexbuffer: an NPU op). The command stream (Vela's driver payload,
"COP1" header included) and the flash tensor (Vela's read-only data: encoded weights, scales,
LUTs) are the partition payload's bytes unchanged. The kernel gives the driver each input's
address as one base register in that order, and Vela's command stream addresses IFMs and OFMs
inside the scratch region (region 1) at the offsets Vela chose: so the scratch tensor and its
IFM/OFM tensors are placed by the ``OfflineMemoryAllocation`` metadata TFLM's planner honours,
each partition's scratch an area of its own. Like Vela's writer, scratch_fast is empty: a
Dedicated_Sram system's fast memory is the driver's (its size is in the export note).

The host ops are written by the ``tflm`` target's exporter (TFLM's kernels and rounding); one
that has no TFLM form is an UnsupportedOpError naming it and its source line. The program was not
given the ``tflm`` target's rewrites, so a host GEMM fuses into TFLM's kernel only where its
requantization already rounds as that kernel does; otherwise it is refused by name, never rounded
differently.
"""

from __future__ import annotations

from collections.abc import Sequence

import flatbuffers
import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator as B

from qlower.backends.litert.emit import NotExact, tflite_quant
from qlower.backends.litert.export import _tfl_dtype
from qlower.backends.litert.flatbuffer import ModelWriter, _int_vector, _Operator
from qlower.backends.tflm.export import TflmExport
from qlower.backends.tflm.rounding import TFLM_ROUNDING
from qlower.contract import Payload
from qlower.errors import UnsupportedOpError
from qlower.ir import Graph, Op, Value

CUSTOM_CODE = "ethos-u"
NPU_OP_OPTIONS = bytes([0x01, 0x04, 0x01])   # flexbuffer uint8 1: "an NPU op" (Vela's writer, TFLM's kernel)
FLEXBUFFERS = 0                              # CustomOptionsFormat.FLEXBUFFERS
OFFLINE_KEY = "OfflineMemoryAllocation"
ALIGN = 16                                   # each partition's scratch area starts aligned
COMMAND_STREAM, READ_ONLY = "command_stream.bin", "read_only.bin"


class NpuModelWriter(ModelWriter):
    """ModelWriter with the ``ethos-u`` custom operator and TFLM's offline tensor placement."""

    def __init__(self, description: str):
        super().__init__(description=description)
        self.offline: dict[int, int] = {}    # tensor index -> offset in the arena

    @staticmethod
    def _opcode(b: flatbuffers.Builder, code: int) -> int:
        if code != B.CUSTOM:
            return ModelWriter._opcode(b, code)
        name = b.CreateString(CUSTOM_CODE)
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, B.CUSTOM)
        tflite.OperatorCodeAddBuiltinCode(b, B.CUSTOM)
        tflite.OperatorCodeAddCustomCode(b, name)
        tflite.OperatorCodeAddVersion(b, 1)
        return tflite.OperatorCodeEnd(b)

    def _operator(self, b: flatbuffers.Builder, op: _Operator) -> int:
        if self.opcodes[op.opcode] != B.CUSTOM:
            return ModelWriter._operator(b, op)
        inputs = _int_vector(b, tflite.OperatorStartInputsVector, op.inputs)
        outputs = _int_vector(b, tflite.OperatorStartOutputsVector, op.outputs)
        custom = b.CreateByteVector(NPU_OP_OPTIONS)
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, op.opcode)
        tflite.OperatorAddInputs(b, inputs)
        tflite.OperatorAddOutputs(b, outputs)
        tflite.OperatorAddCustomOptions(b, custom)
        tflite.OperatorAddCustomOptionsFormat(b, FLEXBUFFERS)
        return tflite.OperatorEnd(b)

    def finish(self, inputs: Sequence[int], outputs: Sequence[int]) -> bytes:
        if self.offline:
            # version 0, one subgraph, its tensor count, then each tensor's offset (-1: TFLM plans it)
            offsets = [self.offline.get(i, -1) for i in range(len(self.tensors))]
            self.metadata[OFFLINE_KEY] = np.asarray([0, 1, len(self.tensors), *offsets], "<i4").tobytes()
        return super().finish(inputs, outputs)


class EthosUTflmExport(TflmExport):
    """The ``tflm`` exporter of the host graph, with each ``delegate`` op written as the custom operator."""

    def __init__(self, host: Graph, payloads: dict[str, Payload], description: str):
        super().__init__(host, description)
        self.b.writer = NpuModelWriter(description)
        self.payloads = payloads
        self.arena_end = 0    # where the next partition's scratch area starts

    def fused_gemm(self, rescale: Op) -> Op | None:
        # a host GEMM fuses only where the program already rounds as TFLM's kernel (the tflm target's
        # rewrite did that; an Ethos-U program's host GEMM rounds as TOSA): else its exact unfused form
        gemm = super().fused_gemm(rescale)
        return gemm if gemm is not None and rescale.attrs["rounding"] == TFLM_ROUNDING[gemm.kind] else None

    def emit(self, op: Op) -> None:
        if op.kind == "delegate":
            self._npu(op)
            return
        for user in self.users.get(op.result, []) if op.kind in TFLM_ROUNDING else []:
            if super().fused_gemm(user) is op and self.fused_gemm(user) is None:
                raise NotExact(f"its requantization %{user.result.name} rounds {user.attrs['rounding']} (the "
                               f"program's form), TFLM's fused {op.kind} rounds {TFLM_ROUNDING[op.kind]}")
        super().emit(op)

    def _placed(self, v: Value, offset: int) -> int:
        """``v``'s tensor at ``offset`` of the arena; a copy (RESHAPE, which TFLM copies between distinct
        buffers) when the tensor has a place already or is a constant."""
        writer = self.b.writer
        t = self.value(v)
        if t in writer.offline or writer.tensors[t].buffer:
            t = self._reshape(t, v.shape, f"{v.name}/npu", tflite_quant(v.type))
        writer.offline[t] = offset
        return t

    def _npu(self, op: Op) -> None:
        name = op.attrs["partition"]
        payload = self.payloads.get(name)
        if payload is None or payload.backend != "ethos-u":
            raise NotExact(f"partition '{name}' is not an Ethos-U payload")
        meta, b = payload.meta, self.b
        scratch, base = int(meta["scratch_size"]), self.arena_end
        ios = meta["io"]
        ins = [io for io in ios if io["kind"] == "input"]
        outs = [io for io in ios if io["kind"] == "output"]
        if len(ins) != len(op.operands[0]) or len(outs) != len(op.results):
            raise NotExact(f"partition '{name}': Vela's IO ({len(ins)} in, {len(outs)} out) is not the call's")
        for io in ios:
            if io["region"] != 1 or io["offset"] + io["size"] > scratch:
                raise NotExact(f"partition '{name}': Vela placed {io['kind']} {io['name']} outside its scratch "
                               f"area (region {io['region']}, offset {io['offset']}); TFLM can't place it")
        stream = b.const(f"{name}/command_stream", np.frombuffer(payload.blobs[COMMAND_STREAM], np.uint8), "uint8")
        flash = b.const(f"{name}/flash", np.frombuffer(payload.blobs[READ_ONLY], np.uint8), "uint8")
        area = b.tensor(f"{name}/scratch", (scratch,), "uint8")
        fast = b.tensor(f"{name}/scratch_fast", (0,), "uint8")
        b.writer.offline[area] = base
        args = [self._placed(v, base + io["offset"]) for v, io in zip(op.operands[0], ins)]
        results = []
        for v, io in zip(op.results, outs):
            t = b.tensor(v.name, v.shape, _tfl_dtype(v.type), tflite_quant(v.type))
            b.writer.offline[t] = base + io["offset"]
            self.bind(v, t)
            results.append(t)
        b.writer.operator(B.CUSTOM, [stream, flash, area, fast, *args], results)
        self.arena_end = base + -(-scratch // ALIGN) * ALIGN


def export_ethosu_tflite(host: Graph, payloads: dict[str, Payload], description: str) -> bytes:
    """The .tflite of an Ethos-U program (module doc): ``host`` its host graph, ``payloads`` by partition
    name. UnsupportedOpError names a host op TFLM has no form of, with its source line."""
    try:
        return EthosUTflmExport(host, payloads, description).run()
    except NotExact as e:
        raise UnsupportedOpError(f"graph '{host.name}' can't be exported for TFLM with Ethos-U: {e}") from None

