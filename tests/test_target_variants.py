"""The target variants the other tests don't run: TOSA-1.0+INT+FP, vgf (INT+FP, on Vulkan) and the
Ethos-U MAC sizes other than ethos-u55-128 / ethos-u85-256. They lower through the same code as the
tested ones; here each runs small models end to end against the reference interpreter's meaning
(``check_against_reference``: the target's form exact, the form within its declared bounds).

Models: a host float op between two partitions (cumsum, which no target takes), a float op at the
end after a float-dequantizing partition (erf), and an integer conv / depthwise / mean / linear net.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

import qlower
from qlower.api import lower_graph
from qlower.backends.registry import targets
from qlower.ir import Graph
from qlower.testing.differential import check_against_reference

ETHOS_U = ("ethos-u55-32", "ethos-u55-64", "ethos-u55-256", "ethos-u65-512",
           "ethos-u85-128", "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048")


class HostCumsum(nn.Module):
    """conv -> relu -> cumsum (a float op on the host) -> linear: two partitions around it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.cumsum(torch.relu(self.conv(x)), dim=3).flatten(2).transpose(1, 2))


class FloatTail(nn.Module):
    """linear whose dequantized output an erf reads on the host (+FP: the dequantize is in the partition)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return torch.erf(self.fc(x))


class Integer(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.dw(torch.relu(self.conv(x)))).mean((2, 3)))


MODELS = {"host_cumsum": (HostCumsum, (1, 3, 5, 5)), "float_tail": (FloatTail, (1, 8)),
          "integer": (Integer, (1, 3, 8, 8))}
# every model on TOSA+FP; the integer net on every MAC size (Vela compiles each; the NPU partitions run
# simulated on the TOSA reference model); a float model on one size of each family
CASES = ([(m, "tosa-1.0+int+fp") for m in MODELS] + [("integer", t) for t in ETHOS_U]
         + [("host_cumsum", "ethos-u85-512"), ("float_tail", "ethos-u55-256")])


@functools.cache
def canonical(name: str) -> tuple[Graph, list[np.ndarray]]:
    """The model's canonical program and an input (compiled once per process, when first needed)."""
    cls, shape = MODELS[name]
    torch.manual_seed(sorted(MODELS).index(name))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(*shape, generator=g)
    calibration = [(torch.randn(*shape, generator=g) * s,) for s in (0.5, 1.0, 2.0)]
    program = qlower.compile(cls().eval(), (x,), target="reference", calibration=calibration, progress=False)
    return program.source, [x.numpy()]


def test_the_variants_are_registered():
    assert {"tosa-1.0+int+fp", "vgf", *ETHOS_U} <= set(targets())


def test_the_float_models_keep_a_float_op():
    for name in ("host_cumsum", "float_tail"):
        graph, _ = canonical(name)
        assert any(op.kind == "aten" for op in graph.ops), name
    assert not any(op.kind == "aten" for op in canonical("integer")[0].ops)
    # on +FP the float boundary ops run inside the partition: a float partition
    program = lower_graph(canonical("float_tail")[0], "tosa-1.0+int+fp")
    (part,) = program.partitions
    assert {"quantize", "dequantize"} <= {op.kind for op in part.subgraph.ops}, program.explain()
    assert part.input_types[0].dtype.is_float and part.output_types[0].dtype.is_float


@pytest.mark.slow
@pytest.mark.parametrize("model, target", CASES)
def test_variant_matches_the_reference(model, target):
    graph, inputs = canonical(model)
    check_against_reference(graph, inputs, target)


@pytest.mark.slow
def test_vgf_int_fp_runs_a_float_partition_on_vulkan():
    """vgf (TOSA-1.0+INT+FP): quantize, linear and dequantize in one partition run by the ML SDK
    scenario runner, erf on the host. One model only: a Vulkan run costs seconds."""
    graph, inputs = canonical("float_tail")
    check_against_reference(graph, inputs, "vgf")
