"""Compile time linear in the graph (issue 25 §4): what made a stage cost more per op as models grow.

- The frontend decomposes each op signature once (frontend/decompose.py): a model's many
  LayerNorms of one shape cost one export + run_decompositions, not one each, and the spliced
  graph still computes what the model does; a different signature (shape, eps) gets its own.
"""

import torch
from torch import nn

from qlower.frontend import decompose
from qlower.frontend.capture import export_module


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
