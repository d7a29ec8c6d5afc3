"""The zoo on the ``tflm`` target: does TFLM load it, is it bit-exact, and what must the device hold.

Each zoo model (image models at ``--size``) is compiled for ``tflm``. A model that runs wholly on
TFLM is exported (``--format tflite``'s file) and run by tflite-micro's interpreter on the example
and ``--inputs`` seeded random inputs, compared with the reference interpreter on the program's
source. Reported per model: partitions and host ops, bit-exact, the smallest arena TFLM's
interpreter allocates the model in, the model's bytes (flash) and milliseconds per inference of
TFLM's reference kernels on this machine (median of ``--runs``; the interpreter is in-process here,
a benchmark, where qlower runs it in a worker). A partly supported model reports its partitions'
arenas and is checked through ``Program.run`` instead.

    python benchmarks/tflm_zoo.py [--size 32] [--inputs 2] [--runs 20] [--models tiny_cnn ...]

Output: benchmarks/results/tflm_zoo.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

import qlower
from qlower import zoo
from qlower.reference import run_graph


def _inputs(example, n: int) -> list[list[np.ndarray]]:
    base = [x.detach().numpy() if hasattr(x, "detach") else np.asarray(x) for x in example]
    rng = np.random.default_rng(0)
    return [base] + [[rng.normal(size=x.shape).astype(x.dtype) for x in base] for _ in range(n)]


def measure(name: str, size: int, n_inputs: int, runs: int) -> dict:
    from tflite_micro.python.tflite_micro import runtime

    model, example, cfg, calibration = zoo.get(name, size=size if zoo.default_size(name) else None)
    prog = qlower.compile(model, example, target="tflm", quant=cfg, calibration=calibration, progress=False)
    whole = len(prog.partitions) == 1 and prog.graph.count_ops() == {"delegate": 1}
    row = {"model": name, "partitions": len(prog.partitions),
           "host_ops": sum(n for k, n in prog.graph.count_ops().items() if k != "delegate"),
           "arena": sum(p.payload.meta["arena_bytes"] for p in prog.partitions),
           "flash": sum(p.payload.meta["flash_bytes"] for p in prog.partitions), "ms": None}
    sets = _inputs(example, n_inputs)
    exact = True
    if whole:
        data = prog.partitions[0].payload.blobs["model.tflite"]
        it = runtime.Interpreter.from_bytes(data, arena_size=row["arena"])
        for inputs in sets:
            for i, x in enumerate(inputs):
                it.set_input(x, i)
            it.invoke()
            want = run_graph(prog.source, inputs)
            exact &= all(np.array_equal(it.get_output(i), w) for i, w in enumerate(want))
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            it.invoke()
            times.append(time.perf_counter() - t)
        row["ms"] = 1000 * float(np.median(times))
    else:
        for inputs in sets:
            exact &= all(np.array_equal(g, w) for g, w in zip(prog.run(*inputs), run_graph(prog.source, inputs)))
    row["exact"] = exact
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--inputs", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--models", nargs="*", default=["tiny_cnn", "digits_cnn", "ds_cnn_kws", "mobilenet_v2",
                                                     "resnet18", "mobilenet_v3_small"])
    args = ap.parse_args()
    rows = []
    print("| model | partitions | host ops | bit-exact | arena bytes | flash bytes | ms / inference |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        r = measure(name, args.size, args.inputs, args.runs)
        rows.append(r)
        ms = f"{r['ms']:.2f}" if r["ms"] is not None else "—"
        print(f"| {name} | {r['partitions']} | {r['host_ops']} | {'yes' if r['exact'] else 'NO'} | "
              f"{r['arena']:,} | {r['flash']:,} | {ms} |", flush=True)
    out = Path(__file__).parent / "results" / "tflm_zoo.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"size": args.size, "load": os.getloadavg(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
