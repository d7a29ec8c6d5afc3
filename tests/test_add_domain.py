"""TFLite's add shift has one definition (qlower.ir.add_domain), which the importer builds adds
with and the litert backend recognises them by (issue 26: it was defined twice and matched by value)."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from torch import nn

import qlower
from qlower.backends.litert.fused_add import add_groups
from qlower.ir.add_domain import ADD_SHIFT

PACKAGE = Path(qlower.__file__).parent


def test_the_shift_is_defined_once():
    """No other module binds a ``*SHIFT*`` name to the value of ``ADD_SHIFT`` (an import is a use)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [f"{path.relative_to(PACKAGE.parent)}:{t.id}" for t in targets
                          if isinstance(t, ast.Name) and "SHIFT" in t.id and node.value.value == ADD_SHIFT]
    assert found == ["qlower/ir/add_domain.py:ADD_SHIFT"]


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.a(x) + self.b(x)


def test_litert_recognises_the_adds_the_importer_builds():
    torch.manual_seed(0)
    x = (torch.randn(1, 3, 6, 6),)
    prog = qlower.compile(Residual().eval(), x, target="litert", progress=False)
    adds = [op for op in prog.source.ops if op.kind == "add"]
    assert len(adds) == 1 and len(add_groups(prog.source)) == 1
    assert "litert.tflite_add" in [r["name"] for r in prog.meta["rewrites"]]
