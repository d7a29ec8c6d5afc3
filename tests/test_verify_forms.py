"""Verification says which reference it used (issue 26): a target rewritten by its backend is
compared with the reference interpreter on its own form (0 steps) and that form with the canonical
program (the ``reference`` target's), per layer and per output, naming the rewrites; ``explain()``
lists the rewrites with their bounds and the program file keeps them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import qlower
from qlower.errors import InvalidProgramError
from qlower.ir import print_graph
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.verification import verify_program


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        return self.fc((y + self.c2(y)).mean((2, 3)))


@pytest.fixture(scope="module")
def litert_program():
    torch.manual_seed(0)
    model, x = Residual().eval(), torch.randn(1, 3, 8, 8)
    calibration = [(torch.randn(1, 3, 8, 8),) for _ in range(4)]
    prog = qlower.compile(model, (x,), target="litert", calibration=calibration, progress=False, trace=True)
    prog.meta["test_calibration"] = calibration   # (not JSON: a program file leaves it out)
    return model, x, prog


def test_the_program_keeps_both_forms_and_explains_the_rewrites(litert_program):
    _, _, prog = litert_program
    assert prog.canonical is not None and prog.canonical is not prog.source
    assert [r.name for r in prog.rewrites] == ["litert.tflite_add", "litert.kernel_rounding"]
    text = prog.explain()
    assert "litert.tflite_add: within 1 step per rewritten op" in text
    assert "litert.kernel_rounding: within 1 step per rewritten op" in text
    names = {v.name for v in prog.source.values()}
    assert all(v in names for r in prog.rewrites for v in r.values)


def test_a_program_file_keeps_the_rewrites_and_refuses_forged_ones(litert_program):
    _, _, prog = litert_program
    loaded = program_from_bytes(program_to_bytes(prog))
    assert loaded.rewrites == prog.rewrites
    assert loaded.canonical_graph is None   # the file keeps the form; the canonical is the model's
    assert "litert.kernel_rounding" in loaded.explain()
    meta = dict(prog.meta, rewrites=[{"name": "x", "steps": -1, "what": "", "values": []}])
    forged = type(prog)(prog.target, prog.graph, prog.source, prog.partitions, prog.decisions, meta)
    with pytest.raises(InvalidProgramError, match="rewrite #0"):
        program_from_bytes(program_to_bytes(forged))


def test_the_report_compares_the_form_with_the_canonical_program(litert_program, tmp_path):
    model, x, prog = litert_program
    report = verify_program(prog, [(x,), (torch.randn(1, 3, 8, 8),)])
    assert report.ok, report.problems
    assert report.rewritten and [r["name"] for r in report.rewrites] == ["litert.tflite_add", "litert.kernel_rounding"]
    compared = [r for r in report.layers if r.form_vs_canonical is not None]
    assert compared and all(r.target_vs_ref.max_steps == 0 for r in compared)
    assert any(r.form_bound == 1 for r in report.layers)   # a rewritten layer shows its bound
    assert all(r.form_alone_steps is None or r.form_alone_steps <= (r.form_bound or 0) for r in report.layers)
    assert all(o.form_vs_canonical is not None for o in report.outputs)
    # the end-to-end numbers are those of a separately compiled reference program
    reference = qlower.compile(model, (x,), target="reference", calibration=prog.meta["test_calibration"],
                               progress=False)
    ours, theirs = prog.run(x)[0], reference.run(x)[0]
    step = prog.source.producers()[prog.source.outputs[0]].operands[0].quant.scale[0]
    drift = report.outputs[0].form_vs_canonical.max_steps
    assert drift >= round(float(np.abs(ours - theirs).max()) / step, 2)
    assert (drift > 0) == bool(report.outputs[0].rewrite)
    d = json.loads(report.to_json())
    assert d["rewrites"] and d["form_violations"] == [] and "form_vs_canonical" in d["outputs"][0]
    assert "form_alone_steps" in d["layers"][0]
    table = report.table(width=220)
    assert "form↔canonical" in table and "litert.tflite_add: within 1 step per rewritten op" in table
    page = report.write_html(tmp_path / "r.html").read_text()
    assert "Which reference" in page and "litert.kernel_rounding" in page


def test_the_reference_target_has_one_form():
    torch.manual_seed(1)
    report = qlower.verify(Residual().eval(), (torch.randn(1, 3, 8, 8),), progress=False)
    assert not report.rewritten and report.rewrites == [] and "form↔canonical" not in report.table()
    assert all(r.form_vs_canonical is None for r in report.layers)


def test_a_loaded_program_is_verified_against_the_canonical_program_compiled_again(litert_program):
    model, x, prog = litert_program
    loaded = program_from_bytes(program_to_bytes(prog))
    loaded.frontend = prog.frontend
    report = verify_program(loaded, [(x,)])
    assert loaded.canonical is not None
    assert print_graph(loaded.canonical) == print_graph(prog.canonical)
    assert report.rewritten and report.ok, report.problems
