"""Checking what a user passes to ``compile`` before any work starts.

Each check raises a QlowerError naming the argument, what was given and what is accepted:
an argument PyTorch or PT2E would choke on minutes later (a float64 model, calibration data
of another shape) or, worse, silently compile into something else (a bare tensor as the
example inputs becomes a tuple of its rows) is refused here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from qlower.errors import ConfigError, InputError
from qlower.frontend.config import QuantConfig


def check_model(model: object) -> nn.Module:
    if not isinstance(model, nn.Module):
        kind = "None" if model is None else type(model).__name__
        raise ConfigError(f"model must be a torch.nn.Module, got {kind}"
                          + ("; wrap the function in a Module's forward" if callable(model) else ""))
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in named:
            if t.is_floating_point() and t.dtype != torch.float32:
                raise ConfigError(f"model {kind} '{name}' is {t.dtype}; qlower compiles float32 models: "
                                  "call model.float() first")
    return model


def _check_tensor(x: object, where: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        hint = " (use torch.from_numpy(x))" if type(x).__module__ == "numpy" else ""
        raise InputError(f"{where} must be a torch.Tensor, got {type(x).__name__}{hint}")
    if x.device.type != "cpu":
        raise InputError(f"{where} is on device {x.device}; qlower runs on the CPU: pass x.cpu()")
    if x.is_floating_point() and x.dtype != torch.float32:
        raise InputError(f"{where} is {x.dtype}; float inputs must be float32 (x.float())")
    return x


def check_example_inputs(example_inputs: object) -> tuple[torch.Tensor, ...]:
    if isinstance(example_inputs, torch.Tensor):
        raise ConfigError(f"example_inputs must be a tuple with one tensor per forward argument, got a bare "
                          f"tensor of shape {tuple(example_inputs.shape)} (which would be read as a tuple of "
                          "its rows): pass (x,)")
    if not isinstance(example_inputs, (tuple, list)):
        raise ConfigError(f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}")
    return tuple(_check_tensor(x, f"example_inputs[{i}]") for i, x in enumerate(example_inputs))


def check_calibration(calibration: object, example: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """Every batch as a tuple matching the example inputs in count, shape and dtype, with finite floats."""
    if isinstance(calibration, torch.Tensor) or not isinstance(calibration, Sequence):
        raise ConfigError(f"calibration must be a list of input tuples (like example_inputs), got "
                          f"{type(calibration).__name__}")
    batches = []
    for b, batch in enumerate(calibration):
        if isinstance(batch, torch.Tensor) and len(example) == 1:
            batch = (batch,)
        if not isinstance(batch, (tuple, list)):
            raise InputError(f"calibration batch {b} must be a tuple of tensors, got {type(batch).__name__}")
        if len(batch) != len(example):
            raise InputError(f"calibration batch {b} has {len(batch)} input(s), the model takes {len(example)}")
        for i, (x, e) in enumerate(zip(batch, example)):
            where = f"calibration batch {b} input {i}"
            _check_tensor(x, where)
            if x.shape != e.shape or x.dtype != e.dtype:
                raise InputError(f"{where} is {x.dtype}{list(x.shape)}, the example input is {e.dtype}{list(e.shape)}")
            # NaN has no scale and no code (±inf may be meant: an attention mask stays float)
            if x.is_floating_point() and bool(torch.isnan(x).any()):
                raise InputError(f"{where} holds NaN: no quantization scale can be observed from it")
        batches.append(tuple(batch))
    return batches


def check_quant(quant: object) -> QuantConfig | None:
    if quant is not None and not isinstance(quant, QuantConfig):
        raise ConfigError(f"quant must be a QuantConfig or None (float), got {type(quant).__name__} {quant!r}; "
                          "e.g. QuantConfig(mode='static')")
    return quant
