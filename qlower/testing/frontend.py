"""Comparing an imported IR graph with the fake-quant PyTorch model, in integer codes.

Every quantize node of the converted model produces exact integer codes in
PyTorch; the IR value standing for that node (``node_values``), permuted back
to PyTorch order, holds codes of the same QuantSpec. Three views, all in
quantization steps:
- ``outputs``: both float outputs quantized with the output's QuantSpec;
- ``drift``: every quantized layer, running the IR on its own (a 1-step
  difference early on propagates, so deep models drift by more than a step);
- ``layers``: every quantized layer with its inputs *teacher-forced* to PyTorch's
  codes, so each op's own rounding is measured (the IR's contract: at most one
  step from the fake-quant model per op).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from qlower.ir import Graph
from qlower.reference import run_graph
from qlower.reference.interpreter import check_inputs, run_op

QD = torch.ops.quantized_decomposed


@dataclass
class CodeStats:
    """Accumulated comparison: largest step difference, exact elements / all elements."""

    max_step: int = 0
    exact: int = 0
    total: int = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        diff = np.abs(a.astype(np.int64) - b.astype(np.int64))
        self.max_step = max(self.max_step, int(diff.max(initial=0)))
        self.exact += int((diff == 0).sum())
        self.total += diff.size

    @property
    def exact_share(self) -> float:
        return self.exact / self.total if self.total else 1.0

    def __str__(self) -> str:
        return f"max {self.max_step} step(s), {100 * self.exact_share:.2f}% exact of {self.total}"


def _torch_codes(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
    codes: dict[str, np.ndarray] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.op == "call_function" and n.target == QD.quantize_per_tensor.default:
                codes[n.name] = out.numpy().copy()
            return out

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return codes


def output_specs(graph: Graph):
    """QuantSpec of the codes each graph output dequantizes (None for a float result)."""
    producers = graph.producers()
    specs = []
    for v in graph.outputs:
        op = producers.get(v)
        while op is not None and op.kind == "transpose":
            op = producers.get(op.operands[0])
        specs.append(op.operands[0].quant if op is not None and op.kind == "dequantize" else None)
    return specs


def to_codes(x: np.ndarray, spec) -> np.ndarray:
    t = torch.as_tensor(np.asarray(x, dtype=np.float32))
    return QD.quantize_per_tensor.default(t, spec.scale[0], spec.zero_point[0], spec.qmin, spec.qmax,
                                          torch.int32).numpy()


def _forced_values(result, batch) -> dict:
    """IR value -> PyTorch's codes for it, laid out like the IR value."""
    forced = {}
    for name, codes in _torch_codes(result.fake_quant, batch).items():
        hit = result.node_values.get(name)
        if hit is None or hit[0] in forced:
            continue
        value, perm = hit
        arr = np.transpose(codes, perm) if perm else codes
        if value.quant is not None and arr.shape == value.shape:
            forced[value] = arr.astype(value.dtype.numpy)
    return forced


@dataclass
class Comparison:
    outputs: CodeStats
    drift: CodeStats
    layers: CodeStats

    def __str__(self) -> str:
        return f"outputs: {self.outputs} | layers (teacher-forced): {self.layers} | drift: {self.drift}"


def compare_with_fake_quant(result, batches: Sequence[Sequence[torch.Tensor]],
                            outputs: Sequence[int] | None = None) -> Comparison:
    """Code statistics of the IR (reference interpreter) vs ``result.fake_quant`` on ``batches``
    (``outputs``: indices of the model outputs to compare, default all)."""
    cmp = Comparison(CodeStats(), CodeStats(), CodeStats())
    specs = output_specs(result.graph)
    for batch in batches:
        batch = tuple(batch)
        arrays = [x.numpy() for x in batch]
        ir_outs, env = run_graph(result.graph, arrays, keep_all=True)
        with torch.no_grad():
            fq = result.fake_quant(*batch)
        fq = fq if isinstance(fq, (tuple, list)) else (fq,)
        for i, (ir, ref, spec) in enumerate(zip(ir_outs, fq, specs)):
            if spec is not None and (outputs is None or i in outputs):
                cmp.outputs.add(to_codes(ir, spec), to_codes(ref.numpy(), spec))
        forced = _forced_values(result, batch)
        for value, codes in forced.items():
            cmp.drift.add(env[value], codes)
        env = dict(zip(result.graph.inputs, check_inputs(result.graph, arrays)))
        for op in result.graph.ops:
            run_op(op, env)
            for r in op.results:
                if r in forced:
                    cmp.layers.add(env[r], forced[r])
                    env[r] = forced[r]
    return cmp


def float_error(result, model: torch.nn.Module, batches: Sequence[Sequence[torch.Tensor]]) -> float:
    """Largest ``max|IR - eager| / max|eager|`` over batches and outputs (float32 graphs)."""
    worst = 0.0
    for batch in batches:
        batch = tuple(batch)
        outs = run_graph(result.graph, [x.numpy() for x in batch])
        with torch.no_grad():
            ref = model(*batch)
        ref = ref if isinstance(ref, (tuple, list)) else (ref,)
        for o, r in zip(outs, ref):
            r = r.numpy()
            worst = max(worst, float(np.abs(o - r).max()) / max(float(np.abs(r).max()), 1e-12))
    return worst


# ops allowed to hold floats (or just move codes) at the edge of an integer program
FLOAT_BOUNDARY = frozenset({"quantize", "dequantize", "constant", "delegate", "transpose", "reshape"})


def assert_integer_program(graph: Graph, kinds: set[str], name: str = "") -> None:
    """No float fallback, the expected op kinds present, and every op between the boundary
    quantize / dequantize producing integers."""
    ops = graph.count_ops()
    assert "aten" not in ops, [op.attrs["target"] for op in graph.ops if op.kind == "aten"]
    assert kinds <= set(ops), ops
    for op in graph.ops:
        if op.kind not in FLOAT_BOUNDARY:
            assert all(r.dtype.is_integer for r in op.results), f"{name}: float {op.kind}"


def assert_targets_bit_exact(name: str, graph: Graph, inputs: Sequence[torch.Tensor], targets: Sequence[str],
                             host_allowed: frozenset[str] = frozenset()) -> None:
    """``graph`` lowered for each target runs bit-exact with the reference interpreter; on TOSA targets
    nothing but the boundary ops (and ``host_allowed``) stays on the host."""
    from qlower.api import lower_graph  # the testing helpers sit above the API

    want = run_graph(graph, [t.numpy() for t in inputs])
    for target in targets:
        lowered = lower_graph(graph, target)
        got = lowered.run(*inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w, err_msg=f"{name} on {target}")
        if target.startswith("tosa"):
            host = [d.op.kind for d in lowered.decisions]
            assert not set(host) - FLOAT_BOUNDARY - host_allowed, f"{name}: left on the host on {target}: {host}"
            assert lowered.partitions
