"""BatchNorm folding before prepare_pt2e (qlower/frontend/batch_norm_fold.py).

Folding keeps the float function of the exported graph, also where torchao 0.18's own fold changes
it: a conv read by more than its BatchNorm, a weight shared by two convs. (That it quantizes as
torchao's fold does is in test_fast_paths.py.)
"""

import pytest
import torch
from torch import nn

from qlower.frontend.batch_norm_fold import fold_batch_norms
from qlower.frontend.capture import export_module

SEED = 0


def _randomize_batch_norms(model: nn.Module) -> nn.Module:
    """Statistics and affine parameters far from the identity, so a dropped or misplaced BatchNorm shows."""
    gen = torch.Generator().manual_seed(SEED)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=gen) * 2 - 1)
            m.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
                m.bias.data.copy_(torch.rand(n, generator=gen) * 2 - 1)
    return model.eval()


class ReadTwice(nn.Module):
    """The conv's result is read raw and through the BatchNorm."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class SharedWeight(nn.Module):
    """One conv applied twice, each time followed by its own BatchNorm."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn1, self.bn2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn2(self.conv(self.bn1(self.conv(x))))


class Kinds(nn.Module):
    """Biasless conv, depthwise conv, transposed conv, BatchNorm without affine, linear + BatchNorm1d
    (2-D: folded) and linear + BatchNorm1d on 3-D (different dims: not folded)."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
        self.c2, self.b2 = nn.Conv2d(6, 6, 3, padding=1, groups=6), nn.BatchNorm2d(6, affine=False)
        self.t3, self.b3 = nn.ConvTranspose2d(6, 4, 2, stride=2), nn.BatchNorm2d(4)
        self.l4, self.b4 = nn.Linear(64, 8), nn.BatchNorm1d(8)
        self.l5, self.b5 = nn.Linear(64, 5), nn.BatchNorm1d(4)

    def forward(self, x):
        y = self.b3(self.t3(self.b2(self.c2(self.b1(self.c1(x))))))
        z = self.b4(self.l4(y.mean(dim=(2, 3)).repeat(1, 16)))
        return z, self.b5(self.l5(y.flatten(2)))


@pytest.mark.parametrize("model, shape, n_folded", [(ReadTwice, (1, 3, 8, 8), 1), (SharedWeight, (1, 4, 8, 8), 2),
                                                    (Kinds, (2, 3, 4, 4), 4)], ids=lambda p: getattr(p, "__name__", ""))
def test_folding_keeps_the_float_function(model, shape, n_folded):
    torch.manual_seed(SEED)
    model = _randomize_batch_norms(model())
    x = torch.randn(shape, generator=torch.Generator().manual_seed(SEED))
    gm = export_module(model, (x,), static=True)
    assert fold_batch_norms(gm) == n_folded
    left = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.batch_norm.default]
    assert len(left) == (1 if isinstance(model, Kinds) else 0), left  # only the 3-D linear's
    with torch.no_grad():
        want, got = model(x), gm(x)
    for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
