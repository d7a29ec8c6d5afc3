"""Backend options are typed by the backend's constructor, from the command line and from Python,
and ``compile(threads=...)`` and litert's ``threads`` option are one setting (issue 26)."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from torch import nn

import qlower
from qlower.backends.litert.backend import LiteRtBackend
from qlower.backends.options import option_types, parse_value
from qlower.cli import main
from qlower.errors import ConfigError

MODEL = ["zoo:tiny_cnn", "--size", "16"]


@pytest.mark.parametrize("text, annotation, value", [
    ("2", int | None, 2), ("none", int | None, None), ("0.5", float, 0.5), ("3", float, 3.0),
    ("true", bool, True), ("No", bool, False), ("0", bool, False), ("builtin", Literal["reference", "builtin"], "builtin"),
    ("Sram_Only", str | None, "Sram_Only"),
])
def test_text_reads_as_the_annotated_type(text, annotation, value):
    got = parse_value("t", "opt", text, annotation)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text, annotation, expected", [
    ("two", int | None, "expected an integer or none"), ("1.5", int, "expected an integer"),
    ("maybe", bool, "expected true or false"), ("fast", Literal["reference", "builtin"], "expected one of reference, builtin"),
    ("x", float, "expected a number"),
])
def test_bad_text_names_the_option_the_value_and_what_it_expects(text, annotation, expected):
    with pytest.raises(ConfigError, match=f"target 't' option opt={text!r}: {expected}"):
        parse_value("t", "opt", text, annotation)


def test_parse_backend_options_types_the_targets_options():
    assert qlower.parse_backend_options("litert", {"threads": "4", "kernels": "builtin"}) == {
        "threads": 4, "kernels": "builtin"}
    assert qlower.parse_backend_options("cpu", {}) == {}
    with pytest.raises(ConfigError, match="takes no backend options"):
        qlower.parse_backend_options("cpu", {"threads": "2"})


def test_litert_declares_its_option_types():
    types = option_types(LiteRtBackend)
    assert types["threads"] == int | None
    assert types["kernels"] == Literal["reference", "builtin", "xnnpack"]


def test_python_values_are_checked_against_the_same_types():
    with pytest.raises(ConfigError, match=r"option threads='2' \(str\): expected an integer or none"):
        qlower.compile(nn.ReLU(), (torch.randn(1, 4),), target="litert", backend_options={"threads": "2"})
    with pytest.raises(ConfigError, match="option kernels='fast'.*one of reference, builtin, xnnpack"):
        qlower.compile(nn.ReLU(), (torch.randn(1, 4),), target="litert", backend_options={"kernels": "fast"})
    with pytest.raises(ConfigError, match="option per_layer=1 \\(int\\): expected true or false"):
        qlower.compile(nn.ReLU(), (torch.randn(1, 4),), target="ethos-u55-128", backend_options={"per_layer": 1})


def _small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval(), (torch.randn(1, 3, 8, 8),)


def _threads(prog) -> tuple[object, object]:
    return prog.meta["threads"], prog.partitions[0].payload.meta["threads"]


def test_compile_threads_and_the_litert_option_are_one_setting():
    model, x = _small()
    assert _threads(qlower.compile(model, x, target="litert", threads=2, progress=False)) == (2, 2)
    assert _threads(qlower.compile(model, x, target="litert", backend_options={"threads": 3},
                                   progress=False)) == (3, 3)
    assert _threads(qlower.compile(model, x, target="litert", threads=2, backend_options={"threads": 2},
                                   progress=False)) == (2, 2)
    with pytest.raises(ConfigError, match="threads=2 and target 'litert' option threads=3 disagree"):
        qlower.compile(model, x, target="litert", threads=2, backend_options={"threads": 3}, progress=False)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_option_threads_is_an_integer(capsys, tmp_path):
    path = tmp_path / "p.qlp"
    code, _, err = _cli(capsys, "compile", *MODEL, "--target", "litert", "--option", "threads=2", "-o", str(path))
    assert code == 0, err
    prog = qlower.load(path)
    assert _threads(prog) == (2, 2)
    assert prog.run(torch.randn(1, 3, 16, 16))[0].shape == (1, 10)


@pytest.mark.parametrize("option, message", [
    ("threads=two", "target 'litert' option threads='two': expected an integer or none"),
    ("kernels=fast", "option kernels='fast': expected one of reference, builtin, xnnpack"),
    ("threads=0", "litert option threads=0"),
])
def test_cli_bad_option_values_exit_2_with_the_reason(capsys, option, message):
    code, _, err = _cli(capsys, "compile", *MODEL, "--target", "litert", "--option", option)
    assert code == 2 and message in err and "Traceback" not in err, err
