"""qlower: PyTorch → int8 programs for CPUs and Arm NPUs, verified stage by stage.

The public names are loaded on first use (PEP 562), so ``import qlower.ir`` or
``import qlower.reference`` loads neither torch nor the compiler's later stages, while
``import qlower; qlower.compile(...)`` and ``qlower.zoo.get(...)`` work as users expect.
"""

import importlib

import qlower._quiet  # noqa: F401  (first: filters import-time noise of torchao, before anything imports it)
from qlower.late import LATE as _LATE

__version__ = "0.1.0"

# public name -> module that defines it
_PUBLIC = {
    "compile": "qlower.api", "verify": "qlower.api", "evaluate": "qlower.api", "sensitivity": "qlower.api", "prepare_qat": "qlower.api", "targets": "qlower.backends.registry",
    "parse_backend_options": "qlower.backends.registry", "verify_program": "qlower.verification",
    "measure_accuracy": "qlower.verification.accuracy", "comparison_table": "qlower.verification.accuracy",
    "inspect_program": "qlower.program.fileformat", "tflite_exact_kernels": "qlower.api", "save_arrays": "qlower.api",
    "op_resolver_header": "qlower.backends.tflm.resolver", "QuantConfig": "qlower.frontend.config", "Program": "qlower.program", "load": "qlower.program.fileformat",
    "write_atomically": "qlower.program.fileformat",
}
# subpackages users reach as attributes without importing them
# (``sweep`` is a package that is also callable: ``qlower.sweep(jobs)``)
_SUBPACKAGES = {"zoo", "errors", "safe_paths", "ir", "reference", "verification", "program", "backends", "frontend", "sweep", "view"}
__all__ = sorted(_PUBLIC)


# the package root binds what an earlier stage calls in a later one (qlower/late.py), loaded on first use
def _runner_for(*args, **kwargs):
    from qlower.runtime import runner_for

    return runner_for(*args, **kwargs)


def _as_numpy(*args, **kwargs):
    from qlower.runtime import as_numpy

    return as_numpy(*args, **kwargs)


def _current_executor():
    """The executor ``qlower.sweep.use_executor`` set for qlower's own fan-outs (None when no sweep is loaded)."""
    import sys

    executors = sys.modules.get("qlower.sweep.executors")
    return None if executors is None else executors.current_executor()


_LATE.add("runner_for", _runner_for)
_LATE.add("as_numpy", _as_numpy)
_LATE.add("current_executor", _current_executor)


def _view_report(*args, **kwargs):
    from qlower.view import view_report

    return view_report(*args, **kwargs)


_LATE.add("view_report", _view_report)


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"qlower.{name}")
    else:
        raise AttributeError(f"module 'qlower' has no attribute {name!r}")
    globals()[name] = value   # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC) | _SUBPACKAGES)
