"""The TOSA 1.0 backend: profiles TOSA-1.0+INT and TOSA-1.0+INT+FP.

``lower`` emits one TOSA 1.0.0 flatbuffer per partition through the official
serializer, checks it with tosa-opt against the target's profile (plus only
the extensions the graph uses), and returns it with the IR boundary types,
which are exactly what the graph reads and writes (int8 stays int8).
``execute`` runs a payload on the official reference model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qlower.backends.tosa import executor
from qlower.backends.tosa.lowering import Lowered, describe, emit_tosa
from qlower.backends.tosa.serializer import TOSA_VERSION
from qlower.backends.tosa.support import PROFILES, Profile, check, profile_for
from qlower.backends.tosa.tensors import tensors_problem, tosa_tensors
from qlower.backends.tosa.validate import Diagnostic, validate
from qlower.contract import Backend, Payload, Verdict, check_payload_inputs
from qlower.errors import CompileError, ExecutionError, QlowerError
from qlower.ir import Graph, Op

GRAPH_BLOB = "graph.tosa"
TRACE_BLOB = "trace.tosa"


class TosaBackend(Backend):
    """Options for accelerators without a divider or a gather (Ethos-U55/U65): ``divide_by_multiply``
    writes an ``intdiv`` by a constant as multiplies and shifts (division.py), ``byte_tables`` an
    int16 -> int32 lookup over at most 256 codes as int8 TABLEs (lower_elementwise.py)."""

    name = "tosa"
    targets = tuple(PROFILES)

    def __init__(self, divide_by_multiply: bool = False, byte_tables: bool = False) -> None:
        self.divide_by_multiply, self.byte_tables = divide_by_multiply, byte_tables

    def supports(self, op: Op, target: str) -> Verdict:
        reason = check(op, profile_for(target))
        return Verdict.yes() if reason is None else Verdict.no(reason)

    def lower(self, subgraph: Graph, target: str, trace: bool = False) -> Payload:
        """Lower, validate and package ``subgraph``.

        With ``trace``, ``blobs["trace.tosa"]`` is the same graph with every mapped
        intermediate tensor appended to its outputs (names in ``meta["trace_outputs"]``);
        it is not validated again: its operators are graph.tosa's.
        Raises UnsupportedOpError for an op ``supports`` rejects, CompileError when
        validation fails (naming the IR op the failing TOSA operator came from).
        """
        payload, lowered = self._emit(subgraph, target, trace)
        profile = profile_for(target)
        _check_valid(payload.blobs[GRAPH_BLOB], profile, payload.meta["extensions"], lowered, subgraph)
        return payload

    def _emit(self, subgraph: Graph, target: str, trace: bool) -> tuple[Payload, Lowered]:
        """The payload ``lower`` returns, before validation (deterministic: same graph, same bytes)."""
        profile = profile_for(target)
        lowered = emit_tosa(subgraph, profile, self.divide_by_multiply, self.byte_tables)
        writer = lowered.writer
        blobs = {GRAPH_BLOB: writer.serialize()}
        meta = {
            "profile": profile.spec,
            "tosa_opt_profiles": profile.tosa_opt,
            "extensions": sorted(writer.extensions),
            "tosa_version": ".".join(map(str, TOSA_VERSION)),
            "tosa_ops": dict(sorted(writer.op_counts().items())),
            "input_tensors": lowered.input_names,
            "output_tensors": lowered.output_names,
        }
        if trace:
            real = set(lowered.output_names)
            intermediates = {e.output for e in writer.operators}
            traced = [name for name in lowered.tensor_map if name in intermediates and name not in real]
            for name in traced:
                writer.mark_output_name(name)
            # The same operators as graph.tosa, which passed validation; only the output list is longer.
            blobs[TRACE_BLOB] = writer.serialize()
            meta["trace_outputs"] = traced
        payload = Payload(
            backend=self.name, target=target, blobs=blobs,
            input_types=tuple(v.type for v in subgraph.inputs),
            output_types=tuple(v.type for v in subgraph.outputs),
            tensor_map=dict(lowered.tensor_map), meta=meta,
        )
        return payload, lowered

    def check_meta(self, payload: Payload) -> str | None:
        """Also the TOSA tensor names execution reads."""
        return super().check_meta(payload) or tensors_problem(payload)

    def check_loaded(self, subgraph: Graph, payload: Payload) -> str | None:
        """The payload must be exactly this lowering of ``subgraph`` (re-emitted: milliseconds,
        no tosa-opt), so the reference model only ever reads graphs qlower wrote and validated."""
        if payload.target not in PROFILES:
            return f"its TOSA profile {payload.target[:40]!r} is not one of {', '.join(PROFILES)}"
        if GRAPH_BLOB not in payload.blobs:
            return f"the payload has no {GRAPH_BLOB}"
        try:
            expected, _ = self._emit(subgraph, payload.target, TRACE_BLOB in payload.blobs)
        except QlowerError as e:
            return f"qlower can't lower its subgraph for {payload.target}: {str(e)[:300]}"
        for name in sorted(set(expected.blobs) | set(payload.blobs)):
            if expected.blobs.get(name) != payload.blobs.get(name):
                return (f"its {name} is not what qlower writes for its subgraph (altered after compilation)"
                        if name in expected.blobs else f"it holds an unexpected blob {name[:40]!r}")
        if expected.meta != payload.meta:
            keys = sorted(k for k in set(expected.meta) | set(payload.meta) if expected.meta.get(k) != payload.meta.get(k))
            return f"its TOSA metadata differs from qlower's lowering of its subgraph ({', '.join(keys)[:200]})"
        if expected.tensor_map != payload.tensor_map:
            return "its tensor map differs from qlower's lowering of its subgraph"
        if (expected.input_types, expected.output_types) != (payload.input_types, payload.output_types):
            return "its boundary types differ from its subgraph's"
        return None

    def execute(self, payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        arrays = check_payload_inputs(payload, inputs, "the TOSA partition")
        outputs = executor.run(payload.blobs[GRAPH_BLOB], arrays, f"partition for {payload.target}")
        return _typed_outputs(payload, outputs[:len(payload.output_types)])

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        """Run the trace graph (or the plain one) and return the requested tensors it exposes
        (inputs, outputs and, with a trace graph, every mapped intermediate; not constants)."""
        arrays = check_payload_inputs(payload, inputs, "the TOSA partition")
        blob = payload.blobs.get(TRACE_BLOB, payload.blobs[GRAPH_BLOB])
        tensors_of = tosa_tensors(payload)
        names = tensors_of.outputs + (tensors_of.trace if TRACE_BLOB in payload.blobs else ())
        outputs = executor.run(blob, arrays, f"traced partition for {payload.target}")
        by_name = dict(zip(tensors_of.inputs, arrays)) | dict(zip(names, outputs))
        return {name: by_name[name] for name in tensors if name in by_name}


def _check_valid(flatbuffer: bytes, profile: Profile, extensions: list[str], lowered: Lowered,
                 subgraph: Graph) -> None:
    diagnostics = validate(flatbuffer, profile.tosa_opt, extensions)
    if diagnostics:
        raise CompileError(_validation_message(diagnostics, profile, extensions, lowered, subgraph))


def _validation_message(diagnostics: list[Diagnostic], profile: Profile, extensions: list[str],
                        lowered: Lowered, subgraph: Graph) -> str:
    target = profile.tosa_opt + (f" with extensions {','.join(extensions)}" if extensions else "")
    lines = [f"the TOSA lowering of graph '{subgraph.name}' is not valid {profile.spec} ({target}):"]
    operators = lowered.writer.operators
    for d in diagnostics[:10]:
        where = f"TOSA {d.tosa_op}" if d.tosa_op else "a TOSA operator"
        if d.position is not None and d.position < len(operators):
            emitted = operators[d.position]
            if emitted.ir_op is not None:
                where = f"TOSA {emitted.tosa_op} emitted for {describe(emitted.ir_op)}"
        lines.append(f"  {where}: {d.message}")
    if len(diagnostics) > 10:
        lines.append(f"  ... and {len(diagnostics) - 10} more")
    lines.append("This is a bug in qlower's TOSA lowering; keeping the op on the host avoids it.")
    return "\n".join(lines)


def _typed_outputs(payload: Payload, outputs: list[np.ndarray]) -> list[np.ndarray]:
    result = []
    for i, (y, t) in enumerate(zip(outputs, payload.output_types)):
        y = np.asarray(y)
        if y.dtype != t.dtype.numpy or tuple(y.shape) != t.shape:
            raise ExecutionError(f"output {i} of the TOSA partition came back as {y.dtype}{list(y.shape)}, "
                               f"the payload declares {t}")
        result.append(y)
    return result
