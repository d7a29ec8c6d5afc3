"""The edge zoo end to end (issue 12): every model compiles for every target and is bit-exact.

Each model is quantized and imported once (PT2E is the slow part); the same
optimised IR is then lowered for every target and run on the same seeded input,
and each target's outputs must equal the reference interpreter's bit for bit.
The verification report (fake-quant ↔ reference per layer, target ↔ reference)
must be clean, with every layer matched to a model node. Reduced input sizes keep
this within CI's budget (lstm_kws over its first 16 frames: qlower.testing.zoo_ci); the models are
the zoo's, unchanged.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import qlower
from qlower.api import lower_graph
from qlower.reference import run_graph
from qlower.testing import zoo_ci

MODELS = {"mobilenet_v3_small": 32, "efficientnet_lite": 32, "convnext_block": 16, "timm_vit_tiny": 16,
          "mobilevit_block": 16, "unet_tiny": 16, "ds_cnn_kws": None, "lstm_kws": None}
TARGETS = ["cpu", "tosa-1.0+int", "ethos-u85-256", "ethos-u55-128", "vgf+int"]


@functools.cache
def _compiled(name: str):
    model, example, quant, calibration = zoo_ci.get(name, MODELS[name])
    prog = qlower.compile(model, example, target="reference", quant=quant, calibration=calibration, progress=False)
    inputs = [x.numpy() for x in example]
    return prog.source, inputs, run_graph(prog.source, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_edge_model_is_bit_exact_on_every_target(name: str, target: str):
    source, inputs, want = _compiled(name)
    prog = lower_graph(source, target)
    got = prog.run(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    for d in prog.decisions:  # whatever stays on the host says why
        assert d.reason


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_edge_model_verification_report_is_clean(name: str):
    model, example, quant, calibration = zoo_ci.get(name, MODELS[name])
    report = qlower.verify(model, example, target="tosa-1.0+int", quant=quant, calibration=calibration,
                           progress=False)
    assert report.ok, report.problems
    quantized = [r for r in report.layers if r.isolated_vs_fake_quant is not None]
    assert quantized, "no layer was compared with the fake-quant model"
    assert all(r.isolated_vs_fake_quant.max_steps <= 1 for r in quantized)
    assert all(r.target_vs_ref is None or r.target_vs_ref.max_steps == 0 for r in report.layers)
