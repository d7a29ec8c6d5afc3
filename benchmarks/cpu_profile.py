"""Where the ``cpu`` backend's time goes: the zoo's MobileNetV2 and ResNet-18 at 224, per kernel kind.

Compiles each model for the ``cpu`` target (as benchmarks/latency.py's cpu row does), then runs its
plan with ``CpuPlan.run_profiled`` and sums each step's wall and process-CPU time by its label (the
fused op chain, e.g. ``conv2d+rescale+clamp``; depthwise convs are labelled ``dw:`` apart from dense
ones). Medians over the runs per step. On a loaded machine, the CPU time of a 1-thread run is the
steadier figure.

    python benchmarks/cpu_profile.py [--models mobilenet_v2 resnet18] [--threads 1 2] [--runs 10] [--layers]

Prints a table per model and thread count (with ``--layers``, every step with its layer shape too) and
writes benchmarks/results/cpu_profile.json (per kind and per step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from qlower import zoo
from qlower.api import lower_graph
from qlower.backends.cpu import prepare


def _labels(plan) -> list[str]:
    out = []
    for step in plan._steps:
        label = "+".join(op.kind for op in step.ops)
        first = step.ops[0]
        if first.kind == "conv2d" and first.attrs["groups"] > 1:
            label = "dw:" + label
        elif first.kind == "conv2d":
            kh, kw = first.operands[1].shape[1:3]
            label = f"{kh}x{kw}:" + label
        out.append(label)
    return out


def _shape(step) -> str:
    """A step's layer shape: ``HxWxC->OHxOWxO kK sS`` for convolutions, else its first operand's shape."""
    op = step.ops[0]
    if op.kind == "conv2d":
        (_, h, w, c), (o, kh, _, _), (_, oh, ow, _) = op.operands[0].shape, op.operands[1].shape, op.result.shape
        return f"{h}x{w}x{c}->{oh}x{ow}x{o} k{kh} s{op.attrs['stride'][0]}"
    return "x".join(map(str, op.operands[0].shape)) if op.operands and op.operands[0] is not None else ""


def profile(graph, x: np.ndarray, threads: int, runs: int, warmup: int) -> dict:
    plan = prepare(graph, threads=threads)
    labels = _labels(plan)
    for _ in range(warmup):
        plan.run([x])
    per_step = [plan.run_profiled([x]) for _ in range(runs)]
    whole = []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        plan.run([x])
        whole.append((time.perf_counter() - w0, time.process_time() - c0))
    kinds: dict[str, dict[str, float]] = {}
    layers = [{"step": i, "kernel": label, "shape": _shape(step),
               "wall_ms": round(statistics.median(r[i][1] for r in per_step) * 1e3, 4),
               "cpu_ms": round(statistics.median(r[i][2] for r in per_step) * 1e3, 4)}
              for i, (label, step) in enumerate(zip(labels, plan._steps))]
    for i, label in enumerate(labels):
        row = kinds.setdefault(label, {"steps": 0, "wall_ms": 0.0, "cpu_ms": 0.0})
        row["steps"] += 1
        row["wall_ms"] += statistics.median(r[i][1] for r in per_step) * 1e3
        row["cpu_ms"] += statistics.median(r[i][2] for r in per_step) * 1e3
    return {"threads": threads, "steps": len(labels),
            "run_wall_ms": round(statistics.median(w for w, _ in whole) * 1e3, 3),
            "run_cpu_ms": round(statistics.median(c for _, c in whole) * 1e3, 3),
            "kinds": {k: {"steps": v["steps"], "wall_ms": round(v["wall_ms"], 3), "cpu_ms": round(v["cpu_ms"], 3)}
                      for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]["wall_ms"])},
            "layers": layers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet18"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", action="store_true", help="also print every step with its layer shape")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpu_profile.json"))
    args = parser.parse_args()
    import qlower

    results = {"load_average_1min_before": round(os.getloadavg()[0], 2), "models": {}}
    for name in args.models:
        model, example, cfg, calibration = zoo.get(name)
        base = qlower.compile(model, example, target="cpu", quant=cfg, calibration=calibration, progress=False)
        graph = lower_graph(base.canonical_graph, "cpu").graph
        x = example[0].numpy()
        rows = []
        for threads in args.threads:
            r = profile(graph, x, threads, args.runs, args.warmup)
            rows.append(r)
            print(f"\n{name}, {threads} thread(s): run {r['run_wall_ms']} ms wall, {r['run_cpu_ms']} ms CPU, "
                  f"{r['steps']} steps")
            print(f"  {'kernel':44s} {'steps':>5s} {'wall ms':>9s} {'cpu ms':>9s}")
            for k, v in r["kinds"].items():
                print(f"  {k:44s} {v['steps']:5d} {v['wall_ms']:9.3f} {v['cpu_ms']:9.3f}")
            if args.layers:
                print(f"  {'step':>4s} {'kernel':28s} {'layer':32s} {'wall ms':>9s} {'cpu ms':>9s}")
                for row in r["layers"]:
                    print(f"  {row['step']:4d} {row['kernel']:28s} {row['shape']:32s} {row['wall_ms']:9.3f} "
                          f"{row['cpu_ms']:9.3f}")
        results["models"][name] = rows
    results["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    print(f"\nload average {results['load_average_1min_before']} -> {results['load_average_1min_after']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
