"""The VGF backend: TOSA 1.0 partitions converted to VGF for the ML extensions for Vulkan.

Targets: ``vgf`` (profile TOSA-1.0+INT+FP) and ``vgf+int`` (TOSA-1.0+INT).
``supports`` is the TOSA backend's verdict for that profile. ``lower`` = the
TOSA backend's lowering (validated by tosa-opt), then the ML SDK model
converter; the payload holds both files (``graph.tosa``, ``model.vgf``). Its
boundary types are read back from the VGF's input and output tensors (DESIGN.md
rule 6): a VGF tensor whose format or shape is not the subgraph value's is a
CompileError, never a reinterpreted buffer.

Execution (the payload's ``execution`` says which, in plain words):
- ``vulkan: ...``: the VGF runs on Vulkan through the ML SDK scenario runner and
  the ML emulation layer (see ``runner``), decided at lowering time by running a
  probe graph once per process;
- ``simulated: TOSA reference model (reason: ...)``: this machine can't run VGF
  (the reason is the exact failure), so the partition's TOSA graph runs on the
  TOSA reference model instead.
Per-layer tracing: ``lower(..., trace=True)`` also converts the TOSA trace graph
(intermediates as extra outputs) to ``trace.vgf``, which ``execute_traced`` runs the
same way, so the intermediates come from the same execution path as the outputs.
``VgfBackend(execution=...)`` (or the environment variable QLOWER_VGF_EXECUTION)
chooses: ``auto`` (default, as above), ``vulkan`` (lowering fails when Vulkan
can't run here) or ``simulate``. A payload lowered for Vulkan never silently
falls back: on a machine without the runtime its execution is an ExecutionError.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from qlower.backends.derived import first_difference
from qlower.backends.float_inputs import SATURATING, check_finite, quantized_only, saturating_problem
from qlower.backends.tosa.backend import GRAPH_BLOB as GRAPH_TOSA
from qlower.backends.tosa.backend import TRACE_BLOB as TRACE_TOSA
from qlower.backends.tosa.consumer import SIMULATED, TosaConsumer, simulated
from qlower.backends.tosa.tensors import tosa_tensors
from qlower.backends.vgf.container import VgfModel, VgfTensor, read_vgf
from qlower.backends.vgf.converter import converter_version, tosa_to_vgf_cached
from qlower.backends.vgf.runner import TensorSpec, VulkanUnavailable, run_vgf, specs_from_meta
from qlower.contract import Execution, Payload, Verdict, check_payload_inputs
from qlower.errors import CompileError, ConfigError, ExecutionError
from qlower.ir import DType, Graph, GraphBuilder, Op, QuantSpec, TensorType, Value

PROFILES: dict[str, str] = {"vgf": "tosa-1.0+int+fp", "vgf+int": "tosa-1.0+int"}
MODEL_VGF, TRACE_VGF = "model.vgf", "trace.vgf"
VULKAN = "vulkan"
MODES = ("auto", "vulkan", "simulate")


def _io_meta(model: VgfModel) -> list[dict]:
    return ([{"kind": "input", **t.as_meta()} for t in model.inputs]
            + [{"kind": "output", **t.as_meta()} for t in model.outputs])


def profile_for(target: str) -> str:
    try:
        return PROFILES[target]
    except KeyError:
        raise CompileError(f"unknown VGF target '{target}'; known: {', '.join(PROFILES)}") from None


def boundary_type(tensor: VgfTensor, value: Value, direction: str) -> TensorType:
    """The type of ``value`` as the VGF reads/writes it; CompileError when it isn't the subgraph's type."""
    where = f"partition {direction} %{value.name} (VGF tensor {tensor.name}, binding {tensor.binding})"
    if tensor.dtype is None:
        raise CompileError(f"{where}: the VGF moves {tensor.vk_format} tensors, which qlower has no type for")
    if tensor.dtype is not value.dtype or tensor.shape != value.shape:
        raise CompileError(f"{where}: the VGF {'reads' if direction == 'input' else 'writes'} {tensor.vk_format}"
                           f"{list(tensor.shape)}, the subgraph value is {value.type}; refusing to reinterpret "
                           "the buffer")
    return TensorType(tensor.shape, tensor.dtype, value.quant)


@functools.lru_cache(maxsize=1)
def vulkan_status() -> tuple[bool, str]:
    """(True, device name) when this machine runs VGF files on Vulkan, else (False, the exact failure).

    Runs a one-op probe graph (int8 CLAMP) through the whole chain once per process
    and checks its result, so "available" means "computes", not "is installed".
    """
    b = GraphBuilder("vgf_probe")
    x = b.input("x", TensorType((1, 2, 2, 4), DType.INT8, QuantSpec.per_tensor(0.1, 0)))
    g = b.build([b.op("clamp", x, min=-3, max=5)])
    data = np.arange(-8, 8, dtype=np.int8).reshape(1, 2, 2, 4)
    try:
        payload = VgfBackend("vulkan", probe=False).lower(g, "vgf+int")
        result = _run_real(payload, [data])
    except Exception as e:  # noqa: BLE001 - any failure means "can't run here"; the reason is reported
        return False, f"{type(e).__name__}: {e}"
    if not np.array_equal(result.outputs[0], np.clip(data, -3, 5)):
        return False, (f"the Vulkan run of a probe graph (int8 clamp to [-3, 5]) returned "
                       f"{result.outputs[0].ravel().tolist()} for {data.ravel().tolist()}")
    return True, result.device or "unknown Vulkan device"


def _specs(payload: Payload, key: str = "io", n_outputs: int | None = None
           ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The tensors to bind for ``model.vgf`` (``meta["io"]``) or ``trace.vgf`` (``meta["trace_io"]``).

    The model's IO must be exactly the payload's boundary types: the JSON meta of a loaded
    program file is not trusted to say otherwise.
    """
    what = f"VGF payload for {payload.target}"
    n_in = len(payload.input_types)
    n_out = len(payload.output_types) if n_outputs is None else n_outputs
    ins, outs = specs_from_meta(payload.meta.get(key), n_in, n_out, what)
    for spec, t in zip(ins + outs, payload.input_types + payload.output_types):
        if spec.shape != t.shape or spec.dtype != t.dtype.numpy:
            raise ExecutionError(f"{what}: its IO description says {spec.vk_format}{list(spec.shape)} where the "
                                 f"payload's boundary type is {t}; recompile the program")
    return ins, outs


def _run_real(payload: Payload, inputs: Sequence[np.ndarray], blob: str = MODEL_VGF, key: str = "io",
              n_outputs: int | None = None):
    if blob not in payload.blobs:
        raise ExecutionError(f"VGF payload for {payload.target} has no {blob}")
    ins, outs = _specs(payload, key, n_outputs)
    return run_vgf(payload.blobs[blob], list(zip(ins, inputs)), outs, f"VGF partition for {payload.target}")


def _finite(payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The inputs of a run on Vulkan, checked: the emulation layer reads NaN as -inf (measured), and a
    NaN that ±inf makes inside a float op too, where the reference refuses (float_inputs.py)."""
    arrays = check_payload_inputs(payload, inputs, "the VGF partition")
    check_finite(payload, arrays, "the VGF partition")
    return arrays


def _convert(tosa: bytes, subgraph: Graph, tosa_meta: dict, profile: str):
    """``tosa_to_vgf`` whose error also says the TOSA graph was valid, and which ops it holds."""
    try:
        return tosa_to_vgf_cached(tosa, f"partition '{subgraph.name}'")
    except CompileError as e:
        ops = ", ".join(f"{k}×{n}" for k, n in tosa_meta.get("tosa_ops", {}).items())
        raise CompileError(f"{e}\nThe TOSA graph ({ops}) is valid {tosa_meta.get('profile')} (tosa-opt), so "
                           "the converter does not take one of its operators or types: keep that op on the "
                           f"host, or compile for {profile}.") from None


def _as_json(x: Any) -> Any:
    return json.loads(json.dumps(x))


def derived_problem(payload: Payload) -> str | None:
    """Why ``payload``'s VGF files are not what the model converter makes of its (validated) TOSA
    graphs, or None."""
    pairs = [(GRAPH_TOSA, MODEL_VGF, "io")] + ([(TRACE_TOSA, TRACE_VGF, "trace_io")] if TRACE_TOSA in payload.blobs
                                                else [])
    unexpected = sorted(set(payload.blobs) - {name for pair in pairs for name in pair[:2]})
    if unexpected:
        return f"it holds an unexpected blob {unexpected[0][:40]!r}"
    for tosa_name, vgf_name, io_key in pairs:
        if vgf_name not in payload.blobs:
            return f"the VGF payload has {tosa_name} but no {vgf_name}"
        try:
            derived = tosa_to_vgf_cached(payload.blobs[tosa_name], f"its {tosa_name}").vgf
            model = read_vgf(derived)
        except CompileError as e:
            return f"its {vgf_name} can't be derived again from its validated {tosa_name}: {str(e)[:300]}"
        if derived != payload.blobs[vgf_name]:
            return (f"its {vgf_name} is not what the ML SDK model converter ({converter_version()}) makes of its "
                    f"validated {tosa_name} ({first_difference(payload.blobs[vgf_name], derived)}): altered after "
                    "compilation, or converted by another converter version; recompile the program")
        if _as_json(payload.meta.get(io_key)) != _as_json(_io_meta(model)):
            return f"its metadata {io_key!r} is not the IO its {vgf_name} declares (altered after compilation)"
        if io_key == "io":
            facts = {"vgf_version": ".".join(map(str, model.version)), "segments": list(model.segments),
                     "constants": model.constants}
            wrong = sorted(k for k, v in facts.items() if _as_json(payload.meta.get(k)) != _as_json(v))
            if wrong:
                return f"its metadata {', '.join(wrong)} is not what its {vgf_name} holds (altered after compilation)"
    return None


class VgfBackend(TosaConsumer):
    name = "vgf"
    title = "VGF"
    execution_kinds = (SIMULATED, VULKAN)
    targets = tuple(PROFILES)
    compiler_blobs = (MODEL_VGF,)

    def __init__(self, execution: str | None = None, *, probe: bool = True) -> None:
        mode = execution or os.environ.get("QLOWER_VGF_EXECUTION", "auto")
        if mode not in MODES:
            raise ConfigError(f"VGF execution mode {mode!r}: expected one of {', '.join(MODES)}")
        self.execution, self._probe = mode, probe

    def tosa_profile(self, target: str) -> str:
        return profile_for(target)

    def supports(self, op: Op, target: str) -> Verdict:
        if any(v.type.dtype is DType.BOOL for v in (*op.input_values(), *op.results)):
            return Verdict.no("bool tensor: qlower doesn't read VGF's bool tensors (VK_FORMAT_R8_BOOL_ARM) yet")
        return self.tosa.supports(op, profile_for(target))

    def execution_for_new_payloads(self) -> Execution:
        """The execution of the payloads this backend lowers now (probes Vulkan once per process)."""
        if self.execution == "simulate":
            return simulated("VGF execution mode 'simulate' was requested")
        if not self._probe:
            return Execution(VULKAN, "not probed")
        ok, detail = vulkan_status()
        if ok:
            return Execution(VULKAN, f"ML SDK scenario runner + ML emulation layer for Vulkan on {detail}")
        if self.execution == "vulkan":
            raise CompileError(f"VGF execution mode 'vulkan' was requested, but VGF can't run on Vulkan here: {detail}")
        return simulated(detail)

    def lower(self, subgraph: Graph, target: str, trace: bool = False) -> Payload:
        """TOSA lowering (validated), then the model converter. With ``trace``, the TOSA trace graph
        (every mapped intermediate also an output) is converted too: ``trace.tosa`` / ``trace.vgf``."""
        profile = profile_for(target)
        start = time.perf_counter()
        tosa = self.tosa.lower(subgraph, profile, trace=trace)
        converted = _convert(tosa.blobs[GRAPH_TOSA], subgraph, tosa.meta, profile)
        model = read_vgf(converted.vgf)
        if len(model.inputs) != len(subgraph.inputs) or len(model.outputs) != len(subgraph.outputs):
            raise CompileError(f"the VGF of partition '{subgraph.name}' has {len(model.inputs)} inputs and "
                               f"{len(model.outputs)} outputs, the partition {len(subgraph.inputs)} and "
                               f"{len(subgraph.outputs)}")
        if any(s != "GRAPH" for s in model.segments):
            raise CompileError(f"the VGF of partition '{subgraph.name}' has segments {list(model.segments)}; qlower "
                               "runs only data-graph segments (a compute segment needs a shader supplied at run time)")
        in_types = tuple(boundary_type(t, v, "input") for t, v in zip(model.inputs, subgraph.inputs))
        out_types = tuple(boundary_type(t, v, "output") for t, v in zip(model.outputs, subgraph.outputs))
        execution, version = self.execution_for_new_payloads(), ".".join(map(str, model.version))
        meta: dict[str, Any] = {
            "profile": tosa.meta.get("profile"),
            "execution": str(execution),
            "summary": f"VGF {version}; execution: {execution}",
            "vgf_version": version,
            "model_converter": converted.version,
            "convert_seconds": round(converted.seconds, 4),
            "segments": list(model.segments),
            "constants": model.constants,
            "io": _io_meta(model),
            # float inputs only quantize ops read: ±inf saturates there as in the reference (float_inputs.py)
            SATURATING: quantized_only(subgraph),
        }
        blobs = {MODEL_VGF: converted.vgf}
        if TRACE_TOSA in tosa.blobs:
            traced = _convert(tosa.blobs[TRACE_TOSA], subgraph, tosa.meta, profile)
            trace_model = read_vgf(traced.vgf)
            names = list(tosa_tensors(tosa).outputs + tosa_tensors(tosa).trace)
            if len(trace_model.inputs) != len(subgraph.inputs) or len(trace_model.outputs) != len(names):
                raise CompileError(f"the trace VGF of partition '{subgraph.name}' has {len(trace_model.outputs)} "
                                   f"outputs, its TOSA graph {len(names)}")
            blobs[TRACE_VGF] = traced.vgf
            meta["trace_io"] = _io_meta(trace_model)
        meta["lower_seconds"] = round(time.perf_counter() - start, 4)
        return self.wrap(target, tosa, blobs, in_types, out_types, meta)

    def check_loaded(self, subgraph: Graph, payload: Payload) -> str | None:
        """The TOSA graphs as every TOSA consumer checks them, then every VGF byte derived again:
        the model converter run on the validated TOSA graph (deterministic; remembered by digest, so
        a program loaded where it was compiled, or loaded twice, converts once) must write exactly
        the payload's VGF, the IO the VGF declares must be the payload's IO metadata, and the inputs
        it lets ±inf saturate those its subgraph only quantizes."""
        return (super().check_loaded(subgraph, payload) or derived_problem(payload)
                or saturating_problem(subgraph, payload))

    @staticmethod
    def _runs_on_vulkan(payload: Payload) -> bool:
        execution = payload.execution
        return execution is not None and execution.kind == VULKAN

    def execute(self, payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """On Vulkan when the payload says so (never a silent fallback), else on the TOSA reference model."""
        if not self._runs_on_vulkan(payload):
            return super().execute(payload, inputs)
        arrays = _finite(payload, inputs)
        try:
            return _run_real(payload, arrays).outputs
        except VulkanUnavailable as e:
            raise ExecutionError(f"this VGF partition was compiled to run on Vulkan, which can't run here: {e}. "
                                 "Compile again on this machine to get a payload simulated on the TOSA "
                                 "reference model (its report then says so).") from None

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        """The requested tensors the payload exposes: inputs, outputs and, when lowered with
        ``trace``, every mapped intermediate; from ``trace.vgf`` (or ``model.vgf``) run on Vulkan,
        or for a simulated payload from the TOSA reference model. Same contract as the TOSA backend."""
        if not self._runs_on_vulkan(payload):
            return super().execute_traced(payload, inputs, tensors)
        names = tosa_tensors(payload)
        arrays = _finite(payload, inputs)
        outputs_named = list(names.outputs)
        try:
            if TRACE_VGF in payload.blobs:
                outputs_named += names.trace
                outputs = _run_real(payload, arrays, TRACE_VGF, "trace_io", len(outputs_named)).outputs
            else:
                outputs = _run_real(payload, arrays).outputs
        except VulkanUnavailable as e:
            raise ExecutionError(f"this VGF partition was compiled to run on Vulkan, which can't run here: {e}") from None
        by_name = dict(zip(names.inputs, arrays)) | dict(zip(outputs_named, outputs))
        return {name: by_name[name] for name in tensors if name in by_name}


