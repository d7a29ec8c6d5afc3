"""The ``litert`` target: the supported graph becomes one .tflite, run by the stock LiteRT interpreter.

``kernels`` picks LiteRT's kernel family: ``"reference"`` (BUILTIN_REF, the default),
``"builtin"`` (the optimized builtin kernels, BUILTIN_WITHOUT_DEFAULT_DELEGATES) or
``"xnnpack"`` (the default delegates). Before partitioning, its ``rewrites`` give residual
adds the form of the ADD that runs them (TFLite's, fused_add.py, or XNNPACK's, xnnpack_add.py),
global means XNNPACK's MEAN for ``xnnpack`` (xnnpack_mean.py), and every rescale that fuses into a TFLite GEMM the rounding those kernels use (rounding.py;
XNNPACK's float32 requantization for ``xnnpack``), each within a step per rescale of the graph
it receives, so the program's form is what LiteRT computes: every family is bit-exact with it,
and within those bounds of the canonical program. XNNPACK payloads take XNNPACK's own forms of
quantize, dequantize, padding, ADD and MEAN (``export.py``, ``native``, exact as well), so the delegate runs
them as one subgraph; benchmarks/latency.py and litert_exactness.py measure both.

Interpreters are built once per model (the flatbuffer is verified first, see
verify.py) and kept in a small bounded cache keyed by the model's SHA-256 and the
interpreter's settings (never by ``hash()``, where two models can collide); a LiteRT
interpreter is not safe to invoke from two threads, so each has its own lock.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
import typing
from collections.abc import Sequence
from typing import Literal

import numpy as np

from qlower.backends.cpu import native
from qlower.backends.litert import rounding, xnnpack_isa
from qlower.backends.litert.export import GEMMS, export_tflite, fused_pairs, unsupported_reason
from qlower.backends.litert.fused_add import TfliteAdd, add_groups
from qlower.backends.litert.verify import builtin_counts, loaded_payload_problem, model_description, verify_tflite
from qlower.backends.litert.xnnpack_add import XnnpackAdd, xnnpack_add_groups
from qlower.backends.litert.xnnpack_mean import XnnpackMean
from qlower.backends.threads import available_cores, check_threads
from qlower.contract import Backend, Exporter, Payload, Verdict, boundary_types_problem, check_payload_inputs
from qlower.errors import ConfigError, ExecutionError, InputError
from qlower.ir import Graph, Op
from qlower.ir.rewrite import Rewrite

MODEL_BLOB = "model.tflite"
Kernels = Literal["reference", "builtin", "xnnpack"]
KERNELS: tuple[str, ...] = typing.get_args(Kernels)
NATIVE_FORMS = ("xnnpack",)   # the export takes the delegate's own forms, so it runs as one subgraph (export.py)
_EXACTNESS = {
    "reference": "bit-exact with the reference interpreter (LiteRT reference kernels, BUILTIN_REF)",
    "builtin": "bit-exact with the reference interpreter (LiteRT optimized builtin kernels)",
    "xnnpack": ("bit-exact with the reference interpreter (LiteRT's XNNPACK delegate: its float32 "
                "requantization, its ADD and its MEAN are the program's form)"),
}
_CACHE_SIZE = 16


def export_program(source: Graph, payloads: Sequence[Payload], description: str) -> bytes:
    """The program as one .tflite (the ``tflite`` export of every target without its own): a program
    compiled for XNNPACK writes the forms its LiteRT partition runs."""
    native = any(p.backend == LiteRtBackend.name and p.meta.get("forms") == "native" for p in payloads)
    return export_tflite(source, description=description, native=native)


class LiteRtBackend(Backend):
    name = "litert"
    targets = ("litert",)
    # XNNPACK payloads written before its arithmetic was modelled say they are approximate; they still load
    execution_kinds = ("approximate",)

    @classmethod
    def exporters(cls, target: str) -> dict[str, Exporter]:
        return {"tflite": export_program}

    @classmethod
    def export_note(cls, target: str, format: str, source: Graph) -> str:
        exact = rounding.exact_kernels(source)
        return ("TFLite, for LiteRT: " + (f"bit-exact with the reference interpreter under LiteRT's {' and '.join(exact)} "
                                          "kernels" if exact else
                                          "its requantization rounds as no LiteRT kernels are guaranteed to: compile "
                                          "with --target litert (--option kernels=...) for a file LiteRT reproduces "
                                          "exactly"))

    def __init__(self, kernels: Kernels = "reference", threads: int | None = None):
        if kernels not in KERNELS:
            raise ConfigError(f"litert option kernels={kernels!r} is not one of {', '.join(KERNELS)}")
        self.kernels = kernels
        self.threads = check_threads(threads, "litert option threads")
        self._fused: set[int] = set()
        self._refused: set[int] = set()

    def rewrites(self, target: str) -> tuple[Rewrite, ...]:
        """Residual adds in the form of the ADD that runs them (XNNPACK's where the delegate takes it,
        else TFLite's), fused requantization with the kernels' rounding."""
        forms = (XnnpackAdd(), TfliteAdd(), XnnpackMean()) if self.kernels == "xnnpack" else (TfliteAdd(),)
        return (*forms, rounding.KernelRounding(self.kernels))

    def prepare(self, graph: Graph) -> None:
        """Note the ops that fuse into one TFLite kernel: only as a whole do they have a TFLite form."""
        pairs = fused_pairs(graph).values()
        self._refused = {id(gemm) for op, gemm in pairs if self.kernels == "xnnpack" and rounding.xnnpack_refuses(op)}
        self._fused = {id(op) for pair in pairs for op in pair if id(pair[1]) not in self._refused}
        groups = add_groups(graph) | (xnnpack_add_groups(graph) if self.kernels == "xnnpack" else {})
        self._fused |= {id(op) for g in groups.values() for op in (g.out, *g.members)}

    def supports(self, op: Op, target: str) -> Verdict:
        if id(op) in self._fused:
            return Verdict.yes()
        if id(op) in self._refused:
            return Verdict.no("XNNPACK refuses its requantization scale (256 or more), and then the whole model")
        if op.kind in GEMMS:
            return Verdict.no(unsupported_reason(op) or "its int32 accumulator feeds no single rescale to int8 "
                              "(TFLite's GEMMs requantize inside the kernel)")
        reason = unsupported_reason(op)
        return Verdict.yes() if reason is None else Verdict.no(reason)

    def lower(self, subgraph: Graph, target: str, trace: bool = False) -> Payload:
        native = self.kernels in NATIVE_FORMS
        model = export_tflite(subgraph, description=model_description(subgraph, self.kernels), native=native)
        names = {v.name for op in subgraph.ops for v in op.results if op.kind != "constant"}
        names |= {v.name for v in subgraph.inputs}
        return Payload(
            backend=self.name, target=target, blobs={MODEL_BLOB: model},
            input_types=tuple(v.type for v in subgraph.inputs),
            output_types=tuple(v.type for v in subgraph.outputs),
            tensor_map={n: n for n in sorted(names)} if trace else {},
            meta={"kernels": self.kernels, "threads": self.threads, "exactness": _EXACTNESS[self.kernels],
                  "forms": "native" if native else "exact",
                  "tflite_ops": builtin_counts(model), "tflite_bytes": len(model),
                  "exact_kernels": rounding.exact_kernels(subgraph),
                  **({"xnnpack_amx": xnnpack_isa.prefers_amx(subgraph)} if self.kernels == "xnnpack" else {})},
        )

    def check_meta(self, payload: Payload) -> str | None:
        """The interpreter's thread count is read from the payload: the bound every run applies."""
        problem = super().check_meta(payload)
        if problem is None:
            try:
                check_threads(payload.meta.get("threads"), "litert payload meta threads")
            except ConfigError as e:
                problem = str(e)
        if problem is None and not isinstance(payload.meta.get("xnnpack_amx", True), bool):
            problem = f"litert payload meta xnnpack_amx must be true or false, got {payload.meta['xnnpack_amx']!r}"
        return problem

    def check_loaded(self, subgraph: Graph, payload: Payload) -> str | None:
        return loaded_payload_problem(subgraph, payload) or boundary_types_problem(subgraph, payload)

    def execute(self, payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return _run(payload, inputs, ())[0]

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        outputs, traced = _run(payload, inputs, tuple(tensors))
        return traced


def with_threads(program, threads: int | None):
    """``program`` (a ``qlower.Program``) with its LiteRT partitions run by ``threads`` interpreter threads:
    the same payloads, only their ``threads`` setting changed (what the interpreter cache keys on), so one
    lowering runs at several thread counts."""
    check_threads(threads, "litert threads")
    parts = [dataclasses.replace(p, payload=dataclasses.replace(p.payload, meta={**p.payload.meta, "threads": threads}))
             if p.backend == LiteRtBackend.name else p for p in program.partitions]
    return dataclasses.replace(program, partitions=parts, _runner=None)


class _Interpreter:
    """One LiteRT interpreter of a payload, with the lock that serialises its invocations."""

    def __init__(self, model: bytes, kernels: str, threads: int | None, keep_all: bool):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        resolver = {"reference": OpResolverType.BUILTIN_REF,
                    "builtin": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
                    "xnnpack": OpResolverType.AUTO}[kernels]
        try:
            # no count given: every core this process may use, as the cpu backend (LiteRT alone uses one)
            self.it = Interpreter(model_content=model, experimental_op_resolver_type=resolver,
                                  num_threads=threads or available_cores(), experimental_preserve_all_tensors=keep_all)
            self.it.allocate_tensors()
        except (RuntimeError, ValueError) as e:
            raise ExecutionError(f"LiteRT refused the partition's model: {e}") from e
        self.inputs = self.it.get_input_details()
        self.outputs = self.it.get_output_details()
        self.by_name = {d["name"]: d["index"] for d in self.it.get_tensor_details()} if keep_all else {}
        self.lock = threading.Lock()


_interpreters: collections.OrderedDict[tuple, _Interpreter] = collections.OrderedDict()
# id(model bytes) -> (those bytes, their SHA-256): a payload runs many times, its model is hashed once;
# holding the bytes keeps their id from being reused while the entry lives
_digests: collections.OrderedDict[int, tuple[bytes, bytes]] = collections.OrderedDict()
_interpreters_lock = threading.Lock()


def _lru_put(cache: collections.OrderedDict, key, value) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)


def _digest(model: bytes) -> bytes:
    with _interpreters_lock:
        hit = _digests.get(id(model))
        if hit is not None and hit[0] is model:
            _digests.move_to_end(id(model))
            return hit[1]
    digest = hashlib.sha256(model).digest()
    with _interpreters_lock:
        _lru_put(_digests, id(model), (model, digest))
    return digest


def _interpreter(payload: Payload, keep_all: bool) -> _Interpreter:
    model = payload.blobs.get(MODEL_BLOB)
    if model is None:
        raise ExecutionError(f"the litert payload has no {MODEL_BLOB}")
    kernels = payload.meta.get("kernels", "reference")
    if kernels not in KERNELS:
        raise ExecutionError(f"the litert payload names unknown kernels {kernels!r}")
    key = (_digest(model), kernels, payload.meta.get("threads"), keep_all)
    with _interpreters_lock:
        found = _interpreters.get(key)
        if found is not None:
            _interpreters.move_to_end(key)
            return found
    verify_tflite(model)   # never hand LiteRT bytes its own parser would have to survive

    def build() -> _Interpreter:
        return _Interpreter(model, kernels, payload.meta.get("threads"), keep_all)
    # XNNPACK picks AMX or VNNI kernels once per process, when it starts: the program's cost model decides
    made = xnnpack_isa.start(build, payload.meta.get("xnnpack_amx", True)) if kernels == "xnnpack" else build()
    with _interpreters_lock:
        _lru_put(_interpreters, key, made)
    return made


def _fill(buffer: np.ndarray, x: np.ndarray) -> bool:
    """Copy ``x`` into ``buffer``; False when float ``x`` holds NaN or infinity. Float32 copies and checks in one
    pass of the native kernels where they are built (a second read of the input is ~1.5% of a MobileNetV2
    run); else the copy, then min and max of the copy (NaN and infinity carry into them)."""
    if x.dtype == np.float32 and x.flags.c_contiguous and buffer.flags.c_contiguous:
        kernels = native.load()
        if kernels is not None:
            return kernels.copy_finite(buffer, x)
    buffer[...] = x
    return x.dtype.kind != "f" or not x.size or bool(np.isfinite(buffer.min()) & np.isfinite(buffer.max()))


def _run(payload: Payload, inputs: Sequence[np.ndarray], traced: tuple[str, ...]
         ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    arrays = check_payload_inputs(payload, inputs, "the LiteRT partition")
    it = _interpreter(payload, keep_all=bool(traced))
    if len(it.inputs) != len(arrays) or len(it.outputs) != len(payload.output_types):
        raise ExecutionError(f"the partition's model has {len(it.inputs)} inputs and {len(it.outputs)} outputs, "
                             f"its payload declares {len(arrays)} and {len(payload.output_types)}")
    with it.lock:
        for i, (d, x) in enumerate(zip(it.inputs, arrays)):
            if tuple(d["shape"]) != x.shape or np.dtype(d["dtype"]) != x.dtype:
                raise ExecutionError(f"the model's input {d['name']} is {d['dtype'].__name__}{list(d['shape'])}, "
                                     f"the payload declares {x.dtype}{list(x.shape)}")
            # one copy into the interpreter's own buffer (set_tensor copies a read-only array once more first)
            buffer = it.it.tensor(d["index"])()
            finite = _fill(buffer, x)
            del buffer   # no view of LiteRT's buffers outlives this step
            if not finite:
                raise InputError(f"input {i} of the LiteRT partition holds NaN or infinity")
        try:
            it.it.invoke()
        except RuntimeError as e:
            raise ExecutionError(f"LiteRT failed running the partition: {e}") from e
        outs = [it.it.get_tensor(d["index"]) for d in it.outputs]   # a copy each (LiteRT documents it)
        seen = {name: np.array(it.it.get_tensor(it.by_name[name])) for name in traced if name in it.by_name}
    for i, (y, t) in enumerate(zip(outs, payload.output_types)):
        if y.dtype != t.dtype.numpy or tuple(y.shape) != t.shape:
            raise ExecutionError(f"output {i} of the LiteRT partition came back as {y.dtype}{list(y.shape)}, "
                                 f"the payload declares {t}")
    return outs, seen
