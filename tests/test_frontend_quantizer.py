"""The PT2E quantizer built from a QuantConfig, seen through the imported IR types."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qlower.errors import InputError
from qlower.frontend import QuantConfig, capture_and_import
from qlower.ir import DType
from qlower.reference import run_graph
from qlower.testing.frontend import fake_quant_agreement


class CatNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv_y = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x, y):
        c = torch.cat((F.relu(self.conv1(x)), self.conv_y(y)), dim=1)
        return self.head(F.max_pool2d(c, 2).flatten(2).reshape(c.shape[0], 8, 2, 2))


def _data(count=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 3, 4, 4, generator=g), torch.rand(2, 3, 4, 4, generator=g)) for _ in range(count)]


def _import(config, model=None, data=None):
    torch.manual_seed(0)
    model = (model or CatNet()).eval()
    data = data or _data()
    return capture_and_import(model, data[0], config, data, progress=False), data


def _int8_specs(graph):
    return {v.quant for v in graph.values() if v.quant is not None and v.dtype is DType.INT8
            and graph.constant_data(v) is None}


def test_concat_and_pass_through_ops_share_one_domain():
    result, _ = _import(QuantConfig())
    ops = {op.kind: op for op in result.graph.ops}
    cat = ops["concat"]
    domain = cat.result.quant
    assert all(v.quant == domain for v in cat.operands[0])
    assert ops["max_pool2d"].result.quant == domain and ops["reshape"].result.quant == domain


def test_activation_range_and_symmetry():
    result, data = _import(QuantConfig(act_qmin=-127, act_qmax=127, symmetric_acts=True))
    specs = _int8_specs(result.graph)
    assert specs and all((q.qmin, q.qmax, q.zero_point) == (-127, 127, (0,)) for q in specs)
    cmp = fake_quant_agreement(result, data)
    assert cmp.layers.max_step <= 1 and cmp.layers.exact_share >= 0.99, str(cmp)


@pytest.mark.parametrize("per_channel", [True, False])
def test_weight_range_and_granularity(per_channel):
    result, data = _import(QuantConfig(per_channel=per_channel, weight_qmin=-100, weight_qmax=100))
    for op in result.graph.ops:
        if op.kind == "conv2d":
            w = op.operands[1]
            codes = result.graph.constant_data(w)
            assert (w.quant.qmin, w.quant.qmax) == (-100, 100)
            assert codes.min() >= -100 and codes.max() <= 100 and np.abs(codes).max() == 100
            assert len(w.quant.scale) == (w.shape[0] if per_channel else 1)
            assert set(w.quant.zero_point) == {0}
    cmp = fake_quant_agreement(result, data)
    assert cmp.layers.max_step <= 1 and cmp.layers.exact_share >= 0.99, str(cmp)


def _quantize_spec(graph, input_index):
    (op,) = [op for op in graph.ops if op.kind == "quantize" and op.operands[0] is graph.inputs[input_index]]
    q = op.result.quant
    return q.scale[0], q.zero_point[0], q.qmin, q.qmax


def test_fixed_overrides_pin_inputs_outputs_and_module_outputs():
    pinned = (0.05, 3, -128, 127)
    config = QuantConfig(fixed={"input:1": (1 / 128, -128, -128, 127), "conv_y": pinned,
                                "output": (0.02, -7, -120, 120)})
    result, data = _import(config)
    scale, zp, qmin, qmax = _quantize_spec(result.graph, 1)
    assert (zp, qmin, qmax) == (-128, -128, 127) and scale == pytest.approx(1 / 128, rel=1e-6)
    cat = next(op for op in result.graph.ops if op.kind == "concat")
    q = cat.result.quant  # conv_y is in the concat's group: the whole group is pinned
    assert (q.zero_point[0], q.qmin, q.qmax) == (3, -128, 127) and q.scale[0] == pytest.approx(0.05, rel=1e-6)
    (deq,) = [op for op in result.graph.ops if op.kind == "dequantize"]
    q = deq.operands[0].quant
    assert (q.zero_point[0], q.qmin, q.qmax) == (-7, -120, 120) and q.scale[0] == pytest.approx(0.02, rel=1e-6)
    cmp = fake_quant_agreement(result, data)
    assert cmp.outputs.max_step <= 1 and cmp.layers.max_step <= 1, str(cmp)


class DynamicNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv3, self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.Conv2d(4, 4, 1)
        self.fc = nn.Linear(4, 6)

    def forward(self, x):
        y = self.conv1(F.relu(self.conv3(x)))          # [N, 4, H, W]
        tokens = y.flatten(2).transpose(1, 2)          # [N, HW, 4]
        return torch.matmul(self.fc(tokens), self.fc(tokens).transpose(1, 2))


@pytest.mark.parametrize("granularity", ["per_tensor", "per_row"])
def test_dynamic_granularity_per_op(granularity):
    torch.manual_seed(0)
    model = DynamicNet().eval()
    data = [(torch.randn(2, 3, 4, 4),) for _ in range(3)]
    result = capture_and_import(model, data[0], QuantConfig(mode="dynamic", granularity=granularity), data,
                                progress=False)
    graph = result.graph
    users = graph.users()
    seen = {}

    def consumers(value):  # through layout changes of the codes
        for user in users.get(value, []):
            yield from consumers(user.result) if user.kind == "transpose" else [user]

    for op in graph.ops:
        if op.kind == "dynamic_quantize":
            for user in consumers(op.results[0]):
                key = user.kind if user.kind != "conv2d" else f"conv{user.operands[1].shape[1]}x"
                seen.setdefault(key, set()).add(op.attrs["granularity"])
    row = "per_row" if granularity == "per_row" else "per_tensor"
    assert seen == {"conv3x": {"per_tensor"}, "conv1x": {row}, "fully_connected": {row},
                    "matmul": {row, "per_tensor"} if row == "per_row" else {"per_tensor"}}
    for (x,) in data:
        ir = run_graph(graph, [x.numpy()])[0]
        with torch.no_grad():
            fq = result.fake_quant(x).numpy()
        assert np.abs(ir - fq).max() <= 1e-5 * np.abs(fq).max()


def test_progress_bar_over_calibration(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)   # bars show on terminals only
    data = _data(3)
    _import(QuantConfig(), data=data)
    assert capsys.readouterr().err == ""
    torch.manual_seed(0)
    capture_and_import(CatNet().eval(), data[0], QuantConfig(), data, progress=True)
    steps = capsys.readouterr().err.split("\r")
    # one bar over export, prepare, the 3 batches and convert, each phase named while it runs
    for phase, done in (("export", 0), ("prepare", 1), ("calibrate", 2), ("convert", 5)):
        assert any(f"quantizing: {phase}" in s and f" {done}/6 " in s for s in steps), phase
    assert "quantized: 100%" in steps[-1] and " 6/6 " in steps[-1]


def test_fixed_pins_an_int16_value_with_its_own_code_type():
    """Under A16W8 a pinned value keeps int16 codes (a pin once built an int8 observer, and the import
    failed verification); a range its code type can't hold is a clear InputError naming the value."""
    config = QuantConfig(act_dtype="int16", fixed={"output": (0.0005, 0, -32768, 32767)})
    result, data = _import(config)
    (deq,) = [op for op in result.graph.ops if op.kind == "dequantize"]
    q = deq.operands[0].quant
    assert deq.operands[0].dtype is DType.INT16 and (q.zero_point[0], q.qmin, q.qmax) == (0, -32768, 32767)
    assert q.scale[0] == pytest.approx(0.0005, rel=1e-6)
    cmp = fake_quant_agreement(result, data)
    assert cmp.outputs.max_step <= 1, str(cmp)
    with pytest.raises(InputError, match=r"int8 codes \[-128, 127\]; the pinned range \[-32768, 32767\]"):
        _import(QuantConfig(fixed={"output": (0.0005, 0, -32768, 32767)}))
