"""qlower.verify: per-layer comparison through every stage, a broken lowering caught, the HTML report."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

import qlower
from qlower import zoo
from qlower.backends.tosa import lowering as tosa_lowering
from qlower.verification import verify_program


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
        # target reference runs the reference interpreter: nothing is compared with itself
        assert r.target_vs_ref is None
    assert not report.target_compared and all(o.target_vs_ref is None for o in report.outputs)
    assert "no other stage to compare it with" in report.table()
    # quantization noise is small: every layer keeps a healthy SQNR against fp32
    assert min(r.ref_vs_fake_quant.sqnr_db for r in report.layers) > 20


@pytest.mark.slow
def test_deep_network_reference_within_one_step_of_fake_quant():
    """A random MobileNetV2: every layer alone is within 1 step, and end to end too now that the fake-quant
    model adds the int32 biases deployment adds (the drift of many steps this test once showed came from
    the float bias at coarse accumulator scales, not from amplification)."""
    model, example, quant, calib = zoo.get("mobilenet_v2", size=32)
    prog = qlower.compile(model, example, target="reference", quant=quant, calibration=calib, progress=False)
    report = verify_program(prog, [example])
    assert report.ok, report.problems
    isolated = [r.isolated_vs_fake_quant for r in report.layers]
    assert all(c is not None and c.max_steps <= 1 for c in isolated)
    assert max(r.ref_vs_fake_quant.max_steps for r in report.layers) <= 1


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
    # many inputs so that some value lands where the two roundings disagree: one verify over all
    rng = np.random.default_rng(0)
    shape = tuple(tiny[1][0].shape)
    inputs = [(rng.standard_normal(shape).astype(np.float32) * 2,) for _ in range(6)]
    report = verify_program(broken, inputs)
    assert report.inputs == 6
    assert not report.ok, "flipping one rescale's rounding went unnoticed"
    first = next(r for r in report.layers if r.target_vs_ref and r.target_vs_ref.max_steps > 0)
    assert first.value == victim.name or first.op == victim.origin.node
    assert f"first diverges from the reference at %{first.value}" in report.problems[0]
    # each row is the worst case: no single input's report shows more steps than the merged one
    alone = [verify_program(broken, [x]) for x in inputs]
    worst = max(next(r for r in a.layers if r.value == first.value).target_vs_ref.max_steps for a in alone)
    assert first.target_vs_ref.max_steps == worst > 0
    assert first.target_vs_ref.exact_share == min(next(r for r in a.layers if r.value == first.value)
                                                  .target_vs_ref.exact_share for a in alone)


def test_verify_uses_every_input_tuple(tiny):
    """qlower.verify(inputs=[...]) runs every tuple: a program wrong only on the second one fails."""
    model, example, quant, calib = tiny
    prog = _compile(tiny, "cpu")
    good = tuple(example)
    other = (np.full(tuple(example[0].shape), 0.5, np.float32),)
    runner = prog.runner()
    original = runner.run

    def wrong_on_other(inputs):
        outs = original(inputs)
        if np.array_equal(np.asarray(inputs[0]), other[0]):
            outs[0] = outs[0] + 1.0
        return outs
    runner.run = wrong_on_other
    assert verify_program(prog, [good]).ok
    report = verify_program(prog, [good, other])
    assert not report.ok and report.inputs == 2
    assert "output 0: cpu is not bit-exact with the reference" in report.problems[-1]


def _break_a_host_step(plan, fused: bool):
    """Make one step of a CPU plan one code off (a fused one, or any step writing int8 codes other
    than a delegate call); the op-by-op kernels and the reference stay right."""
    import dataclasses

    i = next(i for i, step in enumerate(plan._fused_steps)
             if (len(step.ops) > 1 if fused else step.ops[-1].kind != "delegate"
                 and step.ops[-1].results[0].dtype.itemsize == 1))
    step = plan._fused_steps[i]

    def off_by_one(*args, _kernel=step.kernel):
        res = _kernel(*args)
        res = (res,) if not isinstance(res, tuple) else res
        return tuple(r if r.is_floating_point() else (r.to(torch.int32) + 1).clamp(-128, 127).to(r.dtype)
                     for r in res)
    plan._fused_steps[i] = plan._steps[i] = dataclasses.replace(step, kernel=off_by_one)
    return step


@pytest.mark.parametrize("target", ["cpu", "tosa-1.0+int"])
def test_verify_measures_the_kernels_that_run_runs(tiny, target):
    """Per-layer rows of host values come from the plan that ``prog.run`` executes (fused kernels
    included), never from the reference interpreter or op-by-op kernels: a bug only there is caught
    at its layer (a cpu fused kernel; a host op around a TOSA partition)."""
    prog = _compile(tiny, target)
    plan = prog.runner() if target == "cpu" else prog.runner()._cpu_plan()
    step = _break_a_host_step(plan, fused=target == "cpu")
    report = verify_program(prog, [tiny[1]])
    assert not report.ok
    broken = step.ops[-1].results[0]
    rows = [r for r in report.layers if r.target_vs_ref and r.target_vs_ref.max_steps > 0]
    # the first row off is the broken value's layer (the last int8 value of its PyTorch node)
    assert rows and rows[0].op == broken.origin.node, (rows[:1], broken)


@pytest.mark.parametrize("perm, shape", [((1, 0), (10, 10)), ((2, 0, 1), (6, 6, 6)), ((0, 2, 1), (2, 5, 5)),
                                         ((1, 0), (4, 9))])
def test_permutes_are_matched_by_what_computes_them_not_by_shape(perm, shape):
    """A square permute's result has its input's shape: it must still be compared with the
    permuted tensor (it used to be matched with the input, 190+ steps apart)."""
    class Permute(torch.nn.Module):
        def forward(self, x):
            return torch.permute(x, perm)

    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(3)),)
    report = qlower.verify(Permute(), x, target="cpu", progress=False)
    assert report.ok, report.problems
    compared = [r for r in report.layers if r.ref_vs_fake_quant is not None]
    assert compared and all(r.ref_vs_fake_quant.max_steps == 0 for r in compared)
    assert report.outputs[0].ref_vs_fake_quant.max_steps == 0


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


class _SplitNorm(torch.nn.Module):
    """unbind (several float parts: each its own layer) and LayerNorm (native_layer_norm returns a
    tuple, of which the graph reads the first)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(5)
        self.out = torch.nn.Linear(5, 4)

    def forward(self, x):
        a, b = self.fc(x).reshape(2, 5, 2, 8).unbind(2)   # the parts go straight into a matmul, as in attention
        return self.out(self.norm(a @ b.transpose(1, 2)))


def test_nodes_returning_several_tensors_are_matched_to_the_right_part():
    """A value of unbind's part k must not be compared with part 0 (the isolated comparison of the
    layers after it then fed them the wrong tensor: 120 steps on timm_vit_tiny), and LayerNorm's
    value is its first result's."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    report = qlower.verify(_SplitNorm().eval(), (x,), calibration=[(x,), (x * 1.3,)], progress=False)
    assert report.ok, report.problems
    norm = [r for r in report.layers if "layer_norm" in r.op]
    assert norm and all(r.ref_vs_fake_quant is not None for r in norm)
    for r in report.layers:
        if r.isolated_vs_fake_quant is not None:
            assert r.isolated_vs_fake_quant.max_steps <= 1, (r.value, r.op, r.isolated_vs_fake_quant)


def test_frontend_agreement_fails_when_few_layers_find_their_counterpart(tiny, monkeypatch):
    """The frontend tests' comparison counts the layers it compared: a mapping that finds one layer
    of many must fail, not pass on the one it found."""
    from qlower.frontend import capture_and_import
    from qlower.testing import frontend
    from qlower.verification import stages

    model, example, quant, calib = tiny
    result = capture_and_import(model, example, quant, calib, progress=False)
    agreement = frontend.fake_quant_agreement(result, [example])
    assert agreement.counterpart_share == 1.0 and agreement.layers.total > 0
    capture = stages.capture_torch_values

    def lose_all_but_one(module, inputs):
        values, codes = capture(module, inputs)
        keep = sorted(values)[:1]
        return {k: values[k] for k in keep}, {}
    monkeypatch.setattr(stages, "capture_torch_values", lose_all_but_one)
    with pytest.raises(AssertionError, match="too few layers compared"):
        frontend.fake_quant_agreement(result, [example])


def test_npu_cycles_per_layer_reach_explain_and_the_report(tiny, tmp_path):
    """Vela's per-operator cycles name the IR value and the model's source line; explain() lists the
    five costliest, and the verification report carries them into its HTML chart."""
    model, example, quant, calib = tiny
    prog = _compile(tiny, "ethos-u85-256")
    meta = prog.partitions[0].payload.meta
    rows = meta["per_layer"]
    convs = [r for r in rows if r["operator"] == "Conv2D" and r["value"]]
    assert len(convs) >= 3 and all("qlower/zoo/cnn.py:" in r["source"] for r in convs)
    assert sum(r["op_cycles"] for r in rows) <= meta["perf"]["total_cycles"]
    text = prog.explain()
    top = sorted(rows, key=lambda r: -r["op_cycles"])[:5]
    assert f"top 5 of {len(rows)} operators by cycles:" in text
    positions = [text.index(f"%{r['value']} at {r['source']}") for r in top if r["value"]]
    assert positions == sorted(positions)   # costliest first
    report = qlower.verify(model, example, target="ethos-u85-256", quant=quant, calibration=calib, progress=False)
    assert [(r["value"], r["op_cycles"]) for r in report.cycles] == [(r["value"], r["op_cycles"]) for r in rows]
    assert "Cycles per layer" in report.write_html(tmp_path / "r.html").read_text()
    reference = qlower.verify(model, example, target="reference", quant=quant, calibration=calib, progress=False)
    assert reference.cycles == [] and "Cycles per layer" not in reference.write_html(tmp_path / "s.html").read_text()


def test_a_dynamic_model_reports_no_code_steps_it_cannot_measure():
    """Codes quantized at run time have their scale in the run, not in their type: the report shows no
    steps for them (it showed 124 "steps" against scale 1), and a float output without a step no "nan";
    the program still agrees with fake-quant at the output."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5)).eval()
    x = torch.randn(1, 3, 8, 8)
    report = qlower.verify(model, (x,), target="cpu", quant=qlower.QuantConfig(mode="dynamic"), progress=False)
    dynamic = [r for r in report.layers if "dynamic" in r.type]
    assert dynamic and all(r.ref_vs_fake_quant is None and r.isolated_vs_fake_quant is None for r in dynamic)
    assert all(r.target_vs_ref is None or r.target_vs_ref.max_steps == 0 for r in dynamic)
    assert report.ok and "nan" not in report.table()
    (out,) = report.outputs
    assert out.ref_vs_fake_quant.max_abs <= 1e-5 * out.ref_max_abs
