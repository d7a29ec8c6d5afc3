"""Running a sweep: fingerprint each model, take what the cache has, run the rest, keep every row.

Three steps, all through one executor: (1) each distinct model is built and fingerprinted once
(``runner.fingerprint``), which gives every job its cache key; (2) jobs whose key the cache holds
are rows already; (3) the others run (``runner.run_job``), each row written to the cache as it
arrives, so an interrupted sweep loses only the jobs that were running. One progress bar counts
jobs done / failed / cached, on a terminal only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from qlower.errors import ConfigError
from qlower.progress import progress_bar
from qlower.sweep.cache import ResultCache, job_key
from qlower.sweep.executors import make_executor
from qlower.sweep.jobs import Job
from qlower.sweep.results import SweepResult
from qlower.sweep.rows import failed_row


def sweep(jobs: Iterable[Job], *, executor: Any = None, workers: int | None = None, ray: str | bool | None = None,
          cache: bool | str | ResultCache = True, progress: bool = True) -> SweepResult:
    """Run ``jobs`` (``qlower.sweep.Job``s, e.g. from ``grid`` or ``load_spec``) and return their rows.

    ``executor``: a ``LocalExecutor`` or ``RayExecutor``; else ``ray`` (True, or a cluster address)
    makes a ``RayExecutor`` and otherwise a ``LocalExecutor`` of ``workers`` processes (default: the
    cores) runs them. ``cache``: True (the default directory), a directory, a ``ResultCache``, or
    False (run everything, keep nothing). A failed job is a row (status "failed", its reason), never
    an exception; the sweep goes on.
    """
    jobs = list(jobs)
    if not all(isinstance(j, Job) for j in jobs):
        bad = next(j for j in jobs if not isinstance(j, Job))
        raise ConfigError(f"a sweep's jobs are qlower.sweep.Job objects, got {type(bad).__name__}")
    if not jobs:
        raise ConfigError("a sweep needs at least one job")
    runner = make_executor(executor, workers=workers, ray=ray)
    store = None if cache is False else cache if isinstance(cache, ResultCache) else \
        ResultCache(None if cache is True else cache)
    t0 = time.perf_counter()
    from qlower.sweep import runner as job_runner

    rows: list[dict | None] = [None] * len(jobs)
    keys: list[str] = [""] * len(jobs)
    with progress_bar(progress, total=len(jobs), desc="sweep", unit="job") as bar:
        counts = {"done": 0, "failed": 0, "cached": 0}

        def finish(i: int, row: dict) -> None:
            rows[i] = row
            counts["failed" if row["status"] == "failed" else "cached" if row["cached"] else "done"] += 1
            bar.set_postfix(counts, refresh=False)
            bar.update()

        if store is not None:
            # (1) one fingerprint per distinct model, then (2) the cache's rows
            models: dict[tuple, list[int]] = {}
            for i, job in enumerate(jobs):
                models.setdefault((job.model_name, job.size, job.trained), []).append(i)
            firsts = [jobs[members[0]] for members in models.values()]
            for outcome in runner.map(job_runner.fingerprint, firsts):
                members = list(models.values())[outcome.index]
                for i in members:
                    if outcome.ok:
                        keys[i] = job_key(jobs[i], outcome.value["fingerprint"])
                        hit = store.get(keys[i])
                        if hit is not None:
                            finish(i, {**hit, "cached": True})
                    else:
                        finish(i, failed_row(jobs[i], "", f"building the model failed: {outcome.error}",
                                             outcome.attempts))
        todo = [i for i in range(len(jobs)) if rows[i] is None]
        # (3) the rest, each row kept as it arrives
        for outcome in runner.map(job_runner.run_job, [(jobs[i], keys[i]) for i in todo]):
            i = todo[outcome.index]
            row = outcome.value if outcome.ok else failed_row(jobs[i], keys[i], outcome.error, outcome.attempts)
            row.update(executor=runner.name, attempts=outcome.attempts)
            if store is not None and keys[i]:
                store.put(keys[i], row)
            finish(i, row)
    if store is not None:
        store.prune()
    return SweepResult(rows, time.perf_counter() - t0, runner.name, runner.size)
