"""Target names and the backend that compiles for each.

Backends are imported lazily: a user compiling for ``cpu`` never loads the TOSA
or Vela libraries.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from qlower.backends.options import check_options, option_types
from qlower.contract import Backend, CostReport, Exporter, Payload
from qlower.errors import ConfigError, UnknownTargetError
from qlower.ir import Graph

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
    "tflm": ("qlower.backends.tflm", "TflmBackend"),
}
HOST_TARGETS = ("reference", "cpu")


def targets() -> list[str]:
    return list(HOST_TARGETS) + sorted(_NPU_TARGETS)


def _backend_class(target: str, options: Mapping[str, Any] | None) -> type[Backend] | None:
    """The backend class for ``target`` (None for host-only targets), after checking ``options``
    against its constructor: an unknown target (UnknownTargetError) or option (ConfigError) lists the
    known ones, a value of the wrong type (ConfigError) says what the option expects."""
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
    check_options(target, backend_cls, options)
    return backend_cls


def parse_backend_options(target: str, texts: Mapping[str, str]) -> dict[str, Any]:
    """Backend options given as text (the command line's ``--option KEY=VALUE``) as the values the
    target's backend takes, typed by its constructor's annotations (``threads=2`` is the int 2)."""
    if target in HOST_TARGETS:
        _backend_class(target, texts)  # a host target takes no options: any is an error
        return {}
    return check_options(target, _backend_class(target, None), texts, from_text=True)


def backend_threads(target: str, threads: int | None, options: Mapping[str, Any] | None
                    ) -> tuple[int | None, dict[str, Any]]:
    """The program's thread count and the backend's options, agreeing: a backend with a ``threads``
    option (litert) runs with the program's count unless given its own, which is then the
    program's too; two different counts are a ConfigError."""
    options = dict(options or {})
    backend_cls = _backend_class(target, options)
    if backend_cls is None or "threads" not in option_types(backend_cls):
        return threads, options
    own = options.get("threads")
    if threads is not None and own is not None and own != threads:
        raise ConfigError(f"threads={threads} and target {target!r} option threads={own} disagree: "
                          "they are the same setting, give one")
    count = threads if threads is not None else own
    if count is not None:
        options["threads"] = count
    return count, options


def check_target(target: str, options: Mapping[str, Any] | None = None) -> None:
    """Raise the error ``backend_for`` would, without building the backend."""
    _backend_class(target, options)


def backend_for(target: str, options: Mapping[str, Any] | None = None) -> Backend | None:
    """The partitioning backend for ``target``, or None for host-only targets.

    ``options`` are the backend's constructor arguments (e.g. Ethos-U's
    ``system_config``); an unknown one is a ConfigError that lists the known ones."""
    backend_cls = _backend_class(target, options)
    return None if backend_cls is None else backend_cls(**(options or {}))


# format -> the target whose exporter writes that format for a program of any target that declares
# none of its own (a .tflite of builtin operators: LiteRT's whole-program form runs any program)
_ANY_PROGRAM_FORMATS: dict[str, str] = {"tflite": "litert"}


def export_formats(target: str) -> list[str]:
    """The formats a program compiled for ``target`` exports to."""
    backend_cls = _backend_class(target, None)
    own = backend_cls.exporters(target) if backend_cls is not None else {}
    return sorted(set(own) | set(_ANY_PROGRAM_FORMATS))


def _exporting(target: str, format: str) -> tuple[type[Backend], str]:
    """The backend class (and its target) that exports a program compiled for ``target`` in
    ``format``: the target's own when it declares the format, else the format's home backend; a
    ValueError listing the formats otherwise."""
    backend_cls = _backend_class(target, None)
    if backend_cls is not None and format in backend_cls.exporters(target):
        return backend_cls, target
    home = _ANY_PROGRAM_FORMATS.get(format) if isinstance(format, str) else None
    if home is None:
        raise ValueError(f"unknown export format {format!r}; formats: {', '.join(export_formats(target))}")
    return _backend_class(home, None), home


def exporter_for(target: str, format: str) -> Exporter:
    """The exporter writing a program compiled for ``target`` in ``format``: the one its backend
    declares, else the one every program gets; a ValueError listing the formats otherwise."""
    backend_cls, owner = _exporting(target, format)
    return backend_cls.exporters(owner)[format]


def export_note(target: str, format: str, source: Graph) -> str:
    """What the exporter of ``exporter_for(target, format)`` says about the file it writes of ``source``."""
    backend_cls, owner = _exporting(target, format)
    return backend_cls.export_note(owner, format, source)


def cost_report(payload: Payload) -> CostReport | None:
    """The cost report of ``payload`` that its backend declares (None when it estimates none, or
    when the payload's target has no backend)."""
    try:
        backend_cls = _backend_class(payload.target, None)
    except UnknownTargetError:
        return None
    return None if backend_cls is None else backend_cls.cost_report(payload)
