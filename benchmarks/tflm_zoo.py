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
    python benchmarks/tflm_zoo.py --ethos-u [--size 224] [--models mobilenet_v2 ds_cnn_kws]

Output: benchmarks/results/tflm_zoo.json. With ``--ethos-u``, the Ethos-U .tflite instead (ethos-u55-128 and
ethos-u85-256): its ``ethos-u`` custom operators, its builtin (host) operators, and whether the file, run
here (``tflite_check.run_split``: builtin pieces on TFLM, each custom operator by the simulated executor of
the payload whose Vela output it holds byte for byte) is bit-exact with the reference; written to
benchmarks/results/tflm_ethosu.json.
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


def measure_ethosu(name: str, target: str, size: int | None, n_inputs: int) -> dict:
    import tempfile

    from qlower.backends.ethosu.backend import EthosUBackend
    from qlower.backends.ethosu.tflite_check import payload_of, read_npu_tflite, run_split

    model, example, cfg, calibration = zoo.get(name, size=size if zoo.default_size(name) else None)
    prog = qlower.compile(model, example, target=target, quant=cfg, calibration=calibration, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(prog.export(Path(tmp, f"{name}.tflite"), format="tflite")).read_bytes()
    tfl, calls = read_npu_tflite(data)
    payloads = [p.payload for p in prog.partitions]
    held = all(payload_of(c, payloads) is not None for c in calls)   # raises when one holds no payload's output
    exact = True
    for inputs in _inputs(example, n_inputs):
        got = run_split(data, payloads, inputs, EthosUBackend().execute)
        exact &= all(np.array_equal(g, w) for g, w in zip(got, run_graph(prog.source, inputs)))
    return {"model": name, "target": target, "size": size, "custom_ops": len(calls), "vela_output": held,
            "builtin_ops": len(tfl.subgraphs[0].operators) - len(calls),
            "host_ops": sum(n for k, n in prog.graph.count_ops().items() if k not in ("delegate", "constant")),
            "exact": bool(exact), "flash": len(data)}


def main_ethosu(args) -> None:
    rows = []
    print("| model | target | ethos-u custom ops (Vela's output) | builtin ops in the file | program host ops | "
          "bit-exact | file bytes |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        for target in ("ethos-u55-128", "ethos-u85-256"):
            r = measure_ethosu(name, target, args.size, args.inputs)
            rows.append(r)
            print(f"| {name} | {target} | {r['custom_ops']} ({'yes' if r['vela_output'] else 'NO'}) | "
                  f"{r['builtin_ops']} | {r['host_ops']} | {'yes' if r['exact'] else 'NO'} | {r['flash']:,} |",
                  flush=True)
    out = Path(__file__).parent / "results" / "tflm_ethosu.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"size": args.size, "load": os.getloadavg(), "rows": rows}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--inputs", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--models", nargs="*", default=["tiny_cnn", "digits_cnn", "ds_cnn_kws", "mobilenet_v2",
                                                     "resnet18", "mobilenet_v3_small"])
    ap.add_argument("--ethos-u", action="store_true", help="the Ethos-U .tflite of --models (module doc)")
    args = ap.parse_args()
    if args.ethos_u:
        return main_ethosu(args)
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
