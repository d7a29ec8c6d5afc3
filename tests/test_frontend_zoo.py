"""Every zoo model (reduced sizes) imports to a verified IR that matches its fake-quant model.

Static models: every quantized layer, with its inputs teacher-forced to PyTorch's
codes, is within one step of the fake-quant model and >= 99% exact. End to end,
a 1-step difference early in a deep network with random weights drifts further:
in MobileNetV2 at 32x32, moving 5 of the 3072 input codes by one step moves the
fake-quant model's own output by up to 54 steps. Outputs are therefore only
checked where the network is shallow enough for a bound to mean something.
Dynamic models: float outputs within 1e-5 of the fake-quant model's magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlower import zoo
from qlower.frontend import capture_and_import
from qlower.ir import verify_graph
from qlower.reference import run_graph
from qlower.testing import zoo_ci
from qlower.testing.frontend import fake_quant_agreement

SIZES = {"tiny_cnn": 16, "mobilenet_v2": 32, "resnet18": 32, "vit_block": 16, "s0_dynamic_biasless": 16,
         "s1_conv_relu_cat": 8, "s2_perchannel_binary": 8}
SLOW = {"mobilenet_v2", "resnet18"}
# (max steps, min exact share) end to end, for the static models shallow enough to bound
OUTPUT_BOUNDS = {"s1_conv_relu_cat": (1, 0.99), "s3_const_cat": (0, 1.0), "digits_cnn": (1, 0.9),
                 "tiny_cnn": (1, 0.8), "vit_block": (3, 0.6), "s4_attention": (4, 0.95)}


def _params():
    return [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in zoo.names()]


@pytest.mark.parametrize("name", _params())
def test_zoo_model_matches_fake_quant(name):
    model, example, quant, calibration = zoo_ci.get(name, SIZES.get(name))  # lstm_kws over 16 frames
    result = capture_and_import(model, example, quant, calibration, progress=False)
    verify_graph(result.graph)
    batches = [example] + list(calibration)[:4]
    if quant.mode == "dynamic":
        for batch in batches:
            ir = run_graph(result.graph, [x.numpy() for x in batch])[0]
            with torch.no_grad():
                fq = result.fake_quant(*batch).numpy()
            assert np.abs(ir - fq).max() <= 1e-5 * np.abs(fq).max()
        return
    cmp = fake_quant_agreement(result, batches)
    print(f"{name}: {cmp}")
    if name != "s3_const_cat":  # no runtime layers
        assert cmp.layers.total > 0
        assert cmp.layers.max_step <= 1 and cmp.layers.exact_share >= 0.99, str(cmp)
    if name in OUTPUT_BOUNDS:
        steps, share = OUTPUT_BOUNDS[name]
        assert cmp.outputs.max_step <= steps and cmp.outputs.exact_share >= share, str(cmp)
