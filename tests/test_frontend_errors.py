"""Frontend errors: what is wrong, where in the model (source line, module path), what to do."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qlower.errors import InputError, UnsupportedOpError
from qlower.frontend import QuantConfig, capture_and_import
from qlower.reference import run_graph


class Upsampler(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return torch.cumsum(y, dim=1)  # no integer rule: a float fallback, or refused with fallback="error"


class Running(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=2)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(3, 3, 1))
        self.block.add_module("up", Running())

    def forward(self, x):
        return self.block(x)


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


X = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(0))


STRICT = QuantConfig(fallback="error")


def test_unsupported_op_names_the_op_and_the_model_line():
    with pytest.raises(UnsupportedOpError) as err:
        capture_and_import(Upsampler(), (X,), STRICT, [(X,)], progress=False)
    message = str(err.value)
    assert "cumsum" in message and "fallback='error'" in message
    assert f"test_frontend_errors.py:{_line_of(Upsampler.forward, 'torch.cumsum')}" in message


@pytest.mark.parametrize("quant", [None, QuantConfig()], ids=["float", "int8"])
def test_by_default_an_op_without_a_rule_runs_in_float(quant):
    result = capture_and_import(Upsampler(), (X,), quant, [(X,)], progress=False)
    ops = [op for op in result.graph.ops if op.kind == "aten"]
    assert [op.attrs["target"] for op in ops] == ["aten.cumsum.default"]
    assert f"test_frontend_errors.py:{_line_of(Upsampler.forward, 'torch.cumsum')}" in ops[0].origin.describe()


def test_unsupported_op_names_the_module_path():
    with pytest.raises(UnsupportedOpError) as err:
        capture_and_import(Outer(), (X,), STRICT, [(X,)], progress=False)
    assert "module 'block.up'" in str(err.value) and "Running" in str(err.value)


class LoneBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(torch.relu(self.conv(x)))  # relu between: BN can't fold into the conv


def test_unfolded_batch_norm_is_integer_even_when_fallback_is_error():
    model = LoneBatchNorm().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    result = capture_and_import(model, (X,), None, progress=False)  # float: explicit mul + add
    assert {"mul", "add"} <= set(result.graph.count_ops())
    strict = capture_and_import(model, (X,), STRICT, [(X,)], progress=False)  # a per-channel affine map in int32
    bn = [op for op in strict.graph.ops if op.results[0].origin and "bn" in (op.results[0].origin.module or "")
          and op.kind != "dequantize"]  # the model's float output
    assert bn and all(r.dtype.is_integer for op in bn for r in op.results)
    assert f"test_frontend_errors.py:{_line_of(LoneBatchNorm.forward, 'self.bn(')}" in bn[0].results[0].origin.source


class RuntimeWeight(nn.Module):
    def forward(self, x, w):
        return F.conv2d(x, w)


@pytest.mark.parametrize("quant", [None, QuantConfig()], ids=["float", "int8"])
def test_conv_with_a_runtime_weight_runs_in_float(quant):
    """conv2d's rule takes constant weights only; this case is imported as PyTorch's decomposition
    (a core ``aten.convolution``), in float, instead of being refused."""
    w = torch.randn(2, 3, 1, 1, generator=torch.Generator().manual_seed(3))
    result = capture_and_import(RuntimeWeight(), (X, w), quant, [(X, w)], progress=False)
    assert [op.attrs["target"] for op in result.graph.ops if op.kind == "aten"] == ["aten.convolution.default"]
    got = run_graph(result.graph, [X.numpy(), w.numpy()])[0]
    want = RuntimeWeight()(X, w).numpy()
    if quant is None:
        np.testing.assert_array_equal(got, want)
    else:  # the output is quantized: within one step of its scale
        step = (want.max() - want.min()) / 255
        assert np.abs(got - want).max() <= 1.01 * step
    with pytest.raises(UnsupportedOpError, match="weight must be a constant"):
        capture_and_import(RuntimeWeight(), (X, w), STRICT, [(X, w)], progress=False)


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: not exportable
            return x * 2
        return x


def test_unexportable_model_names_the_line():
    with pytest.raises(UnsupportedOpError, match="torch.export could not capture Branchy") as err:
        capture_and_import(Branchy(), (X,), None, progress=False)
    assert f"test_frontend_errors.py:{_line_of(Branchy.forward, 'if x.sum()')}" in str(err.value)


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, idx):
        return self.emb(idx)


def test_integer_inputs_are_taken_other_dtypes_refused():
    result = capture_and_import(Embedding(), (torch.tensor([[1, 2]]),), None, progress=False)
    assert result.graph.inputs[0].type.quant.is_plain_integer
    with pytest.raises(UnsupportedOpError, match="float32, integer or bool"):
        capture_and_import(nn.Identity(), (X.double(),), None, progress=False)


def test_quantization_needs_calibration():
    with pytest.raises(InputError, match="calibration"):
        capture_and_import(Upsampler(), (X,), QuantConfig(), [], progress=False)


def test_unknown_fixed_override_names_the_modules():
    config = QuantConfig(fixed={"nonexistent": (0.1, 0, -128, 127)})
    with pytest.raises(InputError, match="nonexistent.*modules: .*conv"):
        capture_and_import(Upsampler(), (X,), config, [(X,)], progress=False)
    with pytest.raises(InputError, match="1 input"):
        capture_and_import(Upsampler(), (X,), QuantConfig(fixed={"input:3": (0.1, 0, -128, 127)}), [(X,)],
                           progress=False)
