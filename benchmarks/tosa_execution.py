"""What running the TOSA reference model in worker processes costs, per call.

qlower runs TOSA graphs (targets tosa-1.0+*, and the simulated Ethos-U and VGF partitions) in
worker processes, so that a crash of the native reference model can't take the caller down and
no thread has to swap the process's stdout/stderr. This measures, for each model's partition
graph, the median time of one call made in this process straight into ``tosa_reference_model``
and one call through qlower's worker pool (which adds pipes and .npy encoding), in the same run,
and their ratio. A first call also starts a worker; that start-up is reported on its own.

    python benchmarks/tosa_execution.py [--runs 20] [--models tiny_cnn mobilenet_v2 ...] [--size 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ["TOSA_MODEL_NO_BACKTRACE"] = "1"

import numpy as np  # noqa: E402
import tosa_reference_model as trm  # noqa: E402

import qlower  # noqa: E402
from qlower import zoo  # noqa: E402
from qlower.backends.tosa import executor  # noqa: E402


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def measure(name: str, size: int, runs: int) -> dict:
    fixed = name in ("ds_cnn_kws", "lstm_kws")   # audio models have one input shape
    model, example, cfg, calibration = zoo.get(name) if fixed else zoo.get(name, size=size)
    prog = qlower.compile(model, example, target="tosa-1.0+int", quant=cfg, calibration=calibration, progress=False)
    part = max(prog.partitions, key=lambda p: len(p.payload.blobs["graph.tosa"]))
    graph = part.payload.blobs["graph.tosa"]
    rng = np.random.default_rng(0)
    inputs = [rng.integers(t.dtype.min, t.dtype.max + 1, t.shape).astype(t.dtype.numpy)
              if t.dtype.is_integer else rng.standard_normal(t.shape).astype(t.dtype.numpy)
              for t in part.payload.input_types]
    executor._POOL.close()
    t = time.perf_counter()
    executor.run(graph, inputs)
    first = 1e3 * (time.perf_counter() - t)
    worker = _median_ms(lambda: executor.run(graph, inputs), runs)
    direct = _median_ms(lambda: trm.run(graph, inputs), runs)
    same = all(np.array_equal(a, b) for a, b in zip(executor.run(graph, inputs), trm.run(graph, inputs)[0]))
    return {"model": name, "size": size, "graph_bytes": len(graph), "in_process_ms": round(direct, 3),
            "worker_ms": round(worker, 3), "ratio": round(worker / direct, 3), "first_call_ms": round(first, 1),
            "same_outputs": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny_cnn", "ds_cnn_kws", "mobilenet_v2", "resnet18"])
    ap.add_argument("--size", type=int, default=64, help="input size of the image models")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", default="benchmarks/results/tosa_execution.json")
    args = ap.parse_args()
    rows = [measure(m, args.size, args.runs) for m in args.models]
    print(f"{'model':14s} {'graph':>9s} {'in-process':>11s} {'worker':>9s} {'ratio':>6s} {'first call':>11s}  same")
    for r in rows:
        print(f"{r['model']:14s} {r['graph_bytes']:>9,d} {r['in_process_ms']:>9.2f}ms {r['worker_ms']:>7.2f}ms "
              f"{r['ratio']:>6.2f} {r['first_call_ms']:>9.1f}ms  {r['same_outputs']}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.machine(), "cores": os.cpu_count(), "runs": args.runs,
                               "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
