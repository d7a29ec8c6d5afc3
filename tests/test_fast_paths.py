"""qlower's faster ways through PT2E quantize exactly as torchao's own.

``capture(..., fast_paths=False)`` folds BatchNorms in prepare_pt2e (torchao's fold, one dead-code
sweep per BatchNorm) and observes every weight at every calibration batch. The default folds them
beforehand (batch_norm_fold.py) and observes a weight read straight from an attribute that nothing
writes only once. The converted fake-quant graph must be the same, node by node: weights, scales and
zero points included ("the same quantization parameters as today", issue 17).
"""

import pytest
import torch
from torch import nn

from qlower import QuantConfig, zoo
from qlower.frontend.capture import capture, export_module
from qlower.frontend.quantizer import OncePerChannelMinMaxObserver, QlowerQuantizer
from qlower.testing import zoo_ci


def _converted(gm: torch.fx.GraphModule) -> list[tuple]:
    """Every node of a converted graph: op, target and arguments (the q/dq parameters), and the bytes
    of every constant it reads."""
    params = dict(gm.named_parameters())
    rows = []
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            value = params[n.target] if n.target in params else gm.get_buffer(n.target)
            rows.append((n.target, value.dtype, tuple(value.shape), value.detach().numpy().tobytes()))
        else:
            rows.append((n.op, str(n.target), repr(n.args)))
    return rows


def _assert_same_as_torchaos(model, example, quant, calibration):
    fast, torchaos = (_converted(capture(model, example, quant, calibration, progress=False,
                                         fast_paths=fast).graph_module) for fast in (True, False))
    assert len(fast) == len(torchaos)
    assert [i for i, (a, b) in enumerate(zip(fast, torchaos)) if a != b] == []


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18", "efficientnet_lite", "mobilenet_v3_small",
                                  "timm_vit_tiny", "s0_dynamic_biasless", "lstm_kws"])
def test_zoo_quantizes_as_torchao_does(name):
    try:
        model, example, quant, calibration = zoo_ci.get(name, size=32)
    except ValueError:  # a model of fixed input size (lstm_kws: over 16 frames)
        model, example, quant, calibration = zoo_ci.get(name)
    _assert_same_as_torchaos(model, example, quant, calibration)


@pytest.mark.parametrize("quant", [QuantConfig(per_channel=False), QuantConfig(act_dtype="int16")],
                         ids=["per-tensor weights", "A16W8"])
def test_other_weight_observers_quantize_as_torchao_does(quant):
    model, example, _, calibration = zoo.get("resnet18", size=32)
    _assert_same_as_torchaos(model, example, quant, calibration)


class WrittenWeight(nn.Module):
    """A conv whose weight buffer the forward itself rescales in place: observing it once would
    miss the later batches' weights."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        self.w.mul_(1.5)
        return nn.functional.conv2d(x, self.w)


@pytest.mark.parametrize("model, once", [(WrittenWeight, False), (lambda: nn.Conv2d(3, 4, 3), True)],
                         ids=["written in forward", "parameter"])
def test_only_unchanging_weights_are_observed_once(model, once):
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    gm = export_module(model().eval(), (x,), static=True)
    QlowerQuantizer(QuantConfig()).annotate(gm)
    conv = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default)
    weight_spec = conv.meta["quantization_annotation"].input_qspec_map[conv.args[1]]
    assert (weight_spec.observer_or_fake_quant_ctr is OncePerChannelMinMaxObserver) == once


def test_a_weight_the_model_writes_stays_quantized_at_run_time():
    """Folding its quantization would freeze the weight of the last calibration batch."""
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    gm = capture(WrittenWeight().eval(), (x,), QuantConfig(), [(x,)] * 3, progress=False).graph_module
    quantized = [n for n in gm.graph.nodes if n.op == "call_function" and "quantize_per_channel" in str(n.target)
                 and "dequantize" not in str(n.target)]
    assert len(quantized) == 1 and quantized[0].args[0].op != "get_attr"
