"""Target knowledge lives in backends/ (issue 26): the modules every backend plugs into name no
backend, no target and no target's tool; a backend declares what they need (execution kinds,
metadata checks, exporters, a cost report) through the contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import qlower
from qlower.backends.registry import _NPU_TARGETS

PACKAGE = Path(qlower.__file__).parent
BACKEND_NAMES = {module.rsplit(".", 1)[1] for module, _ in _NPU_TARGETS.values()} | {"ethos-u"}
TOOLS = {"vela", "ethos", "xnnpack", "lavapipe"}


def target_words(text: str) -> set[str]:
    """The backend names, target names and target tools ``text`` mentions (as words)."""
    words = BACKEND_NAMES | TOOLS | set(_NPU_TARGETS)
    return {w for w in words if re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", text.lower())}


def test_the_probe_sees_target_names():
    assert target_words('if payload.backend == "tosa": ...  # Vela\'s estimate') == {"tosa", "vela"}
    assert target_words("ethos-u55-128") >= {"ethos-u55-128"} and target_words("tosa_meta") == set()


@pytest.mark.parametrize("module", ["contract.py", "program/program.py", "verification/stages.py",
                                    "verification/report.py", "verification/html.py", "verification/accuracy.py"])
def test_shared_modules_hold_no_target_knowledge(module):
    assert target_words((PACKAGE / module).read_text()) == set()


def _graph():
    from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph

    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, QuantSpec.per_tensor(0.1, 1)))
    y = b.op("max_pool2d", x, kernel=(2, 2), stride=(2, 2), pad=(0, 0, 0, 0), name="y")
    return verify_graph(b.build([y]))


@pytest.fixture(scope="module")
def programs():
    from qlower.api import lower_graph

    return {t: lower_graph(_graph(), t) for t in ("reference", "litert", "tflm")}


def test_export_writes_what_the_targets_backend_declares(programs, tmp_path):
    from qlower.backends.litert import export_tflite
    from qlower.backends.tflm import export_tflm

    def written(target):
        with open(programs[target].export(tmp_path / f"{target}.tflite"), "rb") as f:
            return f.read()

    src = {t: p.source for t, p in programs.items()}
    assert written("tflm") == export_tflm(src["tflm"], description="qlower program for tflm")
    assert written("litert") == export_tflite(src["litert"], description="qlower program for litert")
    # a target that declares no tflite exporter gets the one every program gets
    assert written("reference") == export_tflite(src["reference"], description="qlower program for reference")


def test_a_backend_adds_a_format_by_declaring_it(programs, tmp_path, monkeypatch):
    from qlower.backends.tflm import TflmBackend

    monkeypatch.setattr(TflmBackend, "exporters",
                        classmethod(lambda cls, target: {"probe": lambda src, payloads, text: text.encode()}))
    assert programs["tflm"].export_formats() == ["probe", "tflite"]
    assert programs["reference"].export_formats() == ["tflite"]
    path = programs["tflm"].export(tmp_path / "m.probe", format="probe")
    assert open(path, "rb").read() == b"qlower program for tflm"
    with pytest.raises(ValueError, match="unknown export format 'probe'; formats: tflite"):
        programs["reference"].export(tmp_path / "r.probe", format="probe")
    assert not (tmp_path / "r.probe").exists()


def test_verification_reads_the_cost_report_the_backend_declares(monkeypatch):
    """The per-operator cycles and the estimator's name reach the report from ``Backend.cost_report``
    alone (a TOSA program, whose backend estimates nothing, given a probe's report)."""
    from qlower import zoo
    from qlower.backends.tosa import TosaBackend
    from qlower.contract import CostReport, LayerCost

    model, example, quant, calib = zoo.get("tiny_cnn", size=16)
    report = qlower.verify(model, example, target="tosa-1.0+int", quant=quant, calibration=calib, progress=False)
    assert report.cycles == [] and report.cost_estimator == ""
    probe = CostReport("Probe", 30, 20, {"scratch": 64}, (LayerCost("CONV", 30, 20, value="v", source="m.py:1"),))
    monkeypatch.setattr(TosaBackend, "cost_report", classmethod(lambda cls, payload: probe))
    report = qlower.verify(model, example, target="tosa-1.0+int", quant=quant, calibration=calib, progress=False)
    assert report.cost_estimator == "Probe" and '"cost_estimator": "Probe"' in report.to_json()
    assert {(r["operator"], r["value"], r["op_cycles"], r["npu_cycles"]) for r in report.cycles} == {("CONV", "v", 30, 20)}
    accuracy = qlower.measure_accuracy(qlower.compile(model, example, target="tosa-1.0+int", quant=quant,
                                                      calibration=calib, progress=False),
                                       (example[0].repeat(2, 1, 1, 1), [0, 1]), progress=False)
    parts = accuracy.cycles // 30
    assert parts >= 1 and accuracy.cycles == 30 * parts and "Probe estimate: " in accuracy.table()


def test_the_exporting_backend_says_what_the_file_is(programs, monkeypatch):
    from qlower.backends.tflm import TflmBackend

    assert programs["tflm"].export_note() == ("TFLite, for TFLite Micro: bit-exact with the reference interpreter "
                                              "under TFLM's reference kernels")
    assert programs["litert"].export_note().startswith("TFLite, for LiteRT: bit-exact with the reference")
    assert programs["reference"].export_note().startswith("TFLite, for LiteRT: ")   # litert writes it
    monkeypatch.setattr(TflmBackend, "export_note", classmethod(lambda cls, target, format, source: "probe"))
    assert programs["tflm"].export_note("tflite") == "probe"
    with pytest.raises(ValueError, match="unknown export format 'onnx'"):
        programs["tflm"].export_note("onnx")
