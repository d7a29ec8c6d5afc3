"""A model named on a command line or in a sweep: ``zoo:NAME`` or ``path/to/file.py:factory``.

A factory returns ``(model, example_inputs)`` or ``(model, example_inputs, quant, calibration)``;
``load`` always gives the four, so the CLI and the sweep runner read a user's file the same way
and refuse a bad one with the same one-line ``ConfigError``.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qlower.errors import ConfigError

__all__ = ["load"]


def load(spec: str | Callable[[], tuple], size: int | None = None,
         trained: bool = False) -> tuple[Any, tuple, Any, list]:
    """``(model, example_inputs, quant, calibration)`` of ``spec`` (a spec string or a factory).

    The example is passed on as the factory made it: ``compile`` names a wrong one (a tensor where
    a tuple belongs), which a coercion here would hide."""
    if callable(spec):
        return _four(spec(), getattr(spec, "__name__", "the factory"))
    if spec.startswith("zoo:"):
        return _zoo(spec[4:], size, trained)
    if trained:
        raise ConfigError("--trained (trained weights) applies to zoo:NAME models only")
    path, _, factory = spec.rpartition(":")
    if not path or not factory:
        raise ConfigError(f"{spec!r} is neither zoo:NAME nor FILE.py:FACTORY")
    if not Path(path).is_file():
        raise ConfigError(f"{spec!r}: no file {path!r} (expected zoo:NAME or FILE.py:FACTORY)")
    try:
        mod_spec = importlib.util.spec_from_file_location(f"qlower_user_model_{Path(path).stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file: any error it raises is reported in one line
        raise ConfigError(f"{path} failed to import: {type(e).__name__}: {e}") from None
    fn = getattr(module, factory, None)
    if not callable(fn):
        raise ConfigError(f"{path} has no function {factory!r}")
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{path}:{factory}() raised {type(e).__name__}: {e}") from None
    return _four(result, f"{path}:{factory}()")


def _zoo(name: str, size: int | None, trained: bool) -> tuple[Any, tuple, Any, list]:
    from qlower import zoo

    if name not in zoo.names():
        raise ConfigError(f"unknown zoo model {name!r}; `qlower zoo` lists them")
    if trained and name not in zoo.trained_names():
        raise ConfigError(f"zoo model {name!r} has no trained weights; trained models: "
                          f"{', '.join(zoo.trained_names())}")
    return _four(zoo.get(name, size=size, trained=trained), f"zoo:{name}")


def _four(result: Any, where: str) -> tuple[Any, tuple, Any, list]:
    from qlower.frontend.config import QuantConfig

    if isinstance(result, tuple) and len(result) == 4:
        model, example, quant, calibration = result
        return model, example, quant, list(calibration)
    if isinstance(result, tuple) and len(result) == 2:
        model, example = result
        return model, example, QuantConfig(), [example]
    raise ConfigError(f"{where} returned {type(result).__name__}; expected (model, example_inputs) or "
                      "(model, example_inputs, quant, calibration)")
