"""CPU backend latency: MobileNetV2- and ResNet-18-shaped int8 IR graphs beside torch eager fp32 and LiteRT.

The int8 graphs are built directly in the IR with random int8 weights
(benchmarks/models_ir.py), 224x224x3, batch 1, and compiled with
``qlower.backends.cpu.prepare(graph, threads=2)``. The fp32 baselines are the zoo's
torch models (``qlower.zoo.get(name)[0]``, NCHW, eager, ``torch.inference_mode``)
with the same thread count. After a warm-up, int8 and fp32 runs alternate (so both
see the same machine load) and the median of ``--runs`` is reported. The int8 output
is checked once against the reference interpreter (bit-exact). Targets on the
2-core machine: MobileNetV2 <= 16 ms, ResNet-18 <= 60 ms.

LiteRT rows (``--no-litert`` skips them): the zoo models themselves, quantized by qlower at 224 and
compiled for the ``litert`` target once per kernel family (``xnnpack``: the default delegates,
``builtin``: LiteRT's optimized builtin kernels), with qlower's ``cpu`` backend running the same
quantized graph as a third column; the three take turns in blocks of 10 timed runs (after 3
untimed ones, so no runtime is timed against another's still-spinning thread pool). Each output is compared once with
the reference interpreter on the program's source: max difference in output steps and share of exact
elements.

    python benchmarks/latency.py [--runs 50] [--warmup 10] [--threads 2] [--no-check] [--no-litert]

Prints a table and writes benchmarks/results/latency.json (per-run times, medians,
load average, machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from models_ir import build_mobilenet_v2, build_resnet18, macs  # noqa: E402

from qlower import zoo  # noqa: E402
from qlower.backends.cpu import native, prepare  # noqa: E402
from qlower.backends.cpu.gemm import int_mm_exact  # noqa: E402
from qlower.reference import run_graph  # noqa: E402

MODELS = {  # name: (IR builder, zoo name, target ms)
    "mobilenet_v2": (build_mobilenet_v2, "mobilenet_v2", 16.0),
    "resnet18": (build_resnet18, "resnet18", 60.0),
}


BLOCK, SETTLE = 10, 3   # LiteRT rows: timed runs per block, untimed runs before each block


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(name: str, runs: int, warmup: int, threads: int, check: bool) -> dict:
    build, zoo_name, target = MODELS[name]
    graph = build()
    t0 = time.perf_counter()
    plan = prepare(graph, threads=threads)
    prepare_s = time.perf_counter() - t0
    image = np.random.default_rng(1).integers(-128, 128, size=graph.inputs[0].shape, dtype=np.int8)

    model = zoo.get(zoo_name)[0].eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                plan.run([image])
                model(x)
            int8_s, fp32_s = [], []
            for _ in range(runs):
                int8_s.append(_time(lambda: plan.run([image])))
                fp32_s.append(_time(lambda: model(x)))
    finally:
        torch.set_num_threads(previous)
    exact = None
    if check:
        exact = bool(np.array_equal(plan.run([image])[0], run_graph(graph, [image])[0]))
    med8, med32 = statistics.median(int8_s) * 1e3, statistics.median(fp32_s) * 1e3
    return {
        "model": name, "macs": macs(graph), "ops": len(graph.ops), "steps": plan.num_steps,
        "fused": len(plan.fused), "prepare_s": round(prepare_s, 3),
        "int8_ms": {"median": round(med8, 3), "p10": round(np.percentile(int8_s, 10) * 1e3, 3),
                    "p90": round(np.percentile(int8_s, 90) * 1e3, 3), "runs": [round(t * 1e3, 3) for t in int8_s]},
        "fp32_eager_ms": {"median": round(med32, 3), "p10": round(np.percentile(fp32_s, 10) * 1e3, 3),
                          "p90": round(np.percentile(fp32_s, 90) * 1e3, 3), "runs": [round(t * 1e3, 3) for t in fp32_s]},
        "target_ms": target, "meets_target": med8 <= target, "speedup_vs_fp32": round(med32 / med8, 2),
        "bit_exact_vs_reference": exact,
    }


def bench_litert(name: str, runs: int, warmup: int, threads: int) -> dict:
    """The zoo model quantized at 224: LiteRT (xnnpack, builtin) and qlower's cpu backend, in turns."""
    import qlower
    from qlower.api import lower_graph

    _, zoo_name, _ = MODELS[name]
    model, example, cfg, calibration = zoo.get(zoo_name)
    progs = {f"litert {k}": qlower.compile(model, example, target="litert", quant=cfg, calibration=calibration,
                                           progress=False, backend_options={"kernels": k, "threads": threads})
             for k in ("xnnpack", "builtin")}
    progs["cpu"] = lower_graph(progs["litert xnnpack"].source, "cpu", threads=threads)
    x = example[0].numpy()
    times: dict[str, list[float]] = {k: [] for k in progs}
    for _ in range(warmup):
        for p in progs.values():
            p.run(x)
    # blocks of BLOCK runs, runtimes taking turns: each runtime's thread pool (OpenMP, ruy, pthreadpool)
    # spins for a while after it runs, so run-by-run alternation would time each one against the
    # previous one's spinning threads; a block's first runs are discarded instead
    while min(len(t) for t in times.values()) < runs:
        for k, p in progs.items():
            for _ in range(SETTLE):
                p.run(x)
            times[k].extend(_time(lambda p=p: p.run(x)) for _ in range(min(BLOCK, runs - len(times[k]))))
    rows = {}
    for k, p in progs.items():
        want, got = run_graph(p.source, [x])[0], p.run(x)[0]
        step = float(p.source.ops[-1].operands[0].type.quant.scale[0]) if p.source.ops[-1].kind == "dequantize" else 1
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64)) / step
        rows[k] = {"median_ms": round(statistics.median(times[k]) * 1e3, 3),
                   "p10_ms": round(np.percentile(times[k], 10) * 1e3, 3),
                   "p90_ms": round(np.percentile(times[k], 90) * 1e3, 3),
                   "max_steps_vs_reference": round(float(diff.max()), 3),
                   "exact_share": round(float(np.mean(diff == 0)), 4)}
    return {"model": name, "size": 224, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the reference comparison")
    parser.add_argument("--no-litert", dest="litert", action="store_false", help="skip the LiteRT rows")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "latency.json")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    rows = [bench(m, args.runs, args.warmup, args.threads, args.check) for m in args.models]
    litert = [bench_litert(m, args.runs, args.warmup, args.threads) for m in args.models] if args.litert else []
    result = {
        "benchmark": "latency", "threads": args.threads, "runs": args.runs, "warmup": args.warmup,
        "models": rows, "zoo_models": litert,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "native_kernels": native.load() is not None, "int8_gemm": int_mm_exact(),
                    "load_average_1min_before": round(load_before, 2),
                    "load_average_1min_after": round(os.getloadavg()[0], 2)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _print_table(result)
    print(f"written to {args.out}")


def _print_table(r: dict) -> None:
    header = ("model", "MACs", "int8 cpu (ms)", "p10-p90", "target", "fp32 eager (ms)", "speedup", "exact")
    rows = [(m["model"], f"{m['macs'] / 1e6:.0f} M", f"{m['int8_ms']['median']:.2f}",
             f"{m['int8_ms']['p10']:.1f}-{m['int8_ms']['p90']:.1f}",
             f"<= {m['target_ms']:.0f} {'met' if m['meets_target'] else 'MISSED'}",
             f"{m['fp32_eager_ms']['median']:.2f}", f"{m['speedup_vs_fp32']:.2f}x",
             {True: "yes", False: "NO", None: "-"}[m["bit_exact_vs_reference"]]) for m in r["models"]]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for line in (header, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)))
    if r["zoo_models"]:
        print("\nzoo models quantized by qlower (224x224, batch 1), same run, blocks taking turns:")
        print(f"{'model':14s} {'runtime':16s} {'median ms':>10s} {'p10-p90':>14s} {'max steps':>10s} {'exact':>8s}")
        for m in r["zoo_models"]:
            for k, row in m["rows"].items():
                print(f"{m['model']:14s} {k:16s} {row['median_ms']:10.2f} "
                      f"{row['p10_ms']:6.1f}-{row['p90_ms']:<7.1f} {row['max_steps_vs_reference']:10.3f} "
                      f"{100 * row['exact_share']:7.2f}%")
    mc = r["machine"]
    print(f"threads {r['threads']}, median of {r['runs']} runs after {r['warmup']} warm-up; "
          f"load average {mc['load_average_1min_before']} -> {mc['load_average_1min_after']} on {mc['cpus']} CPUs")


if __name__ == "__main__":
    main()
