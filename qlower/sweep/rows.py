"""A sweep's row: one job's configuration and what was measured, the same keys whoever ran it.

Every row has every key (None where a measure was not asked for or does not apply), so the table,
the JSON and the HTML page read rows alike, and rows from the local pool, Ray or the cache compare
equal once their timings (``TIMING_FIELDS``) and provenance (``RUN_FIELDS``) are left out.
"""

from __future__ import annotations

from typing import Any

from qlower.sweep.jobs import Job

# the job (what was asked)
JOB_FIELDS = ("model", "size", "trained", "target", "quant", "options", "measures")
# what was found: status is "ok", "not exact" (verify ran and the target differs from the reference)
# or "failed" (error says why: an exception, a crash, a timeout)
RESULT_FIELDS = ("status", "error", "partitions", "host_ops", "exact", "max_steps", "sqnr_db", "accuracy",
                 "fp32_accuracy", "cycles", "cycle_estimator")
# wall times: depend on the machine and its load
TIMING_FIELDS = ("seconds", "compile_seconds", "latency_ms")
# how this row came to be: the cache key, whether it came from the cache, which executor ran it, attempts
RUN_FIELDS = ("key", "cached", "executor", "attempts")
FIELDS = JOB_FIELDS + RESULT_FIELDS + TIMING_FIELDS + RUN_FIELDS
STATUSES = ("ok", "not exact", "failed")


def empty_row(job: Job, key: str) -> dict[str, Any]:
    """The row of ``job`` before anything ran: the job's fields, every other key None."""
    row: dict[str, Any] = dict.fromkeys(FIELDS)
    row.update(job.describe())
    row.update(status="failed", error="", key=key, cached=False, attempts=1)
    return row


def failed_row(job: Job, key: str, reason: str, attempts: int = 1) -> dict[str, Any]:
    """The row of a job whose process never answered (a crash, a lost worker, a timeout)."""
    row = empty_row(job, key)
    row.update(error=reason, attempts=attempts)
    return row


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without its timings and provenance: what two runs of the same job must agree on."""
    return {k: row.get(k) for k in JOB_FIELDS + RESULT_FIELDS}
