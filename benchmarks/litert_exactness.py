"""How exactly each LiteRT kernel family reproduces the reference interpreter, per zoo model.

Every static zoo model (image models at ``--size``) is compiled for the ``litert`` target once per
``kernels`` value (so its fused requantization has that family's rounding) and run in LiteRT on
``--inputs`` random inputs (seeded) besides the example; each output is compared with the
reference interpreter on the program's source graph, in steps of the output's quantization (the
scale of the dequantized output, or 1 for integer outputs). Reported: the largest difference in
steps and the share of output elements that are exact. Every family must show 0 steps and 100%:
``xnnpack`` programs carry XNNPACK's float32 requantization and its ADD (qlower/backends/litert/rounding.py,
xnnpack_add.py) and its payloads XNNPACK's own QUANTIZE and DEQUANTIZE (export.py).

XNNPACK runs its AMX or its AVX-512 VNNI GEMM kernels, one choice per process (the first program's cost
model, qlower/backends/litert/xnnpack_isa.py); ``--xnnpack-amx 1|0`` forces it, and the output says which ran.

    python benchmarks/litert_exactness.py [--size 32] [--inputs 4] [--models tiny_cnn ...] [--xnnpack-amx 1|0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import qlower
from qlower import zoo
from qlower.reference import run_graph

KERNELS = ("reference", "builtin", "xnnpack")
DYNAMIC = ("s0_dynamic_biasless", "s2_perchannel_binary")


def output_steps(graph) -> list[float]:
    """The size of one quantization step of each graph output (its dequantize's scale)."""
    producers = graph.producers()
    steps = []
    for v in graph.outputs:
        op = producers.get(v)
        if op is not None and op.kind == "dequantize" and op.operands[0].type.quant is not None:
            steps.append(float(np.max(op.operands[0].type.quant.scale)))
        else:
            steps.append(1.0)
    return steps


def measure(name: str, size: int | None, kernels: str, n_inputs: int) -> dict:
    model, example, cfg, calibration = zoo.get(name, size=size)
    prog = qlower.compile(model, example, target="litert", quant=cfg, calibration=calibration, progress=False,
                          backend_options={"kernels": kernels})
    rng = torch.Generator().manual_seed(0)
    batches = [list(example)] + [[torch.randn(x.shape, generator=rng) if x.is_floating_point() else x
                                  for x in example] for _ in range(n_inputs)]
    worst, exact, total = 0.0, 0, 0
    for batch in batches:
        inputs = [x.detach().numpy() for x in batch]
        want = run_graph(prog.source, inputs)
        got = prog.run(*inputs)
        for w, g, step in zip(want, got, output_steps(prog.source)):
            diff = np.abs(g.astype(np.float64) - w.astype(np.float64)) / step
            worst = max(worst, float(diff.max(initial=0.0)))
            exact += int(np.count_nonzero(diff == 0))
            total += diff.size
    return {"model": name, "kernels": kernels, "max_steps": round(worst, 3), "exact_share": exact / max(total, 1),
            "elements": total, "partitions": len(prog.partitions)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--inputs", type=int, default=4, help="random inputs besides the example")
    ap.add_argument("--models", nargs="*", default=[n for n in zoo.names() if n not in DYNAMIC])
    ap.add_argument("--json", default="benchmarks/results/litert_exactness.json")
    ap.add_argument("--xnnpack-amx", choices=("1", "0"), default=None,
                    help="XNNPACK's kernels for this process: 1 AMX tiles (where the CPU has them), 0 AVX-512 VNNI "
                         "(default: the first xnnpack program's cost model)")
    args = ap.parse_args()
    if args.xnnpack_amx is not None:
        os.environ["QLOWER_XNNPACK_AMX"] = args.xnnpack_amx   # read when XNNPACK starts, below
    warnings.simplefilter("ignore")
    rows = []
    t0 = time.perf_counter()
    for name in args.models:
        size = args.size if zoo.default_size(name) else None
        for kernels in KERNELS:
            rows.append(measure(name, size, kernels, args.inputs))
            r = rows[-1]
            print(f"{name:22s} {kernels:10s} max {r['max_steps']:7.3f} steps  exact {100 * r['exact_share']:7.3f}%"
                  f"  ({r['elements']} elements)", flush=True)
    print(f"\n{'kernels':10s} {'models exact':>13s} {'worst steps':>12s} {'exact share (min)':>18s}")
    for kernels in KERNELS:
        mine = [r for r in rows if r["kernels"] == kernels]
        n_exact = sum(r["max_steps"] == 0 for r in mine)
        print(f"{kernels:10s} {n_exact:>6d}/{len(mine):<6d} {max(r['max_steps'] for r in mine):12.3f} "
              f"{100 * min(r['exact_share'] for r in mine):17.3f}%")
    from qlower.backends.litert import xnnpack_isa
    isa = xnnpack_isa.state()
    print(f"XNNPACK ran {'AMX tiles' if isa['amx_tiles'] else 'AVX-512 VNNI kernels'} ({isa['why']})")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.machine(), "size": args.size, "inputs": args.inputs,
                               "xnnpack_isa": isa,
                               "seconds": round(time.perf_counter() - t0, 1), "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
