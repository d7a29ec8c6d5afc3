"""What runs inside a sweep's worker process: a model's fingerprint, and one job from model to row.

This module imports neither torch nor the compiler at the top (the sweep's own process need not);
the fork server preloads them (``executors.PRELOAD``), so a job starts with them loaded. Both are
plain functions of picklable arguments, so the local pool and Ray run the very same code
and produce the same rows. Everything a job raises becomes its row's ``error``; a crash of the
process itself is caught by the executor.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import replace
from typing import Any

from qlower import model_spec
from qlower.sweep.jobs import Job
from qlower.sweep.rows import empty_row

LATENCY_RUNS = 5


def load_model(job: Job) -> tuple[Any, tuple, Any, list]:
    """``(model, example_inputs, quant, calibration)`` of a job, its ``quant`` fields applied over the
    model's own configuration."""
    from qlower.frontend.config import QuantConfig

    model, example, quant, calibration = model_spec.load(job.model, size=job.size, trained=job.trained)
    if job.quant:
        quant = replace(quant if quant is not None else QuantConfig(), **job.quant)
    return model, example, quant, calibration


def _hash_tensor(h: Any, name: str, t: Any) -> None:
    import torch

    t = torch.as_tensor(t).detach().contiguous().cpu()
    h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).numpy().tobytes())


def fingerprint(job: Job) -> dict[str, Any]:
    """A content hash of what the job's model is: its exported graph (``torch.export``'s code), its
    weights and buffers, its example and calibration inputs and its base quantization. The same model
    built again hashes the same; a changed weight, op or input does not."""
    import torch

    t0 = time.perf_counter()
    model, example, quant, calibration = load_model(job)
    h = hashlib.sha256()
    exported = torch.export.export(model.eval(), example, strict=False)
    h.update(exported.graph_module.code.encode())
    for name, t in sorted(exported.state_dict.items()):
        _hash_tensor(h, name, t)
    for name, t in sorted(getattr(exported, "constants", {}).items()):
        if isinstance(t, torch.Tensor):
            _hash_tensor(h, name, t)
    for i, batch in enumerate([example, *calibration]):
        for j, t in enumerate(batch):
            _hash_tensor(h, f"input{i}.{j}", t)
    h.update(repr(quant).encode())
    return {"fingerprint": h.hexdigest(), "seconds": round(time.perf_counter() - t0, 3)}


def run_job(item: tuple[Job, str]) -> dict[str, Any]:
    """Compile ``job`` and measure what it asks: a row (see ``qlower.sweep.rows``). Never raises for
    what the job does: an error is the row's ``status`` "failed" and its ``error``."""
    job, key = item
    row = empty_row(job, key)
    t0 = time.perf_counter()
    try:
        _measure(job, row)
    except Exception as e:  # noqa: BLE001  (a failed job is a row, the sweep goes on)
        from qlower.sweep.executors import describe_exception

        row["status"], row["error"] = "failed", describe_exception(e)
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def _measure(job: Job, row: dict[str, Any]) -> None:
    import numpy as np
    import torch

    import qlower
    from qlower.backends.registry import cost_report
    from qlower.verification.metrics import sqnr_db

    model, example, quant, calibration = load_model(job)
    t0 = time.perf_counter()
    prog = qlower.compile(model, example, job.target, quant, calibration, progress=False,
                          trace="verify" in job.measures, backend_options=dict(job.options) or None)
    row["compile_seconds"] = round(time.perf_counter() - t0, 3)
    row["partitions"] = len(prog.partitions)
    row["host_ops"] = sum(1 for op in prog.graph.ops if op.kind not in ("constant", "delegate"))
    row["status"] = "ok"
    if "verify" in job.measures:
        report = qlower.verify_program(prog, [example])
        steps = [o.target_vs_ref.max_steps for o in report.outputs if o.target_vs_ref is not None]
        row["exact"], row["max_steps"] = report.ok, (max(steps) if steps else 0.0)
        if not report.ok:
            row["status"], row["error"] = "not exact", report.problems[0]
    if "accuracy" in job.measures:
        with torch.no_grad():
            fp32 = [np.asarray(_first(model(*batch)), dtype=np.float64) for batch in calibration]
        ours = [np.asarray(prog.run(*[t.numpy() for t in batch])[0], dtype=np.float64) for batch in calibration]
        row["sqnr_db"] = _finite(sqnr_db(np.concatenate([f.ravel() for f in fp32]),
                                         np.concatenate([o.ravel() for o in ours])))
        if job.trained and isinstance(job.model, str) and job.model.startswith("zoo:"):
            from qlower import zoo

            acc = qlower.measure_accuracy(prog, zoo.held_out(job.model[4:]), progress=False)
            row["accuracy"], row["fp32_accuracy"] = acc.program, acc.fp32
    if "cycles" in job.measures:
        costs = [c for c in (cost_report(p.payload) for p in prog.partitions) if c is not None and c.cycles is not None]
        if costs:
            row["cycles"] = int(sum(c.cycles for c in costs))
            row["cycle_estimator"] = ", ".join(sorted({c.estimator for c in costs}))
    if "latency" in job.measures:
        inputs = [t.numpy() for t in example]
        prog.run(*inputs)   # warm-up: kernels packed, interpreters loaded
        times = []
        for _ in range(LATENCY_RUNS):
            t = time.perf_counter()
            prog.run(*inputs)
            times.append(time.perf_counter() - t)
        row["latency_ms"] = round(1e3 * statistics.median(times), 3)


def _first(out: Any) -> Any:
    while isinstance(out, tuple | list):
        out = out[0]
    return out.detach()


def _finite(x: float) -> float | None:
    return None if x != x or x in (float("inf"), float("-inf")) else round(x, 4)
