"""The ``tflm`` target: the supported graph as one .tflite that TensorFlow Lite Micro runs, bit-exact.

Before partitioning, ``rewrite`` gives every rescale fused into a TFLM kernel
the rounding that kernel uses (``rounding.py``), so the program means what
TFLM computes. ``supports`` says yes to the ops the TFLM exporter writes with
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

from qlower.backends.litert.verify import builtin_counts, verify_tflite
from qlower.backends.tflm import runner
from qlower.backends.tflm.export import export_tflm, op_reasons
from qlower.backends.tflm.rounding import with_tflm_rounding
from qlower.contract import Backend, Exporter, Payload, Verdict, check_payload_inputs
from qlower.errors import ExecutionError, InputError, InvalidProgramError
from qlower.ir import Graph, Op

MODEL_BLOB = "model.tflite"
EXACTNESS = "bit-exact with the reference interpreter (TFLM reference kernels, tflite-micro's interpreter)"


def description(subgraph: Graph) -> str:
    return f"qlower {subgraph.name} for TFLM"


class TflmBackend(Backend):
    name = "tflm"
    targets = ("tflm",)

    @classmethod
    def exporters(cls, target: str) -> dict[str, Exporter]:
        """``tflite``: the whole program of TFLM's kernels only, with their rounding (export.py)."""
        return {"tflite": lambda source, payloads, text: export_tflm(source, description=text)}

    def __init__(self) -> None:
        self._reasons: dict[int, str] = {}

    def rewrite(self, graph: Graph, target: str) -> Graph:
        """Residual adds in TFLite ADD's form, fused requantization with TFLM's kernels' rounding."""
        return with_tflm_rounding(graph)

    def prepare(self, graph: Graph) -> None:
        self._reasons = op_reasons(graph)

    def supports(self, op: Op, target: str) -> Verdict:
        reason = self._reasons.get(id(op))
        return Verdict.yes() if reason is None else Verdict.no(reason)

    def lower(self, subgraph: Graph, target: str, trace: bool = False) -> Payload:
        model = export_tflm(subgraph, description=description(subgraph))
        verify_tflite(model)
        arena = runner.smallest_arena(model, f"partition '{subgraph.name}'")
        return Payload(
            backend=self.name, target=target, blobs={MODEL_BLOB: model},
            input_types=tuple(v.type for v in subgraph.inputs),
            output_types=tuple(v.type for v in subgraph.outputs),
            meta={"exactness": EXACTNESS, "tflite_ops": builtin_counts(model),
                  "arena_bytes": arena, "flash_bytes": len(model)},
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
        return None

    def execute(self, payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        arrays = check_payload_inputs(payload, inputs, "the TFLM partition")
        for i, x in enumerate(arrays):
            if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
                raise InputError(f"input {i} of the TFLM partition holds NaN or infinity")
        model = payload.blobs.get(MODEL_BLOB)
        if model is None:
            raise ExecutionError(f"the tflm payload has no {MODEL_BLOB}")
        try:
            verify_tflite(model)   # never hand TFLM bytes its own parser would have to survive
        except InvalidProgramError as e:
            raise ExecutionError(f"TFLM can't run the partition: {e}") from None
        outs = runner.run(model, payload.meta.get("arena_bytes"), arrays, "the TFLM partition")
        if len(outs) != len(payload.output_types):
            raise ExecutionError(f"the TFLM partition returned {len(outs)} outputs, its payload declares "
                                 f"{len(payload.output_types)}")
        for i, (y, t) in enumerate(zip(outs, payload.output_types)):
            if y.dtype != t.dtype.numpy or tuple(y.shape) != t.shape:
                raise ExecutionError(f"output {i} of the TFLM partition came back as {y.dtype}{list(y.shape)}, "
                                     f"the payload declares {t}")
        return outs

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        # TFLM reuses the arena's memory: only the boundary is visible (the tensor map is empty)
        self.execute(payload, inputs)
        return {}
