"""The ``tflm`` target: the supported graph as one .tflite that TensorFlow Lite Micro runs, bit-exact.

Before partitioning, its declared ``rewrites`` give every int8 ADD TFLite
ADD's form, every rescale fused into a TFLM kernel that kernel's rounding
(``rounding.py``) and every global mean TFLM's MEAN's (``mean.py``), so the program means what TFLM computes. ``supports`` says yes to the ops the TFLM exporter writes with
TFLM's kernels only (``export.py``, ``kernels.py``); the rest stay on the host
with the exporter's reason. A payload records what the device must hold: the
smallest tensor arena TFLM's interpreter allocates the model in (found by the
interpreter itself) and the model's bytes (flash). Payloads run on TFLM's own
interpreter in worker processes (``runner.py``), after the flatbuffer passed
the same structural check as LiteRT's (``litert/verify.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tflite

from qlower.backends.float_inputs import SATURATING, check_finite, quantized_only, saturating_problem
from qlower.backends.litert.flatbuffer import NUMPY_OF_TFLITE
from qlower.backends.litert.fused_add import TfliteAdd
from qlower.backends.litert.verify import builtin_counts, verify_tflite
from qlower.backends.tflm import runner
from qlower.backends.tflm.export import export_tflm
from qlower.backends.tflm.interface import Io, boundary_reasons, int8_interface
from qlower.backends.tflm.mean import TflmMean
from qlower.backends.tflm.rounding import TflmKernelRounding
from qlower.backends.tflm.settle import settled_reasons
from qlower.contract import (
    Backend,
    CostReport,
    Exporter,
    Payload,
    Verdict,
    boundary_types_problem,
    check_payload_inputs,
)
from qlower.errors import ExecutionError, InvalidProgramError
from qlower.ir import Graph, Op
from qlower.ir.rewrite import Rewrite

MODEL_BLOB = "model.tflite"
ESTIMATOR = "TFLM's interpreter"   # the arena is measured, not estimated
EXACTNESS = "bit-exact with the reference interpreter (TFLM reference kernels, tflite-micro's interpreter)"


def description(subgraph: Graph) -> str:
    return f"qlower {subgraph.name} for TFLM"


class TflmBackend(Backend):
    name = "tflm"
    targets = ("tflm",)

    @classmethod
    def exporters(cls, target: str) -> dict[str, Exporter]:
        """``tflite``: the whole program of TFLM's kernels only, with their rounding (export.py)."""
        return {"tflite": lambda source, payloads, text: export_tflm(
            int8_interface(source) if program_io(payloads) == "int8" else source, description=text)}

    @classmethod
    def export_note(cls, target: str, format: str, source: Graph) -> str:
        return "TFLite, for TFLite Micro: bit-exact with the reference interpreter under TFLM's reference kernels"

    @classmethod
    def cost_report(cls, payload: Payload) -> CostReport | None:
        """What the device must hold: the arena TFLM's interpreter found smallest, the model's bytes (flash);
        no time estimate."""
        arena, flash = payload.meta.get("arena_bytes"), payload.meta.get("flash_bytes")
        if arena is None and flash is None:
            return None
        for key, n in (("arena_bytes", arena), ("flash_bytes", flash)):
            if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
                raise ValueError(f"the tflm payload's {key} {str(n)[:20]!r} is not a size")
        return CostReport(ESTIMATOR, None, None, {"arena": arena, "flash": flash})

    def check_meta(self, payload: Payload) -> str | None:
        try:
            self.cost_report(payload)
        except ValueError as e:
            return super().check_meta(payload) or str(e)
        return super().check_meta(payload)

    def __init__(self, io: Io = "float32") -> None:
        """``io``: the .tflite's interface -- ``float32`` (it quantizes its inputs and dequantizes its outputs
        itself) or ``int8`` (it takes and returns the codes; the program's boundary quantize/dequantize
        stay on the host: interface.py)."""
        self.io = io
        self._reasons: dict[int, str] = {}

    def rewrites(self, target: str) -> tuple[Rewrite, ...]:
        """Residual adds in TFLite ADD's form, fused requantization with TFLM's kernels' rounding, global
        means with TFLM's MEAN's."""
        return (TfliteAdd(), TflmKernelRounding(), TflmMean())

    def prepare(self, graph: Graph) -> None:
        self._reasons = settled_reasons(graph, boundary_reasons(graph) if self.io == "int8" else {})

    def supports(self, op: Op, target: str) -> Verdict:
        reason = self._reasons.get(id(op))
        return Verdict.yes() if reason is None else Verdict.no(reason)

    def lower(self, subgraph: Graph, target: str, trace: bool = False) -> Payload:
        model = export_tflm(subgraph, description=description(subgraph))
        verify_tflite(model)
        arena = runner.smallest_arena(model, f"partition '{subgraph.name}'")
        names = {v.name for op in subgraph.ops for v in op.results if op.kind != "constant"}
        return Payload(
            backend=self.name, target=target, blobs={MODEL_BLOB: model},
            input_types=tuple(v.type for v in subgraph.inputs),
            output_types=tuple(v.type for v in subgraph.outputs),
            # the IR values the model holds as tensors of their own (a fused GEMM's accumulator is not one)
            tensor_map={n: n for n in sorted(names & set(tensor_bytes(model)))} if trace else {},
            meta={"exactness": EXACTNESS, "tflite_ops": builtin_counts(model), "io": self.io,
                  "arena_bytes": arena, "flash_bytes": len(model),
                  # float inputs only QUANTIZE reads: ±inf saturates there as in the reference (float_inputs.py)
                  SATURATING: quantized_only(subgraph),
                  # explain() prints it: what the device must hold
                  "summary": f"TFLM: tensor arena {arena:,} bytes (the smallest its interpreter allocates the "
                             f"model in), model {len(model):,} bytes (flash)"},
        )

    def check_loaded(self, subgraph: Graph, payload: Payload) -> str | None:
        model = payload.blobs.get(MODEL_BLOB)
        if model is None:
            return f"the tflm payload has no {MODEL_BLOB}"
        arena = payload.meta.get("arena_bytes")
        if not isinstance(arena, int) or isinstance(arena, bool) or not 0 < arena <= runner.MAX_ARENA:
            return f"the tflm payload's arena_bytes {str(arena)[:20]!r} is not a size in (0, {runner.MAX_ARENA}]"
        try:
            verify_tflite(model)
        except InvalidProgramError as e:
            return str(e)
        if model != export_tflm(subgraph, description=description(subgraph)):
            return "the .tflite payload is not what qlower writes for its subgraph (altered after compilation)"
        return boundary_types_problem(subgraph, payload) or saturating_problem(subgraph, payload)

    def execute(self, payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self._run(payload, inputs, ())[0]

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        return self._run(payload, inputs, tuple(tensors))[1]

    def _run(self, payload: Payload, inputs: Sequence[np.ndarray], traced: tuple[str, ...]
             ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        arrays = check_payload_inputs(payload, inputs, "the TFLM partition")
        check_finite(payload, arrays, "the TFLM partition")
        model = payload.blobs.get(MODEL_BLOB)
        if model is None:
            raise ExecutionError(f"the tflm payload has no {MODEL_BLOB}")
        try:
            verify_tflite(model)   # never hand TFLM bytes its own parser would have to survive
        except InvalidProgramError as e:
            raise ExecutionError(f"TFLM can't run the partition: {e}") from None
        arena, seen = payload.meta.get("arena_bytes"), {}
        if traced:
            # every tensor kept apart: the device's arena plus room for all of them
            arena = arena + sum(-(-n // 16) * 16 for n in tensor_bytes(model).values()) if isinstance(arena, int) \
                else arena
            outs, seen = runner.run_traced(model, arena, arrays, traced, "the TFLM partition")
        else:
            outs = runner.run(model, arena, arrays, "the TFLM partition")
        if len(outs) != len(payload.output_types):
            raise ExecutionError(f"the TFLM partition returned {len(outs)} outputs, its payload declares "
                                 f"{len(payload.output_types)}")
        for i, (y, t) in enumerate(zip(outs, payload.output_types)):
            if y.dtype != t.dtype.numpy or tuple(y.shape) != t.shape:
                raise ExecutionError(f"output {i} of the TFLM partition came back as {y.dtype}{list(y.shape)}, "
                                     f"the payload declares {t}")
        return outs, seen


def program_io(payloads: Sequence[Payload]) -> str:
    """The interface the program was compiled with (its tflm payloads record it; float32 without one)."""
    ios = {p.meta.get("io", "float32") for p in payloads if p.backend == "tflm"}
    return "int8" if ios == {"int8"} else "float32"


def tensor_bytes(model: bytes) -> dict[str, int]:
    """Bytes of each computed tensor of a (verified) model, by name (constants live in flash)."""
    m = tflite.Model.GetRootAsModel(model, 0)
    sg = m.Subgraphs(0)
    sizes = {}
    for i in range(sg.TensorsLength()):
        t = sg.Tensors(i)
        if m.Buffers(t.Buffer()).DataLength():
            continue
        shape = [t.Shape(j) for j in range(t.ShapeLength())]
        sizes[t.Name().decode()] = int(np.prod(shape, dtype=np.int64)) * NUMPY_OF_TFLITE[t.Type()].itemsize
    return sizes
