"""Calibration time per activation observer (issue 28: "histogram" / "mse" at most 2x min/max).

Times only what the observer choice changes, on one prepared model per observer and the same
batches: the calibration forward passes (each observer's per-batch update) and the range search
(every observer's ``calculate_qparams``, which convert_pt2e calls). Export and prepare are done
once per observer, outside the timings. Each stage is timed in wall seconds and in process CPU
seconds (``time.process_time``: all of this process's threads), on ``--threads`` torch threads
(default 1: on a shared, loaded machine the CPU time of one thread is what stays comparable;
wall time counts the other processes too). Medians over ``--repeat`` runs, the observers in
turn within each run (a burst of load falls on all of them); compare the ratios to min/max.

The ``float`` row runs the same batches through the prepared graph with every observer replaced by an
identity: what calibration cannot go below. Each observer's cost is its forward minus that (the ``observe``
column, CPU): min/max's one reduction per activation, the histograms' reduction and one counting pass
(qlower/frontend/histogram.py); then its search.

    python benchmarks/calibration_speed.py [--model mobilenet_v2] [--size 224] [--batches 4] [--repeat 3] [--threads 1]
                                           [--act-dtype int8|int16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from qlower import QuantConfig, zoo
from qlower.frontend.capture import export_module, prepare
from qlower.frontend.config import OBSERVERS

RESULTS = Path(__file__).parent / "results" / "calibration_speed.json"
STAGES = ("forward", "search")


def _observers(gm: torch.fx.GraphModule) -> list[torch.nn.Module]:
    from torchao.quantization.pt2e import ObserverBase

    return [m for m in gm.modules() if isinstance(m, ObserverBase)]


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def calibrate_once(model, example, observer: str, batches: list[tuple],
                   act_dtype: str = "int8") -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds of the calibration forwards and of the range search, one fresh prepared model
    (``observer="float"``: min/max's, with its observers replaced by identities)."""
    quant = QuantConfig(observer="minmax" if observer == "float" else observer, act_dtype=act_dtype)
    prepared = prepare(export_module(model, example, static=True), quant, batches)
    if observer == "float":
        observers = set(_observers(prepared))  # PT2E's are children of the graph module
        for name, child in list(prepared.named_children()):
            if child in observers:
                setattr(prepared, name, torch.nn.Identity())
    with torch.no_grad():
        w0, c0 = _clocks()
        for b in batches:
            prepared(*b)
        w1, c1 = _clocks()
        for obs in _observers(prepared):
            obs.calculate_qparams()
        w2, c2 = _clocks()
    return {"forward": (w1 - w0, c1 - c0), "search": (w2 - w1, c2 - c1)}


def bench(model_name: str, size: int, n_batches: int, repeat: int, act_dtype: str = "int8") -> list[dict]:
    model, example, _, _ = zoo.get(model_name, size=size)
    gen = torch.Generator().manual_seed(0)
    batches = [tuple(torch.randn(x.shape, generator=gen) for x in example) for _ in range(n_batches)]
    runs: dict[str, list[dict]] = {obs: [] for obs in ("float", *OBSERVERS)}
    for _ in range(repeat):
        for observer in runs:
            runs[observer].append(calibrate_once(model, example, observer, batches, act_dtype))
    rows = []
    for observer, times in runs.items():
        row = dict(model=model_name, size=size, batches=n_batches, act_dtype=act_dtype, observer=observer)
        for k, clock in enumerate(("wall", "cpu")):
            for stage in STAGES:
                row[f"{stage}_{clock}_s"] = round(statistics.median(t[stage][k] for t in times), 3)
            row[f"total_{clock}_s"] = round(statistics.median(sum(t[s][k] for s in STAGES) for t in times), 3)
        rows.append(row)
    base = next(r for r in rows if r["observer"] == "minmax")
    floor = next(r for r in rows if r["observer"] == "float")
    for r in rows:
        r["observe_cpu_s"] = round(r["forward_cpu_s"] - floor["forward_cpu_s"], 3)
        for clock in ("wall", "cpu"):
            r[f"x_minmax_{clock}"] = round(r[f"total_{clock}_s"] / base[f"total_{clock}_s"], 2)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--act-dtype", choices=("int8", "int16"), default="int8")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    print(f"load: {load:.2f} (1 min), torch threads {torch.get_num_threads()}")
    rows = bench(args.model, args.size, args.batches, args.repeat, args.act_dtype)
    print(f"\n{'observer':<11} {'forward s':>15} {'observe':>7} {'search s':>15} {'total s':>15} {'x minmax':>11}")
    print(f"{'':<11} {'wall':>7} {'cpu':>7} {'cpu':>7} {'wall':>7} {'cpu':>7} {'wall':>7} {'cpu':>7} {'wall':>5} "
          f"{'cpu':>5}")
    for r in rows:
        print(f"{r['observer']:<11} {r['forward_wall_s']:>7.3f} {r['forward_cpu_s']:>7.3f} {r['observe_cpu_s']:>7.3f} "
              f"{r['search_wall_s']:>7.3f} {r['search_cpu_s']:>7.3f} {r['total_wall_s']:>7.3f} {r['total_cpu_s']:>7.3f} "
              f"{r['x_minmax_wall']:>5.2f} {r['x_minmax_cpu']:>5.2f}")
    load_after = os.getloadavg()[0]
    print(f"load after: {load_after:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(dict(load=[load, load_after], threads=args.threads, act_dtype=args.act_dtype,
                                         rows=rows), indent=1))


if __name__ == "__main__":
    main()
