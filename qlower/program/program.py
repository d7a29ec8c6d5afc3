"""A compiled program: the host graph, its partitions and their payloads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qlower.contract import check_codes
from qlower.ir import Graph, print_graph
from qlower.ir.rewrite import AppliedRewrite
from qlower.late import late
from qlower.partition import HostDecision, Partition


@dataclass
class Program:
    """What ``qlower.compile`` returns.

    ``graph`` is the host graph (``delegate`` ops call ``partitions``);
    ``source`` is the target's form of the optimised IR before partitioning (what the target
    computes exactly, and the map for per-layer comparison); ``canonical`` is the optimised IR
    before the backend's rewrites (what the ``reference`` target computes: DESIGN.md rule 10).
    ``rewrites`` lists the rewrites between the two, each with its declared bound. A program
    file keeps ``source`` and ``rewrites``, not ``canonical`` (None when loaded: verification
    compiles it again from the model, see ``qlower.verification``).
    """

    target: str
    graph: Graph
    source: Graph
    partitions: list[Partition] = field(default_factory=list)
    decisions: list[HostDecision] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    frontend: Any = field(default=None, repr=False)  # the FrontendResult, when compiled in this process
    _runner: Any = field(default=None, repr=False)
    canonical: Graph | None = field(default=None, repr=False)

    @property
    def rewrites(self) -> list[AppliedRewrite]:
        """The backend rewrites that made ``source`` from the canonical program, in order."""
        return [AppliedRewrite.from_meta(d) for d in self.meta.get("rewrites", [])]

    @property
    def canonical_graph(self) -> Graph | None:
        """The canonical program: ``canonical``, or ``source`` when no rewrite changed it; None when
        unknown (a loaded program whose form was rewritten)."""
        if self.canonical is not None:
            return self.canonical
        return None if self.meta.get("rewrites") else self.source

    # -- running (qlower/runtime executes, a later stage: reached through qlower.late) -----
    def runner(self):
        """The executor of this program (built once): see ``qlower.runtime.runner_for``."""
        if self._runner is None:
            self._runner = late("runner_for")(self.target, self.graph, self.partitions,
                                              threads=self.meta.get("threads"))
        return self._runner

    def run(self, *inputs: Any) -> list[np.ndarray]:
        """Run on NumPy arrays or torch tensors (PyTorch layout, like the model); returns NumPy arrays.
        Integer inputs must hold codes in their type's [qmin, qmax] (an InputError naming the input,
        the code and its index otherwise, on every target)."""
        as_numpy = late("as_numpy")
        arrays = [as_numpy(x, f"input {i}") for i, x in enumerate(inputs)]
        self.check_codes(arrays)
        return self.runner().run(arrays)

    def check_codes(self, arrays: list[np.ndarray]) -> None:
        """An InputError unless every integer array of ``arrays`` holds codes in its graph input's
        [qmin, qmax], the range the program was verified for (``qlower.contract.check_codes``): the one
        check ``run`` and verification apply to the user's inputs, on every target."""
        for i, (v, x) in enumerate(zip(self.graph.inputs, arrays)):
            check_codes(x, v.type, f"input {i} (%{v.name})")

    # -- inspecting ---------------------------------------------------------------
    @property
    def input_types(self):
        return tuple(v.type for v in self.graph.inputs)

    @property
    def output_types(self):
        return tuple(v.type for v in self.graph.outputs)

    def artifacts(self) -> dict[str, bytes]:
        """Every partition's emitted files, named ``<partition>/<file>``."""
        return {f"{p.name}/{name}": blob for p in self.partitions for name, blob in p.payload.blobs.items()}

    def explain(self) -> str:
        """Where each op runs, and why each host op was not delegated (with the model's source line)."""
        lines = [f"target {self.target}: {len(self.partitions)} partition(s), "
                 f"{sum(1 for op in self.graph.ops if op.kind not in ('constant', 'delegate'))} host op(s)"]
        if self.meta.get("auto_int16"):
            lines.append(f"  int16 activations (auto_int16, the most int8-sensitive layers): "
                         f"{', '.join(map(str, self.meta['auto_int16']))}")
        memory = self.device_memory()
        if len(memory) > 1:
            total: dict[str, int] = {}
            for _, kinds_bytes in memory.values():
                for k, n in kinds_bytes.items():
                    total[k] = total.get(k, 0) + n
            lines.append(f"  device memory, all partitions: {_bytes_text(total)}")
        for p in self.partitions:
            kinds: dict[str, int] = {}
            for op in p.subgraph.ops:
                if op.kind != "constant":
                    kinds[op.kind] = kinds.get(op.kind, 0) + 1
            ins = ", ".join(str(t) for t in p.input_types)
            outs = ", ".join(str(t) for t in p.output_types)
            lines.append(f"  {p.name} on {p.backend} ({p.target}): "
                         + ", ".join(f"{k}×{n}" for k, n in sorted(kinds.items())))
            lines.append(f"      reads  {ins}")
            lines.append(f"      writes {outs}")
            if p.payload.meta.get("summary"):  # the backend's one line about its payload, and its details
                lines.append(f"      {p.payload.meta['summary']}")
            lines.extend(f"      {line}" for line in p.payload.meta.get("details", []) if isinstance(line, str))
            if memory.get(p.name):
                lines.append(f"      device memory ({memory[p.name][0]}): {_bytes_text(memory[p.name][1])}")
        rewrites = self.rewrites
        if rewrites:
            lines.append("rewrites of the canonical program (the reference target's), in order, each bounded "
                         "against the graph it received:")
            for r in rewrites:
                shown = ", ".join(f"%{v}" for v in r.values[:6]) + (f", … ({len(r.values)})" if len(r.values) > 6 else "")
                lines.append(f"  {r.name}: {r.bound}{f' ({shown})' if shown else ''}: {r.what}")
        if self.meta.get("float_reasons"):
            lines.append("in float because their integer rule could not take them:")
            lines.extend(f"  {reason}" for reason in self.meta["float_reasons"])
        if self.decisions:
            lines.append("host ops (not delegated):")
            for d in self.decisions:
                r = d.op.results[0]
                where = r.origin.describe() if r.origin else "<no source>"
                lines.append(f"  %{r.name} = {d.op.kind}  at {where}: {d.reason}")
        return "\n".join(lines)

    def device_memory(self) -> dict[str, tuple[str, dict[str, int]]]:
        """Per partition whose backend states it: who says so, and bytes of each memory kind the device
        must hold (``qlower.contract.DEVICE_MEMORY``: arena, flash, sram)."""
        from qlower.backends.registry import cost_report

        out = {}
        for p in self.partitions:
            cost = cost_report(p.payload)
            if cost is not None and cost.device_memory:
                out[p.name] = (cost.estimator, cost.device_memory)
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "inputs": [str(t) for t in self.input_types],
            "outputs": [str(t) for t in self.output_types],
            "partitions": [{"name": p.name, "backend": p.backend, "ops": len(p.subgraph.ops),
                            "inputs": [str(t) for t in p.input_types],
                            "outputs": [str(t) for t in p.output_types],
                            "bytes": sum(len(b) for b in p.payload.blobs.values()),
                            **p.payload.meta} for p in self.partitions],
            "host_ops": self.graph.count_ops(),
            **{k: v for k, v in self.meta.items() if k != "threads"},
        }

    def __str__(self) -> str:
        return print_graph(self.graph)

    # -- saving -------------------------------------------------------------------
    EXPORT_FORMATS = ("tflite",)   # the formats every program exports to; ``export_formats()``: this one's

    def export_formats(self) -> list[str]:
        """The formats ``export`` writes this program in: its backend's own and every program's."""
        from qlower.backends.registry import export_formats

        return export_formats(self.target)

    def export_note(self, format: str = "tflite") -> str:
        """One line about the file ``export(path, format)`` writes: what runs it, and whether it
        computes this program's numbers exactly (its backend says, ``Backend.export_note``)."""
        from qlower.backends.registry import export_note

        return export_note(self.target, format, self.source)

    def export(self, path: str | os.PathLike, format: str = "tflite") -> str:
        """Write the whole program (host ops, every partition's ops, float fallbacks) as one deployable
        model file; returns its path. The target's backend declares the formats and how it writes
        them (``Backend.exporters``); ``"tflite"`` (every program) is a TFLite schema-3 flatbuffer
        computing the program's numbers under the kernels whose rounding it has. UnsupportedOpError
        names an op the format can't hold, with its source line."""
        from qlower.backends.registry import exporter_for
        from qlower.contract import HostGraphExporter
        from qlower.program.fileformat import write_atomically

        exporter, text = exporter_for(self.target, format), f"qlower program for {self.target}"
        if isinstance(exporter, HostGraphExporter):   # writes the partitions as they are
            data = exporter.write(self.graph, {p.name: p.payload for p in self.partitions}, text)
        else:
            data = exporter(self.source, [p.payload for p in self.partitions], text)
        write_atomically(path, data)
        return os.fspath(path)

    def save(self, path: str | os.PathLike) -> None:
        """Write the program to one file (``qlower.load`` reads it back); see qlower/program/fileformat.py."""
        from qlower.program.fileformat import save_program

        save_program(self, path)


def _bytes_text(kinds: dict[str, int]) -> str:
    return ", ".join(f"{k} {n:,} B" for k, n in kinds.items())
