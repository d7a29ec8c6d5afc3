"""Target names and the backend that compiles for each.

Backends are imported lazily: a user compiling for ``cpu`` never loads the TOSA
or Vela libraries.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from qlower.contract import Backend
from qlower.errors import ConfigError, UnknownTargetError

# target -> (module, class); "reference" and "cpu" run the whole graph on the host.
_NPU_TARGETS: dict[str, tuple[str, str]] = {
    "tosa-1.0+int": ("qlower.backends.tosa", "TosaBackend"),
    "tosa-1.0+int+fp": ("qlower.backends.tosa", "TosaBackend"),
    "ethos-u55-32": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u55-64": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u55-128": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u55-256": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u65-256": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u65-512": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u85-128": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u85-256": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u85-512": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u85-1024": ("qlower.backends.ethosu", "EthosUBackend"),
    "ethos-u85-2048": ("qlower.backends.ethosu", "EthosUBackend"),
    "vgf": ("qlower.backends.vgf", "VgfBackend"),
    "vgf+int": ("qlower.backends.vgf", "VgfBackend"),
    "litert": ("qlower.backends.litert", "LiteRtBackend"),
}
HOST_TARGETS = ("reference", "cpu")


def targets() -> list[str]:
    return list(HOST_TARGETS) + sorted(_NPU_TARGETS)


def _backend_class(target: str, options: Mapping[str, Any] | None) -> type[Backend] | None:
    """The backend class for ``target`` (None for host-only targets), after checking ``options``
    against its constructor: an unknown target (UnknownTargetError) or option (ConfigError) lists the known ones."""
    if not isinstance(target, str):
        raise UnknownTargetError(f"target must be a target name (str) such as 'cpu', got {type(target).__name__}; "
                                 f"known targets: {', '.join(targets())}")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"backend_options must be a dict of option name -> value, got {type(options).__name__}")
    options = options or {}
    if target in HOST_TARGETS:
        if options:
            raise ConfigError(f"target {target!r} takes no backend options, got {', '.join(sorted(options))}")
        return None
    try:
        module, cls = _NPU_TARGETS[target]
    except KeyError:
        raise UnknownTargetError(f"unknown target {target!r}; known targets: {', '.join(targets())}") from None
    backend_cls = getattr(importlib.import_module(module), cls)
    known = [n for n, p in inspect.signature(backend_cls).parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"target {target!r} has no backend option {', '.join(map(repr, unknown))}; "
                         f"its options: {', '.join(known) or 'none'}")
    return backend_cls


def check_target(target: str, options: Mapping[str, Any] | None = None) -> None:
    """Raise the error ``backend_for`` would, without building the backend."""
    _backend_class(target, options)


def backend_for(target: str, options: Mapping[str, Any] | None = None) -> Backend | None:
    """The partitioning backend for ``target``, or None for host-only targets.

    ``options`` are the backend's constructor arguments (e.g. Ethos-U's
    ``system_config``); an unknown one is a ConfigError that lists the known ones."""
    backend_cls = _backend_class(target, options)
    return None if backend_cls is None else backend_cls(**(options or {}))
