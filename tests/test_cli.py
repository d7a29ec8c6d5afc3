"""The ``qlower`` command line, in process: each command's output, files and exit code."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qlower
from qlower import zoo
from qlower.cli import main

MODEL = ["zoo:tiny_cnn", "--size", "16"]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_zoo_and_targets_list_what_the_api_knows(capsys):
    code, out, _ = _run(capsys, "zoo")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == zoo.names()
    code, out, _ = _run(capsys, "targets")
    assert code == 0 and out.split() == qlower.targets()


def test_compile_save_inspect_run_round_trip(capsys, tmp_path):
    prog_path, art = tmp_path / "s1.qlp", tmp_path / "art"
    code, out, _ = _run(capsys, "compile", *MODEL, "--target", "tosa-1.0+int", "-o", str(prog_path),
                        "--artifacts", str(art))
    assert code == 0 and "p0 on tosa" in out and prog_path.exists()
    assert (art / "summary.json").exists() and list(art.rglob("*.tosa"))

    code, out, _ = _run(capsys, "inspect", str(prog_path))
    assert code == 0 and json.loads(out)["target"] == "tosa-1.0+int"

    prog = qlower.load(prog_path)
    x = np.random.default_rng(0).uniform(-1, 1, prog.graph.inputs[0].shape).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, _ = _run(capsys, "run", str(prog_path), "--input", str(tmp_path / "x.npy"),
                        "--output", str(tmp_path / "y.npy"))
    assert code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), prog.run(x)[0])


def test_verify_writes_json_and_html_and_exits_zero_when_exact(capsys, tmp_path):
    code, out, _ = _run(capsys, "verify", *MODEL, "--target", "cpu", "--json", str(tmp_path / "r.json"),
                        "--html", str(tmp_path / "r.html"))
    assert code == 0 and "verdict: OK" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["target"] == "cpu" and report["layers"]
    assert all(row["target_vs_ref"]["max_steps"] == 0 for row in report["layers"] if row["target_vs_ref"])
    assert "data:image/png;base64," in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("argv,message", [
    (["compile", *MODEL, "--target", "tosa-2.0"], "unknown target 'tosa-2.0'"),
    (["compile", *MODEL, "--target", "ethos-u85-256", "--option", "bogus=1"],
     "has no backend option 'bogus'; its options: system_config, memory_mode"),
    (["compile", *MODEL, "--target", "cpu", "--option", "threads=2"], "takes no backend options"),
    (["run", "no/such/file.qlp"], "no/such/file.qlp"),
])
def test_bad_arguments_exit_2_with_the_reason_and_no_traceback(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_wrong_input_shape_at_run_names_the_input(capsys, tmp_path):
    assert _run(capsys, "compile", *MODEL, "--target", "cpu", "-o", str(tmp_path / "p.qlp"))[0] == 0
    np.save(tmp_path / "x.npy", np.zeros((1, 2, 3), np.float32))
    code, _, err = _run(capsys, "run", str(tmp_path / "p.qlp"), "--input", str(tmp_path / "x.npy"))
    assert code == 2 and "InputError: input 0" in err and "expected" in err


def test_backend_options_reach_the_backend(capsys, tmp_path):
    """Ethos-U system config and memory mode from --option end up in the compiled payload."""
    path = tmp_path / "u85.qlp"
    code, _, _ = _run(capsys, "compile", *MODEL, "--target", "ethos-u85-256", "-o", str(path),
                      "--option", "system_config=Ethos_U85_SYS_DRAM_High", "--option", "memory_mode=Sram_Only")
    assert code == 0
    meta = qlower.load(path).partitions[0].payload.meta
    assert (meta["system_config"], meta["memory_mode"]) == ("Ethos_U85_SYS_DRAM_High", "Sram_Only")


def test_verify_exits_1_when_the_target_is_not_bit_exact(capsys, monkeypatch):
    """A TOSA lowering of rescale whose output zero point is off by one: verify must fail the run."""
    from qlower.backends.tosa.lowering import LOWERINGS
    from qlower.ir import DType, Op, QuantSpec

    original = LOWERINGS["rescale"]

    def off_by_one(lw, op):
        out = op.attrs["out"]
        if out.dtype is not DType.INT8:  # (TOSA takes only zero point 0 for int32)
            return original(lw, op)
        shifted = QuantSpec.per_tensor(out.scale[0], out.zero_point[0] + 1, out.dtype, out.qmin, out.qmax)
        return original(lw, Op(op.kind, op.operands, {**op.attrs, "out": shifted}, op.results))

    monkeypatch.setitem(LOWERINGS, "rescale", off_by_one)
    code, out, err = _run(capsys, "verify", *MODEL, "--target", "tosa-1.0+int")
    assert code == 1, err
    assert "verdict: FAILED" in out and "first diverges from the reference" in out
