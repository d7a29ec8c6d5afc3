"""The zoo × 6 targets verification sweep, with 1 and 2 local workers and with Ray, on this machine.

Every job compiles one zoo model for one target and verifies it (per layer, bit-exact with the
reference interpreter). Reduced sizes: image models at ``--size`` (default 32) instead of 224, and by
default three of the zoo's smaller models (``--models`` for others); the cache is off, so every executor does
all the work. Reported: wall time per executor, speedup over one worker, the jobs' own times (sum,
median), and Ray's overhead per job (its wall time x workers minus the jobs' time, per job). The
estimate for N machines divides the jobs' time by N x cores and adds the longest job.

    python benchmarks/sweep.py [--models ...] [--targets ...] [--size 32] [--no-ray]
        [--json benchmarks/results/sweep.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from qlower.sweep import LocalExecutor, RayExecutor, grid, sweep

TARGETS = ("cpu", "tosa-1.0+int", "ethos-u55-128", "ethos-u85-256", "litert", "tflm")
MODELS = ("tiny_cnn", "ds_cnn_kws", "vit_block")


def run(executor, jobs) -> dict:
    t0 = time.perf_counter()
    result = sweep(jobs, executor=executor, cache=False, progress=False)
    wall = time.perf_counter() - t0
    job_seconds = [r["seconds"] for r in result.rows if r["seconds"] is not None]
    return {"executor": executor.name, "workers": executor.size, "wall_seconds": round(wall, 1),
            "jobs": len(jobs), "counts": result.counts, "job_seconds_sum": round(sum(job_seconds), 1),
            "job_seconds_median": round(statistics.median(job_seconds), 2) if job_seconds else None,
            "job_seconds_max": round(max(job_seconds), 1) if job_seconds else None,
            "rows": result.comparable_rows(), "failed": [(r["model"], r["target"], r["error"]) for r in result.rows
                                                        if r["status"] != "ok"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--targets", nargs="+", default=list(TARGETS))
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "sweep.json")
    args = ap.parse_args()
    from qlower import zoo

    jobs = []
    for name in args.models:   # models with a fixed input shape take no size
        jobs += grid([f"zoo:{name}"], args.targets, measures=["verify"],
                     size=args.size if zoo.default_size(name) is not None else None)
    runs = []
    for workers in (1, 2):
        runs.append(run(LocalExecutor(workers=workers), jobs))
        print(f"local, {workers} worker(s): {runs[-1]['wall_seconds']} s", flush=True)
    if not args.no_ray:
        import ray

        t0 = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        startup = time.perf_counter() - t0
        runs.append({**run(RayExecutor(), jobs), "ray_init_seconds": round(startup, 1)})
        ray.shutdown()
    base = runs[0]["wall_seconds"]
    print(f"{len(jobs)} jobs ({len(args.models)} models x {len(args.targets)} targets, size {args.size}), "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"{'executor':10s} {'workers':>7s} {'wall s':>8s} {'speedup':>8s} {'jobs s':>8s} {'overhead/job s':>15s}  "
          "ok / not exact / failed")
    for r in runs:
        overhead = (r["wall_seconds"] * r["workers"] - r["job_seconds_sum"]) / r["jobs"]
        r["speedup"] = round(base / r["wall_seconds"], 2)
        r["overhead_per_job_seconds"] = round(overhead, 2)
        c = r["counts"]
        print(f"{r['executor']:10s} {r['workers']:7d} {r['wall_seconds']:8.1f} {r['speedup']:8.2f} "
              f"{r['job_seconds_sum']:8.1f} {overhead:15.2f}  {c['ok']} / {c['not exact']} / {c['failed']}")
    same = all(r["rows"] == runs[0]["rows"] for r in runs[1:])
    print(f"rows identical across executors: {same}")
    job_sum, longest = runs[0]["job_seconds_sum"], runs[0]["job_seconds_max"]
    for machines in (50,):
        cores = machines * (os.cpu_count() or 1)
        print(f"estimate on {machines} machines of {os.cpu_count()} cores: about "
              f"{job_sum / cores + longest:.0f} s (jobs' time / cores + the longest job)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": platform.platform(), "cores": os.cpu_count(),
                                     "load": os.getloadavg(), "size": args.size, "targets": args.targets,
                                     "models": args.models, "rows_identical": same,
                                     "runs": [{k: v for k, v in r.items() if k != "rows"} for r in runs]},
                                    indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
