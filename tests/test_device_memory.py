"""What the device must hold (issue 27 item 2): the backends' cost reports state it in the contract's
memory kinds, and ``explain()``, the verification report (table, JSON, HTML) and the program show it.

TFLM's arena is the smallest its interpreter allocates and runs the model in (one byte less fails);
Ethos-U's figures are Vela's (its scratch regions, read-only region and command stream, peak SRAM).
"""

import json

import numpy as np
import pytest
import tflite
import torch

import qlower
from qlower import zoo
from qlower.backends.ethosu.cost import vela_cost
from qlower.backends.registry import cost_report
from qlower.backends.tflm import runner
from qlower.backends.tflm.backend import MODEL_BLOB
from qlower.contract import Payload
from qlower.errors import ExecutionError
from qlower.reference import run_graph


def _tiny(target: str):
    model, example, quant, calibration = zoo.get("tiny_cnn", size=16)
    return model, example, quant, calibration


def test_the_tflm_arena_is_the_smallest_that_runs_and_explain_shows_it():
    model, example, quant, calibration = _tiny("tflm")
    prog = qlower.compile(model, example, target="tflm", quant=quant, calibration=calibration, progress=False)
    (part,) = prog.partitions
    data = part.payload.blobs[MODEL_BLOB]
    cost = cost_report(part.payload)
    assert cost.cycles is None and cost.device_memory == {"arena": part.payload.meta["arena_bytes"],
                                                          "flash": len(data)}
    arena = cost.device_memory["arena"]
    zeros = [np.zeros(tuple(example[0].shape), np.float32)]
    runner.run(data, arena, zeros)
    for smaller in (arena - 1, arena - 16):
        with pytest.raises(ExecutionError, match="TFLM"):   # refused, or its crash in the worker
            runner.run(data, smaller, zeros)
    assert prog.device_memory() == {part.name: ("TFLM's interpreter", {"arena": arena, "flash": len(data)})}
    assert f"device memory (TFLM's interpreter): arena {arena:,} B, flash {len(data):,} B" in prog.explain()


def test_the_verification_report_shows_the_device_memory(tmp_path):
    model, example, quant, calibration = _tiny("tflm")
    report = qlower.verify(model, example, target="tflm", quant=quant, calibration=calibration, progress=False)
    (row,) = report.memory
    assert row["estimator"] == "TFLM's interpreter" and row["arena"] > 0 and row["flash"] > 0
    data = json.loads(report.to_json())
    assert data["memory"] == [row] and data["memory_total"] == {"arena": row["arena"], "flash": row["flash"]}
    assert f"arena {row['arena']:,}, flash {row['flash']:,}" in report.table()
    html = report.write_html(tmp_path / "r.html").read_text()
    assert "id='memory'" in html and f"{row['arena']:,}" in html
    # a target whose backend states no memory shows none
    assert qlower.verify(model, example, target="tosa-1.0+int", quant=quant, calibration=calibration,
                         progress=False).memory == []


def test_vela_s_figures_are_the_contract_s_memory_kinds():
    meta = {"perf": {"total_cycles": 10, "npu_cycles": 8,
                     "memories": {"Sram": {"peak_bytes": 700}, "OffChipFlash": {"peak_bytes": 900}}},
            "scratch_size": 600, "scratch_fast_size": 100, "read_only_bytes": 900, "command_stream_bytes": 50}
    cost = vela_cost(Payload("ethos-u", "ethos-u55-128", {}, (), (), meta=meta))
    assert cost.device_memory == {"arena": 700, "flash": 950, "sram": 700}
    assert cost.memory_bytes["scratch"] == 600 and cost.memory_bytes["command_stream"] == 50
    meta["perf"]["memories"]["Sram"]["peak_bytes"] = -1
    with pytest.raises(ValueError, match="Sram"):
        vela_cost(Payload("ethos-u", "ethos-u55-128", {}, (), (), meta=meta))


@pytest.mark.slow
def test_an_ethos_u_program_shows_vela_s_memory():
    model, example, quant, calibration = _tiny("ethos-u55-128")
    prog = qlower.compile(model, example, target="ethos-u55-128", quant=quant, calibration=calibration,
                          progress=False)
    (part,) = prog.partitions
    meta = part.payload.meta
    _, memory = prog.device_memory()[part.name]
    assert memory == {"arena": meta["scratch_size"] + meta["scratch_fast_size"],
                      "flash": meta["read_only_bytes"] + meta["command_stream_bytes"],
                      "sram": meta["perf"]["memories"]["Sram"]["peak_bytes"]}
    assert f"device memory (Vela): arena {memory['arena']:,} B" in prog.explain()


class _GlobalMean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 48, 3, padding=1)
        self.fc = torch.nn.Linear(48, 4)

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1), 1))


@pytest.mark.parametrize("h, w", [(6, 5), (16, 17)])
def test_a_global_mean_on_tflm_sums_its_plane_in_int16_or_as_one_float_channel_bit_exact(h, w, monkeypatch):
    """A mean left in the frontend's form (tflm.mean rewrites it into one MEAN where it can: switched off here)
    is summed on TFLM: sums that stay in int16 (6x5 codes) are TFLM's int16 SUM of an int16 copy (half a float32
    one); wider ones (16x17 x 128 > 2**15) a float32 depthwise convolution -- TFLM keeps per-channel
    requantization data for every depthwise convolution, float too, so the plane's sums are one channel
    of h*w rows (ones of h*w floats), not c channels; the int8 codes are cast to float32 directly."""
    from qlower.backends.tflm.backend import TflmBackend
    from qlower.backends.tflm.mean import TflmMean

    kept = TflmBackend.rewrites
    monkeypatch.setattr(TflmBackend, "rewrites",
                        lambda self, target: tuple(r for r in kept(self, target) if not isinstance(r, TflmMean)))
    model = _GlobalMean().eval()
    gen = torch.Generator().manual_seed(h)
    example = (torch.randn(1, 3, h, w, generator=gen),)
    prog = qlower.compile(model, example, target="tflm", progress=False,
                          calibration=[(torch.randn(1, 3, h, w, generator=gen),) for _ in range(4)])
    (part,) = prog.partitions
    assert prog.graph.count_ops() == {"delegate": 1}
    m = tflite.Model.GetRootAsModel(part.payload.blobs[MODEL_BLOB], 0)
    sg = m.Subgraphs(0)
    filters, sums, writers = [], [], {}
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        writers[op.Outputs(0)] = op
        code = m.OperatorCodes(op.OpcodeIndex()).BuiltinCode()
        if code == tflite.BuiltinOperator.SUM:
            sums.append(sg.Tensors(op.Inputs(0)).Type())
        if code == tflite.BuiltinOperator.DEPTHWISE_CONV_2D:
            filters.append(sg.Tensors(op.Inputs(1)).ShapeAsNumpy().tolist())
            cast = writers[op.Inputs(0)]   # the int8 codes straight to float32: no int32 copy in the arena
            assert sg.Tensors(cast.Inputs(0)).Type() == tflite.TensorType.INT8
    if h * w * 128 < 2**15:
        assert filters == [] and sums and set(sums) == {tflite.TensorType.INT16}
    else:
        assert filters == [[1, h * w, 1, 1]] and sums == []
    rng = np.random.default_rng(0)
    for scale in (2, 1000):   # 1000: every code at an end
        x = rng.normal(size=(1, 3, h, w)).astype(np.float32) * scale
        np.testing.assert_array_equal(prog.run(x)[0], run_graph(prog.source, [x])[0])


def test_the_cli_writes_the_operators_tflm_must_register_beside_the_tflite(tmp_path):
    from qlower import cli
    from qlower.backends.litert.verify import builtin_counts
    from qlower.backends.tflm.resolver import method

    path = tmp_path / "tiny.tflite"
    assert cli.main(["compile", "zoo:tiny_cnn", "--size", "16", "--target", "tflm", "--format", "tflite",
                     "-o", str(path)]) == 0
    header = (tmp_path / "tiny_ops.h").read_text()
    ops = builtin_counts(path.read_bytes())
    assert f"MicroMutableOpResolver<{len(ops)}>" in header
    assert [line.strip() for line in header.splitlines() if "resolver.Add" in line] == [
        f"TF_LITE_ENSURE_STATUS(resolver.{method(op)}());" for op in sorted(ops)]
    assert "resolver.AddConv2D()" in header and "resolver.AddFullyConnected()" in header
    assert [method(op) for op in ("DEPTHWISE_CONV_2D", "PADV2", "MAX_POOL_2D", "ethos-u")] == [
        "AddDepthwiseConv2D", "AddPadV2", "AddMaxPool2D", "AddEthosU"]
