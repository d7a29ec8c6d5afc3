"""Running every stage of a compile on the same inputs and comparing them per layer.

Stages: eager fp32 → fake-quant PyTorch (the converted PT2E model) → the
reference interpreter on qlower's IR → the target's program (inside
partitions too, through each payload's tensor map). The reference the target
is compared with is the reference interpreter on the target's own form
(``program.source``: must be bit-exact); when a backend rewrote the canonical
program (``program.rewrites``), that form is compared with the canonical
program too: op by op with each op's inputs forced to the canonical codes (must
be within the rewrites' declared bounds: exact for every value no rewrite
names), and end to end per layer and per output (reported, attributed to the
rewrites upstream; a one-step difference may grow along a network, as between
the reference and fake-quant). A layer is an IR value
holding quantized codes whose origin names a PyTorch node; PyTorch's tensor
at that node is permuted into the IR's layout and quantized with the IR
value's own QuantSpec, so every comparison is in codes of one type.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from qlower.backends.registry import cost_report
from qlower.ir import Graph, Value
from qlower.program import Program
from qlower.reference import run_graph
from qlower.reference.forms import ValueSteps, declared_bounds, form_steps, upstream_rewrites
from qlower.runtime import as_numpy
from qlower.verification.isolated import isolated_codes
from qlower.verification.metrics import Comparison, compare_codes, compare_floats, to_codes
from qlower.verification.report import LayerRow, OutputRow, VerificationReport

_QUANTIZE = "quantize_per_tensor"


def capture_torch_values(module: Any, inputs: Sequence[Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every float tensor of an fx GraphModule by node name, and the integer codes of its
    ``quantize_per_tensor`` nodes by node name."""
    values: dict[str, np.ndarray] = {}
    codes: dict[str, np.ndarray] = {}
    firsts: dict[str, np.ndarray] = {}   # first part of nodes returning several tensors
    if module is None or not hasattr(module, "graph"):
        return values, codes

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                values[n.name] = out.detach().numpy().copy()
            elif isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor) \
                    and out[0].is_floating_point():
                firsts[n.name] = out[0].detach().numpy().copy()
            elif isinstance(out, torch.Tensor) and n.op == "call_function" and _QUANTIZE in str(n.target):
                codes[n.name] = out.detach().numpy().copy()
            return out

    with torch.no_grad():
        Recorder(module).run(*inputs)
    # A node returning several tensors (native_layer_norm, max.dim) stands for its first, unless the graph
    # reads several float parts of it (unbind, split: each part is a value of its own, none is the node's).
    for n in module.graph.nodes:
        parts = [u for u in n.users if u.target is operator.getitem and u.name in values]
        if n.name in firsts and len(parts) <= 1:
            values[n.name] = firsts[n.name]
    # PT2E folds batch norm into the conv before quantizing, so the quantized graph's
    # conv node stands for the float graph's conv → batch-norm pair: alias the pair.
    for n in module.graph.nodes:
        users = list(n.users)
        if n.name in values and len(users) == 1 and "batch_norm" in str(users[0].target):
            bn = users[0]
            out = next((u for u in bn.users if "getitem" in str(u.target)), bn)
            if out.name in values:
                values[n.name] = values[out.name]
    return values, codes


def _quantize_node_codes(front: Any, codes: dict[str, np.ndarray]) -> dict[Value, np.ndarray]:
    """PyTorch's own codes for the IR values the importer made of its quantize nodes, in IR layout:
    the exact counterpart of a layer (no re-quantization of a float that may stand for something else)."""
    out: dict[Value, np.ndarray] = {}
    for name, (value, perm) in getattr(front, "node_values", {}).items():
        c = codes.get(name)
        if c is None or value in out or value.quant is None:
            continue
        c = np.transpose(c, perm) if perm else c
        if c.shape == value.shape:
            out[value] = c.astype(value.dtype.numpy)
    return out


def _torch_value_in_ir_layout(v: Value, values: dict[str, np.ndarray]) -> np.ndarray | None:
    if v.origin is None or v.origin.node not in values:
        return None
    t = values[v.origin.node]
    if v.origin.layout is not None and t.ndim == len(v.origin.layout):
        t = np.transpose(t, v.origin.layout)
    return t if tuple(t.shape) == v.shape else None


def _representable(fp32: np.ndarray | None, v: Value) -> np.ndarray | None:
    """fp32 values clipped to the range ``v``'s type can hold.

    A conv fused with a relu has its int8 value before the clamp typed with the
    relu's range, so the fp32 conv output's negative part is outside it by design;
    SQNR then measures rounding noise, and saturation shows up in the step counts.
    """
    if fp32 is None:
        return None
    q = v.quant
    rank = fp32.ndim
    lo = (q.qmin - q.zero_point_array(rank)) * q.scale_array(rank)
    hi = (q.qmax - q.zero_point_array(rank)) * q.scale_array(rank)
    return np.clip(fp32, lo, hi)


def _layers(graph: Graph) -> list[Value]:
    """The last quantized (int8/int16) value produced for each PyTorch node, in graph order."""
    last: dict[str, Value] = {}
    for op in graph.ops:
        if op.kind in ("constant", "delegate"):
            continue
        for r in op.results:
            if r.quant is not None and r.dtype.itemsize <= 2 and r.origin and r.origin.node:
                last[r.origin.node] = r
    return list(last.values())


def _target_values(program: Program, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """The outputs of ``program.run`` and what its traced run (the same kernels and payloads) exposes."""
    runner = program.runner()
    return runner.run(inputs), runner.run_traced(inputs)


def run_stages(program: Program, inputs: Sequence[Any]) -> VerificationReport:
    front = program.frontend
    if front is None:
        raise ValueError("verify needs a program compiled in this process (it compares with the PyTorch model)")
    np_inputs = [as_numpy(x, f"input {i}") for i, x in enumerate(inputs)]
    program.check_codes(np_inputs)   # as Program.run: the stages below call the runner and interpreters directly
    torch_inputs = tuple(torch.as_tensor(x) for x in np_inputs)
    fp32_out = front.float_model(*torch_inputs)
    fp32_outs = [as_numpy(o) for o in (fp32_out if isinstance(fp32_out, (tuple, list)) else (fp32_out,))]
    fq_values, fq_node_codes = capture_torch_values(front.fake_quant, torch_inputs)
    fp32_values, _ = capture_torch_values(getattr(front, "float_graph", None), torch_inputs)
    fq_exact = _quantize_node_codes(front, fq_node_codes)

    def fake_quant_of(v: Value) -> np.ndarray | None:
        """fake-quant's value for ``v`` in its domain: codes for quantized values, else floats. None for
        codes quantized at run time: their scale is a value of the run, not of the type, so fake-quant's
        float has no code to compare with (the outputs are compared instead)."""
        if v.quant is not None and v.quant.dynamic:
            return None
        if v in fq_exact:
            return fq_exact[v]
        t = _torch_value_in_ir_layout(v, fq_values)
        if t is None:
            return None
        return t.astype(np.float32) if v.quant is None else to_codes(t, v.quant).astype(v.dtype.numpy)
    fq_outs = None
    if front.fake_quant is not None:
        with torch.no_grad():
            o = front.fake_quant(*torch_inputs)
        fq_outs = [as_numpy(x) for x in (o if isinstance(o, (tuple, list)) else (o,))]

    ref_outs, ref_env = run_graph(program.source, np_inputs, keep_all=True)
    ref_named = {v.name: a for v, a in ref_env.items()}
    forms = _FormComparison.of(program, np_inputs) if program.source is not _canonical(program) else None
    # target ``reference`` runs the reference interpreter: it is not compared with itself
    compared = program.target != "reference"
    tgt_outs, tgt_named = _target_values(program, np_inputs) if compared else (None, {})

    where = {name: p.name for p in program.partitions for name in p.values}
    layers = _layers(program.source)
    isolated = isolated_codes(program.source, layers, dict(zip(program.source.inputs, np_inputs)), fake_quant_of)
    rows: list[LayerRow] = []
    for v in layers:
        ref = ref_named[v.name]
        fq = fake_quant_of(v)
        fp = _representable(_torch_value_in_ir_layout(v, fp32_values), v)
        tgt = tgt_named.get(v.name)
        rows.append(LayerRow(
            value=v.name, op=v.origin.node, module=v.origin.module, source=v.origin.source, type=str(v.type),
            ref_vs_fake_quant=None if fq is None else compare_codes(ref, fq, v.quant, fp),
            target_vs_ref=None if tgt is None else Comparison.mismatched_shape() if tgt.shape != ref.shape
            else compare_codes(tgt, ref, v.quant),
            inside_partition=v.name in where,
            isolated_vs_fake_quant=None if fq is None or v not in isolated
            else compare_codes(isolated[v], fq, v.quant),
            **({} if forms is None else forms.layer(v, ref)),
        ))
    outputs = []
    for i, (v, ref) in enumerate(zip(program.source.outputs, ref_outs)):
        fp = fp32_outs[i] if i < len(fp32_outs) else None
        fq = fq_outs[i] if fq_outs is not None and i < len(fq_outs) else None
        step = _output_step(program.source, v)
        outputs.append(OutputRow(
            index=i,
            ref_vs_fp32=None if fp is None else compare_floats(ref, fp, fp, step),
            ref_vs_fake_quant=None if fq is None else compare_floats(ref, fq, fp, step),
            target_vs_ref=compare_floats(tgt_outs[i], ref, fp, step) if compared else None,
            ref_max_abs=float(np.abs(ref.astype(np.float64)).max(initial=0.0)),
            **({} if forms is None else forms.output(i, v, ref, fp, step)),
        ))
    placement = [(op.kind, where.get(op.results[0].name, "host")) for op in program.source.ops if op.kind != "constant"]
    partitions = [{"name": p.name, "backend": p.backend, "target": p.target,
                   "ops": sum(1 for op in p.subgraph.ops if op.kind != "constant"),
                   "inputs": [str(t) for t in p.input_types], "outputs": [str(t) for t in p.output_types]}
                  for p in program.partitions]
    fallbacks = [{"value": d.op.results[0].name, "op": d.op.attrs["target"],
                  "source": d.op.results[0].origin.describe() if d.op.results[0].origin else "", "reason": d.reason}
                 for d in program.decisions if d.op.kind == "aten"]
    costs = [(p.name, cost_report(p.payload)) for p in program.partitions]
    cycles = [{"partition": name, "operator": r.operator, "value": r.value, "source": r.source, "tensor": r.tensor,
               "op_cycles": r.cycles, "npu_cycles": r.compute_cycles}
              for name, cost in costs if cost is not None for r in cost.layers]
    estimators = sorted({cost.estimator for _, cost in costs if cost is not None and cost.cycles is not None})
    memory = [{"partition": name, "estimator": cost.estimator, **cost.device_memory}
              for name, cost in costs if cost is not None and cost.device_memory]
    return VerificationReport(program.target, rows, outputs, dynamic=program.meta.get("quant") == "dynamic",
                              partitions=partitions, placement=placement, float_fallbacks=fallbacks, cycles=cycles,
                              cost_estimator=" and ".join(estimators), memory=memory,
                              rewrites=[r.as_meta() for r in program.rewrites],
                              form_violations=[] if forms is None else forms.violations())


def _canonical(program: Program) -> Graph:
    """The canonical program (what target ``reference`` computes): the program's, or, for a loaded
    program whose form was rewritten (its file keeps the form only), the model's optimised IR
    compiled again, as ``qlower.compile`` made it before the backend's rewrites."""
    graph = program.canonical_graph
    if graph is None:
        from qlower.passes import default_pipeline

        graph = default_pipeline().run(program.frontend.graph)
        program.canonical = graph
    return graph


@dataclass
class _FormComparison:
    """The target's form (``program.source``) against the canonical program on one input tuple:
    every shared value op by op (inputs forced to the canonical codes: the declared bound), and end
    to end per layer and per output (the drift, attributed to the rewrites upstream)."""

    canonical: Graph
    canonical_outs: list[np.ndarray]
    canonical_named: dict[str, tuple[Value, np.ndarray]]
    alone: dict[str, ValueSteps]
    upstream: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, program: Program, inputs: list[np.ndarray]) -> _FormComparison:
        canonical = _canonical(program)
        outs, env = run_graph(canonical, inputs, keep_all=True)
        bounds = declared_bounds(program.rewrites)
        alone = {r.name: r for r in form_steps(canonical, program.source, inputs, bounds, before_values=env)}
        upstream = {v.name: names for v, names in upstream_rewrites(program.source, bounds).items()}
        return cls(canonical, outs, {v.name: (v, a) for v, a in env.items()}, alone, upstream)

    def layer(self, v: Value, form: np.ndarray) -> dict[str, Any]:
        found = self.canonical_named.get(v.name)
        if found is None or found[0].type != v.type:
            return {}
        e2e = compare_codes(form, found[1], v.quant)
        alone = self.alone.get(v.name)
        differs = e2e.max_steps > 0 or (alone is not None and alone.steps > 0)
        return {"form_vs_canonical": e2e, "form_alone_steps": None if alone is None else alone.steps,
                "form_bound": None if alone is None else alone.bound,
                "rewrite": ", ".join(self.upstream.get(v.name, ())) if differs else ""}

    def output(self, i: int, v: Value, form: np.ndarray, fp: np.ndarray | None, step: float | None) -> dict[str, Any]:
        if i >= len(self.canonical_outs) or self.canonical.outputs[i].type != v.type:
            return {"form_vs_canonical": Comparison.mismatched_shape()}
        e2e = compare_floats(form, self.canonical_outs[i], fp, step)
        return {"form_vs_canonical": e2e, "rewrite": ", ".join(self.upstream.get(v.name, ())) if e2e.max_abs else ""}

    def violations(self) -> list[dict[str, Any]]:
        """Shared values further from the canonical program, op by op, than their declared bound."""
        return [{"value": r.name, "steps": r.steps, "bound": r.bound, "rewrites": list(r.rewrites)}
                for r in self.alone.values() if not r.within]


def _output_step(graph: Graph, out: Value) -> float | None:
    """The quantization step of a float output that dequantizes static codes."""
    op = graph.producers().get(out)
    if op is not None and op.kind == "dequantize" and op.operands[1] is None:
        q = op.operands[0].quant
        return q.scale[0] if q is not None and len(q.scale) == 1 else None
    return None
