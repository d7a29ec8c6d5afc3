"""The command line under misuse: usage errors exit 2 in one line, files land exactly where it
says, a closed pipe ends it quietly, a hostile program file can't drive the terminal, and logs
get no progress-bar frames."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qlower
from qlower.cli import main, printable

MODEL = ["zoo:tiny_cnn", "--size", "16"]
ENV = dict(os.environ, PYTHONWARNINGS="ignore")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _factory_file(tmp_path, body: str) -> str:
    path = tmp_path / "models.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.parametrize("argv, message", [
    (["verify", "x"], "'x' is neither zoo:NAME nor FILE.py:FACTORY"),
    (["verify", "zoo:no_such_model"], "unknown zoo model 'no_such_model'; `qlower zoo` lists them"),
    (["compile", *MODEL, "--option", "novalue"], "--option takes KEY=VALUE, got 'novalue'"),
    (["compile", *MODEL, "--format", "tflite"], "--format tflite needs -o FILE.tflite"),
])
def test_usage_errors_exit_2_in_one_line(capsys, argv, message):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and err.startswith(f"qlower: {message}") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("body, message", [
    ("def make():\n    raise RuntimeError('no weights here')\n", "models.py:make() raised RuntimeError: no weights here"),
    ("def make():\n    return 42\n", "models.py:make() returned int; expected (model, example_inputs) or"),
    ("x = 1\n", "models.py has no function 'make'"),
    ("import no_such_module\n", "models.py failed to import: ModuleNotFoundError"),
])
def test_a_bad_factory_is_one_line_not_a_traceback(capsys, tmp_path, body, message):
    spec = f"{_factory_file(tmp_path, body)}:make"
    code, _, err = _run(capsys, "verify", spec)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_factory_returning_a_model_with_a_bad_argument_names_it(capsys, tmp_path):
    spec = _factory_file(tmp_path, """
        import torch
        def make():
            return torch.nn.Linear(4, 2), torch.zeros(1, 4)
    """) + ":make"
    code, _, err = _run(capsys, "compile", spec)
    assert code == 2 and "ConfigError: example_inputs must be a tuple" in err


def test_output_into_a_missing_folder_names_the_folder(capsys, tmp_path):
    code, _, err = _run(capsys, "compile", *MODEL, "-o", str(tmp_path / "missing" / "p.qlp"))
    assert code == 2 and f"folder {tmp_path / 'missing'} does not exist" in err
    assert ".tmp" not in err


def _saved_program(tmp_path, target="cpu"):
    model, example, quant, calib = qlower.zoo.get("tiny_cnn", size=16)
    prog = qlower.compile(model, example, target=target, quant=quant, calibration=calib, progress=False)
    return prog, example


@pytest.mark.parametrize("name, outputs", [("y_noext", 1), ("y.npy", 1), ("y2.npy", 2), ("both", 2)])
def test_run_output_is_written_exactly_where_it_says(capsys, tmp_path, name, outputs):
    prog, example = _saved_program(tmp_path)
    if outputs == 2:   # a program with two outputs: the input passed through and the logits
        b = qlower.ir.GraphBuilder()
        x = b.input("x", qlower.ir.TensorType((2, 3), qlower.ir.DType.FLOAT32))
        y = b.op("quantize", x, out=qlower.ir.QuantSpec.per_tensor(0.1, 0), name="y")
        g = qlower.ir.verify_graph(b.build([x, y]))
        prog = qlower.program.Program("reference", g, g)
        x_in = np.ones((2, 3), np.float32)
    else:
        x_in = example[0].numpy()
    prog.save(tmp_path / "p.qlp")
    np.save(tmp_path / "x.npy", x_in)
    dest = tmp_path / name
    code, out, _ = _run(capsys, "run", str(tmp_path / "p.qlp"), "--input", str(tmp_path / "x.npy"),
                        "--output", str(dest))
    assert code == 0 and f"wrote {dest} (" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"p.qlp", "x.npy", name})
    expected = prog.run(x_in)
    if outputs == 1:
        np.testing.assert_array_equal(np.load(dest), expected[0])
    else:
        with np.load(dest) as z:
            assert [np.array_equal(z[f"arr_{i}"], e) for i, e in enumerate(expected)] == [True, True]


def test_a_closed_pipe_exits_quietly(tmp_path):
    cmd = f"{sys.executable} -m qlower.cli zoo | head -1"
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.stdout.strip().startswith(qlower.zoo.names()[0])
    assert proc.stderr == "" and proc.returncode == 0


def test_escape_sequences_from_a_program_file_never_reach_the_terminal(capsys, tmp_path):
    model, example, quant, calib = qlower.zoo.get("tiny_cnn", size=16)
    prog = qlower.compile(model, example, target="ethos-u55-128", quant=quant, calibration=calib, progress=False)
    prog.meta["note"] = "\x1b[2J\x1b]0;owned\x07 cleared your screen"
    prog.save(tmp_path / "evil.qlp")
    np.save(tmp_path / "x.npy", example[0].numpy())
    for argv in (["inspect", str(tmp_path / "evil.qlp")],
                 ["run", str(tmp_path / "evil.qlp"), "--input", str(tmp_path / "x.npy")]):
        code, out, err = _run(capsys, *argv)
        assert code == 0 and "\x1b" not in out + err and "\x07" not in out + err
    assert "\\u001b[2J" in _run(capsys, "inspect", str(tmp_path / "evil.qlp"))[1]


def test_printable_escapes_controls_and_bidi_overrides_but_keeps_lines():
    assert printable("a\x1b[31mb\nc\td\u202ee") == "a\\x1b[31mb\nc\td\\u202ee"
    assert printable("µ → ✓ 4×4") == "µ → ✓ 4×4"


def test_progress_bars_stay_out_of_logs(tmp_path):
    """Compiling with progress on (the default) writes no bar frames when stderr is a file."""
    script = tmp_path / "c.py"
    script.write_text(textwrap.dedent("""
        import torch, qlower
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
        qlower.compile(m, (torch.randn(1, 3, 8, 8),), target="tosa-1.0+int")
    """))
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        subprocess.run([sys.executable, str(script)], stderr=f, stdout=subprocess.DEVNULL, env=ENV, timeout=300,
                       check=True)
    text = log.read_text()
    assert "\r" not in text and "quantizing" not in text and "placing ops" not in text


def test_progress_bars_show_on_a_terminal(monkeypatch, capsys):
    from qlower.progress import progress_bar

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with progress_bar(True, total=2, desc="visible") as bar:
        assert not bar.disable
    with progress_bar(False, total=2) as bar:
        assert bar.disable
