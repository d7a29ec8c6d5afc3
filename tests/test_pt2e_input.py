"""A model quantized with torchao's PT2E flow by the user's own Quantizer: compiled as given (issue 28 §5)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torchao.quantization.pt2e import MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec, Quantizer

import qlower
from qlower.errors import ConfigError, UnsupportedOpError
from qlower.reference import run_graph

aten = torch.ops.aten


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 6 * 6, 5)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc(torch.flatten(y, 1))


class UserQuantizer(Quantizer):
    """A user's choices, unlike qlower's defaults: activations symmetric in [-127, 127] (zero point 0),
    weights per tensor with a narrow range [-100, 100], or whatever a refusal test asks for."""

    def __init__(self, act=None, weight=None) -> None:
        super().__init__()
        self.act = act or QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127,
                                           qscheme=torch.per_tensor_symmetric,
                                           observer_or_fake_quant_ctr=MinMaxObserver)
        self.weight = weight or QuantizationSpec(dtype=torch.int8, quant_min=-100, quant_max=100,
                                                 qscheme=torch.per_tensor_symmetric,
                                                 observer_or_fake_quant_ctr=MinMaxObserver)

    def annotate(self, model):
        for n in model.graph.nodes:
            p = getattr(n.target, "overloadpacket", None)
            if p in (aten.conv2d, aten.linear):
                relu = next(iter(n.users))
                fused = getattr(relu.target, "overloadpacket", None) is aten.relu
                n.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={n.args[0]: self.act, n.args[1]: self.weight},
                    output_qspec=None if fused else self.act, _annotated=True)
                if fused:
                    relu.meta["quantization_annotation"] = QuantizationAnnotation(output_qspec=self.act,
                                                                                  _annotated=True)
        return model

    def validate(self, model):
        pass


def _converted(quantizer: Quantizer, seed: int = 0):
    torch.manual_seed(seed)
    model = Net().eval()
    x = torch.randn(1, 3, 6, 6)
    gm = torch.export.export(model, (x,)).module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(gm, quantizer)
        for _ in range(4):
            prepared(torch.randn(1, 3, 6, 6))
        return convert_pt2e(prepared), x


def _scales_of(gm) -> set[float]:
    qd = torch.ops.quantized_decomposed
    return {round(float(n.args[1]), 9) for n in gm.graph.nodes if n.target == qd.quantize_per_tensor.default}


@pytest.mark.parametrize("target", ["reference", "cpu", "tosa-1.0+int", "litert", "tflm"])
def test_user_quantizer_compiles_exactly_with_its_scales(target):
    converted, x = _converted(UserQuantizer())
    inputs = [(torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(i)),) for i in range(3)]
    prog = qlower.compile(converted, (x,), target=target, progress=False)
    # the program's activation types are the user's: scales as chosen, symmetric [-127, 127]
    acts = [v.quant for op in prog.canonical.ops for v in op.results
            if v.quant is not None and v.dtype.name == "INT8" and not op.kind == "constant"]
    assert acts and all(q.qmin == -127 and q.qmax == 127 and q.zero_point[0] == 0 for q in acts)
    assert {round(float(q.scale[0]), 9) for q in acts} == _scales_of(converted)
    weights = [op.results[0].quant for op in prog.canonical.ops if op.kind == "constant"
               and op.results[0].dtype.name == "INT8"]
    assert weights and all(len(q.scale) == 1 and (q.qmin, q.qmax) == (-100, 100) for q in weights)
    for (xi,) in inputs:
        # bit-exact with the reference on the target's own form (litert / tflm round as their kernels do)
        np.testing.assert_array_equal(prog.run(xi)[0], run_graph(prog.source, [xi.numpy()])[0])
        expected = run_graph(prog.canonical, [xi.numpy()])[0]
        # and the reference is the user's fake-quant model, up to one output step
        qd = torch.ops.quantized_decomposed
        step = [float(n.args[1]) for n in converted.graph.nodes if n.target == qd.quantize_per_tensor.default][-1]
        assert np.abs(expected - converted(xi).detach().numpy()).max() <= step * 1.01


def _spec(**kw):
    base = dict(dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_tensor_symmetric,
                observer_or_fake_quant_ctr=MinMaxObserver)
    base.update(kw)
    return QuantizationSpec(**base)


REFUSALS = {
    "per-channel activations": dict(act=_spec(qscheme=torch.per_channel_symmetric, ch_axis=1,
                                              observer_or_fake_quant_ctr=PerChannelMinMaxObserver)),
    "asymmetric weights": dict(weight=_spec(quant_min=-128, quant_max=60, qscheme=torch.per_tensor_affine)),
    "uint8 activation": dict(act=_spec(dtype=torch.uint8, quant_min=0, quant_max=255,
                                       qscheme=torch.per_tensor_affine)),
    "uint8 weights": dict(weight=_spec(dtype=torch.uint8, quant_min=0, quant_max=255,
                                       qscheme=torch.per_tensor_affine)),
    "along axis 1": dict(weight=_spec(qscheme=torch.per_channel_symmetric, ch_axis=1,
                                      observer_or_fake_quant_ctr=PerChannelMinMaxObserver)),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_a_target_cant_hold_is_refused_by_node_and_line(case):
    converted, x = _converted(UserQuantizer(**REFUSALS[case]))
    with pytest.raises(UnsupportedOpError) as info:
        qlower.compile(converted, (x,), target="tosa-1.0+int", progress=False)
    message = str(info.value)
    assert case in message or case.split()[0] in message
    assert "node '" in message and "test_pt2e_input.py:" in message  # the user's source line
    assert "target 'tosa-1.0+int'" in message and "it takes" in message


def test_quant_may_only_choose_the_fallback():
    converted, x = _converted(UserQuantizer())
    with pytest.raises(ConfigError, match="already quantized"):
        qlower.compile(converted, (x,), quant=qlower.QuantConfig(per_channel=False), progress=False)
    with pytest.raises(ConfigError, match="already quantized"):
        qlower.compile(converted, (x,), quant=None, progress=False)
    qlower.compile(converted, (x,), quant=qlower.QuantConfig(fallback="error"), progress=False)
