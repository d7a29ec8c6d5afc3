"""The graph view (issue 32): Model Explorer's graph of a program file, checked against the program
itself on every target, the overlays against the verification report, and the page in Chromium."""

import json
import math
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from model_explorer.utils import convert_adapter_response

import qlower
from qlower.errors import QlowerError
from qlower.view.graph import HOST, partition_group
from qlower.view.main import QlowerProgramAdapter
from qlower.view.overlays import overlays_for, report_overlays
from qlower.view.server import ViewError, view_config

TARGETS = ["reference", "cpu", "tosa-1.0+int", "ethos-u55-128", "ethos-u85-256", "vgf+int", "litert", "tflm"]


class _WithFallback(torch.nn.Module):
    """Convolutions around an op without an integer rule (cumsum: a float fallback on the host)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.head(torch.cumsum(y, dim=3)) + y[:, :4]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    return _WithFallback().eval(), (x,), [(x,), (x * 0.7,)]


def _compile(model, target):
    m, example, calibration = model
    return qlower.compile(m, example, target=target, calibration=calibration)


def _graph(program, tmp_path):
    path = tmp_path / "prog.qlp"
    program.save(path)
    return convert_adapter_response(QlowerProgramAdapter().convert(str(path), {}))["graphs"][0]


def _attr(items, key):
    return next((kv["value"] for kv in items if kv["key"] == key), None)


@pytest.mark.parametrize("target", TARGETS)
def test_the_graph_is_the_program(model, target, tmp_path):
    prog = _compile(model, target)
    graph = _graph(prog, tmp_path)
    nodes = {n["id"]: n for n in graph["nodes"]}
    source = prog.source
    ops = [op for op in source.ops if op.kind != "constant"]
    assert len(nodes) == len(graph["nodes"])                   # ids are unique
    assert set(nodes) == ({v.name for v in source.inputs} | {op.results[0].name for op in ops}
                          | {f"output_{i}" for i in range(len(source.outputs))})
    producer = {r: (op, i) for op in source.ops for i, r in enumerate(op.results)}
    in_partition = {name: p for p in prog.partitions for name in p.values}
    reasons = {d.op.results[0].name: d.reason for d in prog.decisions}
    for op in ops:
        node = nodes[op.results[0].name]
        assert node["label"] == (op.kind if op.kind != "aten" else f"{op.attrs['target'].split('.')[1]} (float)")
        # edges: every operand an op or an input computes, in order; constants listed, not drawn
        drawn = [v for v in op.input_values() if v not in producer or producer[v][0].kind != "constant"]
        expected = [(v.name if v not in producer else producer[v][0].results[0].name,
                     "0" if v not in producer else str(producer[v][1])) for v in drawn]
        assert [(e["sourceNodeId"], e["sourceNodeOutputId"]) for e in node["incomingEdges"]] == expected
        constants = {kv["key"][len("constant "):] for kv in node["attrs"] if kv["key"].startswith("constant ")}
        assert constants == {v.name for v in op.input_values() if v in producer and producer[v][0].kind == "constant"}
        # where it runs: inside its partition's group, or outside every group with the backend's reason
        name = op.results[0].name
        if name in in_partition:
            assert node["namespace"].split("/")[0] == partition_group(in_partition[name])
            assert _attr(node["attrs"], "runs on") == partition_group(in_partition[name])
        else:
            assert node["namespace"] == "" and _attr(node["attrs"], "runs on") == HOST
            assert _attr(node["attrs"], "why on the host") == (reasons.get(name) or "-")
        assert (_attr(node["attrs"], "float fallback") is not None) == (op.kind == "aten")
        # each output's type and quantization
        for meta, r in zip(node["outputsMetadata"], op.results, strict=True):
            assert _attr(meta["attrs"], "tensor_shape") == f"{r.dtype.value}[{'x'.join(map(str, r.shape))}]"
            if r.quant is not None and len(r.quant.scale) == 1:
                assert float(_attr(meta["attrs"], "scale")) == pytest.approx(r.quant.scale[0], rel=1e-5)
                assert int(_attr(meta["attrs"], "zero_point")) == r.quant.zero_point[0]
    assert any(op.kind == "aten" for op in ops), "the model's cumsum is a float fallback on every target"
    groups = {c["namespaceRegex"] for c in graph.get("groupNodeConfigs") or []}
    assert len(groups) == len({partition_group(p) for p in prog.partitions if p.values})
    for i, v in enumerate(source.outputs):
        edge = nodes[f"output_{i}"]["incomingEdges"][0]
        assert edge["sourceNodeId"] == (producer[v][0].results[0].name if v in producer else v.name)


def test_overlays_carry_the_reports_numbers(model, tmp_path):
    prog = _compile(model, "ethos-u55-128")
    report = qlower.verify_program(prog, [model[1]])
    by_name = {o.name: o.values for o in overlays_for(prog, report)}
    steps = by_name["steps end to end (reference vs fake-quant)"]
    expected = {r.value: r.ref_vs_fake_quant.max_steps for r in report.layers
                if r.ref_vs_fake_quant is not None and not math.isnan(r.ref_vs_fake_quant.max_steps)}
    assert steps == expected and steps
    exact = by_name["exact % (target vs reference)"]
    assert exact == {r.value: 100 * r.target_vs_ref.exact_share for r in report.layers if r.target_vs_ref is not None}
    # the same from the report's JSON (what qlower verify --json writes)
    from_json = {o.name: o.values for o in report_overlays(json.loads(report.to_json()))}
    assert from_json["steps end to end (reference vs fake-quant)"] == steps
    # Vela's per-layer cycles, summed per value, sum to what Vela reports for the partition's layers
    cycles = by_name["cycles (Vela's estimate per layer)"]
    rows = [r for p in prog.partitions for r in p.payload.meta["per_layer"] if r["value"]]
    assert sum(cycles.values()) == sum(r["op_cycles"] for r in rows) > 0
    fallback = by_name["float fallback: elements computed in float"]
    assert fallback == {op.results[0].name: sum(r.type.numel for r in op.results)
                        for op in prog.graph.ops if op.kind == "aten"}
    # everything the browser reads must be strict JSON (no NaN / Infinity)
    for overlay in overlays_for(prog, report):
        json.loads(overlay.node_data("prog.qlp").to_json_string(), parse_constant=_refuse_constant)
        assert set(overlay.values) <= {n["id"] for n in _graph(prog, tmp_path)["nodes"]}


def _refuse_constant(name):
    raise AssertionError(f"{name} in node data")


def test_a_corrupt_file_or_report_is_refused_before_the_server_starts(model, tmp_path):
    prog = _compile(model, "cpu")
    path = tmp_path / "prog.qlp"
    prog.save(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    bad = tmp_path / "bad.qlp"
    bad.write_bytes(bytes(data))
    with pytest.raises(QlowerError):
        view_config(bad)
    not_a_report = tmp_path / "r.json"
    not_a_report.write_text('{"target": "cpu"}')
    with pytest.raises(ViewError, match="not a qlower verification report"):
        view_config(path, str(not_a_report))
    with pytest.raises(ViewError, match="no program"):
        report = qlower.verify_program(prog, [model[1]])
        report.program = None
        report.view(open_browser=False)
    out = subprocess.run([sys.executable, "-m", "qlower.cli", "view", str(bad), "--no-browser"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "qlower" in out.stderr.lower() and "Traceback" not in out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_page_renders_the_graph_with_the_overlay(model, tmp_path):
    from qlower.testing.chromium import Chromium

    prog = _compile(model, "ethos-u55-128")
    path = tmp_path / "prog.qlp"
    prog.save(path)
    report_path = tmp_path / "report.json"
    report_path.write_text(qlower.verify_program(prog, [model[1]]).to_json())
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "qlower.cli", "view", str(path), "--report", str(report_path),
                               "--port", str(port), "--no-browser"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = None
        for line in server.stdout:
            if line.startswith(f"http://localhost:{port}/"):
                url = line.strip()
                break
        assert url, "qlower view printed no URL"
        with Chromium(width=1400, height=900) as browser:
            browser.open(url)
            text = browser.wait_for("document.body.innerText.includes('NODE DATA PROVIDERS') && "
                                    "document.body.innerText.includes('steps end to end') && "
                                    "document.body.innerText", timeout=120)
            nodes = len([op for op in prog.source.ops if op.kind != "constant"]) + 2
            assert f"{nodes} nodes" in text
            assert partition_group(prog.partitions[0]) in text       # the partition's group, at the root
            for name in ("cycles (Vela's estimate per layer)", "SQNR dB", "exact % (target vs reference)"):
                assert name in text
            shot = tmp_path / "view.png"
            browser.screenshot(shot)
        import matplotlib.image as mpimg

        pixels = (mpimg.imread(shot)[..., :3] * 255).round().astype(int)
        # the overlay paints nodes and cells in its colours: the "exact" green appears
        green = np.all(np.abs(pixels - np.array([0xA5, 0xD6, 0xA7])) <= 2, axis=-1)
        assert green.sum() > 200, "no node coloured by the overlay"
    finally:
        server.terminate()
        server.wait(timeout=30)
