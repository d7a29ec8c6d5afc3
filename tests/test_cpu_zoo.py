"""End to end: zoo models through the frontend, run on the CPU plan, bit-exact with the reference.

Image models run at reduced sizes; MobileNetV2 and ResNet-18 are marked slow.
"""

import pytest

from qlower import zoo
from qlower.frontend import capture_and_import
from qlower.testing.cpu_checks import assert_cpu_matches_reference
from qlower.testing.graph_checks import random_inputs

FAST = ["tiny_cnn", "vit_block", "digits_cnn", "s0_dynamic_biasless", "s1_conv_relu_cat", "s2_perchannel_binary",
        "s3_const_cat",
        "s4_attention"]
SLOW = ["mobilenet_v2", "resnet18"]


def _import(name):
    size = 32 if zoo.default_size(name) else None
    model, example, quant, calibration = zoo.get(name, size) if size else zoo.get(name)
    return capture_and_import(model, example, quant, calibration[:2], progress=False).graph


def _check(name):
    graph = _import(name)
    configs = ({}, {"native": False, "gemm_engine": "float32"})
    for seed in range(2):
        plans = assert_cpu_matches_reference(graph, random_inputs(graph, seed), configs=configs)
    return plans


@pytest.mark.parametrize("name", FAST)
def test_zoo_model_matches_reference(name):
    plans = _check(name)
    if name == "s2_perchannel_binary":
        assert any(label.startswith("dynamic_quantize+conv2d+dequantize") for label in plans[0].fused)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_large_zoo_model_matches_reference(name):
    plans = _check(name)
    assert any("conv2d+rescale" in label for label in plans[0].fused)
