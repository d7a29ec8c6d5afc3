"""How fast are pooling and reductions on extreme shapes, on the reference and the cpu backend?

Each case is a one-op graph built directly in the IR: average and max pooling of
a 1x800x90x8 NHWC map with an 800x90 window (a global pool over a tall map), an
800x1 and a 1x90 window (stride 1, so 1x90 and 800x1 outputs), a medium 64x64x16
map with a 7x7 window, stride 1 and padding 3, a large window with a large output
(100x30, stride 2, padding 10 and 5 over the tall map: 361x36 outputs), and reduce_sum / reduce_max over
the tall map. Average pooling runs on int8, int16 and float32 inputs, max pooling
on int8 and float32. Each case runs once on the reference interpreter and once on
a prepared cpu plan (the cpu output is checked bit-exact against the reference),
then ``--runs`` more times on each; the medians are reported. A case whose first
run takes more than ``--slow`` seconds is not repeated (its single time is the
median), so that the old, slow kernels can be measured in reasonable time.
The cpu column excludes ``prepare`` (timed separately, once). The cpu plan runs on
``--threads`` torch threads (default 1: on the shared 2-core machine a second
thread mostly waits for a core another process holds, which makes small kernels
take a scheduler tick or two; 0 keeps torch's default).

    python benchmarks/extreme_shapes.py [--runs 5] [--slow 5] [--threads 1] [--only SUBSTRING] [--out PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from qlower.backends.cpu import prepare
from qlower.ir import DType, Graph, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph

TALL = (1, 800, 90, 8)
MEDIUM = (1, 64, 64, 16)
NO_PAD = (0, 0, 0, 0)
# (name, op kind, dtype, input shape, attributes)
CASES = [
    *[(f"{kind} {dt.name.lower()} 800x90 k{k[0]}x{k[1]}", kind, dt, TALL, {"kernel": k, "stride": (1, 1), "pad": NO_PAD})
      for kind, dts in (("avg_pool2d", (DType.INT8, DType.INT16, DType.FLOAT32)),
                        ("max_pool2d", (DType.INT8, DType.FLOAT32)))
      for dt in dts
      for k in ((800, 90), (800, 1), (1, 90))],
    *[(f"{kind} {dt.name.lower()} 64x64 k7x7 p3", kind, dt, MEDIUM, {"kernel": (7, 7), "stride": (1, 1),
                                                                      "pad": (3, 3, 3, 3)})
      for kind, dts in (("avg_pool2d", (DType.INT8, DType.FLOAT32)), ("max_pool2d", (DType.INT8, DType.FLOAT32)))
      for dt in dts],
    *[(f"{kind} {dt.name.lower()} 800x90 k100x30 s2 p10,5", kind, dt, TALL, {"kernel": (100, 30), "stride": (2, 2),
                                                                              "pad": (10, 10, 5, 5)})
      for kind, dts in (("avg_pool2d", (DType.INT8, DType.FLOAT32)), ("max_pool2d", (DType.INT8, DType.FLOAT32)))
      for dt in dts],
    *[(f"{kind} {dt.name.lower()} 800x90 axis {axis}", kind, dt, TALL, {"axis": axis})
      for kind, dts in (("reduce_sum", (DType.INT32, DType.FLOAT32)), ("reduce_max", (DType.INT8, DType.FLOAT32)))
      for dt in dts
      for axis in (1, 2)],
]


def build(kind: str, dtype: DType, shape: tuple, attrs: dict) -> Graph:
    if dtype.is_float:
        quant = None
    elif dtype is DType.INT32:
        quant = QuantSpec.per_tensor(0.001, 0, dtype)
    else:
        quant = QuantSpec.per_tensor(0.05, -7 if dtype is DType.INT8 else 0, dtype)
    b = GraphBuilder(kind)
    x = b.input("x", TensorType(shape, dtype, quant))
    return verify_graph(b.build([b.op(kind, x, **attrs)]))


def make_input(dtype: DType, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    if dtype.is_float:
        return rng.standard_normal(shape).astype(np.float32)
    if dtype is DType.INT32:
        return rng.integers(-(2**20), 2**20, size=shape).astype(np.int32)
    info = np.iinfo(dtype.numpy)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype.numpy)


def _timed(fn, arg, runs: int, slow: float) -> tuple[list[float], object]:
    t = time.perf_counter()
    out = fn(arg)
    times = [time.perf_counter() - t]
    if times[0] > slow:
        return times, out
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t)
    return times, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--slow", type=float, default=5.0, help="don't repeat a case whose first run takes longer")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the cpu plan; 0: torch's default")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "extreme_shapes.json")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    rows = []
    for name, kind, dtype, shape, attrs in CASES:
        if args.only not in name:
            continue
        graph = build(kind, dtype, shape, attrs)
        x = make_input(dtype, shape, rng)
        ref_times, (expected,) = _timed(functools.partial(run_graph, graph), [x], args.runs, args.slow)
        t = time.perf_counter()
        plan = prepare(graph, threads=args.threads or None)
        prepare_s = time.perf_counter() - t
        cpu_times, (got,) = _timed(plan.run, [x], args.runs, args.slow)
        exact = expected.dtype == got.dtype and np.ascontiguousarray(expected).tobytes() == \
            np.ascontiguousarray(got).tobytes()
        rows.append({"case": name, "op": kind, "dtype": dtype.name.lower(), "shape": list(shape),
                     "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()},
                     "reference_s": [round(v, 5) for v in ref_times],
                     "reference_median_s": round(statistics.median(ref_times), 5),
                     "cpu_prepare_s": round(prepare_s, 5),
                     "cpu_s": [round(v, 5) for v in cpu_times],
                     "cpu_median_s": round(statistics.median(cpu_times), 5),
                     "bit_exact": bool(exact)})
        _print_row(rows[-1])

    result = {
        "benchmark": "extreme_shapes",
        "runs": args.runs,
        "slow_s": args.slow,
        "cpu_threads": args.threads or "torch default",
        "cases": rows,
        "all_bit_exact": all(r["bit_exact"] for r in rows),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "numpy": np.__version__,
                    "torch": torch.__version__, "torch_default_threads": torch.get_num_threads(),
                    "load_average_1min": round(os.getloadavg()[0], 2)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _print_table(result)
    print(f"written to {args.out}")


def _print_row(r: dict) -> None:
    print(f"  {r['case']:<40} reference {r['reference_median_s']:9.4f} s   cpu {r['cpu_median_s']:9.4f} s"
          f"   {'exact' if r['bit_exact'] else 'DIFFERS'}", flush=True)


def _print_table(result: dict) -> None:
    header = ("case", "reference (median)", "cpu (median)", "cpu prepare", "bit-exact")
    lines = [(r["case"], f"{r['reference_median_s']:.4f} s", f"{r['cpu_median_s']:.4f} s",
              f"{r['cpu_prepare_s']:.4f} s", "yes" if r["bit_exact"] else "NO") for r in result["cases"]]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for line in [header, *lines]:
            print(f"{line[0]:<40} {line[1]:>18} {line[2]:>14} {line[3]:>12} {line[4]:>9}")
        return
    table = Table(title=f"extreme pooling shapes (load {result['machine']['load_average_1min']:.2f} "
                        f"on {result['machine']['cpus']} CPUs)")
    for h in header:
        table.add_column(h, justify="left" if h == "case" else "right")
    for line in lines:
        table.add_row(*line)
    Console().print(table)


if __name__ == "__main__":
    main()
