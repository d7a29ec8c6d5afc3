"""The Ethos-U backend: TOSA-1.0+INT partitions compiled by Vela for one accelerator.

``lower`` = the TOSA backend's lowering (profile TOSA-1.0+INT), then Vela. The
payload's boundary types are built from what Vela reports it reads and writes
(DESIGN.md rule 6): the element size of each IO tensor together with the TOSA
tensor's dtype; when that disagrees with the subgraph's type, lowering fails
with a CompileError instead of letting bytes be reinterpreted.

No Ethos-U simulator is installable here, so ``execute`` runs the same TOSA
partition (``blobs["graph.tosa"]``) on the TOSA reference model (``TosaConsumer``);
the payload's ``execution`` says so. The NPU numbers in ``meta["perf"]`` are
Vela's estimates, not measurements.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from qlower.backends.ethosu.channels import ChannelWidening, cheaper_widths, narrowed_tensors, unpad_traced, widen
from qlower.backends.ethosu.cost import cost_problem, vela_cost
from qlower.backends.ethosu.derive import derived_compile
from qlower.backends.ethosu.means import MeanForms, PoolLimit, pool_is_cheaper
from qlower.backends.ethosu.support import GraphFacts, ethosu_verdict
from qlower.backends.ethosu.tables import InterpolatedTables, cheaper
from qlower.backends.ethosu.vela import (
    ACCELERATORS,
    DEFAULT_SYSTEM,
    IOTensor,
    VelaConfig,
    VelaDroppedIO,
    VelaResult,
    compile_cached,
    total_cycles,
    vela_config,
)
from qlower.backends.options import check_arguments
from qlower.backends.tosa.backend import GRAPH_BLOB, TosaBackend
from qlower.backends.tosa.consumer import TosaConsumer, simulated
from qlower.contract import CostReport, HostGraphExporter, Payload, Verdict
from qlower.errors import CompileError, QlowerError
from qlower.ir import DType, Graph, GraphBuilder, Op, TensorType, Value, rebuild
from qlower.ir.rewrite import Rewrite, Rewritten, apply_rewrite

TOSA_PROFILE = "tosa-1.0+int"
EXECUTION = str(simulated())
# TOSA dtype name -> (IR dtype, bytes per element)
_TOSA_DTYPES: dict[str, tuple[DType, int]] = {
    "BOOL": (DType.BOOL, 1), "INT8": (DType.INT8, 1), "INT16": (DType.INT16, 2), "INT32": (DType.INT32, 4),
}


def boundary_type(io: IOTensor, value: Value, direction: str) -> TensorType:
    """The type of ``value`` as Vela reads/writes it; CompileError when it isn't the subgraph's type."""
    where = f"partition {direction} %{value.name} (Vela tensor {io.name})"
    if io.dtype not in _TOSA_DTYPES:
        raise CompileError(f"{where}: Vela moves {io.dtype} tensors, which qlower has no type for")
    dtype, size = _TOSA_DTYPES[io.dtype]
    if io.element_size != size:
        raise CompileError(f"{where}: Vela uses {io.element_size} byte(s) per element for a {io.dtype} tensor, "
                           f"expected {size}; refusing to reinterpret the buffer")
    if dtype is not value.dtype or io.shape != value.shape:
        raise CompileError(f"{where}: Vela {'reads' if direction == 'input' else 'writes'} "
                           f"{dtype.value}{list(io.shape)} ({io.element_size} byte(s) per element), the subgraph "
                           f"value is {value.type}; refusing to reinterpret the buffer")
    if io.size < value.type.numel * size:
        raise CompileError(f"{where}: Vela's buffer holds {io.size} bytes, the value needs {value.type.nbytes}")
    return TensorType(io.shape, dtype, value.quant)


# ops that only move data: Vela may compile their TOSA form (RESHAPE, strided SLICE as RESHAPEs, ...)
# to no command at all, its result a view of another buffer
MOVEMENT_KINDS = frozenset({"reshape", "slice", "transpose", "concat", "pad"})


def aliased_outputs(graph: Graph, every: bool = False) -> set[Value]:
    """Outputs Vela may not give a buffer of their own, so that they vanish from the command
    stream's outputs (measured with Vela 5.2):

    - an output that is only a reshape (or chain of reshapes) of an input or of an earlier
      output: Vela compiles the reshape to no data movement, sharing the other's buffer;
    - an output made by a data-movement op that is also read inside the partition: Vela folds
      the movement into the reader (e.g. a strided slice, lowered to SLICE + RESHAPE, feeding a
      TRANSPOSE) and the output tensor disappears.

    With ``every``, all outputs that a copy can materialize. Only quantized per-tensor values
    count (an exact RESCALE copies them). ``EthosUBackend.lower`` checks Vela's result for
    outputs these rules miss (dropped, or sharing bytes) and then copies every output."""
    producer = graph.producers()
    read_inside = {v for op in graph.ops for v in op.input_values()}

    def root(v: Value) -> Value:
        while v in producer and producer[v].kind == "reshape":
            v = producer[v].operands[0]
        return v

    claimed = set(graph.inputs)
    aliased = set()
    for v in graph.outputs:
        r = root(v)
        movement = v in producer and producer[v].kind in MOVEMENT_KINDS and v in read_inside
        if (every or r in claimed or movement) and v.type.quant is not None and not v.type.quant.is_per_channel:
            aliased.add(v)  # (only quantized tensors can be copied by RESCALE)
        claimed.add(r)
    return aliased


RESCALE_COPY_BOUND = 2**29   # TOSA's apply_scale_32 with shift 30 requires |value| < 2^29


def materialize_aliased_outputs(graph: Graph, every: bool = False) -> Graph:
    """Give every aliased output (see ``aliased_outputs``) its own buffer: an exact identity
    RESCALE (same scale and zero point, multiplier 2^30 >> 30), which the NPU runs as a copy;
    int32 values beyond that RESCALE's input range (plain integers) get a clamp to their own range."""
    aliased = aliased_outputs(graph, every)
    if not aliased:
        return graph

    def copy(b: GraphBuilder, old: Value, new: Value) -> Value:
        if old not in aliased:
            return new
        q = new.type.quant
        if q.qmin < -RESCALE_COPY_BOUND or q.qmax >= RESCALE_COPY_BOUND:
            return b.op("clamp", new, min=q.qmin, max=q.qmax, name=f"{old.name}_copy")
        return b.op("rescale", new, out=q, name=f"{old.name}_copy")

    return rebuild(graph, lambda b, op, operands: None, finish=copy)


class OutputCopies(Rewrite):
    """The rewrite giving aliased outputs a buffer of their own (``materialize_aliased_outputs``):
    identity copies, so every original value keeps its codes."""

    name = "ethosu.output_copies"
    steps = 0
    what = "outputs Vela would alias get an identity RESCALE of their own"

    def __init__(self, every: bool = False):
        self.every = every

    def apply(self, graph: Graph) -> Rewritten:
        return Rewritten(materialize_aliased_outputs(graph, self.every))


def shared_output_buffers(outputs: Sequence[IOTensor]) -> list[tuple[int, int]]:
    """Pairs ``(i, j)``, ``i < j``, of outputs whose bytes overlap in Vela's memory map. Every
    output is live when the command stream ends, so an overlap means Vela made one output a
    view of another (a movement it compiled to nothing) instead of a buffer of its own."""
    return [(i, j) for i, a in enumerate(outputs) for j, b in enumerate(outputs)
            if i < j and a.region == b.region and a.offset < b.offset + b.size and b.offset < a.offset + a.size]


def layer_sources(rows: list[dict[str, Any]], tensor_map: dict[str, str], graph: Graph) -> list[dict[str, Any]]:
    """Vela's per-operator rows, each with the IR value its output tensor holds and the model's
    source line of that value (empty when Vela's tensor is one of its own)."""
    values = {v.name: v for op in graph.ops for v in op.results}
    out = []
    for r in rows:
        v = values.get(tensor_map.get(r["tensor"], ""))
        out.append({**r, "value": v.name if v is not None else "",
                    "source": v.origin.describe() if v is not None and v.origin is not None else ""})
    return out


def top_layers(rows: list[dict[str, Any]], total: int, count: int = 5) -> list[str]:
    """Lines naming the ``count`` operators that cost the most cycles, with their source lines."""
    top = sorted(rows, key=lambda r: -r["op_cycles"])[:count]
    lines = [f"top {len(top)} of {len(rows)} operators by cycles:"] if top else []
    for r in top:
        share = f"{100 * r['op_cycles'] / total:.1f}% of total, " if total else ""
        where = f"%{r['value']} at {r['source'] or '<no source>'}" if r["value"] else f"Vela tensor {r['tensor']}"
        lines.append(f"  {r['op_cycles']:>10,} cycles ({share}{r['npu_cycles']:,} NPU)  {r['operator']}  {where}")
    return lines


def vela_description(result: VelaResult, config: VelaConfig, widths: dict[str, int], narrowed: dict[str, int],
                     tensor_map: dict[str, str], graph: Graph) -> dict[str, Any]:
    """What a payload says in words about Vela's compile: its summary, where it runs, and its
    per-operator rows with their source lines. A function of facts only (Vela's result for the
    validated TOSA graph, the configuration, the widening, the lowered graph), so ``check_loaded``
    writes it again rather than trusting a file's copy of an estimate."""
    # the total is what the device spends: NPU work plus the time it waits on memory
    total, npu = result.perf["total_cycles"], result.perf["npu_cycles"]
    family = "-".join(config.accelerator.split("-")[:2])
    chosen = (f"Vela's own defaults for {family}"
              if (config.system_config, config.memory_mode) == DEFAULT_SYSTEM[family] else "as chosen")
    summary = (f"Vela ({config.system_config} / {config.memory_mode}, {chosen}): {total:,} total cycles "
               f"({npu:,} NPU, {max(total - npu, 0):,} waiting on memory), "
               f"{1e3 * result.perf['inference_seconds']:.2f} ms at {config.core_clock / 1e6:g} MHz "
               f"(estimates); runs here {EXECUTION}")
    if widths:
        runs_text = ", ".join(f"%{name} {narrowed[name]}→{w}" for name, w in sorted(widths.items()))
        summary += f"; channels widened with zeros where Vela costs them lower: {runs_text}"
    described: dict[str, Any] = {"summary": summary, "execution": EXECUTION}
    if result.per_layer is not None:
        described["per_layer"] = layer_sources(result.per_layer, tensor_map, graph)
        described["details"] = top_layers(described["per_layer"], total)
    return described


def _lower_unvalidated(graph: Graph, divider_free: bool = True) -> tuple[bytes, list[str]]:
    """TOSA bytes (and operator names) of a one-op graph for a verdict. tosa-opt validation
    (a subprocess, ~0.1 s) is skipped: Vela validates its TOSA input itself."""
    from qlower.backends.tosa.lowering import emit_tosa
    from qlower.backends.tosa.support import profile_for

    writer = emit_tosa(graph, profile_for(TOSA_PROFILE), divide_by_multiply=divider_free,
                       byte_tables=divider_free).writer
    return writer.serialize(), sorted(writer.op_counts())


def graph_cycles(graph: Graph, config: VelaConfig) -> int | None:
    """Vela's total cycle estimate of ``graph`` alone, or None when it can't be lowered or compiled
    (what the cost-driven rewrites compare; remembered by the graph's TOSA, see ``total_cycles``)."""
    try:
        tosa, _ = _lower_unvalidated(graph)
    except QlowerError:
        return None
    return total_cycles(tosa, config)


class EthosUBackend(TosaConsumer):
    """Arm Ethos-U55/U65/U85 through Vela. Options: Vela's system config and memory mode
    (defaults: Vela's own per family), ``per_layer`` (default on) for Vela's per-operator
    estimate in the payload meta, each row with its IR value and the model's source line, Vela's ``optimise`` goal ("Performance" or "Size"),
    ``widen_channels`` (default on: runs of convolutions get zero channels where Vela costs them
    lower, see channels.py), ``divider_free`` (default on: an intdiv by a constant and a narrow int16
    lookup in TOSA forms without INTDIV and GATHER, which U55/U65 lack, see tosa/division.py), and
    ``trace`` to keep the TOSA backend's trace graph
    (``blobs["trace.tosa"]``) so that the simulated run can report every intermediate tensor for
    per-layer comparison."""

    name = "ethos-u"
    title = "Ethos-U"
    targets = ACCELERATORS
    compiler_blobs = ("command_stream.bin", "read_only.bin")

    @classmethod
    def cost_report(cls, payload: Payload) -> CostReport | None:
        """Vela's estimate (cost.py)."""
        return vela_cost(payload)

    @classmethod
    def exporters(cls, target: str) -> dict[str, HostGraphExporter]:
        """``tflite``: one .tflite for TFLM, NPU partitions as Vela's ``ethos-u`` custom operators
        (tflite_export.py)."""
        from qlower.backends.ethosu.tflite_export import export_ethosu_tflite

        return {"tflite": HostGraphExporter(export_ethosu_tflite)}

    @classmethod
    def export_note(cls, target: str, format: str, source: Graph) -> str:
        return ("TFLite, for TFLite Micro with its Ethos-U kernel: host ops are TFLM builtins (bit-exact under "
                "TFLM's reference kernels), NPU partitions Vela's ethos-u custom operators, which need the "
                "device or Arm's FVP to run (a Dedicated_Sram system's fast memory is the driver's)")

    def check_meta(self, payload: Payload) -> str | None:
        return super().check_meta(payload) or cost_problem(payload)

    def __init__(self, system_config: str | None = None, memory_mode: str | None = None,
                 per_layer: bool = True, optimise: Literal["Performance", "Size"] = "Performance", trace: bool = False,
                 widen_channels: bool = True, divider_free: bool = True) -> None:
        check_arguments("ethos-u", type(self), system_config=system_config, memory_mode=memory_mode,
                        per_layer=per_layer, optimise=optimise, trace=trace, widen_channels=widen_channels)
        self.system_config, self.memory_mode = system_config, memory_mode
        self.divider_free = divider_free
        self.per_layer, self.optimise, self.trace = per_layer, optimise, trace
        self.widen_channels = widen_channels
        self.facts = GraphFacts()

    def tosa_profile(self, target: str) -> str:
        return TOSA_PROFILE

    @functools.cached_property
    def tosa(self) -> TosaBackend:
        """The TOSA lowering Vela reads: an ``intdiv`` by a constant as multiplies and shifts
        (Vela runs no INTDIV on U55/U65; tosa/division.py proves the form exact) and a narrow
        int16 lookup (softmax's exponentials) as int8 TABLEs, Vela's LUTs (no GATHER on U55)."""
        return TosaBackend(divide_by_multiply=self.divider_free, byte_tables=self.divider_free)

    def rewrites(self, target: str) -> tuple[Rewrite, ...]:
        """Each mean over H and W Vela can take only as a sum, then each mean and each int16 lookup, in
        the form Vela runs fastest on this accelerator (means.py, tables.py), each within a step per
        rewritten op of the graph it receives."""
        config = self.config(target)
        return (PoolLimit(), MeanForms(lambda m: not pool_is_cheaper(m, config)),
                InterpolatedTables(lambda op, form: cheaper(op, form, config)))

    def config(self, target: str) -> VelaConfig:
        return vela_config(target, self.system_config, self.memory_mode)

    def prepare(self, graph: Graph) -> None:
        """Remember the graph about to be partitioned (its inputs, outputs and constants),
        so that ``supports`` can keep boundary transposes on the host and check ops
        with their real constant data."""
        self.facts = GraphFacts.of(graph)

    def supports(self, op: Op, target: str) -> Verdict:
        return ethosu_verdict(op, self.config(target), self.facts,
                              lambda o: self.tosa.supports(o, TOSA_PROFILE),
                              lambda g: _lower_unvalidated(g, self.divider_free), variant=self.divider_free)

    def lower(self, subgraph: Graph, target: str, trace: bool = False) -> Payload:
        """TOSA-1.0+INT lowering, then Vela; with ``trace`` (or the ``trace`` option) the payload
        also carries the TOSA trace graph for ``execute_traced``."""
        config = self.config(target)
        if not subgraph.outputs:
            raise CompileError(f"partition '{subgraph.name}' has no outputs: Vela has nothing to compile "
                               "(dead code; run dead-code elimination before partitioning)")
        trace = trace or self.trace
        widths = cheaper_widths(subgraph, lambda g: graph_cycles(g, config)) if self.widen_channels else {}
        narrowed = narrowed_tensors(subgraph, widths)
        wide = apply_rewrite(ChannelWidening(widths), subgraph).graph
        subgraph, tosa, result = self._compile_with_own_buffers(wide, config, trace)
        if len(result.inputs) != len(subgraph.inputs) or len(result.outputs) != len(subgraph.outputs):
            raise CompileError(f"Vela's command stream has {len(result.inputs)} inputs and {len(result.outputs)} "
                               f"outputs, the partition {len(subgraph.inputs)} and {len(subgraph.outputs)}")
        in_types = tuple(boundary_type(io, v, "input") for io, v in zip(result.inputs, subgraph.inputs))
        out_types = tuple(boundary_type(io, v, "output") for io, v in zip(result.outputs, subgraph.outputs))
        for mine, theirs, what in ((in_types, tosa.input_types, "inputs"), (out_types, tosa.output_types, "outputs")):
            if tuple(mine) != tuple(theirs):
                raise CompileError(f"the TOSA graph's {what} are {[str(t) for t in theirs]}, Vela moves "
                                   f"{[str(t) for t in mine]}")
        meta: dict[str, Any] = {
            "accelerator": config.accelerator, "system_config": config.system_config,
            "memory_mode": config.memory_mode, "macs_per_cycle": config.macs * config.cores,
            "scratch_size": result.scratch_size, "scratch_fast_size": result.scratch_fast_size,
            "command_stream_bytes": len(result.command_stream), "read_only_bytes": len(result.read_only),
            "io": ([{"kind": "input", "value": v.name, **io.as_meta()} for io, v in zip(result.inputs, subgraph.inputs)]
                   + [{"kind": "output", "value": v.name, **io.as_meta()}
                      for io, v in zip(result.outputs, subgraph.outputs)]),
            "perf": result.perf, "vela_seconds": round(result.seconds, 4),
            "widened": widths, "narrowed": narrowed, "optimise": self.optimise,
        }
        meta.update(vela_description(result, config, widths, narrowed, tosa.tensor_map, subgraph))
        return self.wrap(target, tosa, {"command_stream.bin": result.command_stream, "read_only.bin": result.read_only},
                         in_types, out_types, meta)

    def check_loaded(self, subgraph: Graph, payload: Payload) -> str | None:
        """The partition as ``lower`` compiled it: widened as its metadata says (validated), the
        TOSA graph as every TOSA consumer checks it, and Vela's files compiled again from it."""
        widths = payload.meta.get("widened", {})
        try:
            if not isinstance(widths, dict):
                raise ValueError("not a table of runs")
            wide = widen(subgraph, widths)
        except ValueError as e:
            return f"its widened channels don't fit its subgraph: {e}"
        if payload.meta.get("narrowed", {}) != narrowed_tensors(subgraph, widths):
            return "its narrowed tensors are not those of its widened channels"
        # then every byte Vela wrote derived again from the validated TOSA graph (derive.py)
        problem = super().check_loaded(wide, payload)
        if problem is not None:
            return problem
        problem, result, config = derived_compile(payload)
        if problem is None:   # and its words about that compile written again from the facts, never read
            lowered = next((g for g in (materialize_aliased_outputs(wide), materialize_aliased_outputs(wide, every=True))
                            if set(payload.tensor_map.values()) <= {v.name for op in g.ops for v in op.results}
                            | {v.name for v in g.inputs}), wide)
            payload.meta.update(vela_description(result, config, widths, payload.meta.get("narrowed", {}),
                                                 payload.tensor_map, lowered))
        return problem

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        """Traced tensors as the program has them: a widened run's zero channels cut off."""
        traced = super().execute_traced(payload, inputs, tensors)
        narrowed = payload.meta.get("narrowed", {})   # by IR value; traced tensors are named by the tensor map
        channels = {t: narrowed[v] for t, v in payload.tensor_map.items() if v in narrowed}
        return {t: unpad_traced(a, channels[t]) if t in channels else a for t, a in traced.items()}

    def _compile_with_own_buffers(self, subgraph: Graph, config: VelaConfig, trace: bool):
        """(graph compiled, TOSA payload, Vela result) with a buffer of its own for every output.

        First with the copies ``aliased_outputs`` predicts. When Vela still drops an output or lays
        two outputs over the same bytes (a pattern those rules miss), compile again with every
        output copied; if even that fails, a CompileError rather than a program whose NPU outputs
        are missing or overwritten."""
        attempts = [apply_rewrite(OutputCopies(), subgraph).graph]
        if aliased_outputs(subgraph, every=True) != aliased_outputs(subgraph):
            attempts.append(apply_rewrite(OutputCopies(every=True), subgraph).graph)
        problem = ""
        for graph in attempts:
            tosa = self.tosa.lower(graph, TOSA_PROFILE, trace=trace)
            try:
                result = compile_cached(tosa.blobs[GRAPH_BLOB], config, per_layer=self.per_layer,
                                      optimise=self.optimise)
            except VelaDroppedIO as e:
                problem = str(e)
                continue
            shared = shared_output_buffers(result.outputs)
            if not shared:
                return graph, tosa, result
            problem = "; ".join(f"outputs %{graph.outputs[i].name} and %{graph.outputs[j].name} share bytes "
                                f"{result.outputs[j].offset}.. of region {result.outputs[j].region}"
                                for i, j in shared)
        raise CompileError(f"Vela gives the outputs of partition '{subgraph.name}' no buffer of their own, even "
                           f"with every quantized output copied: {problem}")

    def check_loaded_tosa(self, subgraph: Graph, tosa: Payload) -> str | None:
        """``lower`` compiles the subgraph with its outputs copied: those Vela is known to drop, or
        every one when Vela dropped another."""
        problem = self.tosa.check_loaded(materialize_aliased_outputs(subgraph), tosa)
        if problem is None or self.tosa.check_loaded(materialize_aliased_outputs(subgraph, every=True), tosa) is None:
            return None
        return problem
