"""SCENARIOS.md S1 on the VGF targets: conv -> relu (zero point -111, not qmin: the relu stays an
explicit clamp) -> concat sharing its domain with y -> conv, compiled from PyTorch for "vgf"
(TOSA-1.0+INT+FP) and "vgf+int" (TOSA-1.0+INT), converted to VGF, run on Vulkan and compared
bit-exactly with the reference interpreter on the program's own source graph. The program file
keeps the VGF and runs again after loading."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qlower
from qlower import zoo
from qlower.backends.vgf import backend as vgf_backend
from qlower.program.fileformat import load
from qlower.reference import run_graph

SIZE = 8


@pytest.fixture(scope="module")
def s1():
    ok, detail = vgf_backend.vulkan_status()
    if not ok:
        pytest.fail(f"VGF can't run on Vulkan here ({detail}); scripts/setup_vulkan.sh installs what it needs")
    return zoo.get("s1_conv_relu_cat", SIZE)


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(1, 3, SIZE, SIZE, generator=g), torch.rand(1, 4, SIZE, SIZE, generator=g) - 0.065)


def relu_clamps(graph):
    return [op for op in graph.ops if op.kind == "clamp"]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["vgf", "vgf+int"])
def test_s1_runs_on_vulkan_bit_exact(s1, target, tmp_path):
    model, example, config, calibration = s1
    prog = qlower.compile(model, example, target, config, calibration, progress=False)
    # the relu survived as a clamp to its own zero point, above qmin, inside a VGF partition
    (relu,) = relu_clamps(prog.source)
    out_q = relu.results[0].quant
    assert relu.attrs["min"] == out_q.zero_point[0] == -111 and out_q.qmin == -127
    assert any(relu_clamps(p.subgraph) for p in prog.partitions)
    assert prog.partitions and all(p.backend == "vgf" for p in prog.partitions)
    for p in prog.partitions:
        assert p.payload.meta["execution"].startswith("vulkan:")
    assert any(name.endswith("/model.vgf") and blob[:4] == b"VGF1" for name, blob in prog.artifacts().items())

    for seed in (0, 1):
        xs = example if seed == 0 else inputs(seed)
        got = prog.run(*xs)
        want = run_graph(prog.source, [x.numpy() for x in xs])
        assert len(got) == len(want) == 1
        assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape == (1, 8, SIZE, SIZE)
        np.testing.assert_array_equal(got[0], want[0])

    path = tmp_path / "s1.qlower"
    prog.save(path)
    again = load(path)
    assert again.artifacts() == prog.artifacts()
    xs = inputs(2)
    np.testing.assert_array_equal(again.run(*xs)[0], run_graph(prog.source, [x.numpy() for x in xs])[0])
