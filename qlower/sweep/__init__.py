"""Sweeps: models × targets × configurations compiled and measured in one call, on this machine's
cores or on a Ray cluster, cached and resumable.

``qlower.sweep(jobs)`` (this package is callable: it is ``orchestrate.sweep``) runs ``Job``s made by
``grid(...)``, ``load_spec("spec.toml")`` or by hand, and returns a ``SweepResult`` (``.table()``,
``.to_json()``, ``.write_html(path)``, ``.pareto()``). Modules: ``jobs`` (jobs and specs), ``executors``
(local process pool, Ray), ``runner`` (what a worker runs), ``cache``, ``rows``, ``results``, ``html``.
"""

from __future__ import annotations

import sys
import types

from qlower.sweep.cache import ResultCache
from qlower.sweep.executors import LocalExecutor, Outcome, RayExecutor, current_executor, use_executor
from qlower.sweep.jobs import MEASURES, Job, grid, grid_from_text, load_spec
from qlower.sweep.orchestrate import sweep
from qlower.sweep.results import SweepResult

__all__ = ["MEASURES", "Job", "LocalExecutor", "Outcome", "RayExecutor", "ResultCache", "SweepResult", "grid",
           "current_executor", "grid_from_text", "load_spec", "sweep", "use_executor"]


class _CallableModule(types.ModuleType):
    """``qlower.sweep`` is both this package and the function ``sweep``: importing a submodule binds the
    package as ``qlower.sweep``, so the package itself answers the call."""

    def __call__(self, *args, **kwargs):
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
