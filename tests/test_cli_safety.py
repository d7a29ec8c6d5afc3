"""Special files, huge inputs, out of memory, usage errors and option text on the command line
(issue 30): every refusal a one-line message and exit code 2; nothing but regular files replaced."""

from __future__ import annotations

import os

import numpy as np
import pytest
from numpy.lib import format as npy

import qlower
from qlower.api import lower_graph
from qlower.backends.ethosu import EthosUBackend
from qlower.cli import main
from qlower.errors import ConfigError, SaveError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType

Q = QuantSpec.per_tensor(0.1, 0)


@pytest.fixture
def program(tmp_path):
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4), DType.INT8, Q))
    path = tmp_path / "p.qlp"
    lower_graph(b.build([b.op("clamp", x, min=-3, max=5, name="y")]), "reference").save(path)
    np.save(tmp_path / "x.npy", np.arange(-2, 2, dtype=np.int8).reshape(1, 4))
    return path


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_special_files_are_never_written_or_read(program, tmp_path, capsys):
    fifo, dev_link, file_link, real = (tmp_path / n for n in ("fifo", "null", "link", "real.npy"))
    os.mkfifo(fifo)
    dev_link.symlink_to(os.devnull)
    real.write_bytes(b"keep")
    file_link.symlink_to(real)
    x = str(tmp_path / "x.npy")
    for out in (fifo, dev_link, file_link, tmp_path):
        code, err = _cli(capsys, "run", str(program), "--input", x, "--output", str(out))
        assert code == 2 and "SaveError" in err and "regular files or new paths" in err, err
    assert real.read_bytes() == b"keep" and dev_link.is_symlink() and fifo.is_fifo()
    for special in (fifo, dev_link):   # a FIFO with no writer would block forever
        code, err = _cli(capsys, "run", str(program), "--input", str(special))
        assert code == 2 and "not a regular file" in err, err
    prog = qlower.load(program)
    for out in (fifo, dev_link, file_link):
        with pytest.raises(SaveError, match="regular files or new paths"):
            prog.save(out)
        with pytest.raises(SaveError):
            prog.export(out)
    code, _ = _cli(capsys, "run", str(program), "--input", x, "--output", str(tmp_path / "new.npy"))
    assert code == 0 and np.array_equal(np.load(tmp_path / "new.npy"), np.clip(np.load(x), -3, 5))


def test_an_input_declaring_a_huge_shape_is_refused(program, tmp_path, capsys):
    path = tmp_path / "huge.npy"
    with open(path, "wb") as f:
        npy.write_array_header_1_0(f, {"descr": "|i1", "fortran_order": False, "shape": (1 << 20, 1 << 22)})
        f.write(b"\0" * 64)
    code, err = _cli(capsys, "run", str(program), "--input", str(path))
    assert code == 2 and "declares" in err and len(err.splitlines()) == 1, err


def test_out_of_memory_is_exit_2(tmp_path, capsys):
    factory = tmp_path / "hungry.py"
    factory.write_text("import torch\n"
                       "class M(torch.nn.Module):\n"
                       "    def forward(self, x):\n"
                       "        return x + torch.zeros(1 << 40, dtype=torch.int8)[:1]\n"
                       "def make():\n"
                       "    return M(), (torch.randn(1, 4),)\n")
    code, err = _cli(capsys, "compile", f"{factory}:make", "--target", "cpu")
    assert code == 2 and "out of memory" in err, err


def test_usage_errors_are_one_line(capsys):
    for argv in (["compile"], ["frobnicate"], ["run", "p.qlp", "--bogus"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err


def test_ethos_u_options_are_checked_against_their_types():
    for text in ({"optimise": "Size\n[compiler]\nverbose=1"}, {"optimise": "Fastest"}, {"per_layer": "maybe"},
                 {"widen_channels": "2"}, {"system_config": "Ethos_U55_High_End_Embedded\n[x]"}):
        with pytest.raises(ConfigError):
            qlower.parse_backend_options("ethos-u55-128", text)
    assert qlower.parse_backend_options("ethos-u55-128", {"optimise": "size"}) == {"optimise": "Size"}
    for kwargs in ({"optimise": "Size\n[x]"}, {"per_layer": "yes"}, {"widen_channels": 1}):
        with pytest.raises(ConfigError):
            EthosUBackend(**kwargs)
