"""``make fuzz``: every fuzz and property suite, in parallel through the sweep's local process pool.

The fuzz tests (``pytest -m fuzz``) are shared out as jobs: one per test file, and one per test of
the files named in ``SPLIT`` (the differential fuzzer's per-target runs, the longest). Each job is
one pytest process with the same hypothesis seed and example budget; a job that crashes or fails is
a failed row and the others go on. Exit status 1 when any job failed.

    python scripts/fuzz.py --seed N [--examples 2000] [--workers K] [--only TEXT]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPLIT = {"tests/test_fuzz_differential.py"}


def fuzz_jobs() -> list[str]:
    """The node ids / files to run, one a job."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "fuzz", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if not ids:
        raise SystemExit(f"collecting the fuzz tests failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    by_file: dict[str, list[str]] = defaultdict(list)
    for node in ids:
        by_file[node.split("::")[0]].append(node)
    return [job for file, nodes in by_file.items() for job in (nodes if file in SPLIT else [file])]


def run_pytest(item: tuple[str, int, int]) -> dict:
    """One job: pytest on ``node`` with the seed and budget; its exit code and summary line."""
    node, seed, examples = item
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "fuzz", "-p", "no:cacheprovider",
                           f"--hypothesis-seed={seed}", node], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "QLOWER_FUZZ_EXAMPLES": str(examples), "TOSA_MODEL_NO_BACKTRACE": "1"},
                          check=False)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return {"node": node, "code": proc.returncode, "summary": lines[-1] if lines else proc.stderr[-300:],
            "output": proc.stdout[-4000:] if proc.returncode else "", "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=None, help="jobs at once (default: the cores)")
    ap.add_argument("--only", default="", help="only the jobs whose node id contains this text")
    args = ap.parse_args()
    from qlower.sweep import LocalExecutor

    jobs = [job for job in fuzz_jobs() if args.only in job]
    executor = LocalExecutor(workers=args.workers)
    print(f"make fuzz: {len(jobs)} jobs on {executor.size} worker(s), seed {args.seed}, {args.examples} examples",
          flush=True)
    failed = 0
    t0 = time.perf_counter()
    for outcome in executor.map(run_pytest, [(job, args.seed, args.examples) for job in jobs]):
        if not outcome.ok:
            failed += 1
            print(f"FAILED {jobs[outcome.index]}: {outcome.error}", flush=True)
            continue
        r = outcome.value
        failed += r["code"] != 0
        print(f"{'ok    ' if r['code'] == 0 else 'FAILED'} {r['node']} ({r['seconds']} s): {r['summary']}", flush=True)
        if r["code"]:
            print(r["output"], flush=True)
    print(f"make fuzz: {len(jobs) - failed} of {len(jobs)} jobs passed in {time.perf_counter() - t0:.0f} s "
          f"(repeat with QLOWER_FUZZ_SEED={args.seed} make fuzz)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
