"""Compile time linear in the graph (issue 25 §4): what made a stage cost more per op as models grow.

- The frontend decomposes each op signature once (frontend/decompose.py): a model's many
  LayerNorms of one shape cost one export + run_decompositions, not one each, and the spliced
  graph still computes what the model does; a different signature (shape, eps) gets its own.
- The partitioner's greedy grouping keeps sets of partitions as bit masks and the partitions each
  waits for as a maintained closure (partition/partitioner.py ``_assign``): it must place every op
  exactly where the plain statement of the rule (below: a walk of the partition graph per
  candidate, cubic with many partitions) places it.
"""

from collections import defaultdict

import numpy as np
import torch
from torch import nn

from qlower.contract import Verdict
from qlower.frontend import decompose
from qlower.frontend.capture import export_module
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType
from qlower.partition.partitioner import _assign


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.LayerNorm(8), nn.LayerNorm(8)      # one signature
        self.c = nn.LayerNorm(8, eps=1e-3)                      # another eps
        self.d = nn.LayerNorm(4)                                # another shape
        for i, m in enumerate((self.a, self.b, self.c, self.d)):
            with torch.no_grad():
                m.weight.copy_(torch.linspace(0.5, 1.5, m.weight.numel()) * (i + 1))
                m.bias.copy_(torch.linspace(-1, 1, m.bias.numel()) * (i + 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.c(self.b(self.a(x)) + x)
        return y, self.d(y[..., :4])


def _count_exports(monkeypatch) -> list[int]:
    calls = [0]
    real = torch.export.export

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    return calls


def test_each_op_signature_is_decomposed_once(monkeypatch):
    decompose._DECOMPOSED.clear()
    calls = _count_exports(monkeypatch)
    model = Norms().eval()
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(3))
    gm = export_module(model, (x,))
    # one export of the model, then one per distinct layer_norm signature (a/b shared, c, d)
    assert calls[0] == 1 + 3
    assert not any("layer_norm" in str(n.target) and "native" not in str(n.target) for n in gm.graph.nodes)
    for got, want in zip(gm(x), model(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # a second model with the same signatures decomposes nothing again
    export_module(Norms().eval(), (x,))
    assert calls[0] == 1 + 3 + 1


def test_a_decomposition_is_not_shared_across_signatures():
    decompose._DECOMPOSED.clear()
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(4))
    model = Norms().eval()
    gm = export_module(model, (x,))
    eps = sorted({float(n.args[-1]) for n in gm.graph.nodes if "native_layer_norm" in str(n.target)}
                 | {float(a) for n in gm.graph.nodes for a in n.args if isinstance(a, float)})
    assert 1e-3 in eps and 1e-5 in eps


# -- the partitioner's grouping --------------------------------------------------------------------

def _assign_by_walks(graph, verdicts):
    """The grouping rule stated plainly: an op joins its producer's partition, else the newest one,
    unless it reads that partition through the host or a partition it reads waits for it."""
    producer = graph.producers()
    part_of, ext, needs, n_parts = {}, defaultdict(frozenset), defaultdict(set), 0

    def part(v):
        return part_of.get(producer[v]) if v in producer else None

    def waits_for(a, b):
        stack, seen = [a], {a}
        while stack:
            for n in needs[stack.pop()]:
                if n == b:
                    return True
                if n not in seen:
                    seen.add(n)
                    stack.append(n)
        return False

    for op in graph.ops:
        if op.kind == "constant":
            continue
        inputs = list(op.input_values())
        if verdicts[op].ok:
            reads = {p for v in inputs for p in (*ext[v], part(v)) if p is not None}
            chosen = next((c for c in [part(v) for v in inputs] + list(range(n_parts - 1, -1, -1))
                           if c is not None and all(c not in ext[v] for v in inputs)
                           and not any(waits_for(p, c) for p in reads if p != c)), None)
            if chosen is None:
                chosen, n_parts = n_parts, n_parts + 1
            part_of[op] = chosen
            needs[chosen] |= reads - {chosen}
        deps = set()
        for v in inputs:
            deps |= ext[v]
            if part(v) is not None and part(v) != part_of.get(op):
                deps.add(part(v))
        for r in op.results:
            ext[r] = frozenset(deps)
    return part_of


def _wide_dag(seed: int, n: int = 160, window: int = 30):
    """Rescales, maximums and concats reading values from anywhere earlier (many joins)."""
    rng = np.random.default_rng(seed)
    q = QuantSpec.per_tensor(0.05, 0)
    b = GraphBuilder("dag")
    values = [b.input("x", TensorType((1, 2, 2, 4), DType.INT8, q))]
    for i in range(n):
        x, y = (values[int(rng.integers(max(0, len(values) - window), len(values)))] for _ in range(2))
        kind = rng.choice(["rescale", "maximum", "concat"])
        if kind == "rescale":
            values.append(b.op("rescale", x, out=q, name=f"r{i}"))
        elif kind == "maximum":
            values.append(b.op("maximum", x, y, name=f"m{i}"))
        else:
            both = b.op("concat", (x, y), axis=3, name=f"c{i}")
            values.append(b.op("slice", both, start=(0, 0, 0, 2), stop=(1, 2, 2, 6), name=f"s{i}"))
    return b.build([values[-1], values[len(values) // 2]])


def test_grouping_places_every_op_as_the_plain_rule_does():
    rng = np.random.default_rng(25)
    partitions = []
    for seed in range(12):
        g = _wide_dag(seed, window=(4, 30, 160)[seed % 3])
        for host_share in (0.05, 0.3, 0.6, 0.85):
            verdicts = {op: Verdict.no("host") if op.kind != "constant" and rng.random() < host_share
                        else Verdict.yes() for op in g.ops}
            got = _assign(g, verdicts)
            assert got == _assign_by_walks(g, verdicts), (seed, host_share)
            partitions.append(len(set(got.values())))
    assert max(partitions) >= 12    # many partitions meeting through the host were exercised
