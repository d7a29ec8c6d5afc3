"""qlower.verify: per-layer comparison through every stage, a broken lowering caught, the HTML report."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import qlower
from qlower import zoo
from qlower.backends.tosa import lowering as tosa_lowering
from qlower.verify import verify_program


@pytest.fixture(scope="module")
def tiny():
    return zoo.get("tiny_cnn", size=16)


def _compile(tiny, target):
    model, example, quant, calib = tiny
    return qlower.compile(model, example, target=target, quant=quant, calibration=calib, progress=False, trace=True)


def test_reference_report_covers_every_layer_within_one_step(tiny):
    model, example, quant, calib = tiny
    report = qlower.verify(model, example, target="reference", quant=quant, calibration=calib, progress=False)
    assert report.ok, report.problems
    convs = [r for r in report.layers if "conv" in r.op]
    assert len(convs) >= 2 and len(report.layers) >= 5
    for r in report.layers:
        assert r.ref_vs_fake_quant is not None, f"{r.value} has no PyTorch counterpart"
        assert r.isolated_vs_fake_quant is not None, f"{r.value} could not be isolated"
        assert r.isolated_vs_fake_quant.max_steps <= 1
        assert r.target_vs_ref.max_steps == 0
    # quantization noise is small: every layer keeps a healthy SQNR against fp32
    assert min(r.ref_vs_fake_quant.sqnr_db for r in report.layers) > 20


@pytest.mark.slow
def test_deep_network_drift_is_amplification_not_semantics():
    """A random MobileNetV2 drifts many steps end to end, yet every layer alone is within 1 step."""
    model, example, quant, calib = zoo.get("mobilenet_v2", size=32)
    prog = qlower.compile(model, example, target="reference", quant=quant, calibration=calib, progress=False)
    report = verify_program(prog, [example])
    assert report.ok, report.problems
    isolated = [r.isolated_vs_fake_quant for r in report.layers]
    assert all(c is not None and c.max_steps <= 1 for c in isolated)
    assert max(r.ref_vs_fake_quant.max_steps for r in report.layers) > 1  # the drift this test is about


def test_tosa_report_looks_inside_the_partition(tiny):
    prog = _compile(tiny, "tosa-1.0+int")
    report = verify_program(prog, [tiny[1]])
    assert report.ok, report.problems
    inside = [r for r in report.layers if r.inside_partition]
    assert len(inside) >= 4
    assert all(r.target_vs_ref is not None and r.target_vs_ref.max_steps == 0 for r in inside)
    assert report.partitions and report.partitions[0]["backend"] == "tosa"


def test_a_broken_rescale_lowering_is_caught_at_its_layer(tiny, monkeypatch):
    reference_prog = _compile(tiny, "tosa-1.0+int")
    rescales = [op for op in reference_prog.source.ops if op.kind == "rescale" and op.operands[0].dtype.itemsize == 4]
    victim = rescales[1].results[0]  # the second conv's requantization
    original = tosa_lowering.LOWERINGS["rescale"]

    def flipped_rounding(lw, op):
        if op.results[0].name != victim.name:
            return original(lw, op)
        # the same rescale with TFLite-style double rounding instead of TOSA single rounding
        src, out = op.operands[0].type.quant, op.attrs["out"]
        mult = tosa_lowering.requant.requantize_ratio(np.asarray(src.scale), out.scale[0])
        y = lw.rescale(lw.t(op.operands[0]), mult, src.zero_point[0], out.zero_point[0],
                       tosa_lowering.tosa_dtype(out.dtype), double_round=True)
        return lw.clamp(y, out.qmin, out.qmax)

    monkeypatch.setitem(tosa_lowering.LOWERINGS, "rescale", flipped_rounding)
    broken = _compile(tiny, "tosa-1.0+int")
    # many inputs so that some value lands where the two roundings disagree
    rng = np.random.default_rng(0)
    shape = tuple(tiny[1][0].shape)
    reports = [verify_program(broken, [(rng.standard_normal(shape).astype(np.float32) * 2,)]) for _ in range(6)]
    failing = [r for r in reports if not r.ok]
    assert failing, "flipping one rescale's rounding went unnoticed"
    first = next(r for r in failing[0].layers if r.target_vs_ref and r.target_vs_ref.max_steps > 0)
    assert first.value == victim.name or first.op == victim.origin.node
    assert f"first diverges from the reference at %{first.value}" in failing[0].problems[0]


def test_html_report_renders_in_a_real_browser(tiny, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is needed for this test (.ci/run installs Debian's chromium)"
    prog = _compile(tiny, "tosa-1.0+int")
    report = verify_program(prog, [tiny[1]])
    page = report.write_html(tmp_path / "report.html")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert "verdict: <b>OK</b>" in dom
    assert dom.count("<tr class=") == len(report.layers)
    assert dom.count("data:image/png;base64,") == 2
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri()],
                   capture_output=True, timeout=120)
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)
    # the page is not blank: the plots put many distinct colours on it
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50
