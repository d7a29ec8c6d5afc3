"""Target names and the backend that compiles for each.

Backends are imported lazily: a user compiling for ``cpu`` never loads the TOSA
or Vela libraries.
"""

from __future__ import annotations

import importlib

from qlower.backends.base import Backend

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
}
HOST_TARGETS = ("reference", "cpu")


def targets() -> list[str]:
    return list(HOST_TARGETS) + sorted(_NPU_TARGETS)


def register_target(target: str, module: str, cls: str) -> None:
    _NPU_TARGETS[target] = (module, cls)


def backend_for(target: str) -> Backend | None:
    """The partitioning backend for ``target``, or None for host-only targets."""
    if target in HOST_TARGETS:
        return None
    try:
        module, cls = _NPU_TARGETS[target]
    except KeyError:
        raise ValueError(f"unknown target {target!r}; known targets: {', '.join(targets())}") from None
    return getattr(importlib.import_module(module), cls)()
