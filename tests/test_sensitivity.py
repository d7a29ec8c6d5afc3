"""qlower.sensitivity: each layer alone in int8, ranked by output SQNR.

The expected numbers are computed here with PyTorch's documented fake-quantize ops and the
min/max observer arithmetic (scale = (max - min) / 255 over a range that holds 0; symmetric
weights: amax / 127 per output channel), not with the code under test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import qlower
from qlower import zoo
from qlower.cli import main
from qlower.errors import ConfigError
from qlower.frontend.capture import capture
from qlower.verification.metrics import sqnr_db
from qlower.verification.sensitivity import add_switches, batch_agnostic, group_layers

G = torch.Generator().manual_seed(17)


class TwoLinear(nn.Module):
    """fc2's outputs span a range 100x wider than fc1's: quantized per tensor, they lose the most."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)
        with torch.no_grad():
            for m in (self.fc1, self.fc2):
                m.weight.copy_(torch.randn(m.weight.shape, generator=G) / 4)
                m.bias.zero_()
            self.fc2.weight[0] *= 100.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _inputs(count: int) -> list[tuple[torch.Tensor]]:
    return [(torch.randn(1, 16, generator=G),) for _ in range(count)]


def _fake_quant_acts(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255.0
    zp = int(np.clip(-128 - round(lo / scale), -128, 127))
    return torch.fake_quantize_per_tensor_affine(x, scale, zp, -128, 127)


def test_one_layer_alone_is_what_pytorch_fake_quantize_computes():
    model = TwoLinear().eval()
    calibration, inputs = _inputs(8), _inputs(20)
    report = qlower.sensitivity(model, calibration[0], calibration=calibration, data=(
        torch.cat([x for (x,) in inputs]), torch.zeros(20, dtype=torch.int64)), progress=False)
    assert report.most_sensitive(1) == ["fc2"]
    # fc2 alone: its weights per channel symmetric int8 [-127, 127], its output per tensor affine int8
    # over the range its float output takes on the calibration inputs
    with torch.no_grad():
        hidden = [torch.relu(model.fc1(x)) for (x,) in calibration]
        w = model.fc2.weight
        scale = w.abs().amax(dim=1) / 127.0
        wq = torch.fake_quantize_per_channel_affine(w, scale, torch.zeros(4, dtype=torch.int32), 0, -127, 127)
        out_cal = torch.cat([model.fc2(h) for h in hidden])  # observers see float weights while calibrating
        lo, hi = float(out_cal.min()), float(out_cal.max())
        ref = torch.cat([model(x) for (x,) in inputs])
        alone = torch.cat([_fake_quant_acts(nn.functional.linear(torch.relu(model.fc1(x)), wq, model.fc2.bias),
                                            lo, hi) for (x,) in inputs])
    row = next(r for r in report.layers if r.name == "fc2")
    assert row.op == "linear"
    assert row.sqnr_db == pytest.approx(sqnr_db(ref.numpy(), alone.numpy()), abs=1e-3)
    assert row.sqnr_db < min(r.sqnr_db for r in report.layers if r.name != "fc2")
    assert report.int8_sqnr_db <= row.sqnr_db + 0.5  # everything in int8 is no better than fc2 alone
    assert [r.sqnr_db for r in report.layers] == sorted(r.sqnr_db for r in report.layers)


def test_switches_all_on_is_the_fake_quant_model_and_all_off_the_float_model():
    model, example, cfg, calibration = zoo.get("digits_cnn")
    folded = capture(model, example, cfg, calibration, progress=False).graph_module
    captured = capture(model, example, cfg, calibration, progress=False, fold_weights=False)
    assert list(captured.seconds) == ["export", "prepare", "calibrate", "convert"]  # benchmarks/compile.py's split
    assert all(t >= 0 for t in captured.seconds.values())
    switched = captured.graph_module
    switches = add_switches(switched)
    layers = group_layers(switched)
    assert sorted(i for layer in layers for i in layer.points) == list(range(len(switches)))
    assert {layer.name for layer in layers} >= {"input", "conv1", "conv2", "fc1", "fc2"}
    x = zoo.held_out("digits_cnn").inputs[0][:16]
    with torch.no_grad():
        for i in range(16):
            torch.testing.assert_close(switched(x[i:i + 1]), folded(x[i:i + 1]), rtol=0, atol=0)
        for s in switches:
            s.on = False
        torch.testing.assert_close(torch.cat([switched(x[i:i + 1]) for i in range(16)]), model(x),
                                   rtol=1e-4, atol=1e-4)


class MixesBatch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=0, keepdim=True)


def test_batch_agnostic_tells_models_that_mix_the_batch():
    samples = [(torch.randn(1, 3, generator=G),) for _ in range(4)]
    assert batch_agnostic(nn.Linear(3, 2).eval(), samples)
    assert not batch_agnostic(MixesBatch(), samples)


def test_stacked_measurement_matches_one_input_at_a_time():
    """Calibration stacked into one forward ranks as batch 1 does. Min/max observers see the same values up
    to float32 rounding (a batched conv may round a last bit differently and move a scale by an ulp), so
    SQNRs agree to 0.1 dB (measured: within 0.02) and accuracies to one input."""
    model, example, cfg, calibration = zoo.get("digits_cnn")
    data = zoo.held_out("digits_cnn")
    stacked = qlower.sensitivity(model, example, cfg, calibration, data, limit=48, progress=False)
    import qlower.verification.sensitivity as sensitivity

    original = sensitivity.batch_agnostic
    sensitivity.batch_agnostic = lambda model, samples: False
    try:
        alone = qlower.sensitivity(model, example, cfg, calibration, data, limit=48, progress=False)
    finally:
        sensitivity.batch_agnostic = original
    a = {(r.name, r.op): r.sqnr_db for r in alone.layers}
    for r in stacked.layers:
        assert r.sqnr_db == pytest.approx(a[(r.name, r.op)], abs=0.1), r
    assert abs(stacked.int8_accuracy - alone.int8_accuracy) <= 1 / 48 and stacked.fp32_accuracy == alone.fp32_accuracy


def test_sensitivity_refuses_dynamic_float_and_no_inputs():
    model, example, _, _ = zoo.get("digits_cnn")
    for quant in (None, qlower.QuantConfig(mode="dynamic")):
        with pytest.raises(ConfigError, match="static"):
            qlower.sensitivity(model, example, quant, progress=False)
    for limit in (0, -3, 2.5):
        with pytest.raises(ConfigError, match="limit"):
            qlower.sensitivity(model, example, limit=limit, progress=False)


def test_cli_sensitivity_json_and_plot(capsys, tmp_path):
    code = main(["sensitivity", "zoo:digits_cnn", "--limit", "24", "--top", "3",
                 "--json", str(tmp_path / "s.json"), "--plot", str(tmp_path / "s.png")])
    out, _ = capsys.readouterr()
    assert code == 0, out
    result = json.loads((tmp_path / "s.json").read_text())
    sqnrs = [row["sqnr_db"] for row in result["layers"]]
    assert sqnrs == sorted(sqnrs) and result["inputs"] == 24
    assert len([line for line in out.splitlines() if line.strip()[:1].isdigit()]) == 3
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
