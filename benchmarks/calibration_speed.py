"""Calibration time per activation observer (issue 28: "histogram" / "mse" at most 2x min/max).

Times only what the observer choice changes, on one prepared model per observer and the same
batches: the calibration forward passes (each observer's per-batch update) and the range search
(every observer's ``calculate_qparams``, which convert_pt2e calls). Export and prepare are done
once per observer, outside the timings. Medians over ``--repeat`` runs (observers reset between
runs); the machine is shared and noisy, so compare the ratios to min/max within one run.

    python benchmarks/calibration_speed.py [--model mobilenet_v2] [--size 224] [--batches 4] [--repeat 3]
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


def _observers(gm: torch.fx.GraphModule) -> list[torch.nn.Module]:
    from torchao.quantization.pt2e import ObserverBase

    return [m for m in gm.modules() if isinstance(m, ObserverBase)]


def bench(model_name: str, size: int, n_batches: int, repeat: int) -> list[dict]:
    model, example, _, _ = zoo.get(model_name, size=size)
    gen = torch.Generator().manual_seed(0)
    batches = [tuple(torch.randn(x.shape, generator=gen) for x in example) for _ in range(n_batches)]
    rows = []
    for observer in OBSERVERS:
        quant = QuantConfig(observer=observer)
        forward, search = [], []
        for _ in range(repeat):
            prepared = prepare(export_module(model, example, static=True), quant, batches)
            with torch.no_grad():
                t0 = time.perf_counter()
                for b in batches:
                    prepared(*b)
                t1 = time.perf_counter()
                for obs in _observers(prepared):
                    obs.calculate_qparams()
                t2 = time.perf_counter()
            forward.append(t1 - t0)
            search.append(t2 - t1)
        f, s = statistics.median(forward), statistics.median(search)
        rows.append(dict(model=model_name, size=size, batches=n_batches, observer=observer,
                         forward_s=round(f, 3), search_s=round(s, 3), total_s=round(f + s, 3)))
        print(f"{observer:<11} forward {f:7.3f} s  search {s:7.3f} s  total {f + s:7.3f} s", flush=True)
    base = next(r["total_s"] for r in rows if r["observer"] == "minmax")
    for r in rows:
        r["x_minmax"] = round(r["total_s"] / base, 2)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), torch threads {torch.get_num_threads()}")
    rows = bench(args.model, args.size, args.batches, args.repeat)
    print(f"\n{'observer':<11} {'forward s':>9} {'search s':>9} {'total s':>8} {'x minmax':>8}")
    for r in rows:
        print(f"{r['observer']:<11} {r['forward_s']:>9.3f} {r['search_s']:>9.3f} {r['total_s']:>8.3f} "
              f"{r['x_minmax']:>8.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(dict(load=os.getloadavg()[0], rows=rows), indent=1))


if __name__ == "__main__":
    main()
